//===- HostArena.cpp - Free lists of host blocks by category and size -----===//

#include "parc/Runtime/HostArena.h"

#include "parc/Runtime/Kernels.h"

#include <cstdlib>

namespace parc::runtime {

namespace {
// Cache-line aligned, which the vectorised kernels and OpenBLAS's loads prefer.
constexpr size_t alignment = 64;
size_t rounded(size_t bytes) { return (bytes + alignment - 1) / alignment * alignment; }
} // namespace

HostArena::~HostArena() {
  for (auto &lists : freeBlocks)
    for (auto &[bytes, blocks] : lists)
      for (void *block : blocks)
        std::free(block);
}

void *HostArena::allocate(MemoryCategory category, size_t bytes) {
  std::vector<void *> &blocks = freeBlocks[static_cast<size_t>(category)][rounded(bytes)];
  if (!blocks.empty()) {
    void *block = blocks.back();
    blocks.pop_back();
    cpu::zeroBytes(block, bytes);
    return block;
  }
  void *block = std::aligned_alloc(alignment, rounded(bytes));
  if (!block)
    return nullptr;
  cpu::zeroBytes(block, bytes);
  ++fresh;
  reserved[static_cast<size_t>(category)] += int64_t(rounded(bytes));
  return block;
}

void HostArena::release(MemoryCategory category, void *data, size_t bytes) {
  freeBlocks[static_cast<size_t>(category)][rounded(bytes)].push_back(data);
}

} // namespace parc::runtime
