//===- Profiler.cpp - Op timings, their exchange and the table ------------===//

#include "parc/Runtime/Profiler.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Format.h"

#include <algorithm>

namespace parc::runtime {

using plan::OpKind;

void OpProfile::add(const std::string &key, double seconds, double flops) {
  Entry &entry = byKey[key];
  ++entry.calls;
  entry.seconds += seconds;
  entry.flops += flops;
}

void OpProfile::addStep(double seconds) {
  ++stepCount;
  stepSeconds += seconds;
}

std::string OpProfile::encode() const {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << "step " << stepCount << " " << llvm::format("%.9e", stepSeconds) << "\n";
  for (const auto &[key, entry] : byKey)
    os << key << " " << entry.calls << " " << llvm::format("%.9e %.9e", entry.seconds, entry.flops)
       << "\n";
  return os.str();
}

OpProfile OpProfile::merge(llvm::ArrayRef<std::string> encoded) {
  OpProfile sum;
  for (llvm::StringRef text : encoded) {
    llvm::SmallVector<llvm::StringRef, 64> lines;
    text.split(lines, '\n', -1, /*KeepEmpty=*/false);
    for (llvm::StringRef line : lines) {
      llvm::SmallVector<llvm::StringRef, 4> fields;
      line.split(fields, ' ');
      if (fields.size() == 3 && fields[0] == "step") {
        int64_t steps = 0;
        double seconds = 0;
        fields[1].getAsInteger(10, steps);
        fields[2].getAsDouble(seconds);
        // Every rank timed the same steps; the step count is one rank's.
        sum.stepCount = std::max(sum.stepCount, steps);
        sum.stepSeconds += seconds;
        continue;
      }
      if (fields.size() != 4)
        continue;
      Entry &entry = sum.byKey[fields[0].str()];
      int64_t calls = 0;
      double seconds = 0, flops = 0;
      fields[1].getAsInteger(10, calls);
      fields[2].getAsDouble(seconds);
      fields[3].getAsDouble(flops);
      entry.calls += calls;
      entry.seconds += seconds;
      entry.flops += flops;
    }
  }
  return sum;
}

void OpProfile::print(llvm::raw_ostream &out, int64_t ranks, int64_t threadsPerRank) const {
  double steps = double(std::max<int64_t>(1, stepCount));
  out << "profile  " << stepCount << (stepCount == 1 ? " step" : " steps") << ", " << ranks
      << (ranks == 1 ? " rank" : " ranks") << " of " << threadsPerRank
      << (threadsPerRank == 1 ? " thread" : " threads") << ": time per step by op kind"
      << (ranks > 1 ? " (rank-ms: summed over the ranks)" : "") << "\n";
  std::vector<std::pair<std::string, Entry>> rows(byKey.begin(), byKey.end());
  llvm::stable_sort(
      rows, [](const auto &a, const auto &b) { return a.second.seconds > b.second.seconds; });
  double covered = 0, flops = 0;
  for (const auto &row : rows) {
    covered += row.second.seconds;
    flops += row.second.flops;
  }
  auto line = [&](llvm::StringRef name, double calls, double seconds, double rowFlops) {
    out << "  " << llvm::left_justify(name, 30)
        << llvm::format("%10.1f %10.3f %7.1f%% ", calls / steps, 1e3 * seconds / steps,
                        stepSeconds > 0 ? 100 * seconds / stepSeconds : 0.0);
    if (rowFlops > 0 && seconds > 0)
      out << llvm::format("%9.1f", rowFlops / seconds / 1e9);
    else
      out << llvm::right_justify("-", 9);
    out << "\n";
  };
  out << "  " << llvm::left_justify("op", 30) << llvm::right_justify("calls/step", 10)
      << llvm::right_justify("ms/step", 11) << llvm::right_justify("share", 9)
      << llvm::right_justify("GFLOP/s", 10) << "\n";
  for (const auto &[key, entry] : rows)
    line(key, double(entry.calls), entry.seconds, entry.flops);
  line("(outside ops)", 0, std::max(0.0, stepSeconds - covered), 0);
  line("step", steps, stepSeconds, flops);
  out.flush();
}

std::string profileKey(const plan::Op &op) {
  std::string kind = plan::spelling(op.kind).str();
  size_t inputs = op.inputs.size();
  // The fused forms of OpFusion.h have one input more than the plan's.
  if ((op.kind == OpKind::GELU && inputs == 2) || (op.kind == OpKind::GELUBwd && inputs == 3))
    return kind + "+bias_add";
  if ((op.kind == OpKind::LayerNorm && inputs == 4) || (op.kind == OpKind::RMSNorm && inputs == 3))
    return kind + "+residual_add";
  return kind;
}

double opFlops(const plan::Op &op, llvm::function_ref<std::vector<int64_t>(size_t)> inputShape) {
  auto numel = [](const std::vector<int64_t> &shape) {
    double n = 1;
    for (int64_t dim : shape)
      n *= double(dim);
    return n;
  };
  switch (op.kind) {
  case OpKind::MatMul:
  case OpKind::MatMulBwd: {
    std::vector<int64_t> a = inputShape(0), b = inputShape(1);
    if (a.empty() || b.size() != 2)
      return 0;
    bool transA = op.boolAttr("trans_a"), transB = op.boolAttr("trans_b");
    double k = double(transA ? a[0] : a.back()), m = numel(a) / k;
    double n = double(transB ? b[0] : b[1]);
    // The backward is two products of the forward's size: da and db.
    return (op.kind == OpKind::MatMul ? 2 : 4) * m * n * k;
  }
  case OpKind::ExpertMatMul:
  case OpKind::ExpertMatMulBwd: {
    // Each row meets one expert's weight [out, in]: rows x out x in multiply-adds in all.
    std::vector<int64_t> rows = inputShape(0), weight = inputShape(2);
    if (rows.size() != 2 || weight.size() != 3)
      return 0;
    double products = double(rows[0]) * double(weight[1]) * double(weight[2]);
    return (op.kind == OpKind::ExpertMatMul ? 2 : 4) * products;
  }
  case OpKind::Attention:
  case OpKind::AttentionBwd: {
    std::vector<int64_t> q = inputShape(0);
    if (q.size() != 3)
      return 0;
    // q k^T and P v per head: 2 products of seq x seq x head size. The backward makes four
    // (dv, dP, dq, dk) from the kept probabilities, and flash attention's recomputes the
    // scores first: five. The causal half is counted too.
    double seq = double(q[0]), perProduct = 2 * seq * seq * double(q[1]) * double(q[2]);
    if (op.kind == OpKind::Attention)
      return 2 * perProduct;
    return (op.boolAttr("flash") ? 5 : 4) * perProduct;
  }
  default:
    return 0;
  }
}

} // namespace parc::runtime
