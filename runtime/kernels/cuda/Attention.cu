//===- Attention.cu - grouped-query attention: cuBLAS GEMMs, fused softmax -===//
//
// q, y are [seq, batch, heads*d] and k, v [seq, batch, kvHeads*d]. Query head h of batch b
// is slice b*heads + h = (b*kvHeads + kh)*group + g with group = heads / kvHeads, kh its
// key/value head and g its place in the group. So for a fixed g, the query slices of all
// (b, kh) are evenly spaced (group*d apart) and so are the key/value slices they read (d
// apart): one strided-batched GEMM per g covers every batch and key/value head, and k and v
// are never copied per query head. Rows of a slice are batch*heads*d (or batch*kvHeads*d)
// apart, which cuBLAS takes as the leading dimension.
//
// Scores and dP are fp32 [batch*kvHeads, seq, seq]; the probabilities are in T, for the
// GEMMs, and overwrite the scores when T is float. dS overwrites the probabilities once dv
// has used them. dk and dv sum over the g of a group through beta = 1, in the CPU's order.
//
//===----------------------------------------------------------------------===//

#include "Common.cuh"
#include "Gemm.h"

#include <cmath>
#include <type_traits>

namespace parc::runtime::cuda {

using namespace detail;

namespace {

// p[t,u] = exp(s[t,u] - max_u s[t,u]) / sum_u exp(...) over u <= t when causal (else 0)
template <typename T>
__global__ void causalSoftmaxKernel(T *probs, const float *scores, int64_t seq, bool causal) {
  int64_t row = blockIdx.x, t = row % seq, valid = causal ? t + 1 : seq;
  const float *s = scores + row * seq;
  T *p = probs + row * seq;
  float max = -INFINITY;
  for (int64_t u = threadIdx.x; u < valid; u += blockDim.x)
    max = fmaxf(max, s[u]);
  max = blockReduce(max, MaxOp(), -INFINITY);
  float sum = 0;
  for (int64_t u = threadIdx.x; u < valid; u += blockDim.x)
    sum += expf(s[u] - max);
  sum = blockReduce(sum, SumOp(), 0.0f);
  for (int64_t u = threadIdx.x; u < seq; u += blockDim.x)
    p[u] = fromFloat<T>(u < valid ? expf(s[u] - max) / sum : 0.0f);
}

// dS[t,u] = P[t,u] (dP[t,u] - sum_u P[t,u] dP[t,u]), written over P
template <typename T>
__global__ void softmaxBackwardKernel(T *probsThenGrad, const float *dprobs, int64_t seq) {
  int64_t row = blockIdx.x;
  T *p = probsThenGrad + row * seq;
  const float *dp = dprobs + row * seq;
  float dot = 0;
  for (int64_t u = threadIdx.x; u < seq; u += blockDim.x)
    dot += toFloat(p[u]) * dp[u];
  dot = blockReduce(dot, SumOp(), 0.0f);
  for (int64_t u = threadIdx.x; u < seq; u += blockDim.x)
    p[u] = fromFloat<T>(toFloat(p[u]) * (dp[u] - dot));
}

/// Where the slices of one g live: see the file comment.
struct Layout {
  int64_t seq, slices, group, headDim, qLd, kvLd;
  float scale;

  Layout(int64_t seq, int64_t batch, int64_t heads, int64_t kvHeads, int64_t headDim,
         const char *kernel)
      : seq(seq), slices(batch * kvHeads), group(kvHeads > 0 ? heads / kvHeads : 0),
        headDim(headDim), qLd(batch * heads * headDim), kvLd(batch * kvHeads * headDim),
        scale(static_cast<float>(1.0 / std::sqrt(double(headDim)))) {
    if (kvHeads <= 0 || heads % kvHeads != 0 || headDim <= 0)
      throwCallFailed(kernel, "argument check",
                      "kv_heads must divide heads and the head size must be positive", __FILE__,
                      __LINE__);
  }
  template <typename T> Matrix query(const T *base, int64_t g) const {
    return matrix(base + g * headDim, qLd, group * headDim);
  }
  template <typename T> Matrix keyValue(const T *base) const { return matrix(base, kvLd, headDim); }
  template <typename T> Matrix square(const T *base) const { return matrix(base, seq, seq * seq); }
  Matrix scores(const float *base) const { return {base, CUDA_R_32F, seq, seq * seq}; }
  unsigned rows() const { return static_cast<unsigned>(slices * seq); }
};

// S = scale q k^T for query heads g, then P = softmax(S) in place or into `probs`
template <typename T>
void probabilities(Blas &blas, const Layout &l, T *probs, float *scores, const T *q, const T *k,
                   int64_t g, bool causal, const char *kernel) {
  gemm(blas, false, true, l.seq, l.seq, l.headDim, l.scale, l.query(q, g), l.keyValue(k), 0.0f,
       l.scores(scores), l.slices, kernel);
  causalSoftmaxKernel<<<l.rows(), kBlock, 0, blas.stream()>>>(probs, scores, l.seq, causal);
  checkLaunch(kernel);
}

// The probabilities in T: the scores buffer itself when T is float.
template <typename T> struct ProbBuffer {
  StreamBuffer<T> own;
  T *data;
  ProbBuffer(float *scores, size_t count, cudaStream_t stream, const char *kernel)
      : own(std::is_same_v<T, float> ? 0 : count, stream, kernel),
        data(std::is_same_v<T, float> ? reinterpret_cast<T *>(scores) : own.get()) {}
};

} // namespace

template <typename T>
void attentionForward(Blas &blas, T *y, const T *q, const T *k, const T *v, int64_t seq,
                      int64_t batch, int64_t heads, int64_t kvHeads, int64_t headDim, bool causal) {
  // y = softmax(q k^T / sqrt(d) + mask) v per (batch, head)
  const char *kernel = "attentionForward";
  Layout l(seq, batch, heads, kvHeads, headDim, kernel);
  if (seq <= 0 || l.slices <= 0)
    return;
  size_t count = size_t(l.slices) * seq * seq;
  StreamBuffer<float> scores(count, blas.stream(), kernel);
  ProbBuffer<T> probs(scores.get(), count, blas.stream(), kernel);
  for (int64_t g = 0; g < l.group; ++g) {
    probabilities(blas, l, probs.data, scores.get(), q, k, g, causal, kernel);
    gemm(blas, false, false, seq, headDim, seq, 1.0f, l.square(probs.data), l.keyValue(v), 0.0f,
         l.query(y, g), l.slices, kernel);
  }
}

template <typename T>
void attentionBackward(Blas &blas, T *dq, T *dk, T *dv, const T *q, const T *k, const T *v,
                       const T *dy, int64_t seq, int64_t batch, int64_t heads, int64_t kvHeads,
                       int64_t headDim, bool causal) {
  // dv += P^T dy; dS = P (dP - rowsum(P dP)), dP = dy v^T; dq = s dS k; dk += s dS^T q
  const char *kernel = "attentionBackward";
  Layout l(seq, batch, heads, kvHeads, headDim, kernel);
  if (seq <= 0 || l.slices <= 0)
    return;
  size_t count = size_t(l.slices) * seq * seq;
  StreamBuffer<float> scores(count, blas.stream(), kernel), dprobs(count, blas.stream(), kernel);
  ProbBuffer<T> probs(scores.get(), count, blas.stream(), kernel);
  for (int64_t g = 0; g < l.group; ++g) {
    float accumulate = g == 0 ? 0.0f : 1.0f; // the first query head of a group overwrites
    probabilities(blas, l, probs.data, scores.get(), q, k, g, causal, kernel);
    gemm(blas, true, false, seq, headDim, seq, 1.0f, l.square(probs.data), l.query(dy, g),
         accumulate, l.keyValue(dv), l.slices, kernel);
    gemm(blas, false, true, seq, seq, headDim, 1.0f, l.query(dy, g), l.keyValue(v), 0.0f,
         l.scores(dprobs.get()), l.slices, kernel);
    softmaxBackwardKernel<<<l.rows(), kBlock, 0, blas.stream()>>>(probs.data, dprobs.get(), seq);
    checkLaunch(kernel);
    gemm(blas, false, false, seq, headDim, seq, l.scale, l.square(probs.data), l.keyValue(k), 0.0f,
         l.query(dq, g), l.slices, kernel);
    gemm(blas, true, false, seq, headDim, seq, l.scale, l.square(probs.data), l.query(q, g),
         accumulate, l.keyValue(dk), l.slices, kernel);
  }
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void attentionForward(Blas &, T *, const T *, const T *, const T *, int64_t, int64_t,   \
                                 int64_t, int64_t, int64_t, bool);                                 \
  template void attentionBackward(Blas &, T *, T *, T *, const T *, const T *, const T *,          \
                                  const T *, int64_t, int64_t, int64_t, int64_t, int64_t, bool);
PARC_CUDA_FOR_STORAGE_TYPES(PARC_INSTANTIATE)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cuda
