//===- CudaMemory.h - Where a CUDA rank's memory comes from ---------------===//
//
// CudaMemorySpace is the MemorySpace of a rank on a GPU: one stream-ordered memory pool per
// MemoryCategory, so that the driver's own high-water mark of each pool (poolPeakBytes) can be
// printed beside the MemoryTracker's count of the same category. Pools keep freed memory for
// reuse instead of returning it to the driver at every synchronisation, which would turn each
// step's activations into fresh driver allocations.
//
// StreamBuffer is a stream-ordered scratch array of the device's default pool (not counted in
// any category), PinnedStaging the page-locked host buffer that uploads copy from, so that an
// upload does not wait for the device.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_CUDAMEMORY_H
#define PARC_RUNTIME_CUDAMEMORY_H

#include "parc/Runtime/Buffer.h"
#include "parc/Runtime/CudaCheck.h"
#include "parc/Runtime/CudaStreamBuffer.h"

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace parc::runtime {

class CudaMemorySpace final : public MemorySpace {
public:
  /// Pools on `device`; allocations and frees are ordered on `stream`, the rank's stream.
  CudaMemorySpace(int device, cudaStream_t stream);
  ~CudaMemorySpace() override;
  CudaMemorySpace(const CudaMemorySpace &) = delete;
  CudaMemorySpace &operator=(const CudaMemorySpace &) = delete;

  /// Zero-filled (by a memset queued on the stream). Throws cuda::CudaError naming the
  /// category, the bytes and the device's free and total memory when the device is full.
  void *allocate(MemoryCategory category, size_t bytes, Init init) override;
  /// Never throws (Buffer frees in destructors); a failure is thrown by the next allocate.
  void release(MemoryCategory category, void *data, size_t bytes) override;

  /// The most bytes the category's pool ever had handed out at once, as the driver counts
  /// them (allocation sizes rounded up to its granularity).
  int64_t poolPeakBytes(MemoryCategory category) const;

  /// Called before the one blocking wait of allocate() (the retry of an allocation that did
  /// not fit): the rank's communicator finishes its calls there under its deadline, where a
  /// plain stream wait could block forever behind a collective whose peer died.
  void setBeforeBlockingWait(std::function<void()> wait) { beforeBlockingWait = std::move(wait); }

private:
  cudaMemPool_t pool(MemoryCategory category) const { return pools[static_cast<size_t>(category)]; }
  /// Lets memory that the pools keep for reuse go back to the driver, for an allocation that
  /// did not fit: one category's peak may live where another's was.
  void releaseKeptMemory(const std::string &context);
  [[noreturn]] void throwOutOfMemory(MemoryCategory category, size_t bytes,
                                     const std::string &error);

  int device;
  cudaStream_t stream;
  std::array<cudaMemPool_t, NumMemoryCategories> pools{};
  std::string failedRelease;
  std::function<void()> beforeBlockingWait;
};

namespace cuda {

/// One page-locked host buffer, reused by every upload of a rank: acquire() waits until the
/// previous upload's copy out of it completed (normally long ago), grows it if needed, and
/// copiedOn() marks the copy just queued.
class PinnedStaging {
public:
  PinnedStaging();
  ~PinnedStaging();
  PinnedStaging(const PinnedStaging &) = delete;
  PinnedStaging &operator=(const PinnedStaging &) = delete;

  void *acquire(size_t bytes, const std::string &what);
  void copiedOn(cudaStream_t stream, const std::string &what);
  /// Whether acquire() would wait: the last copy has not completed (or failed, which
  /// acquire() then reports).
  bool busy();
  /// Whether acquire(bytes) would have to grow the buffer, which may wait for the device.
  bool mustGrow(size_t bytes) const { return bytes > capacity; }

private:
  void *host = nullptr;
  size_t capacity = 0;
  cudaEvent_t copied = nullptr;
  bool pending = false;
};

} // namespace cuda
} // namespace parc::runtime

#endif // PARC_RUNTIME_CUDAMEMORY_H
