//===- Mapping.h - The parallel mapping with everything derived -----------===//
//
// The output of the feasibility checks (compiler/Check): the rank layout and its process
// groups, the blocks of each pipeline stage, the number of microbatches and the padded vocab.
// Only built when every divisibility rule holds, so later stages (cost model, lowering) can
// rely on it without re-checking.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_CHECK_MAPPING_H
#define PARC_CHECK_MAPPING_H

#include "parc/Sema/Program.h"
#include "parc/Support/Diagnostics.h"

#include <optional>
#include <vector>

namespace parc {

struct Coords {
  int64_t tp = 0, pp = 0, dp = 0, cp = 0;
};

/// Megatron-Core's rank layout (RankGrid) placed on the cluster's nodes: with the default
/// order tp-cp-ep-dp-pp, rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)).
class RankLayout {
public:
  RankLayout() = default;
  RankLayout(int64_t tp, int64_t pp, int64_t dp, const RankOrder &order, int64_t gpusPerNode,
             int64_t cp = 1, int64_t ep = 1);

  int64_t world() const { return grid.world(); }
  int64_t rankOf(Coords c) const;
  Coords coordsOf(int64_t rank) const;
  int64_t nodeOf(int64_t rank) const { return rank / gpusPerNode; }
  int64_t localRankOf(int64_t rank) const { return rank % gpusPerNode; }

  /// This rank's group over `axes`, member i the one of index i (Megatron's get_ranks).
  std::vector<int64_t> group(int64_t rank, AxisSet axes) const { return grid.group(rank, axes); }
  /// This rank's groups, each ordered by the coordinate that varies within it (pp by stage).
  std::vector<int64_t> tpGroup(int64_t rank) const { return group(rank, {Axis::TP}); }
  std::vector<int64_t> dpGroup(int64_t rank) const { return group(rank, {Axis::DP}); }
  std::vector<int64_t> ppGroup(int64_t rank) const { return group(rank, {Axis::PP}); }
  std::vector<int64_t> cpGroup(int64_t rank) const { return group(rank, {Axis::CP}); }
  /// Data parallel with context parallel (Megatron's "dp-cp"): the ranks holding one model
  /// shard, over which gradients are reduced and ZeRO shards.
  std::vector<int64_t> dpCpGroup(int64_t rank) const { return group(rank, kGradientAxes); }
  /// Expert parallelism, from Megatron-Core's expert rank generator (parallel_state.py,
  /// initialize_model_parallel): a second grid over the same ranks and order with expert
  /// tensor parallelism = tp, ep, expert dp = dp * cp / ep and cp = 1, so that ep is carved
  /// out of dp x cp together. The ep group exchanges tokens; the expert-data-parallel group
  /// holds the same experts and reduces their gradients.
  std::vector<int64_t> epGroup(int64_t rank) const { return expertGrid.group(rank, {Axis::EP}); }
  std::vector<int64_t> expertDataGroup(int64_t rank) const {
    return expertGrid.group(rank, {Axis::DP});
  }
  /// This rank's position in its ep group: its experts are [epRank * E / ep, ...).
  int64_t epRankOf(int64_t rank) const { return expertGrid.coord(rank, Axis::EP); }
  int64_t ep() const { return expertGrid.size(Axis::EP); }
  /// tp x pp: every rank holding a part of one model replica, in rank order.
  std::vector<int64_t> modelGroup(int64_t rank) const;
  /// First and last stage of the pp group when the head is tied and pp > 1; else empty.
  std::vector<int64_t> embeddingGroup(int64_t rank, bool tiedHead) const;
  /// True when the ranks of `group`, one of the groups above (in ascending rank order), sit
  /// on more than one node.
  bool crossesNodes(const std::vector<int64_t> &group) const;
  /// True when some group over `axes` sits on more than one node. Costs at most
  /// min(world, gpusPerNode^2) steps when the axes are consecutive digits of the order, so
  /// that a huge cluster does not mean a huge loop; a group of scattered digits costs one step
  /// per group.
  bool anyGroupCrossesNodes(AxisSet axes) const { return anyGroupCrossesNodes(grid, axes); }
  bool anyGroupCrossesNodes(Axis axis) const { return anyGroupCrossesNodes(AxisSet{axis}); }
  int64_t sizeOf(Axis axis) const { return grid.size(axis); }
  int64_t sizeOf(AxisSet axes) const { return grid.groupSize(axes); }
  /// The same for the ep groups, or with `expertData` the expert-data-parallel groups.
  bool anyExpertGroupCrossesNodes(bool expertData) const {
    return anyGroupCrossesNodes(expertGrid, expertData ? AxisSet{Axis::DP} : AxisSet{Axis::EP});
  }
  /// How far apart in rank numbers two neighbours along `axis` are.
  int64_t strideOf(Axis axis) const { return grid.stride(axis); }
  /// The order as it reads: tp-dp-pp without context or expert parallelism, tp-cp-dp-pp
  /// with cp, tp-ep-dp-pp with ep (where the order names them).
  std::string orderText() const {
    AxisSizes sizes = grid.axisSizes();
    sizes[indexOf(Axis::EP)] = ep();
    return grid.order().str(sizes);
  }
  /// The link a collective over `group` is limited by: inter-node as soon as it spans nodes.
  const LinkSpec &linkOf(const std::vector<int64_t> &group, const ClusterSpec &cluster) const {
    return crossesNodes(group) ? cluster.interNode : cluster.intraNode;
  }

  /// The axes gradients are reduced over: data and context parallelism.
  static constexpr AxisSet kGradientAxes = {Axis::DP, Axis::CP};

  RankGrid grid;
  /// Megatron-Core's expert grid; its tp and pp groups are the grid's (expertGridAligned).
  RankGrid expertGrid;
  int64_t gpusPerNode = 1;
  /// Megatron-Core asserts that the expert grid's pipeline groups are the dense grid's; parc
  /// also keeps its tensor groups. Both hold unless the order splits dp from cp by tp or pp.
  bool expertGridAligned() const;

private:
  bool anyGroupCrossesNodes(const RankGrid &on, AxisSet axes) const;
};

/// Which transformer blocks each virtual pipeline stage holds. With `chunks` model chunks per
/// pipeline rank, chunk c of stage s is virtual stage c * pp + s (Megatron's interleaving).
struct StagePartition {
  int64_t pp = 1, chunks = 1;
  /// [first, last) block of virtual stage v, indexed v = chunk * pp + stage.
  std::vector<std::pair<int64_t, int64_t>> blocks;

  std::pair<int64_t, int64_t> range(int64_t stage, int64_t chunk) const {
    return blocks[chunk * pp + stage];
  }
  int64_t blocksOnStage(int64_t stage) const;
};

struct Mapping {
  int64_t tp = 1, pp = 1, dp = 1, cp = 1, chunks = 1;
  int64_t ep = 1; // expert parallelism, carved from dp x cp
  int64_t expertDp() const { return dp * cp / ep; }
  int64_t microBatch = 1, globalBatch = 1;
  int64_t microbatches = 1; // M = global_batch / (micro_batch * dp)
  /// Ranks that hold one model shard and each a share of the batch's tokens: dp x cp. The
  /// gradients are reduced, and ZeRO shards the model states, over them.
  int64_t gradientRanks() const { return dp * cp; }
  int64_t paddedVocab = 0;  // vocab rounded up to a multiple of 128 * tp (Megatron)
  RankLayout layout;
  StagePartition partition;
};

/// The forward and backward passes of every stage's chunks and microbatches that a step time
/// simulates, bounded by limits::MaxStepPasses (no overflow for pp x chunks <= MaxBlocks and
/// M <= MaxMicrobatches).
inline int64_t stepPasses(int64_t pp, int64_t chunks, int64_t microbatches) {
  return 2 * pp * chunks * microbatches;
}

/// The fraction of a step the pipeline sits idle: (pp - 1) / M for GPipe and 1F1B (same
/// bubble, 1F1B only bounds the activations in flight), (pp - 1) / (chunks * M) interleaved
/// (Narayanan et al. 2021, section 2.2).
double bubbleFraction(const Mapping &mapping, ScheduleKind schedule);

/// Applies every rank and divisibility rule to `program`, reporting each violation as a located
/// diagnostic with a fix, plus the warnings (tp across nodes, bubbles). Returns the derived
/// mapping when no rule failed.
std::optional<Mapping> checkMapping(const Program &program, DiagnosticEngine &diags);

} // namespace parc

#endif
