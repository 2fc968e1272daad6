//===- KernelsInitTest.cpp - counter-based initialisation -----------------===//
//
// The generator against Random123's known answers, shards against slices of the whole
// tensor, and the distribution of the values.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Init.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

using namespace parc::runtime;
using parc::plan::InitKind;
using parc::plan::Slice;

namespace {

using Vec = std::vector<double>;

TEST(KernelsInitTest, PhiloxMatchesRandom123KnownAnswers) {
  using Words = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}),
            (Words{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}),
            (Words{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (Words{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

/// The [rows x cols] block at (rowOffset, colOffset) of a row-major [8, 6] tensor.
Vec block(const Vec &whole, int64_t rowOffset, int64_t rows, int64_t colOffset, int64_t cols) {
  Vec part;
  for (int64_t r = rowOffset; r < rowOffset + rows; ++r)
    for (int64_t c = colOffset; c < colOffset + cols; ++c)
      part.push_back(whole[r * 6 + c]);
  return part;
}

TEST(KernelsInitTest, InitShardsAreSlicesOfTheWholeTensor) {
  const std::vector<int64_t> shape = {8, 6};
  const char *name = "block.0.attn.qkv.weight";
  Vec whole(48);
  initShard(whole.data(), 1234, name, shape, {{0, 8}, {0, 6}}, InitKind::Normal, 0.02);
  // Column-parallel shards split dim 0, row-parallel ones the last dim; a block splits both.
  const std::vector<std::vector<Slice>> slices = {
      {{0, 3}, {0, 6}}, {{3, 5}, {0, 6}}, {{0, 8}, {0, 2}}, {{0, 8}, {2, 4}}, {{2, 4}, {1, 3}}};
  for (const std::vector<Slice> &slice : slices) {
    Vec part(slice[0].size * slice[1].size);
    initShard(part.data(), 1234, name, shape, slice, InitKind::Normal, 0.02);
    EXPECT_EQ(part, block(whole, slice[0].offset, slice[0].size, slice[1].offset, slice[1].size));
  }
  // An fp32 shard holds the fp64 values rounded once.
  std::vector<float> single(48);
  initShard(single.data(), 1234, name, shape, {{0, 8}, {0, 6}}, InitKind::Normal, 0.02);
  for (size_t i = 0; i < whole.size(); ++i)
    EXPECT_EQ(single[i], float(whole[i]));
  // The plan entry gives the same values; another seed or name gives others.
  parc::plan::ParamShard shard;
  shard.name = name;
  shard.shape = shape;
  shard.slice = {{3, 5}, {0, 6}};
  shard.init = {InitKind::Normal, 0.02};
  Vec fromPlan(30), otherSeed(48), otherName(48);
  initShard(fromPlan.data(), 1234, shard);
  EXPECT_EQ(fromPlan, block(whole, 3, 5, 0, 6));
  initShard(otherSeed.data(), 1235, name, shape, {{0, 8}, {0, 6}}, InitKind::Normal, 0.02);
  initShard(otherName.data(), 1234, "block.1.attn.qkv.weight", shape, {{0, 8}, {0, 6}},
            InitKind::Normal, 0.02);
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_NE(otherSeed[i], whole[i]);
    EXPECT_NE(otherName[i], whole[i]);
  }
}

TEST(KernelsInitTest, InitIsNormalWithTheGivenStd) {
  const int64_t rows = 400, cols = 250, n = rows * cols;
  const double std = 0.02;
  Vec values(n);
  initShard(values.data(), 7, "embedding.word.weight", {rows, cols}, {{0, rows}, {0, cols}},
            InitKind::Normal, std);
  double mean = 0, square = 0;
  for (double x : values) {
    mean += x / n;
    square += x * x / n;
  }
  double sampleStd = std::sqrt(square - mean * mean);
  EXPECT_LT(std::abs(mean), 5 * std / std::sqrt(double(n))); // five standard errors
  EXPECT_NEAR(sampleStd / std, 1.0, 0.01);
  // About 68.3% of a normal lies within one std.
  double within =
      std::count_if(values.begin(), values.end(), [&](double x) { return std::abs(x) < std; });
  EXPECT_NEAR(within / n, 0.6827, 0.01);

  Vec constant(6, 5.0);
  initShard(constant.data(), 7, "ln.weight", {6}, {{0, 6}}, InitKind::Ones, 0.0);
  EXPECT_EQ(constant, Vec(6, 1.0));
  initShard(constant.data(), 7, "ln.bias", {6}, {{0, 6}}, InitKind::Zeros, 0.0);
  EXPECT_EQ(constant, Vec(6, 0.0));
}

// Shards above a million elements are filled by several threads; each element must still be
// the function of its global index alone (rows [1000, 4000) and cols [100, 900) of [6000, 1000]).
TEST(KernelsInitTest, LargeShardsAreFilledInParallelWithTheSameValues) {
  Vec shard(3000 * 800);
  initShard(shard.data(), 7, "w", {6000, 1000}, {{1000, 3000}, {100, 800}}, InitKind::Normal, 1.0);
  uint64_t hash = initNameHash("w");
  for (int64_t r = 0; r < 3000; ++r)
    for (int64_t c = 0; c < 800; ++c)
      ASSERT_EQ(shard[size_t(r * 800 + c)],
                initStandardNormal(7, hash, uint64_t((1000 + r) * 1000 + 100 + c)))
          << "row " << r << ", col " << c;
}

} // namespace
