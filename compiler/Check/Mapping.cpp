//===- Mapping.cpp - Rank layout, process groups and stage partition ------===//
//
// The layout is Megatron-Core's RankGenerator (RankGrid): a rank is a mixed-radix number whose
// digits are its coordinates, least significant digit first in `order`. A group over some
// axes is every rank that differs from this one only in those digits.
//
//===----------------------------------------------------------------------===//
#include "parc/Check/Mapping.h"

#include <algorithm>
#include <numeric>

namespace parc {

RankLayout::RankLayout(int64_t tp, int64_t pp, int64_t dp, const RankOrder &order,
                       int64_t gpusPerNode, int64_t cp, int64_t ep)
    : grid(axisSizes(tp, cp, 1, dp, pp), order),
      expertGrid(parc::expertGrid(tp, cp, ep, dp, pp, order)),
      gpusPerNode(gpusPerNode) {}

int64_t RankLayout::rankOf(Coords c) const {
  return grid.rankOf(axisSizes(c.tp, c.cp, 0, c.dp, c.pp));
}

Coords RankLayout::coordsOf(int64_t rank) const {
  AxisSizes c = grid.coordsOf(rank);
  return Coords{c[indexOf(Axis::TP)], c[indexOf(Axis::PP)], c[indexOf(Axis::DP)],
                c[indexOf(Axis::CP)]};
}

std::vector<int64_t> RankLayout::modelGroup(int64_t rank) const {
  std::vector<int64_t> group = grid.group(rank, {Axis::TP, Axis::PP});
  std::sort(group.begin(), group.end());
  return group;
}

std::vector<int64_t> RankLayout::embeddingGroup(int64_t rank, bool tiedHead) const {
  if (!tiedHead || sizeOf(Axis::PP) == 1)
    return {};
  // The first and last stage of this rank's pipeline, without building the whole group.
  int64_t stride = strideOf(Axis::PP);
  int64_t first = rank - grid.coord(rank, Axis::PP) * stride;
  return {first, first + (sizeOf(Axis::PP) - 1) * stride};
}

bool RankLayout::crossesNodes(const std::vector<int64_t> &group) const {
  // Every group is in ascending rank order and nodes are ranges of ranks.
  return !group.empty() && nodeOf(group.front()) != nodeOf(group.back());
}

bool RankLayout::expertGridAligned() const {
  for (Axis a : {Axis::TP, Axis::PP})
    if (grid.size(a) > 1 && grid.stride(a) != expertGrid.stride(a))
      return false;
  return true;
}

bool RankLayout::anyGroupCrossesNodes(const RankGrid &on, AxisSet axes) const {
  int64_t size = on.groupSize(axes);
  if (size == 1)
    return false;
  // A group's lowest and highest members are `span` apart and every group is one lowest
  // member `base` plus the same offsets, so a group crosses iff base % gpusPerNode + span
  // reaches the next node.
  int64_t span = 0, stride = world();
  for (Axis a : kAllAxes)
    if (axes.contains(a) && on.size(a) > 1) {
      span += (on.size(a) - 1) * on.stride(a);
      stride = std::min(stride, on.stride(a));
    }
  if (span >= gpusPerNode)
    return true;
  if (!on.contiguous(axes)) {
    for (int64_t rank = 0; rank < world(); ++rank)
      if (on.indexIn(rank, axes) == 0 && rank % gpusPerNode + span >= gpusPerNode)
        return true;
    return false;
  }
  // Consecutive digits: base = low + block * high with low < stride, and base % gpusPerNode
  // repeats once `high` has gone through gpusPerNode / gcd(block, gpusPerNode) values.
  int64_t block = stride * size;
  int64_t highs = std::min(world() / block, gpusPerNode / std::gcd(block, gpusPerNode));
  for (int64_t high = 0; high < highs; ++high)
    for (int64_t low = 0; low < stride; ++low)
      if ((low + block * high) % gpusPerNode + span >= gpusPerNode)
        return true;
  return false;
}

int64_t StagePartition::blocksOnStage(int64_t stage) const {
  int64_t n = 0;
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    auto [first, last] = range(stage, chunk);
    n += last - first;
  }
  return n;
}

double bubbleFraction(const Mapping &mapping, ScheduleKind schedule) {
  double idleStages = double(mapping.pp - 1);
  double work = double(mapping.microbatches);
  if (schedule == ScheduleKind::Interleaved)
    work *= double(mapping.chunks);
  return idleStages / work;
}

} // namespace parc
