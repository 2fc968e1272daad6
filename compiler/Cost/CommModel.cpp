//===- CommModel.cpp - Collectives and sends as NCCL runs them ------------===//
#include "parc/Cost/CommModel.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

namespace parc {

GroupGeometry geometryOf(int64_t ranks, int64_t stride, bool crossesNodes, int64_t gpusPerNode) {
  GroupGeometry g;
  g.ranks = ranks;
  if (ranks <= 1 || !crossesNodes) {
    g.ranksPerNode = std::max<int64_t>(ranks, 1);
    return g;
  }
  // Members sit `stride` apart: a node of G GPUs holds gcd(ranks * stride, G) / stride of
  // them when that is at least one (whole blocks of the group per node), else one.
  int64_t perNode = 1;
  if (stride < gpusPerNode) {
    int64_t span = std::gcd(ranks * stride, gpusPerNode);
    perNode = std::clamp<int64_t>(span / stride, 1, ranks);
  }
  g.ranksPerNode = perNode;
  g.nodes = (ranks + perNode - 1) / perNode;
  return g;
}

GroupGeometry geometryOf(const RankLayout &layout, Axis axis) {
  return geometryOf(layout, AxisSet{axis});
}

GroupGeometry geometryOf(const RankLayout &layout, AxisSet axes) {
  int64_t ranks = layout.sizeOf(axes), stride = layout.world();
  for (Axis a : kAllAxes)
    if (axes.contains(a) && layout.sizeOf(a) > 1)
      stride = std::min(stride, layout.strideOf(a));
  if (ranks <= 1 || layout.grid.contiguous(axes))
    return geometryOf(ranks, stride, layout.anyGroupCrossesNodes(axes), layout.gpusPerNode);
  std::map<int64_t, int64_t> perNode;
  for (int64_t rank : layout.group(0, axes))
    ++perNode[layout.nodeOf(rank)];
  GroupGeometry g;
  g.ranks = ranks;
  g.nodes = int64_t(perNode.size());
  for (const auto &entry : perNode)
    g.ranksPerNode = std::max(g.ranksPerNode, entry.second);
  return g;
}

GroupGeometry expertGeometry(const RankLayout &layout, bool expertData) {
  // One axis of the expert grid: its groups are evenly strided runs.
  Axis axis = expertData ? Axis::DP : Axis::EP;
  return geometryOf(layout.expertGrid.size(axis), layout.expertGrid.stride(axis),
                    layout.anyExpertGroupCrossesNodes(expertData), layout.gpusPerNode);
}

double CommModel::intraNodeBandwidth() const {
  double efficiency =
      cluster.intraNodeKind == IntraNodeKind::PCIe ? kPCIeEfficiency : kNVLinkEfficiency;
  return cluster.intraNode.bandwidth * efficiency;
}

double CommModel::busBandwidth(const GroupGeometry &group) const {
  if (!group.crossesNodes())
    return intraNodeBandwidth();
  // The adapters the group's GPUs own on one node: each GPU's share of the node's NICs (one
  // each when the cluster does not say).
  const double gpus = double(std::max<int64_t>(cluster.gpusPerNode, 1));
  const double nics = cluster.nicsPerNode > 0 ? double(cluster.nicsPerNode) : gpus;
  double adapters = double(group.ownRailOnly ? 1 : group.ranksPerNode) * nics / gpus;
  double network = adapters * cluster.interNode.bandwidth *
                   (group.ownRailOnly ? kOwnRailEfficiency : kNetworkEfficiency);
  return group.ranksPerNode > 1 ? std::min(intraNodeBandwidth(), network) : network;
}

double CommModel::ringSeconds(double bytes, const GroupGeometry &group, double shareOfBuffer,
                              double steps, double interSteps) const {
  double latency = kBaseLatency + (steps - interSteps) * cluster.intraNode.latency +
                   interSteps * cluster.interNode.latency;
  return latency + shareOfBuffer * bytes / busBandwidth(group);
}

double CommModel::allReduce(double bytes, const GroupGeometry &group) const {
  if (group.ranks <= 1 || bytes <= 0)
    return 0;
  double n = double(group.ranks), nodes = double(group.nodes);
  double ring = ringSeconds(bytes, group, 2 * (n - 1) / n, 2 * (n - 1), 2 * (nodes - 1));
  if (!group.crossesNodes())
    return ring;
  // Across many nodes NCCL switches to a tree, whose latency grows with log2(nodes).
  double tree = kBaseLatency +
                2 * (double(group.ranksPerNode - 1) * cluster.intraNode.latency +
                     std::ceil(std::log2(nodes)) * cluster.interNode.latency) +
                2 * (n - 1) / n * bytes / busBandwidth(group);
  return std::min(ring, tree);
}

double CommModel::allGather(double bytes, const GroupGeometry &group) const {
  if (group.ranks <= 1 || bytes <= 0)
    return 0;
  double n = double(group.ranks);
  return ringSeconds(bytes, group, (n - 1) / n, n - 1, double(group.nodes - 1));
}

double CommModel::reduceScatter(double bytes, const GroupGeometry &group) const {
  return allGather(bytes, group);
}

double CommModel::allToAll(double bytes, const GroupGeometry &group) const {
  if (group.ranks <= 1 || bytes <= 0)
    return 0;
  const double n = double(group.ranks), local = double(group.ranksPerNode);
  double intra = (local - 1) / n * bytes / intraNodeBandwidth();
  if (!group.crossesNodes())
    return kBaseLatency + cluster.intraNode.latency + intra;
  const double gpus = double(std::max<int64_t>(cluster.gpusPerNode, 1));
  const double nics = cluster.nicsPerNode > 0 ? double(cluster.nicsPerNode) : gpus;
  double inter = (n - local) / n * bytes /
                 (nics / gpus * cluster.interNode.bandwidth * kNetworkEfficiency);
  return kBaseLatency + cluster.interNode.latency + std::max(intra, inter);
}

double CommModel::send(double bytes, bool interNode) const {
  if (bytes <= 0)
    return 0;
  if (!interNode)
    return cluster.intraNode.latency + bytes / intraNodeBandwidth();
  return cluster.interNode.latency +
         bytes / (cluster.interNode.bandwidth * kNetworkEfficiency);
}

} // namespace parc
