//===- LayoutPrinter.cpp - The rank layout as text (--emit=layout) --------===//
//
// One line per rank, so the listing is O(world): a group of more than MaxListed ranks shows
// its first ranks, "..", its last and its size, and only those members are computed.
//
//===----------------------------------------------------------------------===//
#include "parc/Check/LayoutPrinter.h"

#include "llvm/ADT/STLFunctionalExtras.h"

namespace parc {

namespace {

constexpr int64_t MaxListed = 16;

/// A group of `size` ranks in ascending order, member i given by `member(i)`.
void printGroup(llvm::StringRef name, int64_t size, llvm::function_ref<int64_t(int64_t)> member,
                const RankLayout &layout, llvm::raw_ostream &os) {
  os << " | " << name << " [";
  bool abbreviated = size > MaxListed;
  int64_t shown = abbreviated ? MaxListed / 2 : size;
  for (int64_t i = 0; i < shown; ++i)
    os << (i ? "," : "") << member(i);
  if (abbreviated)
    os << ",..," << member(size - 1) << "] (" << size << " ranks) ";
  else
    os << "] ";
  if (size < 2)
    os << "-";
  else
    os << (layout.nodeOf(member(0)) != layout.nodeOf(member(size - 1)) ? "inter" : "intra");
}

/// The group over `axes` of `grid` (the layout's, or its expert grid) that holds `rank`,
/// member by member.
void printAxesGroup(llvm::StringRef name, AxisSet axes, int64_t rank, const RankLayout &layout,
                    llvm::raw_ostream &os, const RankGrid &grid) {
  printGroup(
      name, grid.groupSize(axes), [&](int64_t i) { return grid.member(rank, axes, i); },
      layout, os);
}

void printAxesGroup(llvm::StringRef name, AxisSet axes, int64_t rank, const RankLayout &layout,
                    llvm::raw_ostream &os) {
  printAxesGroup(name, axes, rank, layout, os, layout.grid);
}

} // namespace

void printLayout(const Mapping &mapping, const Program &program, llvm::raw_ostream &os) {
  const RankLayout &layout = mapping.layout;
  // Context parallelism's coordinate and groups appear only when cp > 1, so the lines of
  // every other layout stay as they were.
  bool cp = layout.sizeOf(Axis::CP) > 1;
  os << "layout world " << layout.world() << ", nodes " << program.cluster.nodes
     << " x gpus_per_node " << layout.gpusPerNode << ", tp " << layout.sizeOf(Axis::TP) << " pp "
     << layout.sizeOf(Axis::PP) << " dp " << layout.sizeOf(Axis::DP);
  if (cp)
    os << " cp " << layout.sizeOf(Axis::CP);
  bool experts = program.model.hasExperts();
  if (experts)
    os << " ep " << layout.ep();
  os << ", order " << layout.orderText() << "\n";
  bool tied = program.model.tiedHead();
  for (int64_t rank = 0; rank < layout.world(); ++rank) {
    Coords c = layout.coordsOf(rank);
    os << "rank " << rank << " node " << layout.nodeOf(rank) << " local "
       << layout.localRankOf(rank) << " coords tp=" << c.tp << " pp=" << c.pp << " dp=" << c.dp;
    if (cp)
      os << " cp=" << c.cp;
    printAxesGroup("tp", {Axis::TP}, rank, layout, os);
    printAxesGroup("dp", {Axis::DP}, rank, layout, os);
    printAxesGroup("pp", {Axis::PP}, rank, layout, os);
    if (cp) {
      printAxesGroup("cp", {Axis::CP}, rank, layout, os);
      printAxesGroup("dp_cp", RankLayout::kGradientAxes, rank, layout, os);
    }
    printAxesGroup("model", {Axis::TP, Axis::PP}, rank, layout, os);
    std::vector<int64_t> embedding = layout.embeddingGroup(rank, tied); // two ranks at most
    printGroup(
        "embedding", int64_t(embedding.size()), [&](int64_t i) { return embedding[size_t(i)]; },
        layout, os);
    if (experts) {
      printAxesGroup("ep", {Axis::EP}, rank, layout, os, layout.expertGrid);
      printAxesGroup("expert_dp", {Axis::DP}, rank, layout, os, layout.expertGrid);
    }
    os << "\n";
  }
}

} // namespace parc
