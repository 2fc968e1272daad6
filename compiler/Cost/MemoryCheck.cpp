//===- MemoryCheck.cpp - The out-of-memory error and its verified hints ---===//
//
// A hint is only offered after parc re-ran the mapping rules and the memory model on the
// changed program and saw every rank fit, so following one never trades this error for
// another.
//
//===----------------------------------------------------------------------===//
#include "parc/Cost/MemoryModel.h"
#include "parc/Support/Units.h"

#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <string>

namespace parc {

namespace {

std::string breakdown(const Program &program, const Mapping &mapping, const StageMemory &m) {
  std::string out;
  llvm::raw_string_ostream os(out);
  int64_t rank = mapping.layout.rankOf({0, m.stage, 0});
  os << "pipeline stage " << m.stage << " (rank " << rank << " and every rank of its stage, "
     << m.blocks << " transformer blocks) holds weights " << formatBytes(m.weights)
     << ", gradients " << formatBytes(m.grads) << ", optimizer state " << formatBytes(m.optimizer);
  if (m.gathered > 0)
    os << ", zero-3 gathered buckets " << formatBytes(m.gathered);
  if (m.gradBuffers > 0)
    os << ", gradient buffers " << formatBytes(m.gradBuffers);
  os << ", activations " << formatBytes(m.activations) << " (";
  if (program.parallel.schedule == ScheduleKind::Interleaved)
    os << m.inFlight << " chunk forward passes in flight";
  else
    os << m.inFlight << (m.inFlight == 1 ? " microbatch" : " microbatches") << " in flight";
  os << "), reserve " << formatBytes(m.reserve);
  return os.str();
}

/// One change to try: what the hint says, which field it points at, how to apply it.
struct Change {
  std::string text;
  std::string field;
  std::function<void(Program &)> apply;
};

std::vector<Change> candidateChanges(const Program &program, const Mapping &mapping) {
  const ParallelSpec &par = program.parallel;
  std::vector<Change> out;
  // Cheapest first: sequence parallelism and selective recompute cost almost nothing, ZeRO
  // costs communication, smaller microbatches a larger bubble, full recompute a third more
  // compute, and a new tp or pp changes the whole layout.
  if (mapping.tp > 1 && !par.sequenceParallel)
    out.push_back({"sequence_parallel = true", "parallel.sequence_parallel",
                   [](Program &p) { p.parallel.sequenceParallel = true; }});
  if (par.recompute == Recompute::None)
    out.push_back({"recompute = selective", "parallel.recompute",
                   [](Program &p) { p.parallel.recompute = Recompute::Selective; }});
  if (mapping.gradientRanks() > 1)
    for (int zero = par.zero + 1; zero <= 3; ++zero)
      out.push_back({"zero = " + std::to_string(zero), "parallel.zero",
                     [zero](Program &p) { p.parallel.zero = zero; }});
  for (int64_t mb = par.microBatch - 1; mb >= 1; --mb)
    if (par.globalBatch % (mb * mapping.dp) == 0)
      out.push_back({"micro_batch = " + std::to_string(mb), "parallel.micro_batch",
                     [mb](Program &p) { p.parallel.microBatch = mb; }});
  if (par.recompute != Recompute::Full)
    out.push_back({"recompute = full", "parallel.recompute",
                   [](Program &p) { p.parallel.recompute = Recompute::Full; }});

  // Growing tp, pp or cp by k keeps the world size by shrinking dp by k.
  auto regrow = [&](const char *axis, int64_t ParallelSpec::*field) {
    int64_t current = par.*field;
    for (int64_t k = 2; k <= mapping.dp; ++k) {
      if (mapping.dp % k != 0)
        continue;
      int64_t size = current * k, dp = mapping.dp / k;
      std::string text = std::string(axis) + " = " + std::to_string(size);
      text += par.dpAuto ? " (dp becomes " + std::to_string(dp) + ")"
                         : " and dp = " + std::to_string(dp);
      out.push_back({text, std::string("parallel.") + axis, [=](Program &p) {
                       p.parallel.*field = size;
                       if (!p.parallel.dpAuto)
                         p.parallel.dp = dp;
                     }});
    }
  };
  regrow("tp", &ParallelSpec::tp);
  if (par.stageLayers.empty())
    regrow("pp", &ParallelSpec::pp);
  // Context parallelism divides every activation by cp: the fix for a long sequence.
  regrow("cp", &ParallelSpec::cp);
  return out;
}

} // namespace

bool checkMemory(const Program &program, const Mapping &mapping, DiagnosticEngine &diags) {
  MemoryEstimate est = estimateMemory(program, mapping);
  if (est.fits())
    return true;
  const StageMemory &worst = est.worst();
  const std::string capacity = formatQuantity(double(est.gpuMemory), Dimension::size());
  const llvm::SMRange header = program.parallel.headerRange;

  struct Hint {
    std::string text;
    llvm::SMRange range;
  };
  // A change that makes the mapping rules warn (tp across nodes, a larger bubble) is no fix.
  DiagnosticEngine baseline(diags.getSourceMgr(), llvm::nulls());
  checkMapping(program, baseline);

  std::vector<Hint> hints;
  std::vector<std::string> fieldsTaken;
  for (const Change &change : candidateChanges(program, mapping)) {
    if (hints.size() == 3)
      break;
    // One hint per field: the first zero, micro_batch or recompute value that fits.
    if (std::find(fieldsTaken.begin(), fieldsTaken.end(), change.field) != fieldsTaken.end())
      continue;
    Program changed = program;
    change.apply(changed);
    DiagnosticEngine quiet(diags.getSourceMgr(), llvm::nulls());
    std::optional<Mapping> changedMapping = checkMapping(changed, quiet);
    if (!changedMapping || quiet.hasErrors() || quiet.warningCount() > baseline.warningCount())
      continue;
    MemoryEstimate after = estimateMemory(changed, *changedMapping);
    if (!after.fits())
      continue;
    const StageMemory &peak = after.worst();
    fieldsTaken.push_back(change.field);
    hints.push_back({"with " + change.text + " stage " + std::to_string(peak.stage) + " needs " +
                         formatBytes(peak.total()) + " of " + capacity,
                     program.rangeOf(change.field, header)});
  }

  std::string fix = hints.empty()
                        ? "no single change of recompute, zero, sequence_parallel, micro_batch, "
                          "tp, pp or cp fits; use GPUs with more memory or more GPUs"
                        : "apply one of the changes below or use GPUs with more memory";
  diags.error(header, "out of memory: pipeline stage " + std::to_string(worst.stage) + " needs " +
                          formatBytes(worst.total()) + " per GPU but gpu.memory is " + capacity +
                          "; " + fix);
  diags.note(llvm::SMLoc(), breakdown(program, mapping, worst));
  for (const Hint &hint : hints)
    diags.note(hint.range, hint.text);
  return false;
}

} // namespace parc
