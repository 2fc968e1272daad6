//===- HostArenaTest.cpp - What a block of the host arena holds when it is handed out ---===//

#include "parc/Runtime/HostArena.h"

#include "gtest/gtest.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

using namespace parc::runtime;

namespace {

// A block handed back and asked for again, as the next step's op asks for its output.
float *reused(HostArena &arena, Init init) {
  constexpr size_t bytes = 64 * sizeof(float);
  auto *first =
      static_cast<float *>(arena.allocate(MemoryCategory::Activations, bytes, Init::Zero));
  for (int i = 0; i < 64; ++i)
    first[i] = 7.0f;
  arena.release(MemoryCategory::Activations, first, bytes);
  auto *again = static_cast<float *>(arena.allocate(MemoryCategory::Activations, bytes, init));
  EXPECT_EQ(again, first) << "the arena did not reuse the block";
  return again;
}

TEST(HostArena, ZeroBlocksAreZeroedWhenReused) {
  HostArena arena;
  float *block = reused(arena, Init::Zero);
  for (int i = 0; i < 64; ++i)
    EXPECT_EQ(block[i], 0.0f) << i;
  arena.release(MemoryCategory::Activations, block, 64 * sizeof(float));
}

TEST(HostArena, OverwrittenBlocksKeepTheLastValuesOrArePoisoned) {
  unsetenv("PARC_POISON_OVERWRITTEN");
  {
    HostArena arena;
    float *block = reused(arena, Init::Overwritten);
    EXPECT_EQ(block[0], 7.0f); // no pass over the block
    arena.release(MemoryCategory::Activations, block, 64 * sizeof(float));
  }
  setenv("PARC_POISON_OVERWRITTEN", "1", 1);
  HostArena poisoned;
  unsetenv("PARC_POISON_OVERWRITTEN");
  float *block = reused(poisoned, Init::Overwritten);
  for (int i = 0; i < 64; ++i)
    EXPECT_TRUE(std::isnan(block[i])) << i;
  poisoned.release(MemoryCategory::Activations, block, 64 * sizeof(float));
}

// Whether the kernel offers transparent huge pages on request (THP in `always` or `madvise`).
bool hugePagesOnRequest() {
  std::ifstream setting("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  return std::getline(setting, line) && line.find("[never]") == std::string::npos;
}

// The VmFlags of the mapping that holds `address` (/proc/self/smaps), empty if none is found.
std::string mappingFlags(const void *address) {
  std::ifstream smaps("/proc/self/smaps");
  auto where = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long begin = 0, end = 0; // a mapping's line starts "begin-end perms ..."
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2)
      inside = where >= begin && where < end;
    else if (inside && line.rfind("VmFlags:", 0) == 0)
      return line;
  }
  return "";
}

TEST(HostArena, BlocksOfAHugePageOrMoreStartOnOneAndAskForHugePages) {
  constexpr size_t hugePage = size_t(2) << 20;
  HostArena arena;
  for (size_t bytes : {hugePage, 3 * hugePage + 4096}) {
    void *block = arena.allocate(MemoryCategory::Activations, bytes, Init::Zero);
    ASSERT_NE(block, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % hugePage, 0u) << bytes;
    if (hugePagesOnRequest()) {
      EXPECT_NE(mappingFlags(block).find(" hg"), std::string::npos)
          << bytes << ": " << mappingFlags(block);
    }
    arena.release(MemoryCategory::Activations, block, bytes);
  }
  void *small = arena.allocate(MemoryCategory::Activations, 4096, Init::Zero);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % 64, 0u);
  arena.release(MemoryCategory::Activations, small, 4096);
}

} // namespace
