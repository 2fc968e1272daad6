//===- CudaMemory.cpp - Memory pools per category, pinned upload staging --===//

#include "parc/Runtime/CudaMemory.h"

#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <limits>

namespace parc::runtime {

namespace {

std::string gib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", double(bytes) / double(size_t(1) << 30));
  return text;
}

} // namespace

CudaMemorySpace::CudaMemorySpace(int device, cudaStream_t stream) : device(device), stream(stream) {
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cuuint64_t keepEverything = std::numeric_limits<cuuint64_t>::max();
  std::string where = " memory pool on device " + std::to_string(device);
  try {
    for (size_t i = 0; i < NumMemoryCategories; ++i) {
      std::string context = "creating the " + spelling(MemoryCategory(i)).str() + where;
      PARC_CUDA_CHECK(cudaMemPoolCreate(&pools[i], &props), context);
      PARC_CUDA_CHECK(
          cudaMemPoolSetAttribute(pools[i], cudaMemPoolAttrReleaseThreshold, &keepEverything),
          context);
    }
    // The kernels' stream-ordered scratch (attention scores, reductions) comes from the
    // default pool, which would otherwise give its memory back at every synchronisation.
    cudaMemPool_t defaultPool;
    std::string context = "configuring the default" + where;
    PARC_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&defaultPool, device), context);
    PARC_CUDA_CHECK(
        cudaMemPoolSetAttribute(defaultPool, cudaMemPoolAttrReleaseThreshold, &keepEverything),
        context);
  } catch (...) {
    for (cudaMemPool_t pool : pools)
      if (pool)
        cudaMemPoolDestroy(pool);
    throw;
  }
}

CudaMemorySpace::~CudaMemorySpace() {
  // Quiet: a destructor must not throw, and a failure means the context is already gone.
  // Memory still in use returns to the driver once it is freed.
  for (cudaMemPool_t pool : pools)
    cudaMemPoolDestroy(pool);
}

// Init::Overwritten is zero-filled too: that the CUDA kernels overwrite their outputs is
// proved on the CPU twins only (PARC_POISON_OVERWRITTEN), and no GPU has run them yet.
void *CudaMemorySpace::allocate(MemoryCategory category, size_t bytes, Init) {
  if (!failedRelease.empty()) {
    std::string error = "an earlier free of device memory failed: " + failedRelease;
    failedRelease.clear();
    throw cuda::CudaError(error);
  }
  std::string context = "allocating " + std::to_string(bytes) + " bytes of " +
                        spelling(category).str() + " on device " + std::to_string(device);
  // Every request, even of zero bytes, gets its own pointer, as from calloc.
  size_t size = std::max<size_t>(bytes, 1);
  void *data = nullptr;
  cudaError_t status = cudaMallocFromPoolAsync(&data, size, pool(category), stream);
  if (status == cudaErrorMemoryAllocation) {
    // Not sticky, but left as the thread's last error it would be reported by the next
    // kernel launch's check instead of here.
    (void)cudaGetLastError();
    releaseKeptMemory(context);
    status = cudaMallocFromPoolAsync(&data, size, pool(category), stream);
  }
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    // Unchecked on purpose: the numbers only annotate the error thrown below, which must not
    // be replaced by this call's own failure when the context is gone.
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess)
      context += " (" + gib(free) + " of " + gib(total) + " free on the device)";
    else
      (void)cudaGetLastError();
  }
  PARC_CUDA_CHECK(status, context);
  PARC_CUDA_CHECK(cudaMemsetAsync(data, 0, size, stream), context);
  return data;
}

void CudaMemorySpace::releaseKeptMemory(const std::string &context) {
  // Frees still queued on the stream hold their memory until they run.
  if (beforeBlockingWait)
    beforeBlockingWait();
  PARC_CUDA_CHECK(cudaStreamSynchronize(stream), context);
  for (cudaMemPool_t kept : pools)
    PARC_CUDA_CHECK(cudaMemPoolTrimTo(kept, 0), context);
  cudaMemPool_t defaultPool;
  PARC_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&defaultPool, device), context);
  PARC_CUDA_CHECK(cudaMemPoolTrimTo(defaultPool, 0), context);
}

void CudaMemorySpace::release(MemoryCategory category, void *data, size_t bytes) {
  try {
    PARC_CUDA_CHECK(cudaFreeAsync(data, stream), "freeing " + std::to_string(bytes) +
                                                     " bytes of " + spelling(category).str());
  } catch (const std::exception &error) {
    (void)cudaGetLastError();
    if (failedRelease.empty())
      failedRelease = error.what();
  }
}

int64_t CudaMemorySpace::poolPeakBytes(MemoryCategory category) const {
  cuuint64_t peak = 0;
  PARC_CUDA_CHECK(cudaMemPoolGetAttribute(pool(category), cudaMemPoolAttrUsedMemHigh, &peak),
                  "reading the peak of the " + spelling(category).str() + " memory pool");
  return int64_t(peak);
}

namespace cuda {

PinnedStaging::PinnedStaging() {
  PARC_CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming),
                  "creating the upload staging event");
}

PinnedStaging::~PinnedStaging() {
  // Quiet, as every destructor: the last copy completes or the context is gone.
  if (pending)
    cudaEventSynchronize(copied);
  cudaFreeHost(host);
  cudaEventDestroy(copied);
}

void *PinnedStaging::acquire(size_t bytes, const std::string &what) {
  if (pending) {
    PARC_CUDA_CHECK(cudaEventSynchronize(copied), what);
    pending = false;
  }
  if (bytes > capacity) {
    // Doubling keeps a run of growing uploads (the weights, one shard at a time) from
    // reallocating each time.
    size_t grown = std::max(bytes, 2 * capacity);
    PARC_CUDA_CHECK(cudaFreeHost(host), what);
    host = nullptr;
    capacity = 0;
    PARC_CUDA_CHECK(cudaMallocHost(&host, grown), what);
    capacity = grown;
  }
  return host;
}

bool PinnedStaging::busy() {
  if (!pending)
    return false;
  // NotReady is not an error, but it stays the thread's last error for the next launch check.
  cudaError_t status = cudaEventQuery(copied);
  if (status == cudaErrorNotReady)
    (void)cudaGetLastError();
  pending = status != cudaSuccess;
  return pending;
}

void PinnedStaging::copiedOn(cudaStream_t stream, const std::string &what) {
  PARC_CUDA_CHECK(cudaEventRecord(copied, stream), what);
  pending = true;
}

} // namespace cuda
} // namespace parc::runtime
