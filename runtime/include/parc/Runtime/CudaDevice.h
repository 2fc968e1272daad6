//===- CudaDevice.h - The executor's seam to the CUDA kernels -------------===//
//
// The GPU's device policy of the executor (CpuDevice.h says what a device provides): the same
// members with the same arguments, on device pointers, each forwarding to the CudaKernels.h
// function of the same name with the rank's stream or cuBLAS handle added. T is float,
// __nv_bfloat16 or __half. The cross-entropy pieces (Stat) and the optimizer's moments
// (OptState) are fp32 whatever T is; with bf16/fp16 storage the optimizer also keeps fp32
// master weights and steps them, rounding the result into the stored weights (Megatron's
// fp32 main params), so small updates are not lost to rounding.
//
// A CudaDevice owns one non-blocking stream, a cuBLAS handle on it and a memory pool per
// category (CudaMemory.h); all its work is queued on that stream, in call order. Only host
// transfers (download, readScalar, crossEntropyLoss, squaredSum, allReduceHost) and
// synchronize() wait for the device. It must be used on a thread whose current device is
// device(): the constructing thread is; the rank threads of CudaLocalWorld::run are.
//
// allReduceHost takes a device communicator (CudaCommunicator.h) whose compute stream is this
// device's stream() (it checks): the values are reduced in device memory, and the copy back,
// queued on the stream, is ordered after the collective by the communicator. It waits through
// the communicator's synchronize(), whose deadline a missing peer cannot outlast.
//
// The rank's communicator is bound to the device for the run (bindCommunicator): then every
// host wait first waits for the communicator's calls through its synchronize(), so that a
// collective some peer never joins ends in a CommError at the deadline (NCCL aborted) instead
// of blocking the rank for ever inside the driver behind it.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_CUDADEVICE_H
#define PARC_RUNTIME_CUDADEVICE_H

#include "parc/Plan/Plan.h"
#include "parc/Runtime/Buffer.h"
#include "parc/Runtime/Communicator.h"
#include "parc/Runtime/CudaFlashAttention.h"
#include "parc/Runtime/CudaKernels.h"
#include "parc/Runtime/CudaMemory.h"
#include "parc/Runtime/Kernels.h"

#include "llvm/ADT/ArrayRef.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace parc::runtime {

template <> struct ElementTypeOf<__nv_bfloat16> {
  static constexpr ElementType value = ElementType::BF16;
};
template <> struct ElementTypeOf<__half> { static constexpr ElementType value = ElementType::F16; };

class CudaCommunicator;

template <typename T> class CudaDevice {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16> ||
                    std::is_same_v<T, __half>,
                "the CUDA kernels store float, __nv_bfloat16 or __half");

public:
  using Value = T;
  using Stat = float;
  /// Gradients accumulate and are reduced in fp32 whatever T is (Megatron's main_grad).
  using Grad = float;
  using OptState = float;
  static constexpr bool KeepsMasterWeights = !std::is_same_v<T, float>;
  static constexpr const char *Name = "cuda";

  /// Selects `device` for the calling thread and creates the stream, cuBLAS handle and pools.
  /// `flashAttention`: bf16/fp16 attention runs fused (CudaFlashAttention.h) where its shapes
  /// allow; fp32 always takes the cuBLAS path, whose rounding the 1e-5 equivalence needs.
  explicit CudaDevice(int device, bool flashAttention = true);
  /// Waits for the queued work, then releases everything without throwing. Unbinds the
  /// communicator still bound.
  ~CudaDevice();
  CudaDevice(const CudaDevice &) = delete;
  CudaDevice &operator=(const CudaDevice &) = delete;

  MemoryTracker &memory() { return tracker; }
  cudaStream_t stream() const { return stream_.get(); }
  int device() const { return device_; }
  /// Orders `comm`'s calls against stream() (setComputeStream) and makes every host wait go
  /// through comm->synchronize() first; null unbinds the communicator bound before.
  void bindCommunicator(CudaCommunicator *comm);
  /// The driver's high-water mark of the category's pool (CudaMemorySpace::poolPeakBytes).
  int64_t poolPeakBytes(MemoryCategory category) const { return space->poolPeakBytes(category); }

  //===--- Copies, fills, host transfers ----------------------------------===//

  template <typename E> void copy(E *dst, const E *src, int64_t n) {
    if (n > 0)
      PARC_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(E), cudaMemcpyDeviceToDevice, stream()),
                      "copy");
  }
  void copyRows(T *dst, int64_t dstStride, const T *src, int64_t srcStride, int64_t width,
                int64_t rows);
  /// dst[i] = value, rounded to float and then to E.
  template <typename E> void fill(E *dst, int64_t n, double value) {
    cuda::fill(dst, n, float(value), stream());
  }
  /// main[i] += part[i]: a parameter gradient an op wrote in T, added to the fp32 one.
  void accumulateGrad(Grad *main, const T *part, int64_t n);
  /// dst[i] += src[i] on fp32 gradients: a reduced bucket into the owned shard.
  void addGrads(Grad *dst, const Grad *src, int64_t n) {
    if (n > 0)
      cuda::residualAddForward(dst, dst, src, n, stream());
  }
  void uploadIds(int64_t *dst, const int64_t *src, int64_t n);
  /// Rounded to float on the host, then to T on the device.
  void upload(T *dst, const double *src, int64_t n);
  std::vector<double> download(const T *src, int64_t n);
  double readScalar(const T *src) { return download(src, 1).front(); }
  /// Byte-exact copies between a device buffer and host memory (checkpoints); both wait.
  void saveBytes(void *host, const void *src, size_t bytes) {
    copyToHost(host, src, bytes, "saving a checkpoint");
  }
  void loadBytes(void *dst, const void *host, size_t bytes);
  void allReduceHost(Communicator &comm, Communicator::Group group, double *values, size_t n,
                     ReduceOp op = ReduceOp::Sum);
  /// The fp32 initialisation of Init.h, uploaded.
  void initShard(T *dst, uint64_t seed, const plan::ParamShard &shard);
  void synchronize();

  //===--- Kernels (CudaKernels.h) ----------------------------------------===//

  void embeddingForward(T *y, const int64_t *ids, const T *weight, int64_t seq, int64_t batch,
                        int64_t hidden, int64_t vocabOffset, int64_t localRows) {
    cuda::embeddingForward(y, ids, weight, seq, batch, hidden, vocabOffset, localRows, stream());
  }
  void embeddingBackward(T *dweight, const int64_t *ids, const T *dy, int64_t seq, int64_t batch,
                         int64_t hidden, int64_t vocabOffset, int64_t localRows) {
    cuda::embeddingBackward(dweight, ids, dy, seq, batch, hidden, vocabOffset, localRows, stream());
  }
  void positionEmbeddingForward(T *y, const T *x, const T *weight, int64_t seq, int64_t batch,
                                int64_t hidden) {
    cuda::positionEmbeddingForward(y, x, weight, seq, batch, hidden, stream());
  }
  void positionEmbeddingBackward(T *dx, T *dweight, const T *dy, int64_t seq, int64_t batch,
                                 int64_t hidden) {
    cuda::positionEmbeddingBackward(dx, dweight, dy, seq, batch, hidden, stream());
  }
  void layerNormForward(T *y, const T *x, const T *weight, const T *bias, int64_t rows, int64_t dim,
                        double eps) {
    cuda::layerNormForward(y, x, weight, bias, rows, dim, eps, stream());
  }
  void layerNormBackward(T *dx, T *dweight, T *dbias, const T *x, const T *weight, const T *dy,
                         int64_t rows, int64_t dim, double eps) {
    cuda::layerNormBackward(dx, dweight, dbias, x, weight, dy, rows, dim, eps, stream());
  }
  void rmsNormForward(T *y, const T *x, const T *weight, int64_t rows, int64_t dim, double eps) {
    cuda::rmsNormForward(y, x, weight, rows, dim, eps, stream());
  }
  void residualLayerNormForward(T *sum, T *y, const T *a, const T *b, const T *weight,
                                const T *bias, int64_t rows, int64_t dim, double eps) {
    cuda::residualLayerNormForward(sum, y, a, b, weight, bias, rows, dim, eps, stream());
  }
  void residualRmsNormForward(T *sum, T *y, const T *a, const T *b, const T *weight, int64_t rows,
                              int64_t dim, double eps) {
    cuda::residualRmsNormForward(sum, y, a, b, weight, rows, dim, eps, stream());
  }
  void rmsNormBackward(T *dx, T *dweight, const T *x, const T *weight, const T *dy, int64_t rows,
                       int64_t dim, double eps) {
    cuda::rmsNormBackward(dx, dweight, x, weight, dy, rows, dim, eps, stream());
  }
  void matmulForward(T *c, const T *a, const T *b, int64_t m, int64_t n, int64_t k, bool transA,
                     bool transB) {
    cuda::matmulForward(*blas, c, a, b, m, n, k, transA, transB);
  }
  void matmulBackward(T *da, T *db, const T *a, const T *b, const T *dc, int64_t m, int64_t n,
                      int64_t k, bool transA, bool transB, cpu::GradWrite daWrite,
                      cpu::GradWrite dbWrite) {
    cuda::matmulBackward(*blas, da, db, a, b, dc, m, n, k, transA, transB, daWrite, dbWrite);
  }
  void biasAddForward(T *y, const T *x, const T *bias, int64_t rows, int64_t dim) {
    cuda::biasAddForward(y, x, bias, rows, dim, stream());
  }
  void biasAddBackward(T *dx, T *dbias, const T *dy, int64_t rows, int64_t dim) {
    cuda::biasAddBackward(dx, dbias, dy, rows, dim, stream());
  }
  void residualAddForward(T *y, const T *a, const T *b, int64_t n) {
    cuda::residualAddForward(y, a, b, n, stream());
  }
  void residualAddBackward(T *da, T *db, const T *dy, int64_t n) {
    cuda::residualAddBackward(da, db, dy, n, stream());
  }
  void ropeForward(T *y, const T *x, int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                   double theta, int64_t offset) {
    cuda::ropeForward(y, x, seq, batch, heads, headDim, theta, stream(), offset);
  }
  void ropeBackward(T *dx, const T *dy, int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                    double theta, int64_t offset) {
    cuda::ropeBackward(dx, dy, seq, batch, heads, headDim, theta, stream(), offset);
  }
  void attentionBlockForward(T *y, T *lse, const T *q, const T *k, const T *v, int64_t seqQ,
                             int64_t seqK, int64_t batch, int64_t heads, int64_t kvHeads,
                             int64_t headDim, bool causal) {
    cuda::attentionBlockForward(y, lse, q, k, v, seqQ, seqK, batch, heads, kvHeads, headDim,
                                causal, stream());
  }
  void attentionMerge(T *y, T *lse, const T *y1, const T *lse1, const T *y2, const T *lse2,
                      int64_t seq, int64_t batch, int64_t heads, int64_t headDim) {
    cuda::attentionMerge(y, lse, y1, lse1, y2, lse2, seq, batch, heads, headDim, stream());
  }
  void attentionBlockBackward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *y,
                              const T *lse, const T *dy, int64_t seqQ, int64_t seqK,
                              int64_t batch, int64_t heads, int64_t kvHeads, int64_t headDim,
                              bool causal) {
    cuda::attentionBlockBackward(dq, dk, dv, q, k, v, y, lse, dy, seqQ, seqK, batch, heads,
                                 kvHeads, headDim, causal, stream());
  }
  /// The plan's attention: `stats` is allocated as the plan declares it (the row logsumexp
  /// with `planFlash`, else the probabilities), so the memory held is the plan's, but the CUDA
  /// kernels recompute what they need in the backward and leave it unused (docs/runtime.md).
  /// The fused kernels run where the plan asks for FlashAttention, --attention allows it and
  /// the shapes fit; otherwise the unfused path.
  void attentionForward(T *y, T *stats, const T *q, const T *k, const T *v, int64_t seq,
                        int64_t batch, int64_t heads, int64_t kvHeads, int64_t headDim,
                        bool causal, bool planFlash) {
    (void)stats;
    if constexpr (!std::is_same_v<T, float>)
      if (planFlash && flash && cuda::flashAttentionSupports(seq, headDim))
        return cuda::flashAttentionForward(y, q, k, v, seq, batch, heads, kvHeads, headDim, causal,
                                           stream());
    cuda::attentionForward(*blas, y, q, k, v, seq, batch, heads, kvHeads, headDim, causal);
  }
  void attentionBackward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *y,
                         const T *stats, const T *dy, int64_t seq, int64_t batch, int64_t heads,
                         int64_t kvHeads, int64_t headDim, bool causal, bool planFlash) {
    (void)y;
    (void)stats;
    if constexpr (!std::is_same_v<T, float>)
      if (planFlash && flash && cuda::flashAttentionSupports(seq, headDim))
        return cuda::flashAttentionBackward(dq, dk, dv, q, k, v, dy, seq, batch, heads, kvHeads,
                                            headDim, causal, stream());
    cuda::attentionBackward(*blas, dq, dk, dv, q, k, v, dy, seq, batch, heads, kvHeads, headDim,
                            causal);
  }
  void geluForward(T *y, const T *x, int64_t n) { cuda::geluForward(y, x, n, stream()); }
  void biasGeluForward(T *y, const T *x, const T *bias, int64_t rows, int64_t dim) {
    cuda::biasGeluForward(y, x, bias, rows, dim, stream());
  }
  void biasGeluBackward(T *dx, T *dbias, const T *x, const T *bias, const T *dy, int64_t rows,
                        int64_t dim) {
    cuda::biasGeluBackward(dx, dbias, x, bias, dy, rows, dim, stream());
  }
  void geluBackward(T *dx, const T *x, const T *dy, int64_t n) {
    cuda::geluBackward(dx, x, dy, n, stream());
  }
  void swigluForward(T *y, const T *gate, const T *up, int64_t rows, int64_t ffn) {
    cuda::swigluForward(y, gate, up, rows, ffn, stream());
  }
  void swigluBackward(T *dgate, T *dup, const T *gate, const T *up, const T *dy, int64_t rows,
                      int64_t ffn) {
    cuda::swigluBackward(dgate, dup, gate, up, dy, rows, ffn, stream());
  }

  // Vocab-parallel cross entropy; the pieces are Stat (fp32).
  void crossEntropyRowMax(float *rowMax, const T *logits, int64_t rows, int64_t localVocab,
                          int64_t validVocab = -1) {
    cuda::crossEntropyRowMax(rowMax, logits, rows, localVocab, stream(), validVocab);
  }
  void crossEntropySumExp(float *rowSum, const T *logits, const float *rowMax, int64_t rows,
                          int64_t localVocab, int64_t validVocab = -1) {
    cuda::crossEntropySumExp(rowSum, logits, rowMax, rows, localVocab, stream(), validVocab);
  }
  void crossEntropyTargetLogit(float *target, const T *logits, const int64_t *labels, int64_t seq,
                               int64_t batch, int64_t localVocab, int64_t vocabOffset) {
    cuda::crossEntropyTargetLogit(target, logits, labels, seq, batch, localVocab, vocabOffset,
                                  stream());
  }
  /// The microbatch's loss (the fp32 value, before rounding to T), on the host; also written
  /// to `loss`, one Value on the device.
  double crossEntropyLoss(T *loss, const float *rowMax, const float *rowSum, const float *target,
                          int64_t rows);
  void crossEntropyBackward(T *dlogits, const T *logits, const int64_t *labels, const float *rowMax,
                            const float *rowSum, double dloss, int64_t seq, int64_t batch,
                            int64_t localVocab, int64_t vocabOffset, int64_t validVocab) {
    cuda::crossEntropyBackward(dlogits, logits, labels, rowMax, rowSum, float(dloss), seq, batch,
                               localVocab, vocabOffset, stream(), validVocab);
  }

  //===--- Optimizer ------------------------------------------------------===//

  /// sum over the ranges of sum x^2, added in fp64 on the device, read once.
  double squaredSum(llvm::ArrayRef<std::pair<const Grad *, int64_t>> ranges);
  template <typename E> void scale(E *x, int64_t n, double factor) {
    cuda::scale(x, n, factor, stream());
  }
  /// AdamW; for bf16/fp16 on the fp32 `master`, rounded into `weights`.
  void adamwStep(T *weights, float *master, const Grad *grad, float *m, float *v, int64_t n,
                 const cpu::AdamWConfig &config);
  /// SGD, as adamwStep; momentum null when the plan's momentum is 0.
  void sgdStep(T *weights, float *master, const Grad *grad, float *momentum, int64_t n,
               const cpu::SGDConfig &config);
  /// master = weights in fp32, before the first step (KeepsMasterWeights only).
  void initMaster(float *master, const T *weights, int64_t n);

private:
  struct StreamDestroyer {
    void operator()(cudaStream_t stream) const { cudaStreamDestroy(stream); }
  };

  static cudaStream_t createStream(int device);

  /// Blocks until the stream's work so far completed; `what` names the transfer waited for.
  /// The bound communicator's calls are waited for first, under its deadline.
  void waitFor(const std::string &what);
  /// Copies device bytes into host memory and waits for them (the copy into pageable memory
  /// blocks in the driver, so the communicator's calls are waited for before it is queued).
  void copyToHost(void *host, const void *source, size_t bytes, const std::string &what);
  /// The pinned staging buffer, once the previous upload out of it completed.
  void *stage(size_t bytes, const std::string &what);
  /// Copies n floats out of the pinned staging buffer, which the caller filled, into dst as T.
  void uploadStaged(T *dst, const float *staged, int64_t n, const std::string &what);
  /// The optimizer step of bf16/fp16 storage: `step(master)` on the fp32 master copy (the
  /// gradients are fp32 already), then weights = master rounded.
  template <typename Step> void stepMaster(T *weights, float *master, int64_t n, Step step);

  // Declared in construction order; destroyed in reverse, the stream last.
  bool flash;
  int device_;
  CudaCommunicator *comm = nullptr;
  std::unique_ptr<CUstream_st, StreamDestroyer> stream_;
  std::unique_ptr<cuda::Blas> blas;
  std::unique_ptr<CudaMemorySpace> space;
  MemoryTracker tracker;
  cuda::PinnedStaging staging;
};

extern template class CudaDevice<float>;
extern template class CudaDevice<__nv_bfloat16>;
extern template class CudaDevice<__half>;

} // namespace parc::runtime

#endif // PARC_RUNTIME_CUDADEVICE_H
