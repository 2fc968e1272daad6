//===- Mapping.cpp - Rank layout, process groups and stage partition ------===//
//
// The layout follows Megatron-LM's RankGenerator: a rank is a mixed-radix number whose digits
// are the tp, dp and pp coordinates, least significant digit first in `order`. A group along
// an axis is every rank that differs from this one only in that axis's digit.
//
//===----------------------------------------------------------------------===//
#include "parc/Check/Mapping.h"

#include <algorithm>
#include <numeric>

namespace parc {

RankLayout::RankLayout(int64_t tp, int64_t pp, int64_t dp, std::array<Axis, 3> order,
                       int64_t gpusPerNode)
    : tp(tp), pp(pp), dp(dp), gpusPerNode(gpusPerNode), order(order) {}

namespace {
int64_t &coord(Coords &c, Axis a) { return a == Axis::TP ? c.tp : a == Axis::PP ? c.pp : c.dp; }
} // namespace

int64_t RankLayout::rankOf(Coords c) const {
  int64_t rank = 0, stride = 1;
  for (Axis a : order) {
    rank += coord(c, a) * stride;
    stride *= sizeOf(a);
  }
  return rank;
}

Coords RankLayout::coordsOf(int64_t rank) const {
  Coords c;
  for (Axis a : order) {
    int64_t size = sizeOf(a);
    coord(c, a) = rank % size;
    rank /= size;
  }
  return c;
}

namespace {
/// The ranks that share every coordinate of `rank` except `axis`, by that coordinate.
std::vector<int64_t> alongAxis(const RankLayout &layout, int64_t rank, Axis axis) {
  Coords c = layout.coordsOf(rank);
  std::vector<int64_t> group;
  for (int64_t i = 0, n = layout.sizeOf(axis); i < n; ++i) {
    coord(c, axis) = i;
    group.push_back(layout.rankOf(c));
  }
  return group;
}
} // namespace

std::vector<int64_t> RankLayout::tpGroup(int64_t rank) const {
  return alongAxis(*this, rank, Axis::TP);
}
std::vector<int64_t> RankLayout::dpGroup(int64_t rank) const {
  return alongAxis(*this, rank, Axis::DP);
}
std::vector<int64_t> RankLayout::ppGroup(int64_t rank) const {
  return alongAxis(*this, rank, Axis::PP);
}

std::vector<int64_t> RankLayout::epGroup(int64_t rank) const {
  Coords c = coordsOf(rank);
  int64_t first = c.dp / ep * ep;
  std::vector<int64_t> group;
  for (c.dp = first; c.dp < first + ep; ++c.dp)
    group.push_back(rankOf(c));
  return group;
}

std::vector<int64_t> RankLayout::expertDataGroup(int64_t rank) const {
  Coords c = coordsOf(rank);
  std::vector<int64_t> group;
  for (c.dp %= ep; c.dp < dp; c.dp += ep)
    group.push_back(rankOf(c));
  return group;
}

std::vector<int64_t> RankLayout::modelGroup(int64_t rank) const {
  Coords c = coordsOf(rank);
  std::vector<int64_t> group;
  for (c.pp = 0; c.pp < pp; ++c.pp)
    for (c.tp = 0; c.tp < tp; ++c.tp)
      group.push_back(rankOf(c));
  std::sort(group.begin(), group.end());
  return group;
}

std::vector<int64_t> RankLayout::embeddingGroup(int64_t rank, bool tiedHead) const {
  if (!tiedHead || pp == 1)
    return {};
  Coords c = coordsOf(rank);
  c.pp = 0;
  int64_t first = rankOf(c);
  c.pp = pp - 1;
  return {first, rankOf(c)};
}

bool RankLayout::crossesNodes(const std::vector<int64_t> &group) const {
  // Every group is in ascending rank order and nodes are ranges of ranks.
  return !group.empty() && nodeOf(group.front()) != nodeOf(group.back());
}

int64_t RankLayout::coordOf(int64_t rank, Axis axis) const {
  Coords c = coordsOf(rank);
  return coord(c, axis);
}

int64_t RankLayout::strideOf(Axis axis) const {
  int64_t stride = 1;
  for (Axis a : order) {
    if (a == axis)
      break;
    stride *= sizeOf(a);
  }
  return stride;
}

bool RankLayout::anyGroupCrossesNodes(Axis axis) const {
  return anyRunCrossesNodes(sizeOf(axis), strideOf(axis));
}

bool RankLayout::anyExpertGroupCrossesNodes(bool expertData) const {
  int64_t stride = strideOf(Axis::DP);
  return expertData ? anyRunCrossesNodes(dp / ep, stride * ep) : anyRunCrossesNodes(ep, stride);
}

bool RankLayout::anyRunCrossesNodes(int64_t size, int64_t stride) const {
  if (size == 1)
    return false;
  int64_t span = (size - 1) * stride;
  if (span >= gpusPerNode)
    return true;
  // The group whose axis coordinate is 0 starts at base = low + stride * size * high, with
  // low < stride. Its node changes iff base % gpusPerNode + span reaches the next node, and
  // base % gpusPerNode repeats once `high` has gone through gpusPerNode / gcd(block,
  // gpusPerNode) values.
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
