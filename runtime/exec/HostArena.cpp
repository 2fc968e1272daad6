//===- HostArena.cpp - Free lists of host blocks by category and size -----===//

#include "parc/Runtime/HostArena.h"

#include "parc/Runtime/Kernels.h"

#include <cstdlib>
#include <cstring>
#include <sys/mman.h>

namespace parc::runtime {

namespace {
// Cache-line aligned, which the vectorised kernels and OpenBLAS's loads prefer.
constexpr size_t alignment = 64;
size_t rounded(size_t bytes) { return (bytes + alignment - 1) / alignment * alignment; }

// A block of a huge page or more starts on a huge page and asks for transparent huge pages
// (Linux gives them only on request when THP is in `madvise` mode, Debian's default): the
// kernels stream through activations and gradients of hundreds of MiB, and with 4 KiB pages
// every 4 KiB is a TLB miss; on the gemm model of bench/vs-pytorch.sh the GEMMs, the norms and
// the optimizer all ran faster so (docs/runtime.md). Only the whole huge pages inside the block
// are advised, so that the setting of the memory around it stays as it was.
constexpr size_t hugePage = size_t(2) << 20;

void *allocateBlock(size_t bytes) {
  if (bytes < hugePage)
    return std::aligned_alloc(alignment, bytes);
  // posix_memalign, since aligned_alloc wants the size a multiple of the alignment (C11; ASan
  // enforces it), and rounding the size up would make the tail a huge page of its own.
  void *block = nullptr;
  if (posix_memalign(&block, hugePage, bytes) != 0)
    return nullptr;
  madvise(block, bytes / hugePage * hugePage, MADV_HUGEPAGE); // advice: a refusal is harmless
  return block;
}
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
  void *block = allocateBlock(rounded(bytes));
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
