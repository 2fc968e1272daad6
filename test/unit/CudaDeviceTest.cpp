//===- CudaDeviceTest.cpp - The CUDA device against host references ---===//
//
// Each storage type's CudaDevice against host arithmetic and the CPU kernels (Kernels.h).
// Inputs are multiples of 1/8 below 8, exact in bf16 and fp16, so copies and sums must agree
// bit for bit; the optimizer and the loss against the fp32 CPU kernels to 1e-6 and 1e-5
// relative. Tests that need a GPU skip without one.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/CudaDevice.h"
#include "parc/Runtime/Init.h"
#include "parc/Runtime/Kernels.h"

#include "parc/Runtime/CudaLocalCommunicator.h"

#include "CudaTestSupport.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

using namespace parc::runtime;
namespace cpu = parc::runtime::cpu;
namespace cuda = parc::runtime::cuda;
using Doubles = std::vector<double>;

namespace {

/// x rounded as an upload rounds it: to float, then to T.
template <typename T> double rounded(double x) {
  float value = float(x);
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(__float2bfloat16(value));
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(__float2half(value));
  else
    return value;
}

/// n multiples of 1/8 in [-8, 8), none repeating within 128.
Doubles exactValues(size_t n, int salt = 0) {
  Doubles values(n);
  for (size_t i = 0; i < n; ++i)
    values[i] = double(int64_t((i * 37 + size_t(salt) * 11) % 128) - 64) / 8.0;
  return values;
}

std::vector<float> toFloats(const Doubles &values) { return {values.begin(), values.end()}; }

double relativeError(const std::vector<float> &out, const std::vector<float> &ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff += (double(out[i]) - ref[i]) * (double(out[i]) - ref[i]);
    norm += double(ref[i]) * ref[i];
  }
  return std::sqrt(diff / norm);
}

struct TypeNames {
  template <typename T> static std::string GetName(int) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
      return "bf16";
    else if constexpr (std::is_same_v<T, __half>)
      return "fp16";
    else
      return "fp32";
  }
};

template <typename T> class CudaDeviceTest : public ::testing::Test {
protected:
  void SetUp() override {
    SKIP_WITHOUT_DEVICE();
    device = std::make_unique<CudaDevice<T>>(0);
  }

  Buffer<T> uploaded(const Doubles &values, MemoryCategory category = MemoryCategory::Activations) {
    Buffer<T> buffer(device->memory(), category, values.size());
    device->upload(buffer.data(), values.data(), int64_t(values.size()));
    return buffer;
  }
  Doubles downloaded(const Buffer<T> &buffer) {
    return device->download(buffer.data(), int64_t(buffer.size()));
  }
  /// fp32 device memory (gradients, master weights, moments), which the device's own transfers
  /// do not move for bf16/fp16.
  Buffer<float> writeFloats(const Doubles &values,
                            MemoryCategory category = MemoryCategory::Grads) {
    Buffer<float> buffer(device->memory(), category, values.size());
    std::vector<float> host = toFloats(values);
    device->synchronize();
    PARC_CUDA_CHECK(
        cudaMemcpy(buffer.data(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
        "writing fp32 test inputs");
    return buffer;
  }
  /// fp32 device memory (master weights, moments, loss pieces), which the device's own
  /// transfers do not move for bf16/fp16.
  std::vector<float> readFloats(const Buffer<float> &buffer) {
    device->synchronize();
    std::vector<float> host(buffer.size());
    PARC_CUDA_CHECK(
        cudaMemcpy(host.data(), buffer.data(), host.size() * sizeof(float), cudaMemcpyDeviceToHost),
        "reading fp32 test results");
    return host;
  }

  std::unique_ptr<CudaDevice<T>> device;
};

using StorageTypes = ::testing::Types<float, __nv_bfloat16, __half>;
TYPED_TEST_SUITE(CudaDeviceTest, StorageTypes, TypeNames);

TYPED_TEST(CudaDeviceTest, UploadDownloadRoundTrip) {
  Doubles exact = exactValues(1000);
  EXPECT_EQ(this->downloaded(this->uploaded(exact)), exact);

  Doubles inexact(777);
  for (size_t i = 0; i < inexact.size(); ++i)
    inexact[i] = std::sin(double(i)) * 3.0 + 1.0 / 3.0;
  Doubles back = this->downloaded(this->uploaded(inexact));
  for (size_t i = 0; i < inexact.size(); ++i)
    ASSERT_EQ(back[i], rounded<TypeParam>(inexact[i])) << "element " << i;

  Buffer<TypeParam> one = this->uploaded({2.625});
  EXPECT_EQ(this->device->readScalar(one.data()), 2.625);
}

TYPED_TEST(CudaDeviceTest, CopyRowsMatchesHost) {
  const int64_t rows = 6, srcStride = 9, dstStride = 5, width = 3, srcColumn = 2, dstColumn = 1;
  Doubles src = exactValues(rows * srcStride);
  Doubles expected(rows * dstStride, -1.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < width; ++j)
      expected[r * dstStride + dstColumn + j] = src[r * srcStride + srcColumn + j];

  Buffer<TypeParam> from = this->uploaded(src);
  Buffer<TypeParam> to = this->uploaded(Doubles(rows * dstStride, -1.0));
  this->device->copyRows(to.data() + dstColumn, dstStride, from.data() + srcColumn, srcStride,
                         width, rows);
  EXPECT_EQ(this->downloaded(to), expected);

  // Contiguous rows take the one-copy path.
  Buffer<TypeParam> whole(this->device->memory(), MemoryCategory::Activations, src.size());
  this->device->copyRows(whole.data(), srcStride, from.data(), srcStride, srcStride, rows);
  EXPECT_EQ(this->downloaded(whole), src);
}

TYPED_TEST(CudaDeviceTest, FillAndAccumulate) {
  Buffer<TypeParam> y = this->uploaded(exactValues(300));
  this->device->fill(y.data(), 200, 1.5);
  Doubles filled = this->downloaded(y);
  Doubles expected = exactValues(300);
  std::fill_n(expected.begin(), 200, 1.5);
  EXPECT_EQ(filled, expected);
  this->device->fill(y.data() + 100, 200, 0.0);
  std::fill(expected.begin() + 100, expected.end(), 0.0);
  EXPECT_EQ(this->downloaded(y), expected);

  Doubles a = exactValues(500, 1), b = exactValues(500, 2), sum(500);
  for (size_t i = 0; i < sum.size(); ++i)
    sum[i] = a[i] + b[i];
  // A gradient an op wrote in T, added to the fp32 gradient buffer.
  Buffer<float> acc = this->writeFloats(a);
  Buffer<TypeParam> x = this->uploaded(b);
  this->device->accumulateGrad(acc.data(), x.data(), int64_t(acc.size()));
  EXPECT_EQ(this->readFloats(acc), toFloats(sum));
}

TYPED_TEST(CudaDeviceTest, AllocationsAreZeroedAndCounted) {
  MemoryTracker &memory = this->device->memory();
  const size_t weights = 4096, grads = 3000, bytes = sizeof(TypeParam);
  {
    Buffer<TypeParam> dirty(memory, MemoryCategory::Weights, weights);
    this->device->fill(dirty.data(), int64_t(weights), 3.0);
  }
  // The pool hands the freed memory out again; it must come back zeroed.
  Buffer<TypeParam> w(memory, MemoryCategory::Weights, weights);
  Buffer<TypeParam> g(memory, MemoryCategory::Grads, grads);
  EXPECT_EQ(this->downloaded(w), Doubles(weights, 0.0));
  EXPECT_EQ(this->downloaded(g), Doubles(grads, 0.0));

  EXPECT_EQ(memory.current(MemoryCategory::Weights), int64_t(weights * bytes));
  EXPECT_EQ(memory.peak(MemoryCategory::Weights), int64_t(weights * bytes));
  EXPECT_EQ(memory.current(MemoryCategory::Grads), int64_t(grads * bytes));
  EXPECT_EQ(memory.current(MemoryCategory::Optimizer), 0);
  EXPECT_EQ(memory.peakTotal(), int64_t((weights + grads) * bytes));

  EXPECT_GE(this->device->poolPeakBytes(MemoryCategory::Weights), int64_t(weights * bytes));
  EXPECT_GE(this->device->poolPeakBytes(MemoryCategory::Grads), int64_t(grads * bytes));
  EXPECT_EQ(this->device->poolPeakBytes(MemoryCategory::Optimizer), 0);

  g.reset();
  EXPECT_EQ(memory.current(MemoryCategory::Grads), 0);
}

TYPED_TEST(CudaDeviceTest, OutOfMemoryNamesCategoryAndBytes) {
  size_t free = 0, total = 0;
  PARC_CUDA_CHECK(cudaMemGetInfo(&free, &total), "device memory of the test");
  size_t count = 2 * total / sizeof(TypeParam);
  std::string bytes = std::to_string(count * sizeof(TypeParam));
  try {
    Buffer<TypeParam> huge(this->device->memory(), MemoryCategory::Optimizer, count);
    FAIL() << "allocating twice the device's memory succeeded";
  } catch (const cuda::CudaError &error) {
    std::string message = error.what();
    EXPECT_NE(message.find("optimizer"), std::string::npos) << message;
    EXPECT_NE(message.find(bytes + " bytes"), std::string::npos) << message;
    EXPECT_NE(message.find("free on the device"), std::string::npos) << message;
  }
  EXPECT_EQ(this->device->memory().current(MemoryCategory::Optimizer), 0);
  // The failure is not left behind for the next kernel's launch check.
  Buffer<TypeParam> after(this->device->memory(), MemoryCategory::Activations, 10);
  this->device->fill(after.data(), 10, 0.5);
  EXPECT_EQ(this->downloaded(after), Doubles(10, 0.5));
}

TYPED_TEST(CudaDeviceTest, SquaredSumMatchesHost) {
  Doubles a = exactValues(5000, 3), b = exactValues(777, 4);
  double expected = 0;
  for (const Doubles *values : {&a, &b})
    for (double x : *values)
      expected += x * x;
  // Of gradients, which are fp32 whatever the storage.
  Buffer<float> da = this->writeFloats(a), db = this->writeFloats(b);
  std::vector<std::pair<const float *, int64_t>> ranges = {{da.data(), int64_t(a.size())},
                                                           {db.data(), int64_t(b.size())}};
  // Squares of multiples of 1/8 add up exactly in fp64, in any order.
  EXPECT_EQ(this->device->squaredSum(ranges), expected);
  EXPECT_EQ(this->device->squaredSum({}), 0.0);
}

TYPED_TEST(CudaDeviceTest, AdamWMatchesCpuOnMasterWeights) {
  using Device = CudaDevice<TypeParam>;
  const int64_t n = 2048;
  Doubles weights = exactValues(n, 5);
  MemoryTracker &memory = this->device->memory();
  Buffer<TypeParam> w = this->uploaded(weights, MemoryCategory::Weights);
  Buffer<float> master, m(memory, MemoryCategory::Optimizer, n),
      v(memory, MemoryCategory::Optimizer, n);
  if constexpr (Device::KeepsMasterWeights) {
    master = Buffer<float>(memory, MemoryCategory::Optimizer, n);
    this->device->initMaster(master.data(), w.data(), n);
  }
  std::vector<float> cpuWeights = toFloats(weights), cpuM(n, 0.0f), cpuV(n, 0.0f);

  cpu::AdamWConfig config;
  config.lr = 1e-2;
  config.weightDecay = 0.1;
  for (int step = 1; step <= 3; ++step) {
    Doubles grad = exactValues(n, 10 + step);
    Buffer<float> g = this->writeFloats(grad);
    config.step = step;
    this->device->adamwStep(w.data(), master.data(), g.data(), m.data(), v.data(), n, config);
    cpu::adamwStep(cpuWeights.data(), toFloats(grad).data(), cpuM.data(), cpuV.data(), n, config);
  }

  Doubles stored = this->downloaded(w);
  std::vector<float> stepped =
      Device::KeepsMasterWeights ? this->readFloats(master) : toFloats(stored);
  EXPECT_LT(relativeError(stepped, cpuWeights), 1e-6);
  EXPECT_LT(relativeError(this->readFloats(m), cpuM), 1e-6);
  EXPECT_LT(relativeError(this->readFloats(v), cpuV), 1e-6);
  // The stored weights are the master weights rounded, not stepped on their own.
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(stored[i], rounded<TypeParam>(stepped[i])) << "element " << i;
}

TYPED_TEST(CudaDeviceTest, CrossEntropyLossMatchesCpu) {
  const int64_t seq = 4, batch = 3, vocab = 10, rows = seq * batch;
  Doubles logits = exactValues(rows * vocab, 6);
  std::vector<int64_t> labels(rows);
  for (int64_t i = 0; i < rows; ++i)
    labels[i] = (i * 7) % vocab;

  MemoryTracker &memory = this->device->memory();
  Buffer<TypeParam> dLogits = this->uploaded(logits), loss(memory, MemoryCategory::Activations, 1);
  Buffer<int64_t> dLabels(memory, MemoryCategory::Activations, rows);
  Buffer<float> rowMax(memory, MemoryCategory::Activations, rows),
      rowSum(memory, MemoryCategory::Activations, rows),
      target(memory, MemoryCategory::Activations, rows);
  this->device->uploadIds(dLabels.data(), labels.data(), rows);
  this->device->crossEntropyRowMax(rowMax.data(), dLogits.data(), rows, vocab);
  this->device->crossEntropySumExp(rowSum.data(), dLogits.data(), rowMax.data(), rows, vocab);
  this->device->crossEntropyTargetLogit(target.data(), dLogits.data(), dLabels.data(), seq, batch,
                                        vocab, 0);
  double value = this->device->crossEntropyLoss(loss.data(), rowMax.data(), rowSum.data(),
                                                target.data(), rows);

  std::vector<float> hostLogits = toFloats(logits), hostMax(rows), hostSum(rows), hostTarget(rows);
  cpu::crossEntropyRowMax(hostMax.data(), hostLogits.data(), rows, vocab);
  cpu::crossEntropySumExp(hostSum.data(), hostLogits.data(), hostMax.data(), rows, vocab);
  cpu::crossEntropyTargetLogit(hostTarget.data(), hostLogits.data(), labels.data(), seq, batch,
                               vocab, 0);
  float expected = cpu::crossEntropyLoss(hostMax.data(), hostSum.data(), hostTarget.data(), rows);
  EXPECT_NEAR(value, expected, 1e-5 * std::abs(expected));
  EXPECT_EQ(this->device->readScalar(loss.data()), rounded<TypeParam>(value));
}

TYPED_TEST(CudaDeviceTest, InitShardMatchesHost) {
  parc::plan::ParamShard shard;
  shard.name = "block.0.attn.qkv.weight";
  shard.shape = {6, 40};
  shard.slice = {{2, 3}, {8, 16}};
  shard.init = {parc::plan::InitKind::Normal, 0.02};
  std::vector<float> host(3 * 16);
  initShard(host.data(), 1234, shard);

  Buffer<TypeParam> w(this->device->memory(), MemoryCategory::Weights, host.size());
  this->device->initShard(w.data(), 1234, shard);
  Doubles values = this->downloaded(w);
  for (size_t i = 0; i < host.size(); ++i)
    ASSERT_EQ(values[i], rounded<TypeParam>(host[i])) << "element " << i;
}

TEST(CudaDeviceCommTest, AllReduceHostOverDeviceCommunicator) {
  SKIP_WITHOUT_DEVICE();
  CudaLocalWorld world(2, 0);
  std::vector<int64_t> group = {0, 1};
  std::vector<Doubles> sums(2), maxima(2);
  std::vector<std::string> failures = world.run([&](CudaCommunicator &comm) {
    CudaDevice<__nv_bfloat16> device(0);
    comm.setComputeStream(device.stream());
    double rank = double(comm.rank());
    Doubles values = {rank + 1.0, 10.0 * rank, -rank};
    device.allReduceHost(comm, group, values.data(), values.size());
    sums[comm.rank()] = values;
    values = {rank + 1.0, -rank};
    device.allReduceHost(comm, group, values.data(), values.size(), ReduceOp::Max);
    maxima[comm.rank()] = values;
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(failures[rank], "") << "rank " << rank;
    EXPECT_EQ(sums[rank], (Doubles{3.0, 10.0, -1.0})) << "rank " << rank;
    EXPECT_EQ(maxima[rank], (Doubles{2.0, 0.0})) << "rank " << rank;
  }
}

TEST(CudaDeviceCommTest, AllReduceHostRefusesAnUnorderedCommunicator) {
  SKIP_WITHOUT_DEVICE();
  CudaLocalWorld world(2, 0);
  std::vector<int64_t> group = {0, 1};
  std::vector<std::string> failures = world.run([&](CudaCommunicator &comm) {
    CudaDevice<float> device(0);
    double value = 1.0;
    device.allReduceHost(comm, group, &value, 1);
  });
  for (const std::string &failure : failures)
    EXPECT_NE(failure.find("setComputeStream"), std::string::npos) << failure;
}

} // namespace
