//===- CommModel.h - Collectives and sends as NCCL runs them --------------===//
//
// The communication half of the step-time model. A collective over a process group runs as
// NCCL's ring: an all-reduce moves 2 (n - 1) / n of its buffer through every rank, an
// all-gather or reduce-scatter (n - 1) / n, at the group's bus bandwidth, plus a base latency
// and one link latency per ring step (NVIDIA/nccl src/graph/tuning.cc). A group inside one
// node runs at its GPUs' NVLink (or PCIe) bandwidth. A group spanning nodes runs one ring per
// network adapter its GPUs own on each node (rails): its bus bandwidth is the smaller of one
// GPU's intra-node link and those adapters together, so a tp or dp group holding all 8 GPUs
// of a node uses all 8 adapters, and a group of one GPU per node uses that GPU's share; a
// geometry marked ownRailOnly (ZeRO 3's gathers, DataParallelWork.cpp) uses each GPU's share
// however many of its GPUs share a node. A point-to-point send (pipeline activations and
// gradients) crosses one link.
//
// `bytes` is always the size of the full buffer: the all-reduced tensor, the gathered output
// or the reduce-scatter input. A group of one rank communicates nothing and costs 0.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_COST_COMMMODEL_H
#define PARC_COST_COMMMODEL_H

#include "parc/Check/Mapping.h"
#include "parc/Sema/Program.h"

#include <algorithm>
#include <cstdint>

namespace parc {

/// Where the ranks of the widest group of one kind sit.
struct GroupGeometry {
  int64_t ranks = 1;
  int64_t nodes = 1;        // nodes the group spans
  int64_t ranksPerNode = 1; // its ranks on each of those nodes
  /// Its inter-node traffic leaves each GPU through that GPU's own adapter share instead of
  /// the rings over all the adapters its GPUs own on a node (ZeRO 3's gathers, see
  /// DataParallelWork.cpp).
  bool ownRailOnly = false;

  bool crossesNodes() const { return nodes > 1; }
};

/// The geometry of the groups along `axis` (exact for layouts whose groups align with nodes,
/// the widest spread otherwise). O(1) in the world size.
GroupGeometry geometryOf(const RankLayout &layout, Axis axis);
/// The same for the groups over several axes (data parallel with context: dp x cp); exact
/// for rank 0's group when the axes are not consecutive digits of the order.
GroupGeometry geometryOf(const RankLayout &layout, AxisSet axes);
/// The geometry of the ep groups, or with `expertData` of the expert-data-parallel groups.
GroupGeometry expertGeometry(const RankLayout &layout, bool expertData);
/// A group of `ranks` ranks laid out `stride` ranks apart.
GroupGeometry geometryOf(int64_t ranks, int64_t stride, bool crossesNodes, int64_t gpusPerNode);

class CommModel {
public:
  explicit CommModel(const ClusterSpec &cluster) : cluster(cluster) {}

  double allReduce(double bytes, const GroupGeometry &group) const;
  double allGather(double bytes, const GroupGeometry &group) const;
  double reduceScatter(double bytes, const GroupGeometry &group) const;
  /// Every rank sends `bytes / ranks` to each member (NCCL's grouped send/recv, as
  /// Megatron-Core's token dispatcher runs it): the peers on the same node over the
  /// intra-node link and the others over the rank's share of the node's adapters at once.
  double allToAll(double bytes, const GroupGeometry &group) const;
  /// One point-to-point message between two ranks, inside a node or across nodes.
  double send(double bytes, bool interNode) const;

  /// Bytes per second each rank's share of a ring moves (NCCL's "bus bandwidth").
  double busBandwidth(const GroupGeometry &group) const;

  /// NCCL's share of a link's bandwidth its rings reach: on NVLink it caps the bus bandwidth of
  /// an A100 at 235 of 300 GB/s (tuning.cc); over InfiniBand and PCIe, assumed.
  static constexpr double kNVLinkEfficiency = 235.0 / 300.0;
  static constexpr double kPCIeEfficiency = 0.8;
  static constexpr double kNetworkEfficiency = 0.9;
  /// The share of its own adapter that ZeRO 3's gathers and reduce-scatters reach (an
  /// ownRailOnly geometry), and how much slower the compute they overlap runs: measured, not
  /// derived, from DeepSpeed's ZeRO-3 runs of Narayanan et al. 2021 (DataParallelWork.cpp).
  static constexpr double kOwnRailEfficiency = 0.8;
  static constexpr double kGatherOverlapSlowdown = 0.37;
  /// The fixed cost of one ring collective with the Simple protocol (tuning.cc, baseLat).
  static constexpr double kBaseLatency = 8.4e-6;
  /// A collective that runs beside compute is not free: its kernels hold SMs (NCCL's ring
  /// channels, 16 of an A100's 108 with NVLink) and HBM bandwidth while they run, so the
  /// compute they overlap is slowed by about that share.
  static constexpr double kOverlapSlowdown = 0.15;
  /// What `comm` seconds of traffic cost beside `compute` seconds of kernels: the excess, and
  /// the slowdown of the compute it runs beside.
  static double exposedBeside(double comm, double compute,
                              double slowdown = kOverlapSlowdown) {
    return std::max(0.0, comm - compute) + slowdown * std::min(comm, compute);
  }

private:
  double ringSeconds(double bytes, const GroupGeometry &group, double shareOfBuffer,
                     double steps, double interSteps) const;
  double intraNodeBandwidth() const;

  const ClusterSpec &cluster;
};

} // namespace parc

#endif
