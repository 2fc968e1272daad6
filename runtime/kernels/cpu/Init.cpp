//===- Init.cpp - Philox4x32-10, Box-Muller and shard initialisation ------===//
//
// See Init.h for the exact function every element is drawn from; changing anything here
// changes every initial weight of every run, so the known-answer tests pin it down.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Init.h"

#include "Parallel.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

namespace parc::runtime {

namespace {
// Random123's Philox4x32 multipliers and Weyl key increments.
constexpr uint32_t philoxM0 = 0xD2511F53, philoxM1 = 0xCD9E8D57;
constexpr uint32_t philoxW0 = 0x9E3779B9, philoxW1 = 0xBB67AE85;

std::array<uint32_t, 4> philoxRound(const std::array<uint32_t, 4> &c,
                                    const std::array<uint32_t, 2> &key) {
  uint64_t p0 = uint64_t(philoxM0) * c[0], p1 = uint64_t(philoxM1) * c[2];
  return {uint32_t(p1 >> 32) ^ c[1] ^ key[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ key[1],
          uint32_t(p0)};
}

// The top 53 bits of (high, low) as a multiple of 2^-53 in [0, 1).
double unitInterval(uint32_t high, uint32_t low) {
  return double(((uint64_t(high) << 32) | low) >> 11) * 0x1.0p-53;
}

constexpr double twoPi = 6.28318530717958647693;
} // namespace

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
  counter = philoxRound(counter, key);
  for (int round = 1; round < 10; ++round) {
    key[0] += philoxW0;
    key[1] += philoxW1;
    counter = philoxRound(counter, key);
  }
  return counter;
}

uint64_t initNameHash(llvm::StringRef name) {
  uint64_t hash = 0xcbf29ce484222325ULL; // FNV-1a 64 offset basis
  for (unsigned char c : name) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  // SplitMix64 finaliser
  hash = (hash ^ (hash >> 30)) * 0xbf58476d1ce4e5b9ULL;
  hash = (hash ^ (hash >> 27)) * 0x94d049bb133111ebULL;
  return hash ^ (hash >> 31);
}

double initStandardNormal(uint64_t seed, uint64_t nameHash, uint64_t index) {
  // z = sqrt(-2 ln u1) cos(2 pi u2), (u1, u2) from philox(counter = (index, seed), key = name)
  std::array<uint32_t, 4> bits =
      philox4x32({uint32_t(index), uint32_t(index >> 32), uint32_t(seed), uint32_t(seed >> 32)},
                 {uint32_t(nameHash), uint32_t(nameHash >> 32)});
  double u1 = 1.0 - unitInterval(bits[0], bits[1]); // (0, 1]: the logarithm stays finite
  double u2 = unitInterval(bits[2], bits[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(twoPi * u2);
}

template <typename T>
void initShard(T *out, uint64_t seed, llvm::StringRef name, llvm::ArrayRef<int64_t> globalShape,
               llvm::ArrayRef<plan::Slice> slice, plan::InitKind kind, double std) {
  assert(globalShape.size() == slice.size() && "one slice per dimension");
  int64_t count = 1;
  for (const plan::Slice &s : slice)
    count *= s.size;
  if (kind != plan::InitKind::Normal) {
    std::fill(out, out + count, T(kind == plan::InitKind::Ones ? 1 : 0));
    return;
  }
  // The shard is runs of its last dim; run r's first global flat index follows from r's local
  // coordinates in the other dims (mixed radix over the slice sizes) and the offsets.
  size_t rank = globalShape.size();
  std::vector<int64_t> strides(rank);
  int64_t stride = 1;
  for (size_t d = rank; d-- > 0;) {
    strides[d] = stride;
    stride *= globalShape[d];
  }
  int64_t runLength = rank ? slice.back().size : 1;
  int64_t runs = runLength ? count / runLength : 0;
  uint64_t nameHash = initNameHash(name);
  auto fillRuns = [&](int64_t begin, int64_t end) {
    for (int64_t run = begin; run < end; ++run) {
      int64_t first = rank ? slice.back().offset * strides[rank - 1] : 0;
      for (int64_t d = int64_t(rank) - 2, rest = run; d >= 0; --d) {
        first += (slice[size_t(d)].offset + rest % slice[size_t(d)].size) * strides[size_t(d)];
        rest /= slice[size_t(d)].size;
      }
      for (int64_t i = 0; i < runLength; ++i)
        out[run * runLength + i] = T(std * initStandardNormal(seed, nameHash, uint64_t(first + i)));
    }
  };
  // Every element is a pure function of its index, so the runs split over the kernel threads
  // (as many as the rank may use) without changing a bit; a 1.3B-parameter model would take
  // half a minute on one core.
  constexpr int64_t elementsPerChunk = int64_t(1) << 20;
  int64_t runsPerChunk = std::max<int64_t>(1, elementsPerChunk / std::max<int64_t>(1, runLength));
  cpu::detail::parallelFor(runs, runsPerChunk, fillRuns);
}

template <typename T> void initShard(T *out, uint64_t seed, const plan::ParamShard &shard) {
  initShard(out, seed, shard.name, shard.shape, shard.slice, shard.init.kind, shard.init.std);
}

template void initShard(float *, uint64_t, llvm::StringRef, llvm::ArrayRef<int64_t>,
                        llvm::ArrayRef<plan::Slice>, plan::InitKind, double);
template void initShard(double *, uint64_t, llvm::StringRef, llvm::ArrayRef<int64_t>,
                        llvm::ArrayRef<plan::Slice>, plan::InitKind, double);
template void initShard(float *, uint64_t, const plan::ParamShard &);
template void initShard(double *, uint64_t, const plan::ParamShard &);

} // namespace parc::runtime
