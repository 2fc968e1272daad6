#include "parc/Support/NameSuggest.h"

namespace parc {

std::optional<std::string> suggestName(llvm::StringRef typo,
                                       llvm::ArrayRef<llvm::StringRef> candidates) {
  unsigned maxDistance = std::max<unsigned>(1, (typo.size() + 2) / 3);
  std::optional<std::string> best;
  unsigned bestDistance = maxDistance + 1;
  for (llvm::StringRef candidate : candidates) {
    // Case-insensitive first: `Bf16` or `GIB` are one edit from nothing but plainly meant.
    unsigned distance = typo.equals_insensitive(candidate)
                            ? 0
                            : typo.edit_distance(candidate, /*AllowReplacements=*/true,
                                                 /*MaxEditDistance=*/maxDistance + 1);
    if (distance < bestDistance && candidate != typo) {
      bestDistance = distance;
      best = candidate.str();
    }
  }
  if (bestDistance > maxDistance)
    return std::nullopt;
  return best;
}

std::string didYouMean(llvm::StringRef typo, llvm::ArrayRef<llvm::StringRef> candidates) {
  if (auto best = suggestName(typo, candidates))
    return "; did you mean '" + *best + "'?";
  return "";
}

} // namespace parc
