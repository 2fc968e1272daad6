//===- Loss.cu - vocab-parallel cross entropy, the pieces of Kernels.h ----===//
//
// Row reductions run one block per row over this shard's columns; the pieces the executor
// all-reduces between them (row max, sum of exponentials, target logit) are fp32 whatever
// the logits' type. Logits rows are [seq, batch] ordered and labels [batch, seq], so row
// t*batch + b has label labels[b*seq + t].
//
//===----------------------------------------------------------------------===//

#include "Common.cuh"

#include <cmath>

namespace parc::runtime::cuda {

using namespace detail;

namespace {

// The column of row (t, b)'s label in this shard, or -1 when another shard holds it.
__device__ __forceinline__ int64_t localLabel(const int64_t *labels, int64_t t, int64_t b,
                                              int64_t seq, int64_t localVocab,
                                              int64_t vocabOffset) {
  int64_t column = labels[b * seq + t] - vocabOffset;
  return column >= 0 && column < localVocab ? column : -1;
}

// The shard's columns that are vocabulary, not padding.
inline int64_t validColumns(int64_t localVocab, int64_t validVocab) {
  return validVocab < 0 ? localVocab : (validVocab < localVocab ? validVocab : localVocab);
}

// rowMax[r] = max_{j < valid} logits[r,j]
template <typename T>
__global__ void rowMaxKernel(float *rowMax, const T *logits, int64_t localVocab, int64_t valid) {
  const T *row = logits + blockIdx.x * localVocab;
  float max = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x)
    max = fmaxf(max, toFloat(row[j]));
  max = blockReduce(max, MaxOp(), -INFINITY);
  if (threadIdx.x == 0)
    rowMax[blockIdx.x] = max;
}

// rowSum[r] = sum_{j < valid} exp(logits[r,j] - rowMax[r])
template <typename T>
__global__ void sumExpKernel(float *rowSum, const T *logits, const float *rowMax,
                             int64_t localVocab, int64_t valid) {
  const T *row = logits + blockIdx.x * localVocab;
  float max = rowMax[blockIdx.x], sum = 0;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x)
    sum += expf(toFloat(row[j]) - max);
  sum = blockReduce(sum, SumOp(), 0.0f);
  if (threadIdx.x == 0)
    rowSum[blockIdx.x] = sum;
}

// loss = mean_r (log(rowSum[r]) + rowMax[r] - target[r]), one block, summed in fp64
__global__ void lossKernel(float *loss, const float *rowMax, const float *rowSum,
                           const float *target, int64_t rows) {
  double sum = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    sum += double(logf(rowSum[r])) + rowMax[r] - target[r];
  sum = blockReduce(sum, SumOp(), 0.0);
  if (threadIdx.x == 0)
    *loss = static_cast<float>(sum / double(rows));
}

} // namespace

template <typename T>
void crossEntropyRowMax(float *rowMax, const T *logits, int64_t rows, int64_t localVocab,
                        cudaStream_t stream, int64_t validVocab) {
  // rowMax[r] = max_{j < valid} logits[r,j]
  if (rows <= 0)
    return;
  rowMaxKernel<<<static_cast<unsigned>(rows), kBlock, 0, stream>>>(
      rowMax, logits, localVocab, validColumns(localVocab, validVocab));
  checkLaunch("crossEntropyRowMax");
}

template <typename T>
void crossEntropySumExp(float *rowSum, const T *logits, const float *rowMax, int64_t rows,
                        int64_t localVocab, cudaStream_t stream, int64_t validVocab) {
  // rowSum[r] = sum_{j < valid} exp(logits[r,j] - rowMax[r])
  if (rows <= 0)
    return;
  sumExpKernel<<<static_cast<unsigned>(rows), kBlock, 0, stream>>>(
      rowSum, logits, rowMax, localVocab, validColumns(localVocab, validVocab));
  checkLaunch("crossEntropySumExp");
}

template <typename T>
void crossEntropyTargetLogit(float *target, const T *logits, const int64_t *labels, int64_t seq,
                             int64_t batch, int64_t localVocab, int64_t vocabOffset,
                             cudaStream_t stream) {
  // target[r] = logits[r, label(r) - vocabOffset] on the label's shard, else 0
  forEach(seq * batch, stream, "crossEntropyTargetLogit", [=] __device__(int64_t r) {
    int64_t column = localLabel(labels, r / batch, r % batch, seq, localVocab, vocabOffset);
    target[r] = column < 0 ? 0.0f : toFloat(logits[r * localVocab + column]);
  });
}

void crossEntropyLoss(float *loss, const float *rowMax, const float *rowSum, const float *target,
                      int64_t rows, cudaStream_t stream) {
  // loss = mean_r (log(rowSum[r]) + rowMax[r] - target[r])
  lossKernel<<<1, 1024, 0, stream>>>(loss, rowMax, rowSum, target, rows);
  checkLaunch("crossEntropyLoss");
}

template <typename T>
void crossEntropyBackward(T *dlogits, const T *logits, const int64_t *labels, const float *rowMax,
                          const float *rowSum, float dloss, int64_t seq, int64_t batch,
                          int64_t localVocab, int64_t vocabOffset, cudaStream_t stream,
                          int64_t validVocab) {
  // dlogits = (softmax - onehot(label)) * dloss / (seq * batch); 0 on the padding
  float perToken = static_cast<float>(double(dloss) / double(seq * batch));
  int64_t valid = validColumns(localVocab, validVocab);
  forEach(seq * batch * localVocab, stream, "crossEntropyBackward", [=] __device__(int64_t e) {
    int64_t r = e / localVocab, j = e % localVocab;
    int64_t column = localLabel(labels, r / batch, r % batch, seq, localVocab, vocabOffset);
    float prob = j < valid ? expf(toFloat(logits[e]) - rowMax[r]) / rowSum[r] : 0.0f;
    dlogits[e] = fromFloat<T>((prob - (j == column ? 1.0f : 0.0f)) * perToken);
  });
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void crossEntropyRowMax(float *, const T *, int64_t, int64_t, cudaStream_t, int64_t);   \
  template void crossEntropySumExp(float *, const T *, const float *, int64_t, int64_t,            \
                                   cudaStream_t, int64_t);                                         \
  template void crossEntropyTargetLogit(float *, const T *, const int64_t *, int64_t, int64_t,     \
                                        int64_t, int64_t, cudaStream_t);                           \
  template void crossEntropyBackward(T *, const T *, const int64_t *, const float *,               \
                                     const float *, float, int64_t, int64_t, int64_t, int64_t,     \
                                     cudaStream_t, int64_t);
PARC_CUDA_FOR_STORAGE_TYPES(PARC_INSTANTIATE)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cuda
