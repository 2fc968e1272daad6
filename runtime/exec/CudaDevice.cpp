//===- CudaDevice.cpp - Copies, host transfers and optimizer steps on a GPU -===//
//
// The kernel forwards live in the header; here is what needs more than one call. Values
// cross between host and device as fp32: uploads round doubles to float on the host and
// convert to T on the device, downloads convert to float on the device.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/CudaDevice.h"

#include "parc/Runtime/CudaCommunicator.h"
#include "parc/Runtime/Init.h"

#include <algorithm>
#include <cassert>
#include <cstring>

namespace parc::runtime {

template <typename T> cudaStream_t CudaDevice<T>::createStream(int device) {
  std::string context = "creating the stream of CUDA device " + std::to_string(device);
  PARC_CUDA_CHECK(cudaSetDevice(device), context);
  cudaStream_t stream;
  // Non-blocking: the legacy default stream, which other libraries may use, never
  // serialises with the rank's work.
  PARC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), context);
  return stream;
}

template <typename T>
CudaDevice<T>::CudaDevice(int device, bool flashAttention)
    : flash(flashAttention), device_(device), stream_(createStream(device)),
      blas(std::make_unique<cuda::Blas>(stream_.get())),
      space(std::make_unique<CudaMemorySpace>(device, stream_.get())), tracker(space.get()) {}

template <typename T> CudaDevice<T>::~CudaDevice() {
  // The communicator must not order later calls against a stream that is gone.
  if (comm)
    comm->setComputeStream(nullptr);
  // The pools and the stream may only go once the queued kernels and frees are done. Quiet:
  // a failure means the context is gone, and a destructor must not throw.
  cudaStreamSynchronize(stream());
}

template <typename T> void CudaDevice<T>::bindCommunicator(CudaCommunicator *bound) {
  if (comm)
    comm->setComputeStream(nullptr);
  comm = bound;
  if (comm)
    comm->setComputeStream(stream());
  space->setBeforeBlockingWait([this] {
    if (comm)
      comm->synchronize();
  });
}

template <typename T> void CudaDevice<T>::waitFor(const std::string &what) {
  if (comm)
    comm->synchronize();
  // A fault inside a kernel surfaces at the next wait, whatever kernel it was.
  PARC_CUDA_CHECK(cudaStreamSynchronize(stream()),
                  what + " (the error may come from any kernel queued since the previous wait; "
                         "CUDA_LAUNCH_BLOCKING=1 reports it at its launch)");
}

template <typename T>
void CudaDevice<T>::copyToHost(void *host, const void *source, size_t bytes,
                               const std::string &what) {
  if (comm)
    comm->synchronize();
  PARC_CUDA_CHECK(cudaMemcpyAsync(host, source, bytes, cudaMemcpyDeviceToHost, stream()), what);
  waitFor(what);
}

template <typename T> void CudaDevice<T>::loadBytes(void *dst, const void *host, size_t bytes) {
  const std::string what = "loading a checkpoint";
  if (comm)
    comm->synchronize();
  // From pageable memory the driver copies the bytes out before the call returns.
  PARC_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream()), what);
  waitFor(what);
}

template <typename T> void *CudaDevice<T>::stage(size_t bytes, const std::string &what) {
  // Only when the previous upload is still queued, behind collectives perhaps, or the buffer
  // grows (freeing page-locked memory may wait for the whole device): then the communicator's
  // deadline bounds the wait.
  if (comm && (staging.busy() || staging.mustGrow(bytes)))
    comm->synchronize();
  return staging.acquire(bytes, what);
}

template <typename T> void CudaDevice<T>::synchronize() { waitFor("synchronize"); }

//===----------------------------------------------------------------------===//
// Copies and host transfers
//===----------------------------------------------------------------------===//

template <typename T> void CudaDevice<T>::accumulateGrad(Grad *main, const T *part, int64_t n) {
  if (n <= 0)
    return;
  if constexpr (std::is_same_v<T, float>) {
    cuda::residualAddForward(main, main, part, n, stream());
  } else {
    cuda::StreamBuffer<float> widened(size_t(n), stream(), "accumulateGrad");
    cuda::convert(widened.get(), part, n, stream());
    cuda::residualAddForward(main, main, widened.get(), n, stream());
  }
}

template <typename T>
void CudaDevice<T>::copyRows(T *dst, int64_t dstStride, const T *src, int64_t srcStride,
                             int64_t width, int64_t rows) {
  if (width <= 0 || rows <= 0)
    return;
  if (rows == 1 || (dstStride == width && srcStride == width))
    return copy(dst, src, rows == 1 ? width : width * rows);
  PARC_CUDA_CHECK(cudaMemcpy2DAsync(dst, dstStride * sizeof(T), src, srcStride * sizeof(T),
                                    width * sizeof(T), rows, cudaMemcpyDeviceToDevice, stream()),
                  "copyRows");
}

template <typename T> void CudaDevice<T>::uploadIds(int64_t *dst, const int64_t *src, int64_t n) {
  if (n <= 0)
    return;
  std::string what = "upload of " + std::to_string(n) + " ids";
  void *staged = stage(n * sizeof(int64_t), what);
  std::memcpy(staged, src, n * sizeof(int64_t));
  PARC_CUDA_CHECK(
      cudaMemcpyAsync(dst, staged, n * sizeof(int64_t), cudaMemcpyHostToDevice, stream()), what);
  staging.copiedOn(stream(), what);
}

template <typename T>
void CudaDevice<T>::uploadStaged(T *dst, const float *staged, int64_t n, const std::string &what) {
  if constexpr (std::is_same_v<T, float>) {
    PARC_CUDA_CHECK(
        cudaMemcpyAsync(dst, staged, n * sizeof(float), cudaMemcpyHostToDevice, stream()), what);
    staging.copiedOn(stream(), what);
  } else {
    cuda::StreamBuffer<float> values(n, stream(), "upload");
    PARC_CUDA_CHECK(
        cudaMemcpyAsync(values.get(), staged, n * sizeof(float), cudaMemcpyHostToDevice, stream()),
        what);
    staging.copiedOn(stream(), what);
    cuda::convert(dst, values.get(), n, stream());
  }
}

template <typename T> void CudaDevice<T>::upload(T *dst, const double *src, int64_t n) {
  if (n <= 0)
    return;
  std::string what = "upload of " + std::to_string(n) + " values";
  auto *staged = static_cast<float *>(stage(n * sizeof(float), what));
  for (int64_t i = 0; i < n; ++i)
    staged[i] = float(src[i]);
  uploadStaged(dst, staged, n, what);
}

template <typename T>
void CudaDevice<T>::initShard(T *dst, uint64_t seed, const plan::ParamShard &shard) {
  int64_t n = 1;
  for (int64_t dim : shard.localShape())
    n *= dim;
  if (n <= 0)
    return;
  std::string what = "initialisation of " + shard.name;
  auto *staged = static_cast<float *>(stage(n * sizeof(float), what));
  runtime::initShard(staged, seed, shard);
  uploadStaged(dst, staged, n, what);
}

template <typename T> std::vector<double> CudaDevice<T>::download(const T *src, int64_t n) {
  if (n <= 0)
    return {};
  std::string what = "download of " + std::to_string(n) + " values";
  std::vector<float> host(n);
  if constexpr (std::is_same_v<T, float>) {
    copyToHost(host.data(), src, n * sizeof(float), what);
  } else {
    cuda::StreamBuffer<float> values(n, stream(), "download");
    cuda::convert(values.get(), src, n, stream());
    copyToHost(host.data(), values.get(), n * sizeof(float), what);
  }
  return {host.begin(), host.end()};
}

template <typename T>
void CudaDevice<T>::allReduceHost(Communicator &comm, Communicator::Group group, double *values,
                                  size_t n, ReduceOp op) {
  if (n == 0)
    return;
  std::string what = "all-reduce of " + std::to_string(n) + " host values";
  // A host communicator would read the device buffer below as host memory.
  auto *deviceComm = dynamic_cast<CudaCommunicator *>(&comm);
  if (!deviceComm)
    throw cuda::CudaError(what + " on rank " + std::to_string(comm.rank()) +
                          ": the CUDA device needs a device communicator (CudaCommunicator.h)");
  if (deviceComm->computeStream() != stream())
    throw cuda::CudaError(what + ": the communicator of rank " + std::to_string(comm.rank()) +
                          " is not ordered on this device's stream (setComputeStream)");
  cuda::StreamBuffer<double> reduced(n, stream(), "allReduceHost");
  // `values` stays untouched until the wait below, so the copy may read it late.
  PARC_CUDA_CHECK(
      cudaMemcpyAsync(reduced.get(), values, n * sizeof(double), cudaMemcpyHostToDevice, stream()),
      what);
  comm.allReduce(group, reduced.get(), n, op);
  // The communicator's wait has its deadline; a peer that never joins would leave a plain
  // stream wait blocked for ever behind the collective.
  deviceComm->synchronize();
  // The communicator orders the stream's later work after the call.
  copyToHost(values, reduced.get(), n * sizeof(double), what);
}

//===----------------------------------------------------------------------===//
// Loss and optimizer
//===----------------------------------------------------------------------===//

template <typename T>
double CudaDevice<T>::crossEntropyLoss(T *loss, const float *rowMax, const float *rowSum,
                                       const float *target, int64_t rows) {
  float value = 0;
  const char *what = "crossEntropyLoss";
  if constexpr (std::is_same_v<T, float>) {
    cuda::crossEntropyLoss(loss, rowMax, rowSum, target, rows, stream());
    copyToHost(&value, loss, sizeof value, what);
  } else {
    cuda::StreamBuffer<float> exact(1, stream(), what);
    cuda::crossEntropyLoss(exact.get(), rowMax, rowSum, target, rows, stream());
    cuda::convert(loss, exact.get(), 1, stream());
    copyToHost(&value, exact.get(), sizeof value, what);
  }
  return value;
}

template <typename T>
double CudaDevice<T>::squaredSum(llvm::ArrayRef<std::pair<const Grad *, int64_t>> ranges) {
  const char *what = "squaredSum";
  cuda::StreamBuffer<double> sum(1, stream(), what);
  PARC_CUDA_CHECK(cudaMemsetAsync(sum.get(), 0, sizeof(double), stream()), what);
  for (const auto &[data, n] : ranges)
    cuda::squaredSum(sum.get(), data, n, stream());
  double value = 0;
  copyToHost(&value, sum.get(), sizeof value, what);
  return value;
}

template <typename T>
template <typename Step>
void CudaDevice<T>::stepMaster(T *weights, float *master, int64_t n, Step step) {
  assert(master && "bf16/fp16 weights are stepped through their fp32 master copy");
  step(master);
  cuda::convert(weights, master, n, stream());
}

template <typename T>
void CudaDevice<T>::adamwStep(T *weights, float *master, const Grad *grad, float *m, float *v,
                              int64_t n, const cpu::AdamWConfig &config) {
  if constexpr (KeepsMasterWeights) {
    stepMaster(weights, master, n,
               [&](float *param) { cuda::adamwStep(param, grad, m, v, n, config, stream()); });
  } else {
    (void)master;
    cuda::adamwStep(weights, grad, m, v, n, config, stream());
  }
}

template <typename T>
void CudaDevice<T>::sgdStep(T *weights, float *master, const Grad *grad, float *momentum, int64_t n,
                            const cpu::SGDConfig &config) {
  if constexpr (KeepsMasterWeights) {
    stepMaster(weights, master, n,
               [&](float *param) { cuda::sgdStep(param, grad, momentum, n, config, stream()); });
  } else {
    (void)master;
    cuda::sgdStep(weights, grad, momentum, n, config, stream());
  }
}

template <typename T> void CudaDevice<T>::initMaster(float *master, const T *weights, int64_t n) {
  if constexpr (KeepsMasterWeights)
    cuda::convert(master, weights, n, stream());
  else
    copy(master, weights, n);
}

template class CudaDevice<float>;
template class CudaDevice<__nv_bfloat16>;
template class CudaDevice<__half>;

} // namespace parc::runtime
