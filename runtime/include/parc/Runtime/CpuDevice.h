//===- CpuDevice.h - The executor's seam to the CPU kernels ---------------===//
//
// The executor (OpInterpreter, ParamStore, ScheduleRunner, the optimizer step, the weight
// dump) is written once, over a device D: a per-rank object that owns where the rank's
// buffers live and runs the kernels on them. CpuDevice<T> is the CPU's, with T float or
// double: every call is the Kernels.h function of the same name, unchanged. CudaDevice<T>
// (CudaDevice.h) is the GPU's. What a device must provide:
//
//   using Value     the element type of weights, gradients and activations
//   using Stat      the element type of the cross-entropy pieces (row max, sum, target)
//   using OptState  the element type of the optimizer's moments (and master weights)
//   static constexpr bool KeepsMasterWeights   whether the optimizer keeps an OptState copy
//                                              of every owned weight (half-precision storage)
//   static constexpr const char *Name          "cpu" or "cuda", for messages
//   MemoryTracker &memory()                    its space is where Buffers live
//   int64_t poolPeakBytes(MemoryCategory)      a pool's measured peak, or -1
//   the copies, fills and host transfers below, and one method per kernel of Kernels.h with
//   the same arguments (the CUDA device adds its stream and cuBLAS handle itself).
//
// Host transfers (upload, download, readScalar, allReduceHost) are the only way the executor
// reads or writes element values: it never dereferences a Value pointer itself.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_CPUDEVICE_H
#define PARC_RUNTIME_CPUDEVICE_H

#include "parc/Plan/Plan.h"
#include "parc/Runtime/Buffer.h"
#include "parc/Runtime/Communicator.h"
#include "parc/Runtime/HostArena.h"
#include "parc/Runtime/Init.h"
#include "parc/Runtime/Kernels.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace parc::runtime {

/// G is the precision of gradients, master weights and optimizer state: T itself, or double
/// under fp32 storage (`--precision=mixed`), the CPU's counterpart of bf16 storage with fp32
/// gradients and master weights on CUDA, so that mixed precision's path runs in the CPU tests.
template <typename T, typename G = T> class CpuDevice {
public:
  using Value = T;
  using Stat = T;
  using Grad = G;
  using OptState = G;
  static constexpr bool KeepsMasterWeights = !std::is_same_v<T, G>;
  static constexpr const char *Name = "cpu";

  CpuDevice() = default;
  CpuDevice(const CpuDevice &) = delete;
  CpuDevice &operator=(const CpuDevice &) = delete;
  MemoryTracker &memory() { return tracker; }
  /// Where the buffers live: host memory kept for reuse between steps (HostArena.h).
  const HostArena &arena() const { return hostArena; }

  //===--- Copies, fills, host transfers ----------------------------------===//

  /// dst[i] = src[i]; the ranges may not overlap. E is T or G.
  template <typename E> void copy(E *dst, const E *src, int64_t n) {
    if constexpr (std::is_same_v<E, float> || std::is_same_v<E, double>)
      cpu::copyValues(dst, src, n);
    else
      std::copy_n(src, n, dst);
  }
  /// `rows` runs of `width` elements: dst[r*dstStride + j] = src[r*srcStride + j].
  void copyRows(T *dst, int64_t dstStride, const T *src, int64_t srcStride, int64_t width,
                int64_t rows) {
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(src + r * srcStride, width, dst + r * dstStride);
  }
  /// dst[i] = value.
  template <typename E> void fill(E *dst, int64_t n, double value) {
    if constexpr (std::is_same_v<E, float> || std::is_same_v<E, double>)
      cpu::fillValues(dst, n, E(value));
    else
      std::fill_n(dst, n, E(value));
  }
  /// main[i] += part[i]: a parameter gradient an op wrote through a scratch buffer.
  void accumulateGrad(G *main, const T *part, int64_t n) {
    if constexpr (std::is_same_v<T, G>) {
      cpu::residualAddForward(main, main, part, n);
    } else {
      for (int64_t i = 0; i < n; ++i)
        main[i] += G(part[i]);
    }
  }
  /// dst[i] += src[i] on gradients: a reduced bucket into the owned shard it accumulates in.
  void addGrads(G *dst, const G *src, int64_t n) { cpu::residualAddForward(dst, dst, src, n); }
  /// Token ids and labels, from the host.
  void uploadIds(int64_t *dst, const int64_t *src, int64_t n) { std::copy_n(src, n, dst); }
  /// Values, from doubles on the host (rounded to T).
  void upload(T *dst, const double *src, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      dst[i] = T(src[i]);
  }
  /// Values, to doubles on the host. Waits for the work queued before.
  std::vector<double> download(const T *src, int64_t n) { return {src, src + n}; }
  double readScalar(const T *src) { return double(*src); }
  /// Byte-exact copies between a buffer and host memory (checkpoints).
  void saveBytes(void *host, const void *src, size_t bytes) { std::memcpy(host, src, bytes); }
  void loadBytes(void *dst, const void *host, size_t bytes) { std::memcpy(dst, host, bytes); }
  /// An all-reduce of host doubles (the loss, the gradient norm, flags) over `group`.
  void allReduceHost(Communicator &comm, Communicator::Group group, double *values, size_t n,
                     ReduceOp op = ReduceOp::Sum) {
    comm.allReduce(group, values, n, op);
  }
  /// Fills a shard from (seed, name, global index) as Init.h says.
  void initShard(T *dst, uint64_t seed, const plan::ParamShard &shard) {
    runtime::initShard(dst, seed, shard);
  }
  /// Waits until every kernel and copy queued so far completed (step timing).
  void synchronize() {}
  /// The peak of a category's memory pool as the allocator measured it; -1: no pools (host
  /// memory comes from malloc, and the tracker's count is the measure).
  int64_t poolPeakBytes(MemoryCategory category) const {
    (void)category;
    return -1;
  }

  //===--- Kernels (Kernels.h) --------------------------------------------===//

  void embeddingForward(T *y, const int64_t *ids, const T *weight, int64_t seq, int64_t batch,
                        int64_t hidden, int64_t vocabOffset, int64_t localRows) {
    cpu::embeddingForward(y, ids, weight, seq, batch, hidden, vocabOffset, localRows);
  }
  void embeddingBackward(T *dweight, const int64_t *ids, const T *dy, int64_t seq, int64_t batch,
                         int64_t hidden, int64_t vocabOffset, int64_t localRows) {
    cpu::embeddingBackward(dweight, ids, dy, seq, batch, hidden, vocabOffset, localRows);
  }
  void positionEmbeddingForward(T *y, const T *x, const T *weight, int64_t seq, int64_t batch,
                                int64_t hidden) {
    cpu::positionEmbeddingForward(y, x, weight, seq, batch, hidden);
  }
  void positionEmbeddingBackward(T *dx, T *dweight, const T *dy, int64_t seq, int64_t batch,
                                 int64_t hidden) {
    cpu::positionEmbeddingBackward(dx, dweight, dy, seq, batch, hidden);
  }
  void layerNormForward(T *y, const T *x, const T *weight, const T *bias, int64_t rows, int64_t dim,
                        double eps) {
    cpu::layerNormForward(y, x, weight, bias, rows, dim, eps);
  }
  void layerNormBackward(T *dx, T *dweight, T *dbias, const T *x, const T *weight, const T *dy,
                         int64_t rows, int64_t dim, double eps) {
    cpu::layerNormBackward(dx, dweight, dbias, x, weight, dy, rows, dim, eps);
  }
  void rmsNormForward(T *y, const T *x, const T *weight, int64_t rows, int64_t dim, double eps) {
    cpu::rmsNormForward(y, x, weight, rows, dim, eps);
  }
  /// sum = a + b, y = layernorm(sum): residual_add + layernorm fused (OpFusion.h), one pass
  /// with the bits of the pair. Likewise with rmsnorm.
  void residualLayerNormForward(T *sum, T *y, const T *a, const T *b, const T *weight,
                                const T *bias, int64_t rows, int64_t dim, double eps) {
    cpu::residualLayerNormForward(sum, y, a, b, weight, bias, rows, dim, eps);
  }
  void residualRmsNormForward(T *sum, T *y, const T *a, const T *b, const T *weight, int64_t rows,
                              int64_t dim, double eps) {
    cpu::residualRmsNormForward(sum, y, a, b, weight, rows, dim, eps);
  }
  void rmsNormBackward(T *dx, T *dweight, const T *x, const T *weight, const T *dy, int64_t rows,
                       int64_t dim, double eps) {
    cpu::rmsNormBackward(dx, dweight, x, weight, dy, rows, dim, eps);
  }
  void matmulForward(T *c, const T *a, const T *b, int64_t m, int64_t n, int64_t k, bool transA,
                     bool transB) {
    cpu::matmulForward(c, a, b, m, n, k, transA, transB);
  }
  void matmulBackward(T *da, T *db, const T *a, const T *b, const T *dc, int64_t m, int64_t n,
                      int64_t k, bool transA, bool transB, cpu::GradWrite daWrite,
                      cpu::GradWrite dbWrite) {
    cpu::matmulBackward(da, db, a, b, dc, m, n, k, transA, transB, daWrite, dbWrite);
  }
  void biasAddForward(T *y, const T *x, const T *bias, int64_t rows, int64_t dim) {
    cpu::biasAddForward(y, x, bias, rows, dim);
  }
  void biasAddBackward(T *dx, T *dbias, const T *dy, int64_t rows, int64_t dim) {
    cpu::biasAddBackward(dx, dbias, dy, rows, dim);
  }
  void residualAddForward(T *y, const T *a, const T *b, int64_t n) {
    cpu::residualAddForward(y, a, b, n);
  }
  void residualAddBackward(T *da, T *db, const T *dy, int64_t n) {
    cpu::residualAddBackward(da, db, dy, n);
  }
  void ropeForward(T *y, const T *x, int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                   double theta, int64_t offset) {
    cpu::ropeForward(y, x, seq, batch, heads, headDim, theta, offset);
  }
  void ropeBackward(T *dx, const T *dy, int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                    double theta, int64_t offset) {
    cpu::ropeBackward(dx, dy, seq, batch, heads, headDim, theta, offset);
  }
  void attentionBlockForward(T *y, T *lse, const T *q, const T *k, const T *v, int64_t seqQ,
                             int64_t seqK, int64_t batch, int64_t heads, int64_t kvHeads,
                             int64_t headDim, bool causal) {
    cpu::attentionBlockForward(y, lse, q, k, v, seqQ, seqK, batch, heads, kvHeads, headDim,
                               causal);
  }
  void attentionMerge(T *y, T *lse, const T *y1, const T *lse1, const T *y2, const T *lse2,
                      int64_t seq, int64_t batch, int64_t heads, int64_t headDim) {
    cpu::attentionMerge(y, lse, y1, lse1, y2, lse2, seq, batch, heads, headDim);
  }
  void attentionBlockBackward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *y,
                              const T *lse, const T *dy, int64_t seqQ, int64_t seqK,
                              int64_t batch, int64_t heads, int64_t kvHeads, int64_t headDim,
                              bool causal) {
    cpu::attentionBlockBackward(dq, dk, dv, q, k, v, y, lse, dy, seqQ, seqK, batch, heads,
                                kvHeads, headDim, causal);
  }
  /// `stats` is what the plan's attention keeps: the row logsumexp with `flash`, else the
  /// probabilities.
  void attentionForward(T *y, T *stats, const T *q, const T *k, const T *v, int64_t seq,
                        int64_t batch, int64_t heads, int64_t kvHeads, int64_t headDim,
                        bool causal, bool flash) {
    if (flash)
      return cpu::flashAttentionForward(y, stats, q, k, v, seq, batch, heads, kvHeads, headDim,
                                        causal);
    cpu::attentionForward(y, stats, q, k, v, seq, batch, heads, kvHeads, headDim, causal);
  }
  void attentionBackward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *y,
                         const T *stats, const T *dy, int64_t seq, int64_t batch, int64_t heads,
                         int64_t kvHeads, int64_t headDim, bool causal, bool flash) {
    if (flash)
      return cpu::flashAttentionBackward(dq, dk, dv, q, k, v, y, stats, dy, seq, batch, heads,
                                         kvHeads, headDim, causal);
    cpu::attentionBackward(dq, dk, dv, q, k, v, stats, dy, seq, batch, heads, kvHeads, headDim,
                           causal);
  }
  void geluForward(T *y, const T *x, int64_t n) { cpu::geluForward(y, x, n); }
  /// y = gelu(x + bias): the bias_add + gelu pair fused (OpFusion.h), one pass, the bits of
  /// the pair.
  void biasGeluForward(T *y, const T *x, const T *bias, int64_t rows, int64_t dim) {
    cpu::biasGeluForward(y, x, bias, rows, dim);
  }
  /// dx = dy gelu'(x + bias), dbias += sum_r dx: gelu_bwd and bias_add_bwd fused, recomputing
  /// x + bias in dx itself, so that it holds no more than the unfused pair.
  void biasGeluBackward(T *dx, T *dbias, const T *x, const T *bias, const T *dy, int64_t rows,
                        int64_t dim) {
    cpu::biasGeluBackward(dx, dbias, x, bias, dy, rows, dim);
  }
  void geluBackward(T *dx, const T *x, const T *dy, int64_t n) { cpu::geluBackward(dx, x, dy, n); }
  void swigluForward(T *y, const T *gate, const T *up, int64_t rows, int64_t ffn) {
    cpu::swigluForward(y, gate, up, rows, ffn);
  }
  void swigluBackward(T *dgate, T *dup, const T *gate, const T *up, const T *dy, int64_t rows,
                      int64_t ffn) {
    cpu::swigluBackward(dgate, dup, gate, up, dy, rows, ffn);
  }

  // Vocab-parallel cross entropy; the pieces are Stat.
  // `validVocab`: the shard's columns that are vocabulary, not padding (Kernels.h).
  void crossEntropyRowMax(T *rowMax, const T *logits, int64_t rows, int64_t localVocab,
                          int64_t validVocab) {
    cpu::crossEntropyRowMax(rowMax, logits, rows, localVocab, validVocab);
  }
  void crossEntropySumExp(T *rowSum, const T *logits, const T *rowMax, int64_t rows,
                          int64_t localVocab, int64_t validVocab) {
    cpu::crossEntropySumExp(rowSum, logits, rowMax, rows, localVocab, validVocab);
  }
  void crossEntropyTargetLogit(T *target, const T *logits, const int64_t *labels, int64_t seq,
                               int64_t batch, int64_t localVocab, int64_t vocabOffset) {
    cpu::crossEntropyTargetLogit(target, logits, labels, seq, batch, localVocab, vocabOffset);
  }
  /// The microbatch's loss, on the host; also written to `loss` (one Value on the device).
  double crossEntropyLoss(T *loss, const T *rowMax, const T *rowSum, const T *target,
                          int64_t rows) {
    *loss = cpu::crossEntropyLoss(rowMax, rowSum, target, rows);
    return double(*loss);
  }
  void crossEntropyBackward(T *dlogits, const T *logits, const int64_t *labels, const T *rowMax,
                            const T *rowSum, double dloss, int64_t seq, int64_t batch,
                            int64_t localVocab, int64_t vocabOffset, int64_t validVocab) {
    cpu::crossEntropyBackward(dlogits, logits, labels, rowMax, rowSum, T(dloss), seq, batch,
                              localVocab, vocabOffset, validVocab);
  }

  //===--- Optimizer ------------------------------------------------------===//

  /// sum over the ranges of sum x^2, in double, on the host.
  double squaredSum(llvm::ArrayRef<std::pair<const G *, int64_t>> ranges) {
    double sum = 0;
    for (const auto &[data, n] : ranges)
      sum += cpu::squaredSum(data, n);
    return sum;
  }
  void scale(G *x, int64_t n, double factor) { cpu::scale(x, n, factor); }
  /// AdamW on `weights`, or on `master` (null unless KeepsMasterWeights) rounded into them.
  void adamwStep(T *weights, G *master, const G *grad, G *m, G *v, int64_t n,
                 const cpu::AdamWConfig &config) {
    if constexpr (KeepsMasterWeights) {
      cpu::adamwStep(master, grad, m, v, n, config);
      roundInto(weights, master, n);
    } else {
      (void)master;
      cpu::adamwStep(weights, grad, m, v, n, config);
    }
  }
  /// SGD, as adamwStep; momentum null when the plan's momentum is 0.
  void sgdStep(T *weights, G *master, const G *grad, G *momentum, int64_t n,
               const cpu::SGDConfig &config) {
    if constexpr (KeepsMasterWeights) {
      cpu::sgdStep(master, grad, momentum, n, config);
      roundInto(weights, master, n);
    } else {
      (void)master;
      cpu::sgdStep(weights, grad, momentum, n, config);
    }
  }
  /// master = weights, before the first step (KeepsMasterWeights only).
  void initMaster(G *master, const T *weights, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      master[i] = G(weights[i]);
  }

private:
  static void roundInto(T *weights, const G *master, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      weights[i] = T(master[i]);
  }

  HostArena hostArena; // before the tracker, which releases into it
  MemoryTracker tracker{&hostArena};
};

} // namespace parc::runtime

#endif // PARC_RUNTIME_CPUDEVICE_H
