//===- CudaTestSupport.h - What the CUDA GoogleTests share ----------------===//
//
// Every GPU test skips, naming the reason, where no usable CUDA device is; DeviceBuffer moves
// test data between host values and device elements of T (float, double, bf16 or fp16),
// rounding as an upload of the runtime does: to float first, then to T.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_TEST_UNIT_CUDATESTSUPPORT_H
#define PARC_TEST_UNIT_CUDATESTSUPPORT_H

#include "parc/Runtime/CudaCheck.h"
#include "parc/Runtime/CudaKernels.h"

#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#define SKIP_WITHOUT_DEVICE()                                                                      \
  do {                                                                                             \
    std::string why;                                                                               \
    if (!::parc::runtime::cuda::cudaDeviceAvailable(&why))                                         \
      GTEST_SKIP() << why;                                                                         \
  } while (false)

namespace parc::test {

template <typename T> double toHost(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x);
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(x);
  else
    return double(x);
}
template <typename T> T fromHost(double x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16(float(x));
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half(float(x));
  else
    return T(x);
}

/// n elements of T in device memory, freed at scope exit; uninitialised unless given values.
template <typename T> class DeviceBuffer {
public:
  explicit DeviceBuffer(size_t n) : n(n) {
    PARC_CUDA_CHECK(
        cudaMalloc(reinterpret_cast<void **>(&data), std::max<size_t>(n, 1) * sizeof(T)),
        "test buffer");
  }
  template <typename E> explicit DeviceBuffer(const std::vector<E> &values)
      : DeviceBuffer(values.size()) {
    std::vector<T> host(n);
    for (size_t i = 0; i < n; ++i)
      host[i] = fromHost<T>(double(values[i]));
    PARC_CUDA_CHECK(cudaMemcpy(data, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  ~DeviceBuffer() { cudaFree(data); }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;

  T *get() const { return data; }
  size_t size() const { return n; }
  /// The elements as stored, once every kernel queued so far has completed.
  std::vector<T> bits() const {
    PARC_CUDA_CHECK(cudaDeviceSynchronize(), "the kernels under test");
    std::vector<T> host(n);
    PARC_CUDA_CHECK(cudaMemcpy(host.data(), data, n * sizeof(T), cudaMemcpyDeviceToHost), "read");
    return host;
  }
  /// The elements as host values of E.
  template <typename E> std::vector<E> values() const {
    std::vector<E> result;
    for (T x : bits())
      result.push_back(E(toHost(x)));
    return result;
  }

private:
  T *data = nullptr;
  size_t n;
};

} // namespace parc::test

#endif
