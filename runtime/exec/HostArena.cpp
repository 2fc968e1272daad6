//===- HostArena.cpp - Free lists of host blocks by category and size -----===//

#include "parc/Runtime/HostArena.h"

#include "parc/Runtime/Kernels.h"

#include <cstdlib>
#include <cstring>

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

HostArena::HostArena() : poisonOverwritten(std::getenv("PARC_POISON_OVERWRITTEN") != nullptr) {}

void HostArena::initialise(void *block, size_t bytes, Init init) const {
  if (init == Init::Zero)
    cpu::zeroBytes(block, bytes);
  else if (poisonOverwritten)
    std::memset(block, 0xff, bytes); // a NaN in every float and double
}

void *HostArena::allocate(MemoryCategory category, size_t bytes, Init init) {
  std::vector<void *> &blocks = freeBlocks[static_cast<size_t>(category)][rounded(bytes)];
  if (!blocks.empty()) {
    void *block = blocks.back();
    blocks.pop_back();
    initialise(block, bytes, init);
    return block;
  }
  void *block = std::aligned_alloc(alignment, rounded(bytes));
  if (!block)
    return nullptr;
  initialise(block, bytes, init);
  ++fresh;
  reserved[static_cast<size_t>(category)] += int64_t(rounded(bytes));
  return block;
}

void HostArena::release(MemoryCategory category, void *data, size_t bytes) {
  freeBlocks[static_cast<size_t>(category)][rounded(bytes)].push_back(data);
}

} // namespace parc::runtime
