//===- TextTable.h - Aligned text tables for reports ----------------------===//
#ifndef PARC_SUPPORT_TEXTTABLE_H
#define PARC_SUPPORT_TEXTTABLE_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <vector>

namespace parc {

/// Rows of cells, each column padded to its widest cell and indented by two spaces; `align`
/// holds 'l' or 'r' for each column.
void printTable(llvm::raw_ostream &os, const std::vector<std::vector<std::string>> &rows,
                llvm::StringRef align);

/// `v` printed with a printf conversion for one double ("%.1f%%").
std::string formatNumber(const char *spec, double v);

} // namespace parc

#endif
