//===- Buffer.h - Tracked buffers and tensors of the executor -------------===//
//
// Every byte parrun holds for a rank goes through a Buffer, which reports its size to the
// rank's MemoryTracker under one of the categories of the compiler's memory model (weights,
// gradients, optimizer state, activations). The tracker keeps the peak of each category and of
// their sum, so the end-of-run report shows what the runtime really held beside the model.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_BUFFER_H
#define PARC_RUNTIME_BUFFER_H

#include "llvm/ADT/StringRef.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace parc::runtime {

enum class MemoryCategory { Weights, Grads, Optimizer, Activations };
inline constexpr size_t NumMemoryCategories = 4;
llvm::StringRef spelling(MemoryCategory category);

/// The bytes one rank holds, per category. One per rank and used only by that rank's thread.
class MemoryTracker {
public:
  void allocate(MemoryCategory category, int64_t bytes);
  void release(MemoryCategory category, int64_t bytes);

  int64_t current(MemoryCategory category) const { return currentBytes[index(category)]; }
  int64_t peak(MemoryCategory category) const { return peakBytes[index(category)]; }
  /// The peak of the sum, which can be less than the sum of the peaks.
  int64_t peakTotal() const { return peakTotalBytes; }

private:
  static size_t index(MemoryCategory category) { return static_cast<size_t>(category); }

  std::array<int64_t, NumMemoryCategories> currentBytes{}, peakBytes{};
  int64_t currentTotalBytes = 0, peakTotalBytes = 0;
};

/// An owning, zero-initialised array whose bytes count against a tracker for its lifetime.
template <typename E> class Buffer {
public:
  Buffer() = default;
  Buffer(MemoryTracker &tracker, MemoryCategory category, size_t count)
      : values(count ? new E[count]() : nullptr), count(count), tracker(&tracker),
        category(category) {
    tracker.allocate(category, bytes());
  }
  ~Buffer() { reset(); }
  Buffer(Buffer &&other) noexcept { *this = std::move(other); }
  Buffer &operator=(Buffer &&other) noexcept {
    if (this != &other) {
      reset();
      values = std::move(other.values);
      count = other.count;
      tracker = other.tracker;
      category = other.category;
      other.count = 0;
      other.tracker = nullptr;
    }
    return *this;
  }
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;

  /// Frees the array; the buffer is then empty.
  void reset() {
    if (tracker)
      tracker->release(category, bytes());
    values.reset();
    count = 0;
    tracker = nullptr;
  }

  E *data() { return values.get(); }
  const E *data() const { return values.get(); }
  size_t size() const { return count; }
  bool allocated() const { return tracker != nullptr; }
  E &operator[](size_t i) { return values[i]; }
  const E &operator[](size_t i) const { return values[i]; }

private:
  int64_t bytes() const { return int64_t(count * sizeof(E)); }

  std::unique_ptr<E[]> values;
  size_t count = 0;
  MemoryTracker *tracker = nullptr;
  MemoryCategory category = MemoryCategory::Activations;
};

/// A named operand of an op list: the shape of the chunk's tensor table and its elements.
template <typename E> struct Tensor {
  std::vector<int64_t> shape;
  Buffer<E> buffer;

  Tensor() = default;
  Tensor(MemoryTracker &tracker, MemoryCategory category, std::vector<int64_t> shape)
      : shape(std::move(shape)), buffer(tracker, category, size_t(numel())) {}

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t dim : shape)
      n *= dim;
    return n;
  }
  E *data() { return buffer.data(); }
  const E *data() const { return buffer.data(); }
};

} // namespace parc::runtime

#endif
