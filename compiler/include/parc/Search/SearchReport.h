//===- SearchReport.h - The ranked table of `parc --search` ---------------===//
#ifndef PARC_SEARCH_SEARCHREPORT_H
#define PARC_SEARCH_SEARCHREPORT_H

#include "parc/Search/Search.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

namespace parc {

/// The counts, the ranked table of the best mappings, and the DP vs TP vs PP comparison.
void printSearch(const SearchResult &result, const Program &program, llvm::raw_ostream &os);
/// The same as one JSON object (docs/choosing-a-mapping.md lists its keys).
llvm::json::Value searchToJSON(const SearchResult &result, const Program &program);
/// "tp 8, pp 16, dp 8, micro_batch 1, interleaved(chunks = 2), zero 1, recompute selective,
/// sequence parallel, order tp-dp-pp".
std::string mappingText(const ParallelSpec &parallel);

} // namespace parc

#endif
