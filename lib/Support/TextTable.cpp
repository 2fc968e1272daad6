//===- TextTable.cpp - Aligned text tables for reports --------------------===//
#include "parc/Support/TextTable.h"

#include "llvm/Support/Format.h"

#include <algorithm>

namespace parc {

void printTable(llvm::raw_ostream &os, const std::vector<std::vector<std::string>> &rows,
                llvm::StringRef align) {
  std::vector<size_t> width;
  for (const auto &row : rows)
    for (size_t i = 0; i < row.size(); ++i) {
      width.resize(std::max(width.size(), row.size()), 0);
      width[i] = std::max(width[i], row[i].size());
    }
  for (const auto &row : rows) {
    std::string line = " ";
    for (size_t i = 0; i < row.size(); ++i) {
      std::string pad(width[i] - row[i].size(), ' ');
      bool last = i + 1 == row.size();
      bool left = i < align.size() && align[i] == 'l';
      line += " ";
      line += left ? row[i] + (last ? "" : pad) : pad + row[i];
    }
    os << line << "\n";
  }
}

std::string formatNumber(const char *spec, double v) {
  std::string out;
  llvm::raw_string_ostream os(out);
  os << llvm::format(spec, v);
  return os.str();
}

} // namespace parc
