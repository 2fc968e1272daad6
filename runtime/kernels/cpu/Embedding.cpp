//===- Embedding.cpp - vocab-parallel word embedding, learned positions ---===//
//
// Token ids are [batch, seq] while activations are [seq, batch, hidden], so row t*batch + b
// of the output belongs to ids[b*seq + t]. The forwards run over output rows on the kernel
// threads (Rows.h). The backwards are sums over rows into weight rows: the word embedding's
// cuts the hidden columns over the threads, each column of every weight row added over the
// tokens in token order, and the positions' gives each thread whole positions, summed over the
// batch in order; either way the bits are the serial loop's whatever the number of threads.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Kernels.h"

#include "Rows.h"

#include <algorithm>

namespace parc::runtime::cpu {

template <typename T>
void embeddingForward(T *y, const int64_t *ids, const T *weight, int64_t seq, int64_t batch,
                      int64_t hidden, int64_t vocabOffset, int64_t localRows) {
  // y[t,b,:] = weight[ids[b,t] - vocabOffset], or 0 outside this shard's rows
  detail::forRows(seq * batch, hidden, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      T *out = y + r * hidden;
      int64_t row = ids[(r % batch) * seq + r / batch] - vocabOffset;
      if (row < 0 || row >= localRows)
        std::fill(out, out + hidden, T(0));
      else
        std::copy(weight + row * hidden, weight + (row + 1) * hidden, out);
    }
  });
}

template <typename T>
void embeddingBackward(T *dweight, const int64_t *ids, const T *dy, int64_t seq, int64_t batch,
                       int64_t hidden, int64_t vocabOffset, int64_t localRows) {
  // dweight[ids[b,t] - vocabOffset] += dy[t,b,:] for ids in this shard
  int64_t tokens = seq * batch;
  detail::forColumns(hidden, tokens, [&](int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < tokens; ++r) {
      int64_t row = ids[(r % batch) * seq + r / batch] - vocabOffset;
      if (row < 0 || row >= localRows)
        continue;
      const T *grad = dy + r * hidden;
      T *out = dweight + row * hidden;
      for (int64_t i = c0; i < c1; ++i)
        out[i] += grad[i];
    }
  });
}

template <typename T>
void positionEmbeddingForward(T *y, const T *x, const T *weight, int64_t seq, int64_t batch,
                              int64_t hidden) {
  // y[t,b,:] = x[t,b,:] + weight[t,:]
  detail::forRows(seq * batch, hidden, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const T *pos = weight + (r / batch) * hidden;
      for (int64_t i = 0; i < hidden; ++i)
        y[r * hidden + i] = x[r * hidden + i] + pos[i];
    }
  });
}

template <typename T>
void positionEmbeddingBackward(T *dx, T *dweight, const T *dy, int64_t seq, int64_t batch,
                               int64_t hidden) {
  // dx = dy; dweight[t,:] += sum_b dy[t,b,:]
  detail::forRows(seq, batch * hidden, [&](int64_t first, int64_t last) {
    std::copy(dy + first * batch * hidden, dy + last * batch * hidden, dx + first * batch * hidden);
    for (int64_t t = first; t < last; ++t)
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < hidden; ++i)
          dweight[t * hidden + i] += dy[(t * batch + b) * hidden + i];
  });
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
