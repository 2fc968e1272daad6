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

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace parc::runtime {

enum class MemoryCategory { Weights, Grads, Optimizer, Activations };
inline constexpr size_t NumMemoryCategories = 4;
llvm::StringRef spelling(MemoryCategory category);

/// What a new buffer holds. Zero unless its first writer writes every element before anything
/// reads one (an op's output that its kernel overwrites): zero-filling those is a pass over
/// memory that the kernel repeats.
enum class Init { Zero, Overwritten };

/// Where a rank's buffers live: host memory (the default) or a GPU, in one arena per
/// category (CudaDevice.h). Memory it returns for Init::Zero is zero-filled; for
/// Init::Overwritten it may hold anything.
class MemorySpace {
public:
  virtual ~MemorySpace();
  virtual void *allocate(MemoryCategory category, size_t bytes, Init init) = 0;
  virtual void release(MemoryCategory category, void *data, size_t bytes) = 0;
};

/// The bytes one rank holds, per category, and the space they come from. One per rank and used
/// only by that rank's thread.
class MemoryTracker {
public:
  /// `space` null: host memory.
  explicit MemoryTracker(MemorySpace *space = nullptr) : space(space) {}

  /// Counted until released.
  void *allocate(MemoryCategory category, size_t bytes, Init init = Init::Zero);
  void release(MemoryCategory category, void *data, size_t bytes);

  int64_t current(MemoryCategory category) const { return currentBytes[index(category)]; }
  int64_t peak(MemoryCategory category) const { return peakBytes[index(category)]; }
  /// The peak of the sum, which can be less than the sum of the peaks.
  int64_t peakTotal() const { return peakTotalBytes; }

private:
  static size_t index(MemoryCategory category) { return static_cast<size_t>(category); }

  MemorySpace *space;
  std::array<int64_t, NumMemoryCategories> currentBytes{}, peakBytes{};
  int64_t currentTotalBytes = 0, peakTotalBytes = 0;
};

/// An owning array in the tracker's space (zeroed unless asked for Init::Overwritten) whose
/// bytes count against the tracker for its lifetime. On a GPU its elements are device memory:
/// only kernels and the device's copies touch them.
template <typename E> class Buffer {
public:
  Buffer() = default;
  Buffer(MemoryTracker &tracker, MemoryCategory category, size_t count, Init init = Init::Zero)
      : values(count ? static_cast<E *>(tracker.allocate(category, count * sizeof(E), init))
                     : nullptr),
        count(count), tracker(&tracker), category(category) {}
  ~Buffer() { reset(); }
  Buffer(Buffer &&other) noexcept { *this = std::move(other); }
  Buffer &operator=(Buffer &&other) noexcept {
    if (this != &other) {
      reset();
      values = other.values;
      count = other.count;
      tracker = other.tracker;
      category = other.category;
      other.values = nullptr;
      other.count = 0;
      other.tracker = nullptr;
    }
    return *this;
  }
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;

  /// Frees the array; the buffer is then empty.
  void reset() {
    if (tracker && values)
      tracker->release(category, values, count * sizeof(E));
    values = nullptr;
    count = 0;
    tracker = nullptr;
  }

  E *data() { return values; }
  const E *data() const { return values; }
  size_t size() const { return count; }
  bool allocated() const { return tracker != nullptr; }

private:
  E *values = nullptr;
  size_t count = 0;
  MemoryTracker *tracker = nullptr;
  MemoryCategory category = MemoryCategory::Activations;
};

/// A named operand of an op list: the shape of the chunk's tensor table and its elements.
/// The shape is held inline (a tensor has at most four dimensions in practice), so that
/// making one in the step loop allocates nothing but its buffer, from the arena.
template <typename E> struct Tensor {
  llvm::SmallVector<int64_t, 4> shape;
  Buffer<E> buffer;

  Tensor() = default;
  Tensor(MemoryTracker &tracker, MemoryCategory category, llvm::ArrayRef<int64_t> shape,
         Init init = Init::Zero)
      : shape(shape.begin(), shape.end()), buffer(tracker, category, size_t(numel()), init) {}

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
