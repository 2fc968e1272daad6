//===- CudaKernels.h - CUDA kernels of parrun, forward and backward of each op -===//
//
// The CUDA twin of Kernels.h: the same functions, names, argument order, layouts and gradient
// conventions (parameter gradients are added to, everything else overwritten, matmul takes a
// GradWrite per output), on device pointers. Kernels that only launch take the stream to run
// on as their last argument; those that multiply matrices take the rank's Blas first, whose
// cuBLAS handle is bound to the rank's stream. Nothing synchronises with the host.
//
// T is float, __nv_bfloat16 or __half. Whatever T is, arithmetic and every reduction run in
// fp32 (the optimizer's update and the rotary angles in fp64, as on the CPU), GEMMs multiply
// with CUBLAS_COMPUTE_32F (no TF32, no reduced-precision split-K), and attention keeps its
// scores in fp32. Ids and labels are int64 on the device, as the CPU kernels read them.
//
// Differences from the CPU kernels, all because of where results must live:
//  * crossEntropyRowMax/SumExp/TargetLogit write fp32 pieces whatever T is (bf16 would lose
//    the sum of exponentials) and crossEntropyLoss writes the loss to a device scalar.
//  * squaredSum adds to a device double instead of returning, so the squares of all
//    parameters can be summed and all-reduced before one copy to the host.
//
// Every reduction has a fixed order (no atomics), so a kernel gives the same bits on every
// run; gradients with duplicate indices (embedding rows) are added in token order as on the
// CPU. Scratch buffers come from the stream-ordered allocator (cudaMallocAsync).
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_CUDAKERNELS_H
#define PARC_RUNTIME_CUDAKERNELS_H

#include "parc/Runtime/Kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

struct cublasContext;

namespace parc::runtime::cuda {

using cpu::AdamWConfig;
using cpu::GradWrite;
using cpu::SGDConfig;

/// True when a CUDA device of compute capability 8.0 or newer (the kernels are built for
/// sm_80 and sm_90, with PTX for newer chips) can be used; otherwise false, with the reason
/// in `why` when given: "no CUDA device", or the driver's error text.
bool cudaDeviceAvailable(std::string *why = nullptr);

/// One rank's cuBLAS handle, bound to the rank's stream, with a workspace of its own: ranks
/// that share a GPU never share cuBLAS scratch, and GEMMs stay deterministic.
class Blas {
public:
  explicit Blas(cudaStream_t stream);
  ~Blas();
  Blas(const Blas &) = delete;
  Blas &operator=(const Blas &) = delete;

  cudaStream_t stream() const { return stream_; }
  cublasContext *handle() const { return handle_; }

private:
  cudaStream_t stream_;
  cublasContext *handle_ = nullptr;
  void *workspace = nullptr;
};

/// y[i] = value rounded to T, for T float, double, __nv_bfloat16 or __half; a memset when
/// value is +0.
template <typename T> void fill(T *y, int64_t n, float value, cudaStream_t stream);

//===----------------------------------------------------------------------===//
// Embeddings
//===----------------------------------------------------------------------===//

/// y[t,b,:] = weight[ids[b,t] - vocabOffset] for ids among this shard's rows, else 0.
template <typename T>
void embeddingForward(T *y, const int64_t *ids, const T *weight, int64_t seq, int64_t batch,
                      int64_t hidden, int64_t vocabOffset, int64_t localRows, cudaStream_t stream);
/// dweight[ids[b,t] - vocabOffset] += dy[t,b,:]: each row's tokens summed in fp32, in (t, b)
/// order, then added once (a radix sort of the tokens by row finds them).
template <typename T>
void embeddingBackward(T *dweight, const int64_t *ids, const T *dy, int64_t seq, int64_t batch,
                       int64_t hidden, int64_t vocabOffset, int64_t localRows, cudaStream_t stream);

/// y[t,b,:] = x[t,b,:] + weight[t,:].
template <typename T>
void positionEmbeddingForward(T *y, const T *x, const T *weight, int64_t seq, int64_t batch,
                              int64_t hidden, cudaStream_t stream);
/// dx = dy; dweight[t,:] += sum_b dy[t,b,:].
template <typename T>
void positionEmbeddingBackward(T *dx, T *dweight, const T *dy, int64_t seq, int64_t batch,
                               int64_t hidden, cudaStream_t stream);

//===----------------------------------------------------------------------===//
// Normalisation
//===----------------------------------------------------------------------===//

template <typename T>
void layerNormForward(T *y, const T *x, const T *weight, const T *bias, int64_t rows, int64_t dim,
                      double eps, cudaStream_t stream);
template <typename T>
void layerNormBackward(T *dx, T *dweight, T *dbias, const T *x, const T *weight, const T *dy,
                       int64_t rows, int64_t dim, double eps, cudaStream_t stream);

template <typename T>
void rmsNormForward(T *y, const T *x, const T *weight, int64_t rows, int64_t dim, double eps,
                    cudaStream_t stream);
template <typename T>
void rmsNormBackward(T *dx, T *dweight, const T *x, const T *weight, const T *dy, int64_t rows,
                     int64_t dim, double eps, cudaStream_t stream);

/// Fused residual_add + layernorm: sum = a + b, y = layernorm(sum). Reads a and b once
/// instead of writing sum and reading it back.
template <typename T>
void residualLayerNormForward(T *sum, T *y, const T *a, const T *b, const T *weight, const T *bias,
                              int64_t rows, int64_t dim, double eps, cudaStream_t stream);
/// Fused residual_add + rmsnorm: sum = a + b, y = rmsnorm(sum).
template <typename T>
void residualRmsNormForward(T *sum, T *y, const T *a, const T *b, const T *weight, int64_t rows,
                            int64_t dim, double eps, cudaStream_t stream);

//===----------------------------------------------------------------------===//
// Linear algebra
//===----------------------------------------------------------------------===//

/// c[m,n] = op(a) op(b), row-major as in Kernels.h.
template <typename T>
void matmulForward(Blas &blas, T *c, const T *a, const T *b, int64_t m, int64_t n, int64_t k,
                   bool transA, bool transB);
template <typename T>
void matmulBackward(Blas &blas, T *da, T *db, const T *a, const T *b, const T *dc, int64_t m,
                    int64_t n, int64_t k, bool transA, bool transB, GradWrite daWrite,
                    GradWrite dbWrite);

template <typename T>
void biasAddForward(T *y, const T *x, const T *bias, int64_t rows, int64_t dim,
                    cudaStream_t stream);
template <typename T>
void biasAddBackward(T *dx, T *dbias, const T *dy, int64_t rows, int64_t dim, cudaStream_t stream);

template <typename T>
void residualAddForward(T *y, const T *a, const T *b, int64_t n, cudaStream_t stream);
template <typename T>
void residualAddBackward(T *da, T *db, const T *dy, int64_t n, cudaStream_t stream);

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

/// `offset` is the position of row 0 (a context-parallel rank's chunk).
template <typename T>
void ropeForward(T *y, const T *x, int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                 double theta, cudaStream_t stream, int64_t offset = 0);
template <typename T>
void ropeBackward(T *dx, const T *dy, int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                  double theta, cudaStream_t stream, int64_t offset = 0);

/// Ring attention's blocks, merge and block backward: cpu::attentionBlockForward and friends
/// (Kernels.h) on the device (RingAttention.cu). One thread per query row (per key row for dK
/// and dV), accumulating in fp32 (fp64 for double), without atomics: deterministic.
template <typename T>
void attentionBlockForward(T *y, T *lse, const T *q, const T *k, const T *v, int64_t seqQ,
                           int64_t seqK, int64_t batch, int64_t heads, int64_t kvHeads,
                           int64_t headDim, bool causal, cudaStream_t stream);
template <typename T>
void attentionMerge(T *y, T *lse, const T *y1, const T *lse1, const T *y2, const T *lse2,
                    int64_t seq, int64_t batch, int64_t heads, int64_t headDim,
                    cudaStream_t stream);
template <typename T>
void attentionBlockBackward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *y,
                            const T *lse, const T *dy, int64_t seqQ, int64_t seqK, int64_t batch,
                            int64_t heads, int64_t kvHeads, int64_t headDim, bool causal,
                            cudaStream_t stream);

/// Scores by strided-batched GEMM into an fp32 buffer, one fused scale + causal mask +
/// softmax kernel, then the probabilities times v; one batched GEMM per query head of a
/// key/value group, so grouped-query attention needs no copies of k and v.
template <typename T>
void attentionForward(Blas &blas, T *y, const T *q, const T *k, const T *v, int64_t seq,
                      int64_t batch, int64_t heads, int64_t kvHeads, int64_t headDim, bool causal);
/// Recomputes the probabilities; the softmax backward is one fused kernel between the GEMMs.
template <typename T>
void attentionBackward(Blas &blas, T *dq, T *dk, T *dv, const T *q, const T *k, const T *v,
                       const T *dy, int64_t seq, int64_t batch, int64_t heads, int64_t kvHeads,
                       int64_t headDim, bool causal);

//===----------------------------------------------------------------------===//
// Activations
//===----------------------------------------------------------------------===//

template <typename T> void geluForward(T *y, const T *x, int64_t n, cudaStream_t stream);
template <typename T>
void geluBackward(T *dx, const T *x, const T *dy, int64_t n, cudaStream_t stream);

/// Fused bias_add + gelu: y = gelu(x + bias), without writing x + bias.
template <typename T>
void biasGeluForward(T *y, const T *x, const T *bias, int64_t rows, int64_t dim,
                     cudaStream_t stream);
/// dx = dy * gelu'(x + bias) (the gradient of bias_add's input too); dbias += sum_r dx.
template <typename T>
void biasGeluBackward(T *dx, T *dbias, const T *x, const T *bias, const T *dy, int64_t rows,
                      int64_t dim, cudaStream_t stream);

template <typename T>
void swigluForward(T *y, const T *gate, const T *up, int64_t rows, int64_t ffn,
                   cudaStream_t stream);
template <typename T>
void swigluBackward(T *dgate, T *dup, const T *gate, const T *up, const T *dy, int64_t rows,
                    int64_t ffn, cudaStream_t stream);

//===----------------------------------------------------------------------===//
// Vocab-parallel cross entropy, in the pieces of Kernels.h; the pieces are fp32.
//===----------------------------------------------------------------------===//

/// `validVocab`: the shard's columns that are vocabulary (all when negative); the padding's
/// are left out as Kernels.h's twins leave them out.
template <typename T>
void crossEntropyRowMax(float *rowMax, const T *logits, int64_t rows, int64_t localVocab,
                        cudaStream_t stream, int64_t validVocab = -1);
template <typename T>
void crossEntropySumExp(float *rowSum, const T *logits, const float *rowMax, int64_t rows,
                        int64_t localVocab, cudaStream_t stream, int64_t validVocab = -1);
template <typename T>
void crossEntropyTargetLogit(float *target, const T *logits, const int64_t *labels, int64_t seq,
                             int64_t batch, int64_t localVocab, int64_t vocabOffset,
                             cudaStream_t stream);
/// *loss = mean_r (log(rowSum[r]) + rowMax[r] - target[r]), loss a device scalar.
void crossEntropyLoss(float *loss, const float *rowMax, const float *rowSum, const float *target,
                      int64_t rows, cudaStream_t stream);
/// dlogits may be logits: each thread reads its element before it writes it.
template <typename T>
void crossEntropyBackward(T *dlogits, const T *logits, const int64_t *labels, const float *rowMax,
                          const float *rowSum, float dloss, int64_t seq, int64_t batch,
                          int64_t localVocab, int64_t vocabOffset, cudaStream_t stream,
                          int64_t validVocab = -1);

//===----------------------------------------------------------------------===//
// Optimizer and mixed precision
//===----------------------------------------------------------------------===//

template <typename T>
void adamwStep(T *param, const T *grad, T *m, T *v, int64_t n, const AdamWConfig &config,
               cudaStream_t stream);
template <typename T>
void sgdStep(T *param, const T *grad, T *momentumBuffer, int64_t n, const SGDConfig &config,
             cudaStream_t stream);

/// *sum += sum x^2, accumulated in fp64; sum is a device scalar.
template <typename T> void squaredSum(double *sum, const T *x, int64_t n, cudaStream_t stream);
/// x *= factor.
template <typename T> void scale(T *x, int64_t n, double factor, cudaStream_t stream);

/// y = x rounded to To: the fp32 master copies of bf16/fp16 parameters and their gradients.
/// Instantiated between float and each half type, both ways.
template <typename To, typename From>
void convert(To *y, const From *x, int64_t n, cudaStream_t stream);

//===----------------------------------------------------------------------===//
// The reduction step of the device communicators
//===----------------------------------------------------------------------===//

enum class FoldOp { Sum, Max };

/// For every k: r = inputs[0][k] op inputs[1][k] op ... op inputs[numInputs-1][k], folded
/// left in list order (in fp32 for the half types, rounded once), and every outputs[o][k] = r,
/// so all outputs hold the same bits. Max propagates NaN, like the host `accumulate`. An
/// output may be one of the inputs (each element is read before it is written). T is float,
/// double, __nv_bfloat16 or __half.
template <typename T>
void foldBuffers(T *const *outputs, size_t numOutputs, const T *const *inputs, size_t numInputs,
                 size_t count, FoldOp op, cudaStream_t stream);

} // namespace parc::runtime::cuda

#endif // PARC_RUNTIME_CUDAKERNELS_H
