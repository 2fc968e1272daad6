//===- NameSuggest.h - "did you mean 'X'?" for misspelt names -------------===//
#ifndef PARC_SUPPORT_NAMESUGGEST_H
#define PARC_SUPPORT_NAMESUGGEST_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include <optional>
#include <string>

namespace parc {

/// The candidate closest to `typo` by edit distance, if it is close enough to be a plausible
/// misspelling (at most a third of the typo's length, and at least one edit allowed).
std::optional<std::string> suggestName(llvm::StringRef typo,
                                       llvm::ArrayRef<llvm::StringRef> candidates);

/// " (did you mean 'X'?)"-free helper: "; did you mean 'X'?" or "" when nothing is close.
std::string didYouMean(llvm::StringRef typo, llvm::ArrayRef<llvm::StringRef> candidates);

} // namespace parc

#endif
