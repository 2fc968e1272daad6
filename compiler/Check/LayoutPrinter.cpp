//===- LayoutPrinter.cpp - The rank layout as text (--emit=layout) --------===//
#include "parc/Check/LayoutPrinter.h"

namespace parc {

namespace {
void printGroup(llvm::StringRef name, const std::vector<int64_t> &group, const RankLayout &layout,
                llvm::raw_ostream &os) {
  os << " | " << name << " [";
  for (size_t i = 0; i < group.size(); ++i)
    os << (i ? "," : "") << group[i];
  os << "] ";
  if (group.size() < 2)
    os << "-";
  else
    os << (layout.crossesNodes(group) ? "inter" : "intra");
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
    printGroup("tp", layout.tpGroup(rank), layout, os);
    printGroup("dp", layout.dpGroup(rank), layout, os);
    printGroup("pp", layout.ppGroup(rank), layout, os);
    if (cp) {
      printGroup("cp", layout.cpGroup(rank), layout, os);
      printGroup("dp_cp", layout.dpCpGroup(rank), layout, os);
    }
    printGroup("model", layout.modelGroup(rank), layout, os);
    printGroup("embedding", layout.embeddingGroup(rank, tied), layout, os);
    if (experts) {
      printGroup("ep", layout.epGroup(rank), layout, os);
      printGroup("expert_dp", layout.expertDataGroup(rank), layout, os);
    }
    os << "\n";
  }
}

} // namespace parc
