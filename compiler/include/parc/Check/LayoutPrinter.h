//===- LayoutPrinter.h - The rank layout as text (--emit=layout) ----------===//
//
// One line per rank: where it runs, its coordinates and its process groups with the link each
// group's collectives use. The format is stable on purpose: lit tests match it line by line.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_CHECK_LAYOUTPRINTER_H
#define PARC_CHECK_LAYOUTPRINTER_H

#include "parc/Check/Mapping.h"

#include "llvm/Support/raw_ostream.h"

namespace parc {

/// Prints a header line (world, nodes, sizes, order), then for every rank
///   rank R node N local L coords tp=T pp=P dp=D | tp [..] LINK | dp [..] LINK | pp [..] LINK
///     | model [..] LINK | embedding [..] LINK
/// and with cp > 1 also " cp C" in the header, " cp=C" in the coordinates and
/// "| cp [..] LINK | dp_cp [..] LINK" (data parallel with context) before the model group,
/// and, for a model with mixture-of-experts blocks, `| ep [..] LINK | expert_dp [..] LINK`
/// (Megatron-Core's expert grid: ep carved from dp x cp),
/// where LINK is `intra` or `inter`, or `-` for a group of fewer than two ranks, which never
/// communicates.
void printLayout(const Mapping &mapping, const Program &program, llvm::raw_ostream &os);

} // namespace parc

#endif
