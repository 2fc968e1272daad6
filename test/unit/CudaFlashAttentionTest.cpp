//===- CudaFlashAttentionTest.cpp - The fused attention against the CPU kernels -===//
//
// Each case runs flashAttentionForward/Backward in bf16 or fp16 and cpu::attentionForward/
// Backward in double on the same inputs (random normal values rounded to the storage type);
// y, dq, dk and dv must agree to 1e-2 relative L2 error. Outputs start as NaN, so an element
// the kernels never write fails too. A failure names the case, the worst element as (token,
// batch, head, dim) and how many elements are not finite, which points at the tile that went
// wrong. Tests that need a GPU skip without one; the argument checks run everywhere.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/CudaFlashAttention.h"
#include "parc/Runtime/CudaCheck.h"
#include "parc/Runtime/CudaKernels.h"
#include "parc/Runtime/Kernels.h"

#include "CudaTestSupport.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace cpu = parc::runtime::cpu;
namespace cuda = parc::runtime::cuda;
using Doubles = std::vector<double>;

namespace {

constexpr double kTolerance = 1e-2;

enum class Storage { BF16, FP16 };

struct Case {
  Storage storage;
  int64_t seq, batch, heads, kvHeads, headDim;
  bool causal;
};

std::string caseName(const Case &c) {
  std::ostringstream name;
  name << (c.storage == Storage::BF16 ? "bf16" : "fp16") << "_seq" << c.seq << "_batch" << c.batch
       << "_heads" << c.heads << "_kv" << c.kvHeads << "_dim" << c.headDim
       << (c.causal ? "_causal" : "_full");
  return name.str();
}
void PrintTo(const Case &c, std::ostream *out) { *out << caseName(c); }

using parc::test::fromHost;
using parc::test::toHost;

/// A device buffer of n T; starts as NaN (all bits set) unless given values.
template <typename T> class Device : public parc::test::DeviceBuffer<T> {
public:
  explicit Device(size_t n) : parc::test::DeviceBuffer<T>(n) {
    PARC_CUDA_CHECK(cudaMemset(this->get(), 0xff, n * sizeof(T)), "NaN fill");
  }
  explicit Device(const Doubles &values) : parc::test::DeviceBuffer<T>(values) {}
  Doubles read() const { return this->template values<double>(); }
};

/// A stream per test, for the GPU tests.
class DeviceTest {
protected:
  void createStream() { PARC_CUDA_CHECK(cudaStreamCreate(&stream), "test stream"); }
  void destroyStream() {
    if (stream)
      cudaStreamDestroy(stream);
  }
  cudaStream_t stream = nullptr;
};

/// Normal values already rounded to T, so that both sides see the same inputs.
template <typename T> Doubles randomInput(size_t n, std::mt19937 &rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  Doubles values(n);
  for (double &value : values)
    value = toHost(fromHost<T>(normal(rng)));
  return values;
}

/// `what` of a [seq, batch, heads*headDim] tensor within tolerance of the reference; else a
/// message with the worst element's coordinates.
void expectClose(const char *what, const Doubles &got, const Doubles &want, const Case &c,
                 int64_t heads) {
  double diff = 0, norm = 0, worst = -1;
  size_t worstAt = 0, notFinite = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double error = std::abs(got[i] - want[i]);
    notFinite += !std::isfinite(got[i]);
    diff += error * error;
    norm += want[i] * want[i];
    if (!(error <= worst)) { // NaN counts as worst
      worst = error;
      worstAt = i;
    }
  }
  double relative = std::sqrt(diff / norm);
  int64_t i = int64_t(worstAt), dim = i % c.headDim, head = i / c.headDim % heads,
          batch = i / (c.headDim * heads) % c.batch, token = i / (c.headDim * heads * c.batch);
  EXPECT_LT(relative, kTolerance) << what << ": relative L2 error " << relative << ", " << notFinite
                                  << " elements not finite; worst at (token " << token << ", batch "
                                  << batch << ", head " << head << ", dim " << dim << "): got "
                                  << got[worstAt] << ", want " << want[worstAt];
}

template <typename T> void compareWithCpu(const Case &c, cudaStream_t stream) {
  std::mt19937 rng(uint32_t(c.seq * 131 + c.batch * 17 + c.kvHeads * 5 + c.headDim + c.causal));
  size_t nq = c.seq * c.batch * c.heads * c.headDim, nkv = c.seq * c.batch * c.kvHeads * c.headDim;
  Doubles q = randomInput<T>(nq, rng), k = randomInput<T>(nkv, rng), v = randomInput<T>(nkv, rng),
          dy = randomInput<T>(nq, rng);
  Device<T> dQ(q), dK(k), dV(v), dDy(dy), dY(nq), dDq(nq), dDk(nkv), dDv(nkv);
  cuda::flashAttentionForward(dY.get(), dQ.get(), dK.get(), dV.get(), c.seq, c.batch, c.heads,
                              c.kvHeads, c.headDim, c.causal, stream);
  cuda::flashAttentionBackward(dDq.get(), dDk.get(), dDv.get(), dQ.get(), dK.get(), dV.get(),
                               dDy.get(), c.seq, c.batch, c.heads, c.kvHeads, c.headDim, c.causal,
                               stream);
  Doubles y(nq), dq(nq), dk(nkv), dv(nkv), probs(size_t(c.batch * c.heads * c.seq * c.seq));
  cpu::attentionForward(y.data(), probs.data(), q.data(), k.data(), v.data(), c.seq, c.batch,
                        c.heads, c.kvHeads, c.headDim, c.causal);
  cpu::attentionBackward(dq.data(), dk.data(), dv.data(), q.data(), k.data(), v.data(),
                         probs.data(), dy.data(), c.seq, c.batch, c.heads, c.kvHeads, c.headDim,
                         c.causal);
  expectClose("y", dY.read(), y, c, c.heads);
  expectClose("dq", dDq.read(), dq, c, c.heads);
  expectClose("dk", dDk.read(), dk, c, c.kvHeads);
  expectClose("dv", dDv.read(), dv, c, c.kvHeads);
}

class FlashAttentionTest : public ::testing::TestWithParam<Case>, protected DeviceTest {
protected:
  void SetUp() override {
    SKIP_WITHOUT_DEVICE();
    createStream();
  }
  void TearDown() override { destroyStream(); }
};

TEST_P(FlashAttentionTest, MatchesCpuInDouble) {
  const Case &c = GetParam();
  if (c.storage == Storage::BF16)
    compareWithCpu<__nv_bfloat16>(c, stream);
  else
    compareWithCpu<__half>(c, stream);
}

std::vector<Case> sweep() {
  std::vector<Case> cases;
  for (Storage storage : {Storage::BF16, Storage::FP16})
    for (int64_t seq : {64, 128, 256})
      for (int64_t headDim : {64, 128})
        for (bool causal : {true, false})
          for (int64_t kvHeads : {4, 2, 1})
            for (int64_t batch : {1, 3})
              cases.push_back({storage, seq, batch, 4, kvHeads, headDim, causal});
  return cases;
}

std::string paramName(const ::testing::TestParamInfo<Case> &info) { return caseName(info.param); }

INSTANTIATE_TEST_SUITE_P(Sweep, FlashAttentionTest, ::testing::ValuesIn(sweep()), paramName);
// The benchmark's row length: 32 query and key blocks, the online rescaling over many tiles.
INSTANTIATE_TEST_SUITE_P(BenchmarkRowLength, FlashAttentionTest,
                         ::testing::Values(Case{Storage::BF16, 2048, 1, 2, 2, 128, true},
                                           Case{Storage::FP16, 2048, 1, 2, 2, 128, true}),
                         paramName);

class FlashAttentionDeterminism : public ::testing::Test, protected DeviceTest {
protected:
  void SetUp() override {
    SKIP_WITHOUT_DEVICE();
    createStream();
  }
  void TearDown() override { destroyStream(); }

  template <typename T> void expectSameBitsTwice() {
    // Grouped heads and the mask: dk and dv sum over two query heads and many tiles.
    const int64_t seq = 256, batch = 2, heads = 4, kvHeads = 2, headDim = 128;
    size_t nq = seq * batch * heads * headDim, nkv = seq * batch * kvHeads * headDim;
    std::mt19937 rng(7);
    Device<T> q(randomInput<T>(nq, rng)), k(randomInput<T>(nkv, rng)), v(randomInput<T>(nkv, rng)),
        dy(randomInput<T>(nq, rng));
    auto run = [&] {
      Device<T> y(nq), dq(nq), dk(nkv), dv(nkv);
      cuda::flashAttentionForward(y.get(), q.get(), k.get(), v.get(), seq, batch, heads, kvHeads,
                                  headDim, true, stream);
      cuda::flashAttentionBackward(dq.get(), dk.get(), dv.get(), q.get(), k.get(), v.get(),
                                   dy.get(), seq, batch, heads, kvHeads, headDim, true, stream);
      return std::vector<std::vector<T>>{y.bits(), dq.bits(), dk.bits(), dv.bits()};
    };
    auto first = run(), second = run();
    const char *names[] = {"y", "dq", "dk", "dv"};
    for (size_t i = 0; i < first.size(); ++i)
      EXPECT_EQ(std::memcmp(first[i].data(), second[i].data(), first[i].size() * sizeof(T)), 0)
          << names[i] << " differs between two runs";
  }
};

TEST_F(FlashAttentionDeterminism, SameBitsEveryRunBF16) { expectSameBitsTwice<__nv_bfloat16>(); }
TEST_F(FlashAttentionDeterminism, SameBitsEveryRunFP16) { expectSameBitsTwice<__half>(); }

TEST(FlashAttentionSupports, OnlyWholeBlocksAndTwoHeadSizes) {
  EXPECT_TRUE(cuda::flashAttentionSupports(64, 64));
  EXPECT_TRUE(cuda::flashAttentionSupports(2048, 128));
  EXPECT_TRUE(cuda::flashAttentionSupports(64 * 65535, 128));
  EXPECT_FALSE(cuda::flashAttentionSupports(0, 64));
  EXPECT_FALSE(cuda::flashAttentionSupports(-64, 64));
  EXPECT_FALSE(cuda::flashAttentionSupports(100, 64)); // a tail tile
  EXPECT_FALSE(cuda::flashAttentionSupports(32, 128));
  EXPECT_FALSE(cuda::flashAttentionSupports(64 * 65536, 128)); // more blocks than the grid holds
  for (int64_t headDim : {0, 8, 32, 80, 96, 256})
    EXPECT_FALSE(cuda::flashAttentionSupports(2048, headDim)) << headDim;
}

/// The call throws an argument-check error that contains `reason`, before any CUDA call (so
/// these run without a GPU too).
template <typename Call> void expectRejected(Call call, const std::string &reason) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected: " << reason;
  } catch (const cuda::CudaError &error) {
    std::string message = error.what();
    EXPECT_NE(message.find("argument check"), std::string::npos) << message;
    EXPECT_NE(message.find(reason), std::string::npos) << message;
  }
}

TEST(FlashAttentionArguments, RejectedBeforeLaunch) {
  using bf16 = __nv_bfloat16;
  bf16 *none = nullptr;
  // Never dereferenced: the checks come first.
  bf16 *misaligned = reinterpret_cast<bf16 *>(uintptr_t(0x1002));
  expectRejected(
      [&] { cuda::flashAttentionForward(none, none, none, none, 100, 1, 4, 4, 64, true, nullptr); },
      "seq 100 with head size 64 is not supported");
  expectRejected(
      [&] { cuda::flashAttentionForward(none, none, none, none, 128, 1, 4, 4, 96, true, nullptr); },
      "seq 128 with head size 96 is not supported");
  expectRejected(
      [&] {
        cuda::flashAttentionBackward(none, none, none, none, none, none, none, 128, 1, 4, 3, 64,
                                     true, nullptr);
      },
      "kv_heads must divide heads");
  expectRejected(
      [&] {
        cuda::flashAttentionBackward(none, none, misaligned, none, none, none, none, 128, 1, 4, 2,
                                     64, true, nullptr);
      },
      "16-byte aligned");
}

} // namespace
