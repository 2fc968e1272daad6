//===- MoEKernels.h - Router, dispatch and combine of a MoE layer --------===//
//
// The mixture-of-experts kernels that move and weigh rows by the router's choice. They work
// on host doubles whatever the device's element type, so that every device and precision
// routes a token to the same experts whenever the logits agree (the interpreter downloads
// the logits and rows, OpMoE.cpp); the expert GEMMs are the device's own matmul per expert.
//
// Routing (Megatron-Core's softmax top-k router): p = softmax(logits[t,:]) in double, and the
// top_k experts of the largest logits, the lower expert first on a tie, so that every mapping
// routes alike. Slot (t, j) is token t's j-th choice. The rows the experts read are grouped by
// expert, and within an expert ordered by slot: row(t, j) = first row of expert e + the slots
// of e before (t, j).
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_MOEKERNELS_H
#define PARC_RUNTIME_MOEKERNELS_H

#include <cstdint>
#include <vector>

namespace parc::runtime::cpu {

/// The router's choice for `tokens` rows of logits [tokens, experts].
struct MoERouting {
  int64_t tokens = 0, experts = 0, topK = 0;
  std::vector<double> prob;    // [tokens, experts]: the softmax of each token's logits
  std::vector<int64_t> expert; // [tokens, topK]: the chosen experts, best first
  std::vector<int64_t> row;    // [tokens, topK]: the expert row of each slot
  std::vector<int64_t> count;  // [experts]: the rows each expert receives
};

/// p = softmax(logits), expert[t,:] = top_k(logits[t,:]) (lower expert on a tie), rows by
/// expert then slot.
MoERouting moeRoute(const double *logits, int64_t tokens, int64_t experts, int64_t topK);
/// w[t,j] = p[t, expert[t,j]], divided by sum_j p[t, expert[t,j]] with `normalize`.
std::vector<double> moeWeights(const MoERouting &r, bool normalize);

/// rows[row(t,j),:] = x[t,:].
void moeDispatchForward(double *rows, const double *x, const MoERouting &r, int64_t width);
/// dx[t,:] = sum_j drows[row(t,j),:].
void moeDispatchBackward(double *dx, const double *drows, const MoERouting &r, int64_t width);

/// out[t,:] = sum_j w[t,j] y[row(t,j),:].
void moeCombineForward(double *out, const double *y, const MoERouting &r, bool normalize,
                       int64_t width);
/// dy[row(t,j),:] = w[t,j] dout[t,:]; dw[t,j] = dout[t,:] . y[row(t,j),:], through the
/// weights (normalize: dp_e = (dw_j - sum_i dw_i w_i) / S) and the softmax:
/// dlogits = p (dp - sum_e p_e dp_e).
void moeCombineBackward(double *dy, double *dlogits, const double *y, const double *dout,
                        const MoERouting &r, bool normalize, int64_t width);

/// The load-balancing loss (Switch Transformer, Megatron-Core's switch_load_balancing):
/// coefficient * experts / (tokens^2 top_k) * sum_e (sum_t p[t,e]) count_e.
double moeAuxLoss(const MoERouting &r, double coefficient);
/// dlogits = scale * its gradient (the counts are constants): with g_e = coefficient * experts
/// / (tokens^2 top_k) count_e, dlogits[t,:] = scale p[t,:] (g - sum_e p[t,e] g_e).
void moeAuxLossBackward(double *dlogits, const MoERouting &r, double coefficient, double scale);

} // namespace parc::runtime::cpu

#endif
