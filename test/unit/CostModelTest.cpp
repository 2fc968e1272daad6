//===- CostModelTest.cpp - The step-time model's formulas by hand ---------===//
#include "TestModels.h"
#include "parc/Cost/CommModel.h"
#include "parc/Cost/GPUModel.h"
#include "parc/Cost/MemoryModel.h"
#include "parc/Cost/StageWork.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace parc;

namespace {

/// DGX A100: 8 GPUs on NVSwitch (300 GB/s a direction), 8 HDR adapters of 25 GB/s per node.
ClusterSpec dgxA100(int64_t nodes) {
  ClusterSpec c;
  c.nodes = nodes;
  c.gpusPerNode = 8;
  c.gpuKind = GPUKind::A100_80GB;
  c.gpuFlops = 312e12;
  c.gpuMemoryBandwidth = 2039e9;
  c.gpuSMs = 108;
  c.intraNode = {300e9, 3.4e-6};
  c.interNode = {25e9, 5e-6};
  c.nicsPerNode = 8;
  c.hasInterNode = nodes > 1;
  return c;
}

constexpr double GiB = 1073741824.0;

TEST(CommModel, RingAllReduceOfOneGiBOverOneNode) {
  ClusterSpec cluster = dgxA100(1);
  CommModel comm(cluster);
  GroupGeometry node = geometryOf(8, 1, false, 8);
  EXPECT_EQ(node.nodes, 1);
  EXPECT_EQ(node.ranksPerNode, 8);
  // 2 (n - 1) / n of the buffer at NCCL's 235 GB/s NVLink bus bandwidth, the base latency
  // and 2 (n - 1) = 14 ring steps of 3.4 us.
  double expected = 8.4e-6 + 14 * 3.4e-6 + 2.0 * 7 / 8 * GiB / 235e9;
  EXPECT_NEAR(comm.allReduce(GiB, node), expected, 1e-12);
  EXPECT_NEAR(expected, 8.0519e-3, 1e-7);
  // An all-gather or reduce-scatter moves half of it in 7 steps.
  EXPECT_NEAR(comm.allGather(GiB, node), 8.4e-6 + 7 * 3.4e-6 + 7.0 / 8 * GiB / 235e9, 1e-12);
  EXPECT_EQ(comm.allReduce(GiB, geometryOf(1, 1, false, 8)), 0);
}

TEST(CommModel, HierarchicalAllReduceOverTwoNodes) {
  ClusterSpec cluster = dgxA100(2);
  CommModel comm(cluster);
  // tp-dp-pp with tp 8: a dp group of 16 ranks 1 apart fills both nodes, 8 a node, and owns
  // all 8 adapters of each: min(235 GB/s NVLink, 8 x 25 GB/s x 0.9).
  GroupGeometry both = geometryOf(16, 1, true, 8);
  EXPECT_EQ(both.nodes, 2);
  EXPECT_EQ(both.ranksPerNode, 8);
  EXPECT_DOUBLE_EQ(comm.busBandwidth(both), 180e9);
  // Two nodes: the tree's latency (7 intra-node steps and one inter-node, each way) beats the
  // ring's 28 + 2 steps.
  double tree = 8.4e-6 + 2 * (7 * 3.4e-6 + 1 * 5e-6);
  double expected = tree + 2.0 * 15 / 16 * GiB / 180e9;
  EXPECT_NEAR(comm.allReduce(GiB, both), expected, 1e-12);
  EXPECT_NEAR(expected, 11.2508e-3, 1e-7);
  // One GPU per node (ranks 8 apart): only that GPU's adapter.
  GroupGeometry sparse = geometryOf(2, 8, true, 8);
  EXPECT_EQ(sparse.ranksPerNode, 1);
  EXPECT_DOUBLE_EQ(comm.busBandwidth(sparse), 22.5e9);
  // ZeRO 3's gathers leave each GPU through its own adapter, however many share the node, at
  // the share of it DeepSpeed's ZeRO-3 runs show (80 %).
  GroupGeometry ownRail = both;
  ownRail.ownRailOnly = true;
  EXPECT_DOUBLE_EQ(comm.busBandwidth(ownRail), 20e9);
  EXPECT_NEAR(comm.allGather(GiB, ownRail),
              8.4e-6 + 14 * 3.4e-6 + 1 * 5e-6 + 15.0 / 16 * GiB / 20e9, 1e-12);
  // Half as many adapters per node halve a node-filling group's network bandwidth.
  cluster.nicsPerNode = 4;
  EXPECT_DOUBLE_EQ(CommModel(cluster).busBandwidth(both), 90e9);
  EXPECT_DOUBLE_EQ(CommModel(cluster).busBandwidth(ownRail), 10e9);
}

// ZeRO 3 over dp 16 on two DGX nodes (8 blocks of hidden 2048, tp 1, pp 1): the forward shows what its
// compute (kernel launches, on these infinitely fast GPUs) cannot hide of every layer's weight
// gather over each GPU's own adapter, and the first layer's gather again.
TEST(DataParallelWork, ZeroThreeGathersRunOnEachGPUsOwnAdapter) {
  Program p;
  p.model = test::eightBlockGPT();
  p.model.hidden = 2048; // 50 M parameters a block: a gather is bandwidth-bound
  p.model.ffn = p.model.layers[1].ffn = 8192;
  p.cluster = dgxA100(2);
  p.cluster.gpuFlops = p.cluster.gpuMemoryBandwidth = 1e30;
  p.parallel.dpAuto = true;
  p.parallel.globalBatch = 16;
  p.parallel.zero = 3;
  Mapping m = test::mapped(p);
  ASSERT_EQ(m.dp, 16);
  WorkTable work = buildWorkTable(p, m);
  const VirtualStageWork &w = work.virtualStages[0];
  const double layers = double(w.lastBlock - w.firstBlock);
  GroupGeometry dp = work.dp;
  ASSERT_EQ(dp.ranksPerNode, 8);
  dp.ownRailOnly = true;
  CommModel comm(p.cluster);
  // The forward gathers the word embedding, the positions alone, each block (its two halves
  // are one 50 M bucket) and, for the tied head, the word embedding again: 11 gathers in bf16.
  ZeroPolicy policy = zeroPolicy(p.parallel, 16);
  std::vector<ParamUnit> units = virtualStageUnits(p.model, m, 0);
  ZeroGathers g =
      gathersAroundUse(p.model, {policy, units, policy, {}, true, /*tiedHead=*/true}, false)
          .dense;
  ASSERT_EQ(g.forward.collectives, 11);
  double n = double(g.forward.collectives);
  double gather = n * comm.allGather(g.forward.elements * 2 / n, dp);
  // What the forward's compute cannot hide, 37 % of what it does, and the first layer's.
  double compute = w.forward.compute();
  EXPECT_NEAR(w.forward.zero,
              std::max(0.0, gather - compute) +
                  CommModel::kGatherOverlapSlowdown * std::min(gather, compute) + gather / layers,
              1e-9 * gather);
  // The node's 8 adapters together would have made it several times cheaper.
  EXPECT_GT(gather, 4 * n * comm.allGather(g.forward.elements * 2 / n, work.dp));
}

TEST(GPUModel, GemmAtTwoShapes) {
  ClusterSpec cluster = dgxA100(1);
  GPUModel gpu(cluster, DType::BF16);
  // 8192^3: 2048 tiles of 256 x 128 in 19 waves over 108 SMs, K falloff 8192 / (8192 + 64),
  // times the A100's ceiling: 0.86 (MAMF) x 0.9 (sustained).
  double big = 0.86 * 0.9 * (2048.0 / (19 * 108)) * (8192.0 / (8192 + 64));
  EXPECT_NEAR(gpu.gemmEfficiency(8192, 8192, 8192), big, 1e-12);
  EXPECT_NEAR(gpu.gemmSeconds(8192, 8192, 8192), 2 * std::pow(8192.0, 3) / (312e12 * big),
              1e-15);
  // 2048 x 192 x 12288 makes only 32 tiles of 128 x 128 (the last column of tiles half
  // empty): split K 16 ways they fill 5 waves, at 0.9 of the big tile's rate and 0.9 for the
  // split.
  double thin = 0.86 * 0.9 * (2048.0 * 192 * 16 / (5 * 108 * 128 * 128)) * 0.9 * 0.9 *
                (12288.0 / 12352);
  EXPECT_NEAR(gpu.gemmEfficiency(2048, 192, 12288), thin, 1e-12);
  EXPECT_LT(gpu.gemmEfficiency(2048, 192, 12288), 0.6 * big);
  // A tiny GEMM takes at least a kernel launch.
  EXPECT_DOUBLE_EQ(gpu.gemmSeconds(16, 16, 16), GPUModel::kKernelFloor);
}

TEST(GPUModel, MemoryBoundKernelsMoveBytesAtTheCeiling) {
  GPUModel gpu(dgxA100(1), DType::BF16);
  EXPECT_DOUBLE_EQ(gpu.memorySeconds(1e9), 1e9 / (2039e9 * 0.85));
  EXPECT_DOUBLE_EQ(gpu.memorySeconds(1, 3), 3 * GPUModel::kKernelFloor);
}

TEST(GPUModel, FlashAttentionRunsThePaddedHeadKernel) {
  GPUModel gpu(dgxA100(1), DType::BF16);
  // 1 TFLOP of forward at head 128 over 8192 keys: 0.60 x 0.9 of 312 TFLOP/s times the
  // sequence's share 8192 / (8192 + 256); the head's falloff is 1 at 128.
  double share = 0.60 * 0.9 * 8192.0 / (8192 + 256);
  EXPECT_NEAR(gpu.flashSeconds(1e12, 8192, 128, false), 1e12 / (312e12 * share), 1e-15);
  // Head 112 (MPT-30B's 7168 / 64) runs the 128 kernel: the same heads and tokens do
  // 112/128 of the useful FLOPs in the time of head 128's.
  EXPECT_NEAR(gpu.flashSeconds(1e12 * 112 / 128, 8192, 112, false),
              gpu.flashSeconds(1e12, 8192, 128, false), 1e-15);
  // Head 64 is a kernel of its own, at 64/80 over 128/144 of head 128's share.
  double share64 = share * (64.0 / 80) / (128.0 / 144);
  EXPECT_NEAR(gpu.flashSeconds(1e12, 8192, 64, true) * 0.45 / 0.60,
              1e12 / (312e12 * share64), 1e-15);
}

} // namespace

TEST(CommModel, AllToAllInsideAndAcrossNodes) {
  ClusterSpec cluster = dgxA100(2);
  CommModel comm(cluster);
  // Inside one node: 7/8 of the buffer leaves each rank over NVLink (235 GB/s bus).
  GroupGeometry node = geometryOf(8, 1, false, 8);
  EXPECT_NEAR(comm.allToAll(GiB, node), 8.4e-6 + 3.4e-6 + 7.0 / 8 * GiB / 235e9, 1e-12);
  // 16 ranks on two nodes: 7/16 to the node's peers, 8/16 at once over the rank's own
  // adapter (8 adapters for 8 GPUs, 25 GB/s x 0.9); the slower part bounds it.
  GroupGeometry both = geometryOf(16, 1, true, 8);
  double inter = 8.0 / 16 * GiB / (25e9 * 0.9);
  EXPECT_NEAR(comm.allToAll(GiB, both), 8.4e-6 + 5e-6 + inter, 1e-12);
  EXPECT_EQ(comm.allToAll(GiB, geometryOf(1, 1, false, 8)), 0);
}
