//===- HostArena.h - A rank's host memory, kept for the next step ---------===//
//
// A training step allocates and frees the same buffers in the same order every time: each
// op's outputs, the collectives' scratch, the scratch of parameter gradients. From malloc,
// every large one is a fresh mapping, whose pages fault in (zeroed by the kernel) on first
// touch, and which free returns to the system. The CPU device keeps them instead: a released
// block waits on the free list of its category and size, and the next request of that size
// takes it back. The first step sizes the arena; from the second on, a step neither maps nor
// unmaps memory, and allocating is a list pop and, for Init::Zero, a zero-fill.
//
// Init::Overwritten blocks keep what their last user left. With PARC_POISON_OVERWRITTEN set in
// the environment they are filled with NaNs instead, so that a kernel that reads an output
// before writing all of it shows in its results (the test suite runs the equivalence sweep so).
//
// The memory report's `held` row still counts the bytes of live buffers; reservedBytes() is
// what the arena holds besides, live or free.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_HOSTARENA_H
#define PARC_RUNTIME_HOSTARENA_H

#include "parc/Runtime/Buffer.h"

#include <array>
#include <unordered_map>
#include <vector>

namespace parc::runtime {

class HostArena : public MemorySpace {
public:
  HostArena();
  HostArena(const HostArena &) = delete;
  HostArena &operator=(const HostArena &) = delete;
  ~HostArena() override;

  void *allocate(MemoryCategory category, size_t bytes, Init init) override;
  void release(MemoryCategory category, void *data, size_t bytes) override;

  /// Bytes taken from the system for `category`, live or on its free lists.
  int64_t reservedBytes(MemoryCategory category) const {
    return reserved[static_cast<size_t>(category)];
  }
  /// How many blocks were taken from the system so far (a step that reuses only adds none).
  int64_t systemAllocations() const { return fresh; }

private:
  void initialise(void *block, size_t bytes, Init init) const;

  bool poisonOverwritten;
  std::array<std::unordered_map<size_t, std::vector<void *>>, NumMemoryCategories> freeBlocks;
  std::array<int64_t, NumMemoryCategories> reserved{};
  int64_t fresh = 0;
};

} // namespace parc::runtime

#endif
