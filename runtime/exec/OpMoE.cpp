//===- OpMoE.cpp - The mixture-of-experts ops ------------------------------===//
//
// Each op routes from the router's logits itself (MoEKernels.h): the logits are downloaded
// and routed on the host in double, so that every device and precision sends a token to the
// same experts whenever the logits agree. Rows move and combine through MoEKernels.h on the
// host as well; the expert GEMMs run on the device, one matmul per expert over its rows.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/MoEKernels.h"
#include "parc/Runtime/OpInterpreter.h"

#include "Devices.h"

#include <algorithm>
#include <stdexcept>

namespace parc::runtime {

using plan::OpKind;

namespace {
[[noreturn]] void opError(const std::string &message) { throw std::runtime_error(message); }
} // namespace

template <typename D> const RowCounts &OpInterpreter<D>::counts(Context &ctx, size_t i) {
  const std::string &name = ctx.op.inputs[i];
  const RowCounts *c = ctx.env.counts(name);
  if (!c)
    opError("operand '" + name + "' must be row counts that moe_counts or all_to_all wrote, "
            "but is not defined");
  return *c;
}

template <typename D> RowCounts &OpInterpreter<D>::outCounts(Context &ctx, size_t i) {
  const std::string &name = ctx.op.outputs[i];
  auto type = ctx.chunk.tensors.find(name);
  if (type == ctx.chunk.tensors.end() || type->second.dtype != plan::DType::Int64 ||
      type->second.shape.size() != 2)
    opError("output '" + name + "' is not declared as int64 row counts [members, experts]");
  if (ctx.env.has(name))
    opError("output '" + name + "' is written a second time in this pass");
  RowCounts &c = ctx.env.setCounts(name);
  c.shape = type->second.shape;
  c.values.assign(size_t(c.shape[0] * c.shape[1]), 0);
  return c;
}

/// The blocks of rows that counts [members, experts] describe, member-major: block
/// (m, e) holds counts[m][e] rows of local expert e.
static std::vector<std::pair<int64_t, int64_t>> countedBlocks(const RowCounts &c) {
  std::vector<std::pair<int64_t, int64_t>> blocks;
  for (int64_t m = 0; m < c.shape[0]; ++m)
    for (int64_t e = 0; e < c.shape[1]; ++e)
      blocks.push_back({e, c.values[size_t(m * c.shape[1] + e)]});
  return blocks;
}

template <typename D> void OpInterpreter<D>::executeMoE(Context &ctx) {
  const plan::Op &op = ctx.op;
  if ((op.kind == OpKind::ExpertMatMul || op.kind == OpKind::ExpertMatMulBwd) &&
      ctx.env.counts(op.inputs[1]))
    return expertMatMul(ctx, countedBlocks(counts(ctx, 1)));
  size_t logitsIndex = op.kind == OpKind::MoeAuxLossBwd || op.kind == OpKind::MoeCounts ? 0 : 1;
  Operand logits = in(ctx, logitsIndex);
  if (logits.shape.size() != 3)
    opError("the router's logits must be [seq, batch, experts]");
  const int64_t experts = logits.shape[2], tokens = logits.numel() / experts;
  const int64_t topK = op.intAttr("top_k"), rows = tokens * topK;
  if (topK < 1 || topK > experts)
    opError("top_k must lie in [1, experts]");
  cpu::MoERouting r =
      cpu::moeRoute(dev.download(logits.data, logits.numel()).data(), tokens, experts, topK);
  auto host = [&](const Operand &x) { return dev.download(x.data, x.numel()); };
  auto store = [&](const Operand &y, const std::vector<double> &values) {
    dev.upload(y.data, values.data(), y.numel());
  };
  // Checks that a [rows, width] or [seq, batch, width] operand holds what routing says.
  auto width = [&](const Operand &x, int64_t count) {
    if (x.shape.empty() || x.numel() != count * x.shape.back())
      opError("an operand holds " + std::to_string(x.numel()) + " elements, not " +
              std::to_string(count) + " rows");
    return x.shape.back();
  };
  // Input 0's `from` rows to output 0's `to` rows of the same width, through `kernel`.
  auto moveRows = [&](int64_t from, int64_t to, auto kernel) {
    Operand x = in(ctx, 0), y = out(ctx, 0, false);
    int64_t h = width(x, from);
    if (width(y, to) != h)
      opError("the output's rows are not as wide as the input's");
    std::vector<double> values(size_t(y.numel()));
    kernel(values.data(), host(x).data(), h);
    store(y, values);
  };
  switch (op.kind) {
  case OpKind::MoeDispatch:
    return moveRows(tokens, rows, [&](double *y, const double *x, int64_t h) {
      cpu::moeDispatchForward(y, x, r, h);
    });
  case OpKind::MoeDispatchBwd:
    return moveRows(rows, tokens, [&](double *dx, const double *drows, int64_t h) {
      cpu::moeDispatchBackward(dx, drows, r, h);
    });
  case OpKind::MoeCombine:
    return moveRows(rows, tokens, [&](double *combined, const double *y, int64_t h) {
      cpu::moeCombineForward(combined, y, r, op.boolAttr("normalize"), h);
    });
  case OpKind::MoeCombineBwd: {
    Operand y = in(ctx, 0), dout = in(ctx, 2);
    Operand dy = out(ctx, 0, false), dlogits = out(ctx, 1, false);
    int64_t h = width(y, rows);
    if (width(dout, tokens) != h || dy.numel() != y.numel() || dlogits.numel() != logits.numel())
      opError("moe_combine_bwd: the gradients differ in size from their values");
    std::vector<double> dyValues(size_t(dy.numel())), dlValues(size_t(dlogits.numel()));
    cpu::moeCombineBackward(dyValues.data(), dlValues.data(), host(y).data(), host(dout).data(),
                            r, op.boolAttr("normalize"), h);
    store(dy, dyValues);
    return store(dlogits, dlValues);
  }
  case OpKind::MoeAuxLossBwd: {
    Operand dlogits = out(ctx, 0, false);
    if (dlogits.numel() != logits.numel())
      opError("moe_aux_loss_bwd: the gradient differs in size from the logits");
    std::vector<double> values(size_t(dlogits.numel()));
    cpu::moeAuxLossBackward(values.data(), r, op.numberAttr("aux_loss"), op.numberAttr("scale"));
    return store(dlogits, values);
  }
  case OpKind::MoeCounts: {
    // counts[m][e]: the rows for expert e of ep member m, expert m * (experts / members) + e.
    RowCounts &c = outCounts(ctx, 0);
    if (c.shape[0] * c.shape[1] != experts)
      opError("moe_counts: " + std::to_string(c.shape[0]) + " x " + std::to_string(c.shape[1]) +
              " counts for " + std::to_string(experts) + " experts");
    for (int64_t e = 0; e < experts; ++e)
      c.values[size_t(e)] = r.count[size_t(e)];
    return;
  }
  case OpKind::ExpertMatMul:
  case OpKind::ExpertMatMulBwd: {
    std::vector<std::pair<int64_t, int64_t>> blocks;
    for (int64_t e = 0; e < experts; ++e)
      blocks.push_back({e, r.count[size_t(e)]});
    return expertMatMul(ctx, blocks);
  }
  default:
    opError("op kind '" + plan::spelling(op.kind).str() + "' is not a mixture-of-experts op");
  }
}

template <typename D>
void OpInterpreter<D>::expertMatMul(Context &ctx,
                                    llvm::ArrayRef<std::pair<int64_t, int64_t>> blocks) {
  bool backward = ctx.op.kind == OpKind::ExpertMatMulBwd;
  Operand x = in(ctx, 0), weight = in(ctx, 2);
  if (weight.shape.size() != 3)
    opError("the expert weight must be [experts, out, in]");
  const int64_t n = weight.shape[1], k = weight.shape[2];
  if (x.shape.size() != 2 || x.shape[1] != k)
    opError("the rows must be [rows, " + std::to_string(k) + "]");
  // The rows past the blocks (an all-to-all buffer's unused tail) stay zero in the outputs.
  const int64_t rows = x.shape[0];
  int64_t used = 0;
  for (auto [expert, m] : blocks) {
    if (expert < 0 || expert >= weight.shape[0])
      opError("expert " + std::to_string(expert) + " has no weight among the " +
              std::to_string(weight.shape[0]));
    used += m;
  }
  if (used > rows)
    opError(std::to_string(used) + " routed rows do not fit the " + std::to_string(rows) +
            " rows of '" + ctx.op.inputs[0] + "'");
  // y_e = x_e w_e^T over the rows of expert e; the backward adds dx_e = dy_e w_e and
  // dw_e += dy_e^T x_e (fresh tensors start at zero).
  Operand dy, dx, dweight, y;
  if (backward) {
    dy = in(ctx, 3);
    dx = out(ctx, 0, true);
    dweight = out(ctx, 1, true);
  } else {
    y = out(ctx, 0, true); // zeros: the rows past the blocks are not written
  }
  if ((backward ? dy : y).numel() != rows * n)
    opError("the products do not hold " + std::to_string(rows) + " x " + std::to_string(n) +
            " elements");
  int64_t first = 0;
  for (auto [e, m] : blocks) {
    if (m == 0)
      continue;
    const T *xe = x.data + first * k, *we = weight.data + e * n * k;
    if (backward)
      dev.matmulBackward(dx.data + first * k, dweight.data + e * n * k, xe, we,
                         dy.data + first * n, m, n, k, false, true, cpu::GradWrite::Add,
                         cpu::GradWrite::Add);
    else
      dev.matmulForward(y.data + first * n, xe, we, m, n, k, false, true);
    first += m;
  }
}

/// Rows to and from the ep group's members. The counts are exchanged first, on the host
/// (every member adds its own rows of a members x members x experts matrix into zeros, an
/// exact sum), then the rows move; received rows are stacked member-major and the output's
/// rows past them stay zero, so the expert MLP maps them to zero.
template <typename D> void OpInterpreter<D>::allToAll(Context &ctx) {
  const std::vector<int64_t> &ranks = group(ctx.op);
  const RowCounts &mine = counts(ctx, 1);
  const int64_t g = int64_t(ranks.size()), experts = mine.shape[1];
  const int64_t self = int64_t(std::find(ranks.begin(), ranks.end(), plan.rank) - ranks.begin());
  if (mine.shape[0] != g || self == g)
    opError("all_to_all: the counts are not the group's " + std::to_string(g) + " members'");
  std::vector<double> all(size_t(g * g * experts), 0.0);
  for (int64_t i = 0; i < g * experts; ++i)
    all[size_t(self * g * experts + i)] = double(mine.values[size_t(i)]);
  dev.allReduceHost(comm, ranks, all.data(), all.size());

  // Zeros: only the received rows are written.
  Operand x = in(ctx, 0), y = out(ctx, 0, true);
  RowCounts &received = outCounts(ctx, 1);
  if (received.shape != mine.shape)
    opError("all_to_all: the output counts differ in shape from the input counts");
  const int64_t width = x.shape.back();
  std::vector<size_t> sends(static_cast<size_t>(g)), recvs(static_cast<size_t>(g));
  int64_t sent = 0, taken = 0;
  for (int64_t m = 0; m < g; ++m)
    for (int64_t e = 0; e < experts; ++e) {
      int64_t out = mine.values[size_t(m * experts + e)];
      int64_t back = int64_t(all[size_t((m * g + self) * experts + e)]);
      received.values[size_t(m * experts + e)] = back;
      sends[size_t(m)] += size_t(out * width);
      recvs[size_t(m)] += size_t(back * width);
      sent += out;
      taken += back;
    }
  if (sent * width > x.numel() || taken * width > y.numel())
    opError("all_to_all: " + std::to_string(sent) + " rows sent and " + std::to_string(taken) +
            " received do not fit the buffers of " + std::to_string(x.numel() / width) + " and " +
            std::to_string(y.numel() / width) + " rows");
  comm.allToAll(ranks, x.data, sends, y.data, recvs);
}

#define INSTANTIATE(D) template class OpInterpreter<D>;
PARC_FOR_EACH_DEVICE(INSTANTIATE)
#undef INSTANTIATE

} // namespace parc::runtime
