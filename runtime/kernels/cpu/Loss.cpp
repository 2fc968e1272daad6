//===- Loss.cpp - vocab-parallel cross entropy in all-reduce-sized pieces -===//
//
// Megatron's vocab-parallel cross entropy: no rank ever holds a full row of logits. Each piece
// is a per-row reduction over this shard's columns whose result the executor all-reduces over
// the tensor-parallel group before the next piece (see Kernels.h). Logits rows are
// [seq, batch] ordered and labels [batch, seq], so row t*batch + b has label labels[b*seq + t].
// Rows run on the kernel threads; in fp32 the exponentials are VecMath.h's, in vectorised loops
// (sums still in double).
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include "Rows.h"
#include "VecMath.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace parc::runtime::cpu {

namespace {
// The column of row (t, b)'s label in this shard, or -1 when another shard holds it.
int64_t localLabel(const int64_t *labels, int64_t t, int64_t b, int64_t seq, int64_t localVocab,
                   int64_t vocabOffset) {
  int64_t column = labels[b * seq + t] - vocabOffset;
  return column >= 0 && column < localVocab ? column : -1;
}

// The shard's columns that are vocabulary, not padding.
int64_t validColumns(int64_t localVocab, int64_t validVocab) {
  return validVocab < 0 ? localVocab : std::min(validVocab, localVocab);
}

// sum_j exp(logits[j] - max) of one row.
double sumExpRow(const double *logits, double max, int64_t n) {
  double sum = 0;
  for (int64_t j = 0; j < n; ++j)
    sum += std::exp(logits[j] - max);
  return sum;
}

PARC_VECTOR_CLONES double sumExpRow(const float *logits, float max, int64_t n) {
  return detail::laneSum<double, 16>(
      n, [&](int64_t j) { return double(detail::expf(logits[j] - max)); });
}

// out[j] = (exp(logits[j] - max) / sum - [j == label]) * perToken of one row.
void softmaxGradRow(double *out, const double *logits, double max, double sum, int64_t label,
                    double perToken, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    double prob = std::exp(logits[j] - max) / sum;
    out[j] = (prob - (j == label ? 1.0 : 0.0)) * perToken;
  }
}

PARC_VECTOR_CLONES void softmaxGradRow(float *out, const float *logits, float max, float sum,
                                       int64_t label, double perToken, int64_t n) {
  float factor = float(perToken / double(sum));
#pragma omp simd
  for (int64_t j = 0; j < n; ++j)
    out[j] = detail::expf(logits[j] - max) * factor;
  if (label >= 0 && label < n)
    out[label] = float(double(out[label]) - perToken);
}
} // namespace

template <typename T>
void crossEntropyRowMax(T *rowMax, const T *logits, int64_t rows, int64_t localVocab,
                        int64_t validVocab) {
  // rowMax[r] = max_{j < valid} logits[r,j]
  int64_t valid = validColumns(localVocab, validVocab);
  detail::forRows(rows, localVocab, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r)
      rowMax[r] = valid == 0
                      ? -std::numeric_limits<T>::infinity()
                      : *std::max_element(logits + r * localVocab, logits + r * localVocab + valid);
  });
}

template <typename T>
void crossEntropySumExp(T *rowSum, const T *logits, const T *rowMax, int64_t rows,
                        int64_t localVocab, int64_t validVocab) {
  // rowSum[r] = sum_{j < valid} exp(logits[r,j] - rowMax[r])
  int64_t valid = validColumns(localVocab, validVocab);
  detail::forRows(rows, localVocab, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r)
      rowSum[r] = T(sumExpRow(logits + r * localVocab, rowMax[r], valid));
  });
}

template <typename T>
void crossEntropyTargetLogit(T *target, const T *logits, const int64_t *labels, int64_t seq,
                             int64_t batch, int64_t localVocab, int64_t vocabOffset) {
  // target[r] = logits[r, label(r) - vocabOffset] on the label's shard, else 0
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t b = 0; b < batch; ++b) {
      int64_t r = t * batch + b, column = localLabel(labels, t, b, seq, localVocab, vocabOffset);
      target[r] = column < 0 ? T(0) : logits[r * localVocab + column];
    }
}

template <typename T>
T crossEntropyLoss(const T *rowMax, const T *rowSum, const T *target, int64_t rows) {
  // loss = mean_r (log(rowSum[r]) + rowMax[r] - target[r])
  double total = 0;
  for (int64_t r = 0; r < rows; ++r)
    total += std::log(double(rowSum[r])) + rowMax[r] - target[r];
  return T(total / rows);
}

template <typename T>
void crossEntropyBackward(T *dlogits, const T *logits, const int64_t *labels, const T *rowMax,
                          const T *rowSum, T dloss, int64_t seq, int64_t batch, int64_t localVocab,
                          int64_t vocabOffset, int64_t validVocab) {
  // dlogits = (softmax - onehot(label)) * dloss / (seq * batch); 0 on the padding
  double perToken = double(dloss) / double(seq * batch);
  int64_t valid = validColumns(localVocab, validVocab);
  detail::forRows(seq * batch, localVocab, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      int64_t t = r / batch, b = r % batch;
      int64_t column = localLabel(labels, t, b, seq, localVocab, vocabOffset);
      T *out = dlogits + r * localVocab;
      softmaxGradRow(out, logits + r * localVocab, rowMax[r], rowSum[r], column, perToken, valid);
      std::fill(out + valid, out + localVocab, T(0));
    }
  });
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void crossEntropyRowMax(T *, const T *, int64_t, int64_t, int64_t);                     \
  template void crossEntropySumExp(T *, const T *, const T *, int64_t, int64_t, int64_t);          \
  template void crossEntropyTargetLogit(T *, const T *, const int64_t *, int64_t, int64_t,         \
                                        int64_t, int64_t);                                         \
  template T crossEntropyLoss(const T *, const T *, const T *, int64_t);                           \
  template void crossEntropyBackward(T *, const T *, const int64_t *, const T *, const T *, T,     \
                                     int64_t, int64_t, int64_t, int64_t, int64_t);
PARC_INSTANTIATE(float)
PARC_INSTANTIATE(double)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cpu
