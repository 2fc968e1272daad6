//===- Kernels.h - CPU kernels of parrun, forward and backward of each op -===//
//
// One function per plan op (docs/plan-format.md), forward and backward side by side, on raw
// row-major buffers. T is float or double (`parrun --precision=fp32|fp64`); every GEMM goes
// through OpenBLAS.
//
// Shapes follow the plan format: activations are [seq, batch, features] (Megatron's layout),
// token ids and labels [batch, seq]. A kernel that only cares about the last dim takes `rows`
// (the product of all the others) and that dim.
//
// Gradient conventions. Kernels never allocate gradients: the caller owns every buffer.
//  * Outputs that are always parameter gradients (dweight, dbias) are ADDED to: gradients
//    accumulate over ops, chunks and microbatches until optimizer_step clears them.
//  * matmul's operands may be parameters or activations, so matmulBackward takes a GradWrite
//    per output.
//  * Every other output (activations and their gradients) is overwritten.
//
// Nothing is saved between a forward and its backward but what the plan names: layernorm and
// rmsnorm recompute their statistics; attention's forward writes its saved softmax (the
// probabilities, or only their row logsumexp with FlashAttention) as a second output.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_KERNELS_H
#define PARC_RUNTIME_KERNELS_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

namespace parc::runtime::cpu {

/// How a backward kernel stores a gradient it may share with other ops.
enum class GradWrite { Overwrite, Add };

/// The threads each kernel call may use: the calling thread and threads - 1 workers of a pool
/// of its own (a rank thread of a local run has one each). Process-wide; parrun sets the cores
/// divided by the ranks that share them, so that ranks x threads does not oversubscribe the
/// machine. OpenBLAS itself is set to one thread: the kernels split their GEMMs themselves.
void setKernelThreads(int64_t threads);
int64_t kernelThreads();

/// The core OpenBLAS runs its kernels for (openblas_get_corename: "SkylakeX", "Haswell", ...).
std::string blasCoreName();
/// The OpenBLAS core this CPU's instruction sets call for, by OpenBLAS's own tests of them
/// (Cooperlake, SkylakeX, Haswell, Sandybridge); empty without AVX or off x86.
std::string blasCoreForInstructionSets();
/// Starts the program again (exec, same pid and arguments) with OPENBLAS_CORETYPE set to
/// blasCoreForInstructionSets() when OpenBLAS fell back to its generic Prescott kernels for a
/// CPU model it does not know (releases before 0.3.25 do, OpenBLAS#4267) and the variable is
/// not set already; returns when there is nothing to correct or the restart failed (a warning
/// on stderr). First thing in main: a restart repeats what came before.
void restartOnMatchingBlasCore(char **argv);

//===----------------------------------------------------------------------===//
// Fills and copies (the executor's buffers: cleared gradients, reused arena blocks)
//===----------------------------------------------------------------------===//

/// dst[i] = value.
template <typename T> void fillValues(T *dst, int64_t n, T value);
/// dst[i] = src[i]; the ranges do not overlap.
template <typename T> void copyValues(T *dst, const T *src, int64_t n);
/// `bytes` zero bytes from dst on.
void zeroBytes(void *dst, size_t bytes);

//===----------------------------------------------------------------------===//
// Embeddings
//===----------------------------------------------------------------------===//

/// y[t,b,:] = weight[ids[b,t] - vocabOffset] if the id is one of this shard's localRows rows,
/// else 0; the tp all-reduce of the shards' y is the full lookup.
template <typename T>
void embeddingForward(T *y, const int64_t *ids, const T *weight, int64_t seq, int64_t batch,
                      int64_t hidden, int64_t vocabOffset, int64_t localRows);
/// dweight[ids[b,t] - vocabOffset] += dy[t,b,:] for the ids in this shard.
template <typename T>
void embeddingBackward(T *dweight, const int64_t *ids, const T *dy, int64_t seq, int64_t batch,
                       int64_t hidden, int64_t vocabOffset, int64_t localRows);

/// y[t,b,:] = x[t,b,:] + weight[t,:] (learned positions, weight [>= seq, hidden]).
template <typename T>
void positionEmbeddingForward(T *y, const T *x, const T *weight, int64_t seq, int64_t batch,
                              int64_t hidden);
/// dx = dy; dweight[t,:] += sum_b dy[t,b,:].
template <typename T>
void positionEmbeddingBackward(T *dx, T *dweight, const T *dy, int64_t seq, int64_t batch,
                               int64_t hidden);

//===----------------------------------------------------------------------===//
// Normalisation (over the last dim, statistics recomputed in the backward)
//===----------------------------------------------------------------------===//

/// y = (x - mean) / sqrt(var + eps) * weight + bias, var the biased variance (as torch).
template <typename T>
void layerNormForward(T *y, const T *x, const T *weight, const T *bias, int64_t rows, int64_t dim,
                      double eps);
/// xhat = (x - mean) * rstd, g = dy * weight:
/// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dweight += sum dy * xhat; dbias += sum dy.
template <typename T>
void layerNormBackward(T *dx, T *dweight, T *dbias, const T *x, const T *weight, const T *dy,
                       int64_t rows, int64_t dim, double eps);

/// sum = a + b, y = layernorm(sum): residual_add and layernorm fused (OpFusion.h), each row
/// normalised while its sum is in cache; the bits of the unfused pair.
template <typename T>
void residualLayerNormForward(T *sum, T *y, const T *a, const T *b, const T *weight, const T *bias,
                              int64_t rows, int64_t dim, double eps);

/// y = x / sqrt(mean(x^2) + eps) * weight.
template <typename T>
void rmsNormForward(T *y, const T *x, const T *weight, int64_t rows, int64_t dim, double eps);
/// sum = a + b, y = rmsnorm(sum), fused as residualLayerNormForward.
template <typename T>
void residualRmsNormForward(T *sum, T *y, const T *a, const T *b, const T *weight, int64_t rows,
                            int64_t dim, double eps);
/// xhat = x * rrms, g = dy * weight: dx = rrms * (g - xhat * mean(g * xhat));
/// dweight += sum dy * xhat.
template <typename T>
void rmsNormBackward(T *dx, T *dweight, const T *x, const T *weight, const T *dy, int64_t rows,
                     int64_t dim, double eps);

//===----------------------------------------------------------------------===//
// Linear algebra
//===----------------------------------------------------------------------===//

/// c[m,n] = op(a) op(b); a is stored [m,k] ([k,m] with transA), b [k,n] ([n,k] with transB).
/// Without transA, m is the product of all of a's dims but the last (the plan's rows).
template <typename T>
void matmulForward(T *c, const T *a, const T *b, int64_t m, int64_t n, int64_t k, bool transA,
                   bool transB);
/// da = dc op(b)^T (transposed back with transA), db = op(a)^T dc (likewise with transB).
/// A null da or db is not computed.
template <typename T>
void matmulBackward(T *da, T *db, const T *a, const T *b, const T *dc, int64_t m, int64_t n,
                    int64_t k, bool transA, bool transB, GradWrite daWrite, GradWrite dbWrite);

/// y[r,:] = x[r,:] + bias.
template <typename T>
void biasAddForward(T *y, const T *x, const T *bias, int64_t rows, int64_t dim);
/// dx = dy; dbias += sum_r dy[r,:]. dx may be dy (in place).
template <typename T> void biasAddBackward(T *dx, T *dbias, const T *dy, int64_t rows, int64_t dim);

/// y = a + b.
template <typename T> void residualAddForward(T *y, const T *a, const T *b, int64_t n);
/// da = db = dy. Either may be dy (in place).
template <typename T> void residualAddBackward(T *da, T *db, const T *dy, int64_t n);

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

/// Rotary embedding of x [seq, batch, heads*headDim], rotate-half form (Megatron, GPT-NeoX,
/// Hugging Face Llama): within each head, element j < headDim/2 pairs with j + headDim/2 and
/// the pair turns by angle t * theta^(-2j/headDim), t = offset + the index along dim 0 (a
/// context-parallel rank's chunk starts at `offset`):
/// y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin. headDim must be even.
template <typename T>
void ropeForward(T *y, const T *x, int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                 double theta, int64_t offset = 0);
/// The inverse rotation: dx1 = dy1 cos + dy2 sin, dx2 = dy2 cos - dy1 sin.
template <typename T>
void ropeBackward(T *dx, const T *dy, int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                  double theta, int64_t offset = 0);

/// y = P v with P = softmax(q k^T / sqrt(headDim) [+ causal mask]) per (batch, query head),
/// standard (unfused) attention: P is written to `probs` [batch, heads, seq, seq] for the
/// backward. q and y are [seq, batch, heads*headDim], k and v [seq, batch, kvHeads*headDim], and
/// query head h reads key/value head h / (heads / kvHeads) (grouped-query attention).
template <typename T>
void attentionForward(T *y, T *probs, const T *q, const T *k, const T *v, int64_t seq,
                      int64_t batch, int64_t heads, int64_t kvHeads, int64_t headDim, bool causal);
/// With P the forward's probabilities and s = 1/sqrt(headDim): dv = P^T dy,
/// dS = P * (dy v^T - rowsum(P * dy v^T)), dq = s dS k, dk = s dS^T q; dk and dv sum over the
/// query heads that share a key/value head. All three are overwritten.
template <typename T>
void attentionBackward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *probs,
                       const T *dy, int64_t seq, int64_t batch, int64_t heads, int64_t kvHeads,
                       int64_t headDim, bool causal);
/// The same y, FlashAttention style (FlashAttention.cpp): the scores exist a tile at a time and
/// only lse = log(sum_j exp(s_ij)) of every query row is kept, [batch, heads, seq].
template <typename T>
void flashAttentionForward(T *y, T *lse, const T *q, const T *k, const T *v, int64_t seq,
                           int64_t batch, int64_t heads, int64_t kvHeads, int64_t headDim,
                           bool causal);
/// The gradients of the above from y and lse: P = exp(S - lse) recomputed per tile and
/// rowsum(P * dP) = rowsum(dy * y); equal to attentionBackward's up to rounding.
template <typename T>
void flashAttentionBackward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *y,
                            const T *lse, const T *dy, int64_t seq, int64_t batch, int64_t heads,
                            int64_t kvHeads, int64_t headDim, bool causal);

/// Ring attention (RingAttention.cpp): one block of seqQ queries against seqK keys and
/// values, y = softmax(s q k^T [+ causal mask, seqQ = seqK]) v with s = 1/sqrt(headDim), and
/// lse[b, h, t] = log sum_j exp(s q_t k_j) over the block's unmasked keys; lse is
/// [batch, heads, seqQ], q and y [seqQ, batch, heads*headDim], k and v [seqK, batch,
/// kvHeads*headDim].
template <typename T>
void attentionBlockForward(T *y, T *lse, const T *q, const T *k, const T *v, int64_t seqQ,
                           int64_t seqK, int64_t batch, int64_t heads, int64_t kvHeads,
                           int64_t headDim, bool causal);
/// Two blocks of the same queries as one (the online softmax): lse = log(e^lse1 + e^lse2),
/// y = e^(lse1 - lse) y1 + e^(lse2 - lse) y2. y may alias y1, lse lse1.
template <typename T>
void attentionMerge(T *y, T *lse, const T *y1, const T *lse1, const T *y2, const T *lse2,
                    int64_t seq, int64_t batch, int64_t heads, int64_t headDim);
/// One block's gradients from the merged y and lse of its queries (FlashAttention-2's
/// backward): P = exp(s q k^T - lse), dv = P^T dy, dS = P (dy v^T - rowsum(dy * y)),
/// dq = s dS k, dk = s dS^T q; dk and dv sum over the query heads sharing a key/value head.
/// All three are overwritten; the blocks of a query chunk add up to attentionBackward's.
template <typename T>
void attentionBlockBackward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *y,
                            const T *lse, const T *dy, int64_t seqQ, int64_t seqK, int64_t batch,
                            int64_t heads, int64_t kvHeads, int64_t headDim, bool causal);

//===----------------------------------------------------------------------===//
// Activations
//===----------------------------------------------------------------------===//

/// y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))), the exact GELU (torch's default).
template <typename T> void geluForward(T *y, const T *x, int64_t n);
/// dx = dy * (Phi(x) + x * phi(x)), phi the standard normal density.
template <typename T> void geluBackward(T *dx, const T *x, const T *dy, int64_t n);

/// y = gelu(x + bias), x [rows, dim]: bias_add and gelu fused (OpFusion.h), exact to the
/// unfused pair (the sum is rounded to T before the gelu).
template <typename T>
void biasGeluForward(T *y, const T *x, const T *bias, int64_t rows, int64_t dim);
/// dx = dy gelu'(x + bias), dbias += sum_r dx: gelu_bwd and bias_add_bwd fused, recomputing
/// x + bias; the same bits as the unfused pair. dx may not alias x or dy.
template <typename T>
void biasGeluBackward(T *dx, T *dbias, const T *x, const T *bias, const T *dy, int64_t rows,
                      int64_t dim);

/// y = silu(gate) * up, all [rows, ffn]; silu(g) = g sigmoid(g).
template <typename T>
void swigluForward(T *y, const T *gate, const T *up, int64_t rows, int64_t ffn);
/// dgate = dy * up * sigmoid(g) (1 + g (1 - sigmoid(g))), dup = dy * silu(g).
template <typename T>
void swigluBackward(T *dgate, T *dup, const T *gate, const T *up, const T *dy, int64_t rows,
                    int64_t ffn);

//===----------------------------------------------------------------------===//
// Vocab-parallel cross entropy
//
// logits [seq, batch, localVocab] hold columns [vocabOffset, vocabOffset + localVocab) of the
// padded vocabulary; labels are [batch, seq]. The executor runs, per microbatch:
//   crossEntropyRowMax         -> all_reduce(max) over the group -> rowMax
//   crossEntropySumExp(rowMax) -> all_reduce(sum)                -> rowSum
//   crossEntropyTargetLogit    -> all_reduce(sum)                -> target (one shard non-zero)
//   crossEntropyLoss(rowMax, rowSum, target)
// and cross_entropy_bwd repeats the first two before crossEntropyBackward.
//
// The loss of a microbatch is the mean over its seq * batch tokens, and the runtime sets
// loss.grad = 1 / microbatches, so a step's gradient is that of the mean over all tokens of
// all microbatches of this data-parallel replica (the dp all-reduce then averages replicas).
//===----------------------------------------------------------------------===//

/// rowMax[r] = max_j logits[r,j] over this shard's first `validVocab` columns (all when
/// negative): the columns of the vocabulary's padding are left out, as if their logit were
/// minus infinity, so a padded model trains as the unpadded one (-inf for a shard of padding).
template <typename T>
void crossEntropyRowMax(T *rowMax, const T *logits, int64_t rows, int64_t localVocab,
                        int64_t validVocab = -1);
/// rowSum[r] = sum_j exp(logits[r,j] - rowMax[r]) over the valid columns, rowMax the global
/// maximum.
template <typename T>
void crossEntropySumExp(T *rowSum, const T *logits, const T *rowMax, int64_t rows,
                        int64_t localVocab, int64_t validVocab = -1);
/// target[t*batch+b] = logits[t,b,labels[b,t] - vocabOffset] if the label is in this shard,
/// else 0.
template <typename T>
void crossEntropyTargetLogit(T *target, const T *logits, const int64_t *labels, int64_t seq,
                             int64_t batch, int64_t localVocab, int64_t vocabOffset);
/// Returns mean_r (log(rowSum[r]) + rowMax[r] - target[r]), from the all-reduced pieces.
template <typename T>
T crossEntropyLoss(const T *rowMax, const T *rowSum, const T *target, int64_t rows);
/// dlogits[r,j] = (exp(logits[r,j] - rowMax[r]) / rowSum[r] - [j is r's label]) * dloss / rows
/// with rows = seq * batch; the one-hot term only on the shard that holds the label; 0 on the
/// columns past `validVocab` (the padding: probability 0, so no gradient). dlogits may be
/// logits (in place: each element is read before it is written).
template <typename T>
void crossEntropyBackward(T *dlogits, const T *logits, const int64_t *labels, const T *rowMax,
                          const T *rowSum, T dloss, int64_t seq, int64_t batch, int64_t localVocab,
                          int64_t vocabOffset, int64_t validVocab = -1);

//===----------------------------------------------------------------------===//
// Optimizer
//===----------------------------------------------------------------------===//

struct AdamWConfig {
  double lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  /// Decoupled (AdamW); the caller passes 0 for parameters of fewer than two dimensions.
  double weightDecay = 0.0;
  int64_t step = 1; // 1-based: the bias corrections are 1 - beta^step
  /// The clipping factor: the step reads g = round_T(grad * gradScale), the bits it would read
  /// had scale() multiplied the gradient in place first, without that pass over the buffer.
  double gradScale = 1.0;

  // The per-step factors both backends' kernels apply. The bias corrections are folded so
  // that an element costs one square root and one division: p -= stepSize() m /
  // (sqrt(v) rootCorrection2() + eps), which is lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) +
  // eps) rearranged.
  double decayFactor() const { return 1.0 - lr * weightDecay; }
  double stepSize() const { return lr / (1.0 - std::pow(beta1, double(step))); }
  double rootCorrection2() const { return 1.0 / std::sqrt(1.0 - std::pow(beta2, double(step))); }
};

/// torch.optim.AdamW: p -= lr * wd * p; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
/// p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps). m and v start at zero.
template <typename T>
void adamwStep(T *param, const T *grad, T *m, T *v, int64_t n, const AdamWConfig &config);

struct SGDConfig {
  double lr = 3e-4, momentum = 0.0;
  /// Coupled L2 as in torch.optim.SGD; 0 for parameters of fewer than two dimensions.
  double weightDecay = 0.0;
  /// As AdamWConfig's.
  double gradScale = 1.0;
};

/// torch.optim.SGD (no dampening, no Nesterov): g' = g + wd p; buf = momentum buf + g';
/// p -= lr buf. buf starts at zero and may be null when momentum is 0.
template <typename T>
void sgdStep(T *param, const T *grad, T *momentumBuffer, int64_t n, const SGDConfig &config);

/// Returns sum x^2 (accumulated in double), this rank's part of the squared global norm.
template <typename T> double squaredSum(const T *x, int64_t n);
/// x *= factor (the loss scale's inverse; the clipping factor rides in the step's gradScale).
template <typename T> void scale(T *x, int64_t n, double factor);

} // namespace parc::runtime::cpu

#endif
