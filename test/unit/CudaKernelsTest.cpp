//===- CudaKernelsTest.cpp - Every CUDA kernel against its CPU twin -------===//
//
// Each kernel runs on random non-zero inputs in every storage type; the reference is the fp32
// CPU kernel (Kernels.h) on the same inputs rounded to that type. Outputs must agree to 1e-5
// relative L2 error in fp32 and 1e-2 in bf16/fp16. Parameter gradients start non-zero, so a
// kernel that overwrites instead of adding fails. Tests that need a GPU skip without one.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/CudaKernels.h"
#include "parc/Runtime/CudaCheck.h"
#include "parc/Runtime/Kernels.h"

#include "CudaTestSupport.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

namespace cpu = parc::runtime::cpu;
namespace cuda = parc::runtime::cuda;
using cpu::GradWrite;
using Floats = std::vector<float>;

namespace {

using parc::test::fromHost;
using parc::test::toHost;

template <typename T> double tolerance() { return std::is_same_v<T, float> ? 1e-5 : 1e-2; }

/// A device buffer of n T, filled from and read back as floats.
template <typename T> class Device : public parc::test::DeviceBuffer<T> {
public:
  using parc::test::DeviceBuffer<T>::DeviceBuffer;
  Floats read() const { return this->template values<float>(); }
};

class DeviceIds {
public:
  explicit DeviceIds(const std::vector<int64_t> &ids) {
    PARC_CUDA_CHECK(cudaMalloc(reinterpret_cast<void **>(&data), ids.size() * sizeof(int64_t)),
                    "test ids");
    PARC_CUDA_CHECK(
        cudaMemcpy(data, ids.data(), ids.size() * sizeof(int64_t), cudaMemcpyHostToDevice),
        "upload ids");
  }
  ~DeviceIds() { cudaFree(data); }
  DeviceIds(const DeviceIds &) = delete;
  DeviceIds &operator=(const DeviceIds &) = delete;
  const int64_t *get() const { return data; }

private:
  int64_t *data = nullptr;
};

double relativeError(const Floats &out, const Floats &ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff += (double(out[i]) - ref[i]) * (double(out[i]) - ref[i]);
    norm += double(ref[i]) * ref[i];
  }
  return std::sqrt(diff / norm);
}

bool deviceAvailable() {
  static bool available = cuda::cudaDeviceAvailable();
  return available;
}

template <typename T> class CudaKernelsTest : public ::testing::Test {
protected:
  void SetUp() override {
    SKIP_WITHOUT_DEVICE();
    PARC_CUDA_CHECK(cudaStreamCreate(&stream), "test stream");
    blas = std::make_unique<cuda::Blas>(stream);
  }
  void TearDown() override {
    blas.reset();
    if (stream)
      cudaStreamDestroy(stream);
  }

  /// Random values in +-[0.1, 1], already rounded to T so that both sides see them alike.
  Floats input(size_t n, float scale = 1.0f) {
    std::uniform_real_distribution<float> magnitude(0.1f, 1.0f);
    std::bernoulli_distribution negative(0.5);
    Floats values(n);
    for (float &value : values)
      value = toHost(fromHost<T>((negative(rng) ? -scale : scale) * magnitude(rng)));
    return values;
  }
  std::vector<int64_t> ids(size_t n, int64_t bound) {
    std::uniform_int_distribution<int64_t> id(0, bound - 1);
    std::vector<int64_t> values(n);
    for (int64_t &value : values)
      value = id(rng);
    return values;
  }
  void expectClose(const Device<T> &out, const Floats &ref, const char *what,
                   double tol = tolerance<T>()) {
    EXPECT_LT(relativeError(out.read(), ref), tol) << what;
  }

  cudaStream_t stream = nullptr;
  std::unique_ptr<cuda::Blas> blas;
  std::mt19937 rng{12345};
};

using StorageTypes = ::testing::Types<float, __nv_bfloat16, __half>;
TYPED_TEST_SUITE(CudaKernelsTest, StorageTypes);

TYPED_TEST(CudaKernelsTest, Embedding) {
  using T = TypeParam;
  int64_t seq = 9, batch = 3, hidden = 40, rows = 11, offset = 7;
  std::vector<int64_t> ids = this->ids(seq * batch, 30); // duplicates and other shards' rows
  Floats weight = this->input(rows * hidden), dy = this->input(seq * batch * hidden);
  Floats dweight = this->input(rows * hidden), y(seq * batch * hidden);
  DeviceIds dIds(ids);
  Device<T> dWeight(weight), dDy(dy), dDweight(dweight), dY(y.size());
  cuda::embeddingForward(dY.get(), dIds.get(), dWeight.get(), seq, batch, hidden, offset, rows,
                         this->stream);
  cuda::embeddingBackward(dDweight.get(), dIds.get(), dDy.get(), seq, batch, hidden, offset, rows,
                          this->stream);
  cpu::embeddingForward(y.data(), ids.data(), weight.data(), seq, batch, hidden, offset, rows);
  cpu::embeddingBackward(dweight.data(), ids.data(), dy.data(), seq, batch, hidden, offset, rows);
  this->expectClose(dY, y, "y");
  this->expectClose(dDweight, dweight, "dweight");
}

TYPED_TEST(CudaKernelsTest, PositionEmbedding) {
  using T = TypeParam;
  int64_t seq = 7, batch = 3, hidden = 33, n = seq * batch * hidden;
  Floats x = this->input(n), weight = this->input((seq + 2) * hidden), dy = this->input(n);
  Floats dweight = this->input((seq + 2) * hidden), y(n), dx(n);
  Device<T> dX(x), dWeight(weight), dDy(dy), dDweight(dweight), dY(n), dDx(n);
  cuda::positionEmbeddingForward(dY.get(), dX.get(), dWeight.get(), seq, batch, hidden,
                                 this->stream);
  cuda::positionEmbeddingBackward(dDx.get(), dDweight.get(), dDy.get(), seq, batch, hidden,
                                  this->stream);
  cpu::positionEmbeddingForward(y.data(), x.data(), weight.data(), seq, batch, hidden);
  cpu::positionEmbeddingBackward(dx.data(), dweight.data(), dy.data(), seq, batch, hidden);
  this->expectClose(dY, y, "y");
  this->expectClose(dDx, dx, "dx");
  this->expectClose(dDweight, dweight, "dweight");
}

TYPED_TEST(CudaKernelsTest, LayerNormAndRmsNorm) {
  using T = TypeParam;
  int64_t rows = 37, dim = 300, n = rows * dim;
  double eps = 1e-5;
  Floats x = this->input(n), weight = this->input(dim), bias = this->input(dim),
         dy = this->input(n), dweight = this->input(dim), dbias = this->input(dim);
  Floats y(n), dx(n), rmsY(n), rmsDx(n), rmsDweight = dweight;
  Device<T> dX(x), dWeight(weight), dBias(bias), dDy(dy), dDweight(dweight), dDbias(dbias),
      dRmsDweight(dweight), dY(n), dDx(n), dRmsY(n), dRmsDx(n);
  cuda::layerNormForward(dY.get(), dX.get(), dWeight.get(), dBias.get(), rows, dim, eps,
                         this->stream);
  cuda::layerNormBackward(dDx.get(), dDweight.get(), dDbias.get(), dX.get(), dWeight.get(),
                          dDy.get(), rows, dim, eps, this->stream);
  cuda::rmsNormForward(dRmsY.get(), dX.get(), dWeight.get(), rows, dim, eps, this->stream);
  cuda::rmsNormBackward(dRmsDx.get(), dRmsDweight.get(), dX.get(), dWeight.get(), dDy.get(), rows,
                        dim, eps, this->stream);
  cpu::layerNormForward(y.data(), x.data(), weight.data(), bias.data(), rows, dim, eps);
  cpu::layerNormBackward(dx.data(), dweight.data(), dbias.data(), x.data(), weight.data(),
                         dy.data(), rows, dim, eps);
  cpu::rmsNormForward(rmsY.data(), x.data(), weight.data(), rows, dim, eps);
  cpu::rmsNormBackward(rmsDx.data(), rmsDweight.data(), x.data(), weight.data(), dy.data(), rows,
                       dim, eps);
  this->expectClose(dY, y, "layernorm y");
  this->expectClose(dDx, dx, "layernorm dx");
  this->expectClose(dDweight, dweight, "layernorm dweight");
  this->expectClose(dDbias, dbias, "layernorm dbias");
  this->expectClose(dRmsY, rmsY, "rmsnorm y");
  this->expectClose(dRmsDx, rmsDx, "rmsnorm dx");
  this->expectClose(dRmsDweight, rmsDweight, "rmsnorm dweight");
}

TYPED_TEST(CudaKernelsTest, ResidualNormFusions) {
  using T = TypeParam;
  int64_t rows = 21, dim = 520, n = rows * dim;
  double eps = 1e-6;
  Floats a = this->input(n), b = this->input(n), weight = this->input(dim), bias = this->input(dim),
         sum(n), y(n), rmsY(n);
  Device<T> dA(a), dB(b), dWeight(weight), dBias(bias), dSum(n), dY(n), dRmsSum(n), dRmsY(n);
  cuda::residualLayerNormForward(dSum.get(), dY.get(), dA.get(), dB.get(), dWeight.get(),
                                 dBias.get(), rows, dim, eps, this->stream);
  cuda::residualRmsNormForward(dRmsSum.get(), dRmsY.get(), dA.get(), dB.get(), dWeight.get(), rows,
                               dim, eps, this->stream);
  cpu::residualAddForward(sum.data(), a.data(), b.data(), n);
  for (float &value : sum) // the fused kernels normalise the sum as stored
    value = toHost(fromHost<T>(value));
  cpu::layerNormForward(y.data(), sum.data(), weight.data(), bias.data(), rows, dim, eps);
  cpu::rmsNormForward(rmsY.data(), sum.data(), weight.data(), rows, dim, eps);
  this->expectClose(dSum, sum, "layernorm sum");
  this->expectClose(dY, y, "layernorm y");
  this->expectClose(dRmsSum, sum, "rmsnorm sum");
  this->expectClose(dRmsY, rmsY, "rmsnorm y");
}

TYPED_TEST(CudaKernelsTest, Matmul) {
  using T = TypeParam;
  int64_t m = 13, n = 17, k = 19;
  for (bool transA : {false, true})
    for (bool transB : {false, true}) {
      SCOPED_TRACE(testing::Message() << "transA " << transA << " transB " << transB);
      Floats a = this->input(m * k), b = this->input(k * n), dc = this->input(m * n);
      Floats c(m * n), da = this->input(m * k), db = this->input(k * n);
      Device<T> dA(a), dB(b), dDc(dc), dDa(da), dDb(db), dC(m * n);
      cuda::matmulForward(*this->blas, dC.get(), dA.get(), dB.get(), m, n, k, transA, transB);
      cuda::matmulBackward(*this->blas, dDa.get(), dDb.get(), dA.get(), dB.get(), dDc.get(), m, n,
                           k, transA, transB, GradWrite::Overwrite, GradWrite::Add);
      cpu::matmulForward(c.data(), a.data(), b.data(), m, n, k, transA, transB);
      cpu::matmulBackward(da.data(), db.data(), a.data(), b.data(), dc.data(), m, n, k, transA,
                          transB, GradWrite::Overwrite, GradWrite::Add);
      this->expectClose(dC, c, "c");
      this->expectClose(dDa, da, "da (overwritten)");
      this->expectClose(dDb, db, "db (added to)");
    }
}

TYPED_TEST(CudaKernelsTest, BiasAndResidual) {
  using T = TypeParam;
  int64_t rows = 1000, dim = 70, n = rows * dim; // several column-sum chunks
  Floats x = this->input(n), bias = this->input(dim), other = this->input(n), dy = this->input(n);
  Floats dbias = this->input(dim), y(n), dx(n), sum(n), da(n), db(n);
  Device<T> dX(x), dBias(bias), dOther(other), dDy(dy), dDbias(dbias), dY(n), dDx(n), dSum(n),
      dDa(n), dDb(n);
  cuda::biasAddForward(dY.get(), dX.get(), dBias.get(), rows, dim, this->stream);
  cuda::biasAddBackward(dDx.get(), dDbias.get(), dDy.get(), rows, dim, this->stream);
  cuda::residualAddForward(dSum.get(), dX.get(), dOther.get(), n, this->stream);
  cuda::residualAddBackward(dDa.get(), dDb.get(), dDy.get(), n, this->stream);
  cpu::biasAddForward(y.data(), x.data(), bias.data(), rows, dim);
  cpu::biasAddBackward(dx.data(), dbias.data(), dy.data(), rows, dim);
  cpu::residualAddForward(sum.data(), x.data(), other.data(), n);
  cpu::residualAddBackward(da.data(), db.data(), dy.data(), n);
  this->expectClose(dY, y, "bias y");
  this->expectClose(dDx, dx, "bias dx");
  this->expectClose(dDbias, dbias, "bias dbias");
  this->expectClose(dSum, sum, "residual y");
  this->expectClose(dDa, da, "residual da");
  this->expectClose(dDb, db, "residual db");
}

TYPED_TEST(CudaKernelsTest, Rope) {
  using T = TypeParam;
  int64_t seq = 11, batch = 2, heads = 3, headDim = 8, n = seq * batch * heads * headDim;
  Floats x = this->input(n), dy = this->input(n), y(n), dx(n);
  Device<T> dX(x), dDy(dy), dY(n), dDx(n);
  cuda::ropeForward(dY.get(), dX.get(), seq, batch, heads, headDim, 10000.0, this->stream);
  cuda::ropeBackward(dDx.get(), dDy.get(), seq, batch, heads, headDim, 10000.0, this->stream);
  cpu::ropeForward(y.data(), x.data(), seq, batch, heads, headDim, 10000.0);
  cpu::ropeBackward(dx.data(), dy.data(), seq, batch, heads, headDim, 10000.0);
  this->expectClose(dY, y, "y");
  this->expectClose(dDx, dx, "dx");
}

TYPED_TEST(CudaKernelsTest, Attention) {
  using T = TypeParam;
  struct Shape {
    int64_t heads, kvHeads;
    bool causal;
  };
  int64_t seq = 17, batch = 2, headDim = 8;
  for (Shape shape : {Shape{4, 2, true}, Shape{4, 1, false}, Shape{3, 3, true}}) {
    SCOPED_TRACE(testing::Message() << "heads " << shape.heads << " kv_heads " << shape.kvHeads
                                    << " causal " << shape.causal);
    int64_t nq = seq * batch * shape.heads * headDim, nkv = seq * batch * shape.kvHeads * headDim;
    Floats q = this->input(nq), k = this->input(nkv), v = this->input(nkv), dy = this->input(nq);
    Floats y(nq), dq(nq), dk(nkv), dv(nkv);
    Device<T> dQ(q), dK(k), dV(v), dDy(dy), dY(nq), dDq(nq), dDk(nkv), dDv(nkv);
    cuda::attentionForward(*this->blas, dY.get(), dQ.get(), dK.get(), dV.get(), seq, batch,
                           shape.heads, shape.kvHeads, headDim, shape.causal);
    cuda::attentionBackward(*this->blas, dDq.get(), dDk.get(), dDv.get(), dQ.get(), dK.get(),
                            dV.get(), dDy.get(), seq, batch, shape.heads, shape.kvHeads, headDim,
                            shape.causal);
    Floats probs(size_t(batch * shape.heads * seq * seq));
    cpu::attentionForward(y.data(), probs.data(), q.data(), k.data(), v.data(), seq, batch,
                          shape.heads, shape.kvHeads, headDim, shape.causal);
    cpu::attentionBackward(dq.data(), dk.data(), dv.data(), q.data(), k.data(), v.data(),
                           probs.data(), dy.data(), seq, batch, shape.heads, shape.kvHeads, headDim,
                           shape.causal);
    this->expectClose(dY, y, "y");
    this->expectClose(dDq, dq, "dq");
    this->expectClose(dDk, dk, "dk");
    this->expectClose(dDv, dv, "dv");
  }
}

TYPED_TEST(CudaKernelsTest, Activations) {
  using T = TypeParam;
  int64_t rows = 45, dim = 64, n = rows * dim;
  Floats x = this->input(n, 3.0f), bias = this->input(dim), up = this->input(n),
         dy = this->input(n), dbias = this->input(dim);
  Floats y(n), dx(n), fusedY(n), geluDx(n), fusedDx(n), shifted(n), gate(n), dup(n);
  Device<T> dX(x), dBias(bias), dUp(up), dDy(dy), dDbias(dbias), dY(n), dDx(n), dFusedY(n),
      dFusedDx(n), dSwiglu(n), dDgate(n), dDup(n);
  cuda::geluForward(dY.get(), dX.get(), n, this->stream);
  cuda::geluBackward(dDx.get(), dX.get(), dDy.get(), n, this->stream);
  cuda::biasGeluForward(dFusedY.get(), dX.get(), dBias.get(), rows, dim, this->stream);
  cuda::biasGeluBackward(dFusedDx.get(), dDbias.get(), dX.get(), dBias.get(), dDy.get(), rows, dim,
                         this->stream);
  cuda::swigluForward(dSwiglu.get(), dX.get(), dUp.get(), rows, dim, this->stream);
  cuda::swigluBackward(dDgate.get(), dDup.get(), dX.get(), dUp.get(), dDy.get(), rows, dim,
                       this->stream);
  cpu::geluForward(y.data(), x.data(), n);
  cpu::geluBackward(dx.data(), x.data(), dy.data(), n);
  this->expectClose(dY, y, "gelu y");
  this->expectClose(dDx, dx, "gelu dx");
  // bias_add then gelu, and gelu_bwd then bias_add_bwd, through the unfused CPU kernels
  cpu::biasAddForward(shifted.data(), x.data(), bias.data(), rows, dim);
  cpu::geluForward(fusedY.data(), shifted.data(), n);
  cpu::geluBackward(geluDx.data(), shifted.data(), dy.data(), n);
  cpu::biasAddBackward(fusedDx.data(), dbias.data(), geluDx.data(), rows, dim);
  this->expectClose(dFusedY, fusedY, "bias gelu y");
  this->expectClose(dFusedDx, fusedDx, "bias gelu dx");
  this->expectClose(dDbias, dbias, "bias gelu dbias");
  cpu::swigluForward(y.data(), x.data(), up.data(), rows, dim);
  cpu::swigluBackward(gate.data(), dup.data(), x.data(), up.data(), dy.data(), rows, dim);
  this->expectClose(dSwiglu, y, "swiglu y");
  this->expectClose(dDgate, gate, "swiglu dgate");
  this->expectClose(dDup, dup, "swiglu dup");
}

TYPED_TEST(CudaKernelsTest, CrossEntropy) {
  using T = TypeParam;
  int64_t seq = 5, batch = 3, vocab = 37, offset = 20, rows = seq * batch;
  std::vector<int64_t> labels = this->ids(rows, 80); // some in this shard, most elsewhere
  labels[0] = offset + 3;
  Floats logits = this->input(rows * vocab, 4.0f), rowMax(rows), rowSum(rows), target(rows);
  Floats dlogits(rows * vocab);
  DeviceIds dLabels(labels);
  Device<T> dLogits(logits), dDlogits(rows * vocab);
  Device<float> dRowMax(rows), dRowSum(rows), dTarget(rows), dLoss(1);
  cuda::crossEntropyRowMax(dRowMax.get(), dLogits.get(), rows, vocab, this->stream);
  cuda::crossEntropySumExp(dRowSum.get(), dLogits.get(), dRowMax.get(), rows, vocab, this->stream);
  cuda::crossEntropyTargetLogit(dTarget.get(), dLogits.get(), dLabels.get(), seq, batch, vocab,
                                offset, this->stream);
  cuda::crossEntropyLoss(dLoss.get(), dRowMax.get(), dRowSum.get(), dTarget.get(), rows,
                         this->stream);
  cuda::crossEntropyBackward(dDlogits.get(), dLogits.get(), dLabels.get(), dRowMax.get(),
                             dRowSum.get(), 0.25f, seq, batch, vocab, offset, this->stream);
  cpu::crossEntropyRowMax(rowMax.data(), logits.data(), rows, vocab);
  cpu::crossEntropySumExp(rowSum.data(), logits.data(), rowMax.data(), rows, vocab);
  cpu::crossEntropyTargetLogit(target.data(), logits.data(), labels.data(), seq, batch, vocab,
                               offset);
  float loss = cpu::crossEntropyLoss(rowMax.data(), rowSum.data(), target.data(), rows);
  cpu::crossEntropyBackward(dlogits.data(), logits.data(), labels.data(), rowMax.data(),
                            rowSum.data(), 0.25f, seq, batch, vocab, offset);
  // The pieces are fp32 from identical inputs whatever T is.
  EXPECT_LT(relativeError(dRowMax.read(), rowMax), 1e-5);
  EXPECT_LT(relativeError(dRowSum.read(), rowSum), 1e-5);
  EXPECT_LT(relativeError(dTarget.read(), target), 1e-5);
  EXPECT_LT(relativeError(dLoss.read(), {loss}), 1e-5);
  this->expectClose(dDlogits, dlogits, "dlogits");
  // parrun writes the gradient over the logits where they die (OpInterpreter::outOver): in
  // place the kernel gives the bits it gives into a fresh buffer.
  cuda::crossEntropyBackward(dLogits.get(), dLogits.get(), dLabels.get(), dRowMax.get(),
                             dRowSum.get(), 0.25f, seq, batch, vocab, offset, this->stream);
  EXPECT_EQ(dLogits.read(), dDlogits.read());
}

TYPED_TEST(CudaKernelsTest, Optimizer) {
  using T = TypeParam;
  int64_t n = 3000;
  Floats param = this->input(n), grad = this->input(n), m = this->input(n, 0.1f),
         v = this->input(n, 0.01f);
  for (float &value : v)
    value = std::fabs(value);
  Floats sgdParam = param, buffer = m, scaled = grad;
  cpu::AdamWConfig adamw;
  adamw.lr = 1e-2;
  adamw.weightDecay = 0.1;
  adamw.step = 3;
  adamw.gradScale = 0.8; // a clipping factor
  cpu::SGDConfig sgd;
  sgd.lr = 0.05;
  sgd.momentum = 0.9;
  sgd.weightDecay = 0.01;
  sgd.gradScale = 0.8;
  Device<T> dParam(param), dGrad(grad), dM(m), dV(v), dSgdParam(param), dBuffer(buffer),
      dScaled(grad);
  Device<double> dSquares(1);
  double squares = 1.5;
  PARC_CUDA_CHECK(cudaMemcpy(dSquares.get(), &squares, sizeof(double), cudaMemcpyHostToDevice),
                  "test");
  cuda::adamwStep(dParam.get(), dGrad.get(), dM.get(), dV.get(), n, adamw, this->stream);
  cuda::sgdStep(dSgdParam.get(), dGrad.get(), dBuffer.get(), n, sgd, this->stream);
  cuda::squaredSum(dSquares.get(), dGrad.get(), n, this->stream);
  cuda::scale(dScaled.get(), n, 0.37, this->stream);
  cpu::adamwStep(param.data(), grad.data(), m.data(), v.data(), n, adamw);
  cpu::sgdStep(sgdParam.data(), grad.data(), buffer.data(), n, sgd);
  squares += cpu::squaredSum(grad.data(), n);
  cpu::scale(scaled.data(), n, 0.37);
  this->expectClose(dParam, param, "adamw param");
  this->expectClose(dM, m, "adamw m");
  this->expectClose(dV, v, "adamw v");
  this->expectClose(dSgdParam, sgdParam, "sgd param");
  this->expectClose(dBuffer, buffer, "sgd momentum");
  this->expectClose(dScaled, scaled, "scale");
  double deviceSquares = 0;
  PARC_CUDA_CHECK(
      cudaMemcpy(&deviceSquares, dSquares.get(), sizeof(double), cudaMemcpyDeviceToHost), "test");
  EXPECT_NEAR(deviceSquares, squares, 1e-9 * squares);
}

TYPED_TEST(CudaKernelsTest, Deterministic) {
  // Same inputs, same bits: no atomics anywhere, fixed reduction trees.
  using T = TypeParam;
  int64_t seq = 33, batch = 2, heads = 4, headDim = 16, n = seq * batch * heads * headDim;
  Floats q = this->input(n), k = this->input(n), v = this->input(n), dy = this->input(n);
  std::vector<int64_t> ids = this->ids(seq * batch, 5);
  Device<T> dQ(q), dK(k), dV(v), dDy(dy);
  DeviceIds dIds(ids);
  auto run = [&] {
    Device<T> dq(n), dk(n), dv(n), dweight(Floats(5 * heads * headDim, 0.5f));
    cuda::attentionBackward(*this->blas, dq.get(), dk.get(), dv.get(), dQ.get(), dK.get(), dV.get(),
                            dDy.get(), seq, batch, heads, heads, headDim, true);
    cuda::embeddingBackward(dweight.get(), dIds.get(), dDy.get(), seq, batch, heads * headDim, 0, 5,
                            this->stream);
    return std::vector<Floats>{dq.read(), dk.read(), dv.read(), dweight.read()};
  };
  std::vector<Floats> first = run(), second = run();
  for (size_t i = 0; i < first.size(); ++i)
    EXPECT_EQ(std::memcmp(first[i].data(), second[i].data(), first[i].size() * sizeof(float)), 0)
        << "output " << i;
}

TEST(CudaKernels, ConvertRoundsToNearest) {
  SKIP_WITHOUT_DEVICE();
  Floats values = {1.0f, -2.5f, 3.14159265f, 1e-3f, 65504.0f, -0.0f};
  Device<float> source(values), back(values.size());
  Device<__nv_bfloat16> bf16(values.size());
  cuda::convert(bf16.get(), source.get(), int64_t(values.size()), nullptr);
  cuda::convert(back.get(), bf16.get(), int64_t(values.size()), nullptr);
  Floats result = back.read();
  for (size_t i = 0; i < values.size(); ++i)
    EXPECT_EQ(result[i], __bfloat162float(__float2bfloat16(values[i]))) << i;
}

TEST(CudaKernels, FoldMatchesHostOrderWithManyMembers) {
  SKIP_WITHOUT_DEVICE();
  // 40 members: two stages of the fan-in; the outputs are the inputs (an in-place all-reduce).
  size_t members = 40, count = 1000;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<std::unique_ptr<Device<float>>> buffers;
  std::vector<float *> pointers;
  Floats expected(count, 0.0f), expectedMax(count, -INFINITY);
  for (size_t m = 0; m < members; ++m) {
    Floats data(count);
    for (float &x : data)
      x = value(rng);
    for (size_t k = 0; k < count; ++k) {
      expected[k] = m == 0 ? data[k] : expected[k] + data[k]; // the left fold, in fp32
      expectedMax[k] = std::max(expectedMax[k], data[k]);
    }
    buffers.push_back(std::make_unique<Device<float>>(data));
    pointers.push_back(buffers.back()->get());
  }
  Device<float> maxOut(count);
  float *maxPointer = maxOut.get();
  cuda::foldBuffers(&maxPointer, 1, pointers.data(), members, count, cuda::FoldOp::Max, nullptr);
  cuda::foldBuffers(pointers.data(), members, pointers.data(), members, count, cuda::FoldOp::Sum,
                    nullptr);
  EXPECT_EQ(maxOut.read(), expectedMax);
  for (size_t m = 0; m < members; ++m)
    EXPECT_EQ(buffers[m]->read(), expected) << "member " << m;
}

TEST(CudaKernels, FoldMaxPropagatesNaN) {
  SKIP_WITHOUT_DEVICE();
  float nan = std::numeric_limits<float>::quiet_NaN();
  Device<float> a(Floats{1.0f, nan, 2.0f}), b(Floats{nan, 3.0f, 1.0f}), out(3);
  const float *inputs[] = {a.get(), b.get()};
  float *outputs[] = {out.get()};
  cuda::foldBuffers(outputs, 1, inputs, 2, 3, cuda::FoldOp::Max, nullptr);
  Floats result = out.read();
  EXPECT_TRUE(std::isnan(result[0]));
  EXPECT_TRUE(std::isnan(result[1]));
  EXPECT_EQ(result[2], 2.0f);
}

// These need no device: they check what a user reads when something goes wrong.

TEST(CudaKernels, DeviceAvailabilityExplainsItself) {
  std::string why;
  bool available = cuda::cudaDeviceAvailable(&why);
  EXPECT_EQ(available, deviceAvailable());
  if (!available)
    EXPECT_FALSE(why.empty());
  else
    EXPECT_TRUE(why.empty()) << why;
}

TEST(CudaKernels, ErrorsNameTheCallTheContextAndTheOp) {
  cuda::ErrorScope outer("attention_bwd on rank 3");
  try {
    PARC_CUDA_CHECK(cudaErrorMemoryAllocation, "attentionBackward scores");
    FAIL() << "a failed call must throw";
  } catch (const cuda::CudaError &error) {
    std::string message = error.what();
    EXPECT_NE(message.find("cudaErrorMemoryAllocation failed in attentionBackward scores "
                           "(attention_bwd on rank 3): cudaErrorMemoryAllocation"),
              std::string::npos)
        << message;
  }
  {
    cuda::ErrorScope inner("optimizer_step on rank 3");
    EXPECT_EQ(cuda::ErrorScope::current(), "optimizer_step on rank 3");
  }
  EXPECT_EQ(cuda::ErrorScope::current(), "attention_bwd on rank 3");
  EXPECT_NO_THROW(PARC_CUDA_CHECK(CUBLAS_STATUS_SUCCESS, "nothing"));
  EXPECT_THROW(PARC_CUDA_CHECK(CUBLAS_STATUS_NOT_INITIALIZED, "cublas"), cuda::CudaError);
}

} // namespace
