//===- CudaStreamBuffer.h - Scratch device memory ordered on a stream ------===//
//
// The kernels' and the device's temporaries: allocated and freed on the stream that uses
// them, so they cost no synchronisation.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_CUDASTREAMBUFFER_H
#define PARC_RUNTIME_CUDASTREAMBUFFER_H

#include "parc/Runtime/CudaCheck.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <exception>

namespace parc::runtime::cuda {

/// A device array of `count` V from the device's default pool, allocated and freed on
/// `stream`: it costs no synchronisation, and its memory is reused once the stream's work
/// before the free is done.
template <typename V> class StreamBuffer {
public:
  StreamBuffer(size_t count, cudaStream_t stream, const char *what) : stream(stream), what(what) {
    if (count)
      PARC_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void **>(&data), count * sizeof(V), stream),
                      what);
  }
  // Throws only when no other exception is on its way out, which would terminate.
  ~StreamBuffer() noexcept(false) {
    if (!data)
      return;
    cudaError_t status = cudaFreeAsync(data, stream);
    if (std::uncaught_exceptions() == 0)
      PARC_CUDA_CHECK(status, what);
  }
  StreamBuffer(const StreamBuffer &) = delete;
  StreamBuffer &operator=(const StreamBuffer &) = delete;

  V *get() const { return data; }

private:
  V *data = nullptr;
  cudaStream_t stream;
  const char *what;
};

} // namespace parc::runtime::cuda

#endif // PARC_RUNTIME_CUDASTREAMBUFFER_H
