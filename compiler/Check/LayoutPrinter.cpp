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

int64_t &coord(Coords &c, Axis axis) {
  return axis == Axis::TP ? c.tp : axis == Axis::PP ? c.pp : c.dp;
}

void printAxisGroup(llvm::StringRef name, Axis axis, int64_t rank, const RankLayout &layout,
                    llvm::raw_ostream &os) {
  Coords self = layout.coordsOf(rank);
  printGroup(
      name, layout.sizeOf(axis),
      [&](int64_t i) {
        Coords c = self;
        coord(c, axis) = i;
        return layout.rankOf(c);
      },
      layout, os);
}

/// The tp x pp ranks of this rank's replica in ascending order: in rank numbers the axis with
/// the larger stride varies slowest.
void printModelGroup(int64_t rank, const RankLayout &layout, llvm::raw_ostream &os) {
  Coords self = layout.coordsOf(rank);
  bool tpInner = layout.strideOf(Axis::TP) < layout.strideOf(Axis::PP);
  Axis inner = tpInner ? Axis::TP : Axis::PP, outer = tpInner ? Axis::PP : Axis::TP;
  int64_t innerSize = layout.sizeOf(inner);
  printGroup(
      "model", layout.tp * layout.pp,
      [&](int64_t i) {
        Coords c = self;
        coord(c, inner) = i % innerSize;
        coord(c, outer) = i / innerSize;
        return layout.rankOf(c);
      },
      layout, os);
}

} // namespace

void printLayout(const Mapping &mapping, const Program &program, llvm::raw_ostream &os) {
  const RankLayout &layout = mapping.layout;
  const ParallelSpec &par = program.parallel;
  os << "layout world " << layout.world() << ", nodes " << program.cluster.nodes
     << " x gpus_per_node " << layout.gpusPerNode << ", tp " << layout.tp << " pp " << layout.pp
     << " dp " << layout.dp;
  bool experts = program.model.hasExperts();
  if (experts)
    os << " ep " << layout.ep;
  os << ", order " << orderText(par.order) << "\n";
  bool tied = program.model.tiedHead();
  for (int64_t rank = 0; rank < layout.world(); ++rank) {
    Coords c = layout.coordsOf(rank);
    os << "rank " << rank << " node " << layout.nodeOf(rank) << " local "
       << layout.localRankOf(rank) << " coords tp=" << c.tp << " pp=" << c.pp << " dp=" << c.dp;
    printAxisGroup("tp", Axis::TP, rank, layout, os);
    printAxisGroup("dp", Axis::DP, rank, layout, os);
    printAxisGroup("pp", Axis::PP, rank, layout, os);
    printModelGroup(rank, layout, os);
    std::vector<int64_t> embedding = layout.embeddingGroup(rank, tied); // two ranks at most
    printGroup(
        "embedding", int64_t(embedding.size()), [&](int64_t i) { return embedding[size_t(i)]; },
        layout, os);
    if (experts) {
      // Expert parallelism splits dp: ep consecutive replicas, and every ep-th one across them.
      Coords self = layout.coordsOf(rank);
      auto withDp = [&](int64_t dp) {
        Coords m = self;
        m.dp = dp;
        return layout.rankOf(m);
      };
      printGroup(
          "ep", layout.ep, [&](int64_t i) { return withDp(self.dp / layout.ep * layout.ep + i); },
          layout, os);
      printGroup(
          "expert_dp", layout.dp / layout.ep,
          [&](int64_t i) { return withDp(self.dp % layout.ep + i * layout.ep); }, layout, os);
    }
    os << "\n";
  }
}

} // namespace parc
