//===- Buffer.cpp - Per-rank memory accounting ----------------------------===//

#include "parc/Runtime/Buffer.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

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

MemorySpace::~MemorySpace() = default;

void *MemoryTracker::allocate(MemoryCategory category, size_t size, Init init) {
  void *data = space ? space->allocate(category, size, init) : std::calloc(size, 1);
  if (!data)
    throw std::runtime_error("out of host memory: " + std::to_string(size) + " bytes of " +
                             spelling(category).str());
  int64_t bytes = int64_t(size);
  size_t i = index(category);
  currentBytes[i] += bytes;
  peakBytes[i] = std::max(peakBytes[i], currentBytes[i]);
  currentTotalBytes += bytes;
  peakTotalBytes = std::max(peakTotalBytes, currentTotalBytes);
  return data;
}

void MemoryTracker::release(MemoryCategory category, void *data, size_t size) {
  if (space)
    space->release(category, data, size);
  else
    std::free(data);
  currentBytes[index(category)] -= int64_t(size);
  currentTotalBytes -= int64_t(size);
}

} // namespace parc::runtime
