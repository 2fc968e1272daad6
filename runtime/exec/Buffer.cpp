//===- Buffer.cpp - Per-rank memory accounting ----------------------------===//

#include "parc/Runtime/Buffer.h"

#include <algorithm>

namespace parc::runtime {

llvm::StringRef spelling(MemoryCategory category) {
  switch (category) {
  case MemoryCategory::Weights:
    return "weights";
  case MemoryCategory::Grads:
    return "grads";
  case MemoryCategory::Optimizer:
    return "optimizer";
  case MemoryCategory::Activations:
    return "activations";
  }
  return "?";
}

void MemoryTracker::allocate(MemoryCategory category, int64_t bytes) {
  size_t i = index(category);
  currentBytes[i] += bytes;
  peakBytes[i] = std::max(peakBytes[i], currentBytes[i]);
  currentTotalBytes += bytes;
  peakTotalBytes = std::max(peakTotalBytes, currentTotalBytes);
}

void MemoryTracker::release(MemoryCategory category, int64_t bytes) {
  currentBytes[index(category)] -= bytes;
  currentTotalBytes -= bytes;
}

} // namespace parc::runtime
