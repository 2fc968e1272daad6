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

#include <stdexcept>

namespace parc::runtime {

using plan::OpKind;

namespace {
[[noreturn]] void opError(const std::string &message) { throw std::runtime_error(message); }
} // namespace

template <typename D> void OpInterpreter<D>::executeMoE(Context &ctx) {
  const plan::Op &op = ctx.op;
  size_t logitsIndex = op.kind == OpKind::MoeAuxLossBwd ? 0 : 1;
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
  case OpKind::ExpertMatMul:
  case OpKind::ExpertMatMulBwd:
    return expertMatMul(ctx, r);
  default:
    opError("op kind '" + plan::spelling(op.kind).str() + "' is not a mixture-of-experts op");
  }
}

template <typename D>
void OpInterpreter<D>::expertMatMul(Context &ctx, const cpu::MoERouting &r) {
  bool backward = ctx.op.kind == OpKind::ExpertMatMulBwd;
  Operand x = in(ctx, 0), weight = in(ctx, 2);
  if (weight.shape.size() != 3 || weight.shape[0] != r.experts)
    opError("the expert weight must be [experts, out, in]");
  const int64_t rows = r.tokens * r.topK, n = weight.shape[1], k = weight.shape[2];
  if (x.numel() != rows * k)
    opError("the rows do not hold " + std::to_string(rows) + " x " + std::to_string(k) +
            " elements");
  // y_e = x_e w_e^T over the rows of expert e; the backward adds dx_e = dy_e w_e and
  // dw_e += dy_e^T x_e (fresh tensors start at zero).
  Operand dy, dx, dweight, y;
  if (backward) {
    dy = in(ctx, 3);
    dx = out(ctx, 0, true);
    dweight = out(ctx, 1, true);
  } else {
    y = out(ctx, 0, false);
  }
  if ((backward ? dy : y).numel() != rows * n)
    opError("the products do not hold " + std::to_string(rows) + " x " + std::to_string(n) +
            " elements");
  int64_t first = 0;
  for (int64_t e = 0; e < r.experts; ++e) {
    int64_t m = r.count[size_t(e)];
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

#define INSTANTIATE(D) template class OpInterpreter<D>;
PARC_FOR_EACH_DEVICE(INSTANTIATE)
#undef INSTANTIATE

} // namespace parc::runtime
