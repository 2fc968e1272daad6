//===- LayoutTest.cpp - Megatron rank layout, groups and the comm model ---===//
#include "TestModels.h"
#include "parc/Check/Mapping.h"
#include "parc/Cost/CommModel.h"

#include "llvm/Support/SourceMgr.h"
#include "gtest/gtest.h"

#include <algorithm>
#include <set>

using namespace parc;

namespace {

using Order = RankOrder;

/// The six orders of tp, dp and pp (cp of size 1 follows them).
std::vector<Order> allOrders() {
  std::array<Axis, 3> o = {Axis::TP, Axis::DP, Axis::PP};
  std::sort(o.begin(), o.end());
  std::vector<Order> out;
  do
    out.push_back(RankOrder(llvm::ArrayRef<Axis>(o)));
  while (std::next_permutation(o.begin(), o.end()));
  return out;
}

std::string name(const Order &o) { return o.str({}); }

/// Every rank lies in exactly one group, and the group of each member is that same group.
void expectPartition(const RankLayout &layout,
                     std::vector<int64_t> (RankLayout::*groupOf)(int64_t) const,
                     int64_t expectedSize, const std::string &what) {
  std::set<int64_t> seen;
  for (int64_t r = 0; r < layout.world(); ++r) {
    std::vector<int64_t> group = (layout.*groupOf)(r);
    ASSERT_EQ(int64_t(group.size()), expectedSize) << what << " of rank " << r;
    EXPECT_TRUE(std::count(group.begin(), group.end(), r)) << what << " of rank " << r;
    for (int64_t member : group)
      EXPECT_EQ((layout.*groupOf)(member), group) << what << " of " << member;
    if (group.front() == *std::min_element(group.begin(), group.end()) && r == group.front())
      seen.insert(group.begin(), group.end());
  }
  EXPECT_EQ(int64_t(seen.size()), layout.world()) << what;
}

TEST(RankLayout, RankOfAndCoordsOfAreInverseForEveryOrder) {
  for (const Order &order : allOrders()) {
    RankLayout layout(2, 3, 4, order, 8);
    std::set<int64_t> ranks;
    for (int64_t r = 0; r < layout.world(); ++r) {
      Coords c = layout.coordsOf(r);
      EXPECT_LT(c.tp, 2);
      EXPECT_LT(c.pp, 3);
      EXPECT_LT(c.dp, 4);
      EXPECT_EQ(layout.rankOf(c), r) << name(order);
      ranks.insert(layout.rankOf(c));
    }
    EXPECT_EQ(int64_t(ranks.size()), 24) << name(order);
  }
}

TEST(RankLayout, FirstAxisInOrderVariesFastest) {
  RankLayout layout(2, 2, 2, {Axis::TP, Axis::DP, Axis::PP}, 8);
  EXPECT_EQ(layout.rankOf({1, 0, 0}), 1);
  EXPECT_EQ(layout.rankOf({0, 0, 1}), 2);
  EXPECT_EQ(layout.rankOf({0, 1, 0}), 4);
  RankLayout ppFirst(4, 2, 3, {Axis::PP, Axis::DP, Axis::TP}, 8);
  // rank = pp + 2 * dp + 6 * tp
  EXPECT_EQ(ppFirst.rankOf({3, 1, 2}), 1 + 2 * 2 + 6 * 3);
}

TEST(RankLayout, GroupsPartitionTheWorldForEveryOrder) {
  for (const Order &order : allOrders()) {
    RankLayout layout(2, 4, 3, order, 4);
    expectPartition(layout, &RankLayout::tpGroup, 2, "tp " + name(order));
    expectPartition(layout, &RankLayout::ppGroup, 4, "pp " + name(order));
    expectPartition(layout, &RankLayout::dpGroup, 3, "dp " + name(order));
    expectPartition(layout, &RankLayout::modelGroup, 8, "model " + name(order));
  }
}

TEST(RankLayout, GroupsVaryOnlyTheirOwnAxis) {
  for (const Order &order : allOrders()) {
    RankLayout layout(2, 3, 2, order, 4);
    for (int64_t r = 0; r < layout.world(); ++r) {
      Coords c = layout.coordsOf(r);
      std::vector<int64_t> pp = layout.ppGroup(r);
      for (int64_t stage = 0; stage < 3; ++stage) {
        Coords m = layout.coordsOf(pp[stage]);
        EXPECT_EQ(m.pp, stage) << "pp groups are ordered by stage";
        EXPECT_EQ(m.tp, c.tp);
        EXPECT_EQ(m.dp, c.dp);
      }
      for (int64_t member : layout.modelGroup(r))
        EXPECT_EQ(layout.coordsOf(member).dp, c.dp);
    }
  }
}

TEST(RankLayout, MatchesMegatronWorldEightExample) {
  RankLayout layout(2, 2, 2, {Axis::TP, Axis::DP, Axis::PP}, 8);
  using G = std::vector<int64_t>;
  EXPECT_EQ(layout.tpGroup(5), (G{4, 5}));
  EXPECT_EQ(layout.dpGroup(5), (G{5, 7}));
  EXPECT_EQ(layout.ppGroup(5), (G{1, 5}));
  EXPECT_EQ(layout.modelGroup(5), (G{0, 1, 4, 5}));
  EXPECT_EQ(layout.embeddingGroup(5, true), (G{1, 5}));
  EXPECT_TRUE(layout.embeddingGroup(5, false).empty());
  RankLayout noPipeline(2, 1, 4, {Axis::TP, Axis::DP, Axis::PP}, 8);
  EXPECT_TRUE(noPipeline.embeddingGroup(0, true).empty());
}

TEST(RankLayout, NodesAndCrossings) {
  RankLayout layout(4, 2, 2, {Axis::TP, Axis::DP, Axis::PP}, 4);
  EXPECT_EQ(layout.nodeOf(13), 3);
  EXPECT_EQ(layout.localRankOf(13), 1);
  EXPECT_FALSE(layout.crossesNodes(layout.tpGroup(13)));
  EXPECT_TRUE(layout.crossesNodes(layout.dpGroup(13)));
  EXPECT_FALSE(layout.anyGroupCrossesNodes(Axis::TP));
  EXPECT_TRUE(layout.anyGroupCrossesNodes(Axis::DP));
  EXPECT_TRUE(layout.anyGroupCrossesNodes(Axis::PP));
}

/// anyGroupCrossesNodes takes a shortcut; it must agree with looking at every group.
TEST(RankLayout, AnyGroupCrossesNodesAgreesWithBruteForce) {
  for (const Order &order : allOrders())
    for (int64_t gpus : {1, 2, 3, 4, 6, 8})
      for (int64_t tp : {1, 2, 3, 4})
        for (int64_t pp : {1, 2, 3})
          for (int64_t dp : {1, 2, 4}) {
            RankLayout layout(tp, pp, dp, order, gpus);
            if (layout.world() % gpus != 0)
              continue;
            for (Axis axis : {Axis::TP, Axis::PP, Axis::DP}) {
              bool any = false;
              for (int64_t r = 0; r < layout.world(); ++r) {
                std::vector<int64_t> g = axis == Axis::TP   ? layout.tpGroup(r)
                                         : axis == Axis::PP ? layout.ppGroup(r)
                                                            : layout.dpGroup(r);
                any |= layout.crossesNodes(g);
              }
              EXPECT_EQ(layout.anyGroupCrossesNodes(axis), any)
                  << name(order) << " gpus " << gpus << " tp " << tp << " pp " << pp << " dp " << dp
                  << " axis " << toString(axis);
            }
          }
}

TEST(Bubble, OneFOneBAndInterleaved) {
  Mapping m;
  m.pp = 4;
  m.microbatches = 8;
  m.chunks = 2;
  EXPECT_DOUBLE_EQ(bubbleFraction(m, ScheduleKind::OneFOneB), 3.0 / 8);
  EXPECT_DOUBLE_EQ(bubbleFraction(m, ScheduleKind::GPipe), 3.0 / 8);
  EXPECT_DOUBLE_EQ(bubbleFraction(m, ScheduleKind::Interleaved), 3.0 / 16);
  m.pp = 1;
  EXPECT_DOUBLE_EQ(bubbleFraction(m, ScheduleKind::OneFOneB), 0);
}

/// A small model whose 8 blocks and 8 GPUs leave every rule satisfied.
Program smallProgram() {
  Program p;
  p.model = test::eightBlockGPT();
  p.cluster.nodes = 2;
  p.cluster.gpusPerNode = 4;
  p.cluster.intraNode = p.cluster.interNode = {1e11, 1e-6};
  p.parallel.tp = 2;
  p.parallel.pp = 2;
  p.parallel.dpAuto = true;
  p.parallel.globalBatch = 16;
  return p;
}

struct Checked {
  std::optional<Mapping> mapping;
  std::string diagnostics;
};

Checked check(const Program &p) {
  llvm::SourceMgr sourceMgr;
  std::string text;
  llvm::raw_string_ostream os(text);
  DiagnosticEngine diags(sourceMgr, os);
  Checked out;
  out.mapping = checkMapping(p, diags);
  out.diagnostics = os.str();
  return out;
}

using Blocks = std::vector<std::pair<int64_t, int64_t>>;

TEST(CheckMapping, DerivesDpMicrobatchesAndVocab) {
  Checked c = check(smallProgram());
  ASSERT_TRUE(c.mapping) << c.diagnostics;
  EXPECT_EQ(c.mapping->dp, 2);
  EXPECT_EQ(c.mapping->microbatches, 8);
  EXPECT_EQ(c.mapping->paddedVocab, 1024);
  EXPECT_EQ(c.mapping->layout.world(), 8);
  EXPECT_EQ(c.mapping->partition.blocks, (Blocks{{0, 4}, {4, 8}}));
}

TEST(CheckMapping, InterleavedChunksAreVirtualStagesInOrder) {
  Program p = smallProgram();
  p.parallel.schedule = ScheduleKind::Interleaved;
  p.parallel.chunks = 2;
  Checked c = check(p);
  ASSERT_TRUE(c.mapping) << c.diagnostics;
  const StagePartition &part = c.mapping->partition;
  EXPECT_EQ(part.blocks, (Blocks{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  // Chunk 1 of stage 0 is virtual stage 2.
  EXPECT_EQ(part.range(0, 1), (std::pair<int64_t, int64_t>{4, 6}));
  EXPECT_EQ(part.blocksOnStage(0), 4);
  EXPECT_EQ(part.blocksOnStage(1), 4);
}

TEST(CheckMapping, StageLayersGiveUnevenStages) {
  Program p = smallProgram();
  p.parallel.stageLayers = {5, 3};
  Checked c = check(p);
  ASSERT_TRUE(c.mapping) << c.diagnostics;
  EXPECT_EQ(c.mapping->partition.blocks, (Blocks{{0, 5}, {5, 8}}));
  p.parallel.stageLayers = {5, 2};
  EXPECT_FALSE(check(p).mapping);
}

TEST(CheckMapping, ReportsEveryViolationAndReturnsNothing) {
  Program p = smallProgram();
  p.parallel.tp = 8; // splits neither 4 heads ...
  p.parallel.pp = 1;
  p.model.ffn = 500; // ... nor this ffn
  p.parallel.globalBatch = 3;
  p.parallel.microBatch = 2;
  Checked c = check(p);
  EXPECT_FALSE(c.mapping);
  EXPECT_NE(c.diagnostics.find("heads = 4"), std::string::npos) << c.diagnostics;
  EXPECT_NE(c.diagnostics.find("ffn = 500"), std::string::npos) << c.diagnostics;
  EXPECT_NE(c.diagnostics.find("global_batch = 3"), std::string::npos) << c.diagnostics;
}

/// Megatron-Core's expert rank generator (parallel_state.py, order tp-cp-ep-dp-pp with cp 1
/// and expert tp = tp): rank = tp + TP (ep + EP (edp + EDP pp)).
TEST(RankLayout, ExpertGroupsAreMegatronCoreExpertRanks) {
  const int64_t TP = 2, EP = 4, EDP = 2, PP = 2;
  RankLayout layout(TP, PP, EP * EDP, {Axis::TP, Axis::DP, Axis::PP}, 8, 1, EP);
  auto megatron = [&](int64_t t, int64_t e, int64_t d, int64_t p) {
    return t + TP * (e + EP * (d + EDP * p));
  };
  for (int64_t t = 0; t < TP; ++t)
    for (int64_t e = 0; e < EP; ++e)
      for (int64_t d = 0; d < EDP; ++d)
        for (int64_t p = 0; p < PP; ++p) {
          int64_t rank = megatron(t, e, d, p);
          std::vector<int64_t> ep, edp;
          for (int64_t i = 0; i < EP; ++i)
            ep.push_back(megatron(t, i, d, p));
          for (int64_t i = 0; i < EDP; ++i)
            edp.push_back(megatron(t, e, i, p));
          EXPECT_EQ(layout.epGroup(rank), ep) << "rank " << rank;
          EXPECT_EQ(layout.expertDataGroup(rank), edp) << "rank " << rank;
          EXPECT_EQ(layout.epRankOf(rank), e);
        }
}

TEST(RankLayout, ExpertGroupsPartitionTheRanksInEveryOrder) {
  for (const Order &order : allOrders()) {
    RankLayout layout(2, 2, 8, order, 8, 1, 4);
    EXPECT_TRUE(layout.expertGridAligned()) << name(order);
    expectPartition(layout, &RankLayout::epGroup, 4, "ep " + name(order));
    expectPartition(layout, &RankLayout::expertDataGroup, 2, "expert_dp " + name(order));
    for (int64_t r = 0; r < layout.world(); ++r) {
      // Both are inside the rank's data-parallel group.
      std::vector<int64_t> dp = layout.dpGroup(r);
      for (int64_t member : layout.epGroup(r))
        EXPECT_TRUE(std::count(dp.begin(), dp.end(), member)) << name(order);
    }
  }
}

/// With context parallelism Megatron-Core's expert grid (tp, ep, expert dp = dp x cp / ep,
/// pp, cp = 1, the same order) carves ep out of dp x cp together: in tp-cp-ep-dp-pp the
/// dense rank is t + TP (c + CP (d + DP p)) and the expert rank t + TP (e + EP (f + EDP p)).
TEST(RankLayout, ExpertGroupsCarvedFromDataAndContextParallel) {
  const int64_t TP = 2, CP = 2, DP = 4, PP = 2;
  for (int64_t EP : {2, 4, 8}) {
    const int64_t EDP = DP * CP / EP;
    RankLayout layout(TP, PP, DP, RankOrder(), 8, CP, EP);
    ASSERT_TRUE(layout.expertGridAligned()) << "ep " << EP;
    auto megatron = [&](int64_t t, int64_t e, int64_t f, int64_t p) {
      return t + TP * (e + EP * (f + EDP * p));
    };
    for (int64_t t = 0; t < TP; ++t)
      for (int64_t e = 0; e < EP; ++e)
        for (int64_t f = 0; f < EDP; ++f)
          for (int64_t p = 0; p < PP; ++p) {
            int64_t rank = megatron(t, e, f, p);
            std::vector<int64_t> ep, edp;
            for (int64_t i = 0; i < EP; ++i)
              ep.push_back(megatron(t, i, f, p));
            for (int64_t i = 0; i < EDP; ++i)
              edp.push_back(megatron(t, e, i, p));
            EXPECT_EQ(layout.epGroup(rank), ep) << "ep " << EP << " rank " << rank;
            EXPECT_EQ(layout.expertDataGroup(rank), edp) << "ep " << EP << " rank " << rank;
            EXPECT_EQ(layout.epRankOf(rank), e);
            // Tensor and pipeline groups are the dense grid's; ep and expert dp lie inside
            // the rank's dp x cp group.
            EXPECT_EQ(layout.expertGrid.group(rank, {Axis::TP}), layout.tpGroup(rank));
            EXPECT_EQ(layout.expertGrid.group(rank, {Axis::PP}), layout.ppGroup(rank));
            std::vector<int64_t> dpCp = layout.dpCpGroup(rank);
            for (int64_t member : ep)
              EXPECT_TRUE(std::count(dpCp.begin(), dpCp.end(), member)) << rank;
            for (int64_t member : edp)
              EXPECT_TRUE(std::count(dpCp.begin(), dpCp.end(), member)) << rank;
          }
    expectPartition(layout, &RankLayout::epGroup, EP, "ep " + std::to_string(EP));
    expectPartition(layout, &RankLayout::expertDataGroup, EDP, "edp " + std::to_string(EP));
  }
  // cp = 2, dp = 2, ep = 2: the ep group is the cp group, expert dp the dp group.
  RankLayout small(1, 1, 2, RankOrder(), 8, 2, 2);
  EXPECT_EQ(small.epGroup(0), small.cpGroup(0));
  EXPECT_EQ(small.expertDataGroup(1), small.dpGroup(1));
}

TEST(RankLayout, ExpertGridRefusesPipelineBetweenContextAndData) {
  // tp-cp-pp-dp: expert ranks t + TP (e + EP (f + EDP p)) would move the pipeline groups.
  RankOrder split({Axis::TP, Axis::CP, Axis::PP, Axis::DP});
  EXPECT_FALSE(RankLayout(2, 2, 2, split, 8, 2, 2).expertGridAligned());
  // Whatever ep: the expert grid folds cp into the expert dp.
  EXPECT_FALSE(RankLayout(2, 2, 2, split, 8, 2, 1).expertGridAligned());
  // Without context parallelism the same order carves ep from dp alone and keeps them.
  EXPECT_TRUE(RankLayout(2, 2, 4, split, 8, 1, 2).expertGridAligned());
}

} // namespace

//===----------------------------------------------------------------------===//
// Context parallelism: the groups of Megatron-Core's RankGenerator
//===----------------------------------------------------------------------===//

namespace {

using G = std::vector<int64_t>;
using Groups = std::vector<G>;

/// Expected groups derived by hand from Megatron-Core's megatron/core/parallel_state.py:
/// RankGenerator(tp, ep, dp, pp, cp, order).get_ranks(token) calls
/// generate_masked_orthogonal_rank_groups(world, ordered sizes, mask of the token's axes),
/// which lists group g (g decomposed over the unmasked sizes, the first axis of the order
/// fastest) with its members by their index over the masked sizes (likewise).
TEST(RankGrid, MatchesMegatronCoreRankGeneratorDefaultOrder) {
  // tp 2, cp 2, dp 2, pp 2, order "tp-cp-ep-dp-pp": rank = tp + 2 cp + 4 dp + 8 pp.
  RankGrid grid(axisSizes(2, 2, 1, 2, 2), RankOrder());
  EXPECT_EQ(grid.groups({Axis::TP}),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(grid.groups({Axis::CP}),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(grid.groups({Axis::DP}),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  // get_ranks('dp-cp'): members by (cp, dp) index, cp fastest as it comes first in the order.
  EXPECT_EQ(grid.groups({Axis::DP, Axis::CP}),
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(grid.groups({Axis::PP}),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  // get_ranks('tp-pp'): the model-parallel group.
  EXPECT_EQ(grid.groups({Axis::TP, Axis::PP}),
            (Groups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  // get_ranks('tp-cp'): tensor and context parallel.
  EXPECT_EQ(grid.groups({Axis::TP, Axis::CP}),
            (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(grid.indexIn(6, {Axis::DP, Axis::CP}), 3);
}

TEST(RankGrid, MatchesMegatronCoreRankGeneratorOtherOrders) {
  // "tp-dp-cp-pp" with pp 1: rank = tp + 2 dp + 4 cp; 'dp-cp' members by (dp, cp), dp fastest.
  RankGrid slowCp(axisSizes(2, 2, 1, 2, 1), RankOrder({Axis::TP, Axis::DP, Axis::CP, Axis::PP}));
  EXPECT_EQ(slowCp.groups({Axis::CP}), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(slowCp.groups({Axis::DP, Axis::CP}), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  // "cp-tp-pp-dp" with tp 2, cp 4, pp 1, dp 2: rank = cp + 4 tp + 8 dp.
  RankGrid cpFirst(axisSizes(2, 4, 1, 2, 1), RankOrder({Axis::CP, Axis::TP, Axis::PP, Axis::DP}));
  EXPECT_EQ(cpFirst.groups({Axis::CP}), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11},
                                                {12, 13, 14, 15}}));
  EXPECT_EQ(cpFirst.groups({Axis::TP}),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(cpFirst.groups({Axis::DP, Axis::CP}),
            (Groups{{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}}));
  // A three-axis order appends the unnamed axes, as RankGenerator does with size-1 ones.
  RankOrder threeAxes({Axis::TP, Axis::PP, Axis::DP});
  EXPECT_FALSE(threeAxes.names(Axis::CP));
  EXPECT_EQ(threeAxes.str(axisSizes(2, 1, 1, 2, 2)), "tp-pp-dp");
  EXPECT_EQ(RankOrder().str(axisSizes(2, 1, 1, 2, 2)), "tp-dp-pp");
  EXPECT_EQ(RankOrder().str(axisSizes(2, 2, 1, 2, 2)), "tp-cp-dp-pp");
}

TEST(RankLayout, ContextGroupsPartitionTheWorldAndCrossNodesAsBruteForceSays) {
  for (const RankOrder &order : parc::allOrders())
    for (int64_t gpus : {2, 4, 8})
      for (int64_t cp : {2, 4})
        for (int64_t tp : {1, 2})
          for (int64_t dp : {1, 2}) {
            RankLayout layout(tp, 2, dp, order, gpus, cp);
            expectPartition(layout, &RankLayout::cpGroup, cp, "cp " + order.str({}));
            expectPartition(layout, &RankLayout::dpCpGroup, dp * cp, "dp_cp " + order.str({}));
            for (AxisSet axes : {AxisSet{Axis::CP}, RankLayout::kGradientAxes}) {
              bool any = false;
              for (int64_t r = 0; r < layout.world(); ++r)
                any |= layout.crossesNodes(layout.group(r, axes));
              EXPECT_EQ(layout.anyGroupCrossesNodes(axes), any)
                  << order.str({}) << " gpus " << gpus << " cp " << cp << " tp " << tp;
            }
          }
}

} // namespace
