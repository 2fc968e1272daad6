//===- Embedding.cpp - vocab-parallel word embedding, learned positions ---===//
//
// Token ids are [batch, seq] while activations are [seq, batch, hidden], so row t*batch + b
// of the output belongs to ids[b*seq + t].
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include <algorithm>

namespace parc::runtime::cpu {

template <typename T>
void embeddingForward(T *y, const int64_t *ids, const T *weight, int64_t seq, int64_t batch,
                      int64_t hidden, int64_t vocabOffset, int64_t localRows) {
  // y[t,b,:] = weight[ids[b,t] - vocabOffset], or 0 outside this shard's rows
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t b = 0; b < batch; ++b) {
      T *out = y + (t * batch + b) * hidden;
      int64_t row = ids[b * seq + t] - vocabOffset;
      if (row < 0 || row >= localRows)
        std::fill(out, out + hidden, T(0));
      else
        std::copy(weight + row * hidden, weight + (row + 1) * hidden, out);
    }
}

template <typename T>
void embeddingBackward(T *dweight, const int64_t *ids, const T *dy, int64_t seq, int64_t batch,
                       int64_t hidden, int64_t vocabOffset, int64_t localRows) {
  // dweight[ids[b,t] - vocabOffset] += dy[t,b,:] for ids in this shard
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t b = 0; b < batch; ++b) {
      int64_t row = ids[b * seq + t] - vocabOffset;
      if (row < 0 || row >= localRows)
        continue;
      const T *grad = dy + (t * batch + b) * hidden;
      T *out = dweight + row * hidden;
      for (int64_t i = 0; i < hidden; ++i)
        out[i] += grad[i];
    }
}

template <typename T>
void positionEmbeddingForward(T *y, const T *x, const T *weight, int64_t seq, int64_t batch,
                              int64_t hidden) {
  // y[t,b,:] = x[t,b,:] + weight[t,:]
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < hidden; ++i)
        y[(t * batch + b) * hidden + i] = x[(t * batch + b) * hidden + i] + weight[t * hidden + i];
}

template <typename T>
void positionEmbeddingBackward(T *dx, T *dweight, const T *dy, int64_t seq, int64_t batch,
                               int64_t hidden) {
  // dx = dy; dweight[t,:] += sum_b dy[t,b,:]
  std::copy(dy, dy + seq * batch * hidden, dx);
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < hidden; ++i)
        dweight[t * hidden + i] += dy[(t * batch + b) * hidden + i];
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void embeddingForward(T *, const int64_t *, const T *, int64_t, int64_t, int64_t,       \
                                 int64_t, int64_t);                                                \
  template void embeddingBackward(T *, const int64_t *, const T *, int64_t, int64_t, int64_t,      \
                                  int64_t, int64_t);                                               \
  template void positionEmbeddingForward(T *, const T *, const T *, int64_t, int64_t, int64_t);    \
  template void positionEmbeddingBackward(T *, T *, const T *, int64_t, int64_t, int64_t);
PARC_INSTANTIATE(float)
PARC_INSTANTIATE(double)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cpu
