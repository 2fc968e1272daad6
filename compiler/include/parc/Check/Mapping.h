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
  int64_t tp = 0, pp = 0, dp = 0;
};

/// Megatron's rank layout: `order` lists the axes fastest-varying first, so with tp-dp-pp
/// rank = tp_rank + tp * dp_rank + tp * dp * pp_rank.
class RankLayout {
public:
  RankLayout() = default;
  RankLayout(int64_t tp, int64_t pp, int64_t dp, std::array<Axis, 3> order,
             int64_t gpusPerNode);

  int64_t world() const { return tp * pp * dp; }
  int64_t rankOf(Coords c) const;
  Coords coordsOf(int64_t rank) const;
  int64_t nodeOf(int64_t rank) const { return rank / gpusPerNode; }
  int64_t localRankOf(int64_t rank) const { return rank % gpusPerNode; }

  /// This rank's groups, each ordered by the coordinate that varies within it (pp by stage).
  std::vector<int64_t> tpGroup(int64_t rank) const;
  std::vector<int64_t> dpGroup(int64_t rank) const;
  std::vector<int64_t> ppGroup(int64_t rank) const;
  /// Expert parallelism, as Megatron-Core's expert rank generator lays it out with expert
  /// tensor parallelism = tp and the default order tp-cp-ep-dp-pp: ep carves runs of `ep`
  /// consecutive data-parallel coordinates. The ep group holds one run (by coordinate), over
  /// which tokens are exchanged; the expert-data-parallel group the ranks at the same position
  /// of every run, which hold the same experts and reduce their gradients.
  std::vector<int64_t> epGroup(int64_t rank) const;
  std::vector<int64_t> expertDataGroup(int64_t rank) const;
  /// This rank's position in its ep group: its experts are [epRank * E / ep, ...).
  int64_t epRankOf(int64_t rank) const { return coordsOf(rank).dp % ep; }
  /// tp x pp: every rank holding a part of one model replica, in rank order.
  std::vector<int64_t> modelGroup(int64_t rank) const;
  /// First and last stage of the pp group when the head is tied and pp > 1; else empty.
  std::vector<int64_t> embeddingGroup(int64_t rank, bool tiedHead) const;
  /// True when the ranks of `group`, one of the groups above (in ascending rank order), sit
  /// on more than one node.
  bool crossesNodes(const std::vector<int64_t> &group) const;
  /// The coordinate of `rank` along `axis`.
  int64_t coordOf(int64_t rank, Axis axis) const;
  /// True when some group along `axis` sits on more than one node. Costs at most
  /// min(world, gpusPerNode^2) steps, so that a huge cluster does not mean a huge loop.
  bool anyGroupCrossesNodes(Axis axis) const;
  /// The same for the ep groups, or with `expertData` the expert-data-parallel groups.
  bool anyExpertGroupCrossesNodes(bool expertData) const;
  int64_t sizeOf(Axis axis) const { return axis == Axis::TP ? tp : axis == Axis::PP ? pp : dp; }
  /// How far apart in rank numbers two neighbours along `axis` are.
  int64_t strideOf(Axis axis) const;
  /// The link a collective over `group` is limited by: inter-node as soon as it spans nodes.
  const LinkSpec &linkOf(const std::vector<int64_t> &group, const ClusterSpec &cluster) const {
    return crossesNodes(group) ? cluster.interNode : cluster.intraNode;
  }

  int64_t tp = 1, pp = 1, dp = 1, gpusPerNode = 1;
  std::array<Axis, 3> order = {Axis::TP, Axis::DP, Axis::PP};
  int64_t ep = 1; // divides dp

private:
  /// Whether some run of `size` ranks `stride` apart, as the groups of an axis of that size
  /// and stride are laid out, sits on more than one node.
  bool anyRunCrossesNodes(int64_t size, int64_t stride) const;
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
  int64_t tp = 1, pp = 1, dp = 1, chunks = 1;
  int64_t ep = 1;        // expert parallelism, carved from dp
  int64_t expertDp() const { return dp / ep; }
  int64_t microBatch = 1, globalBatch = 1;
  int64_t microbatches = 1; // M = global_batch / (micro_batch * dp)
  int64_t paddedVocab = 0;  // vocab rounded up to a multiple of 128 * tp (Megatron)
  RankLayout layout;
  StagePartition partition;
};

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
