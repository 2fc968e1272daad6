//===- CudaCommunicator.cpp - Stream ordering and waiting for device calls -===//
//
// Each call: the compute stream records computeReady, the call's stream waits for it, the
// call's work is queued, the call's stream records callDone, the compute stream waits for it
// and records `queued`. synchronize() polls `queued` rather than blocking in the driver, so
// that it can give up at the deadline and ask the transport for its errors meanwhile.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/CudaCommunicator.h"

#include "parc/Runtime/CudaCheck.h"
#include "parc/Runtime/CudaKernels.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>
#include <thread>

namespace parc::runtime {

CudaCommunicator::CudaCommunicator(CommOptions options, int device)
    : Communicator(options), device_(device) {
  std::string what = "setting up the CUDA communicator on device " + std::to_string(device);
  PARC_COMM_CUDA_CHECK(cudaSetDevice(device), what);
  for (cudaEvent_t *event : {&computeReady, &callDone, &queued, &joined})
    PARC_COMM_CUDA_CHECK(cudaEventCreateWithFlags(event, cudaEventDisableTiming), what);
  PARC_COMM_CUDA_CHECK(cudaStreamCreateWithFlags(&joinStream, cudaStreamNonBlocking), what);
}

CudaCommunicator::~CudaCommunicator() {
  // Events still pending are released by the driver once they complete.
  for (cudaEvent_t event : {computeReady, callDone, queued, joined})
    if (event)
      cudaEventDestroy(event);
  if (joinStream)
    cudaStreamDestroy(joinStream);
}

void CudaCommunicator::beginCall(cudaStream_t stream, const std::string &what) {
  PARC_COMM_CUDA_CHECK(cudaSetDevice(device_), what);
  if (stream == compute)
    return;
  PARC_COMM_CUDA_CHECK(cudaEventRecord(computeReady, compute), what);
  PARC_COMM_CUDA_CHECK(cudaStreamWaitEvent(stream, computeReady, 0), what);
}

void CudaCommunicator::endCall(cudaStream_t stream, const std::string &what) {
  if (stream == compute)
    return endCallAfter(nullptr, what);
  PARC_COMM_CUDA_CHECK(cudaEventRecord(callDone, stream), what);
  endCallAfter(callDone, what);
}

void CudaCommunicator::endCallAfter(cudaEvent_t event, const std::string &what) {
  lastCall = what;
  // The join stream captures the event's state now, so the event may be recorded again by
  // the next call before the join.
  if (overlap && event) {
    PARC_COMM_CUDA_CHECK(cudaStreamWaitEvent(joinStream, event, 0), what);
    overlapPending = true;
    return;
  }
  if (event)
    PARC_COMM_CUDA_CHECK(cudaStreamWaitEvent(compute, event, 0), what);
  PARC_COMM_CUDA_CHECK(cudaEventRecord(queued, compute), what);
}

void CudaCommunicator::joinOverlapped() {
  if (!overlapPending)
    return;
  std::string what = "the join of overlapped calls on rank " + std::to_string(rank());
  PARC_COMM_CUDA_CHECK(cudaSetDevice(device_), what);
  PARC_COMM_CUDA_CHECK(cudaEventRecord(joined, joinStream), what);
  PARC_COMM_CUDA_CHECK(cudaStreamWaitEvent(compute, joined, 0), what);
  PARC_COMM_CUDA_CHECK(cudaEventRecord(queued, compute), what);
  overlapPending = false;
}

void CudaCommunicator::checkCuda(cudaError_t status, const char *call, const std::string &what) {
  if (status != cudaSuccess)
    fail(what + ": " + call + " failed: " + cuda::errorText(status));
}

void CudaCommunicator::fold(ElementType type, ReduceOp op, void *const *outputs, size_t numOutputs,
                            const void *const *inputs, size_t numInputs, size_t count,
                            cudaStream_t stream, const std::string &what) {
  cuda::FoldOp foldOp = op == ReduceOp::Sum ? cuda::FoldOp::Sum : cuda::FoldOp::Max;
  try {
    switch (type) {
    case ElementType::F32:
      return cuda::foldBuffers(reinterpret_cast<float *const *>(outputs), numOutputs,
                               reinterpret_cast<const float *const *>(inputs), numInputs, count,
                               foldOp, stream);
    case ElementType::F64:
      return cuda::foldBuffers(reinterpret_cast<double *const *>(outputs), numOutputs,
                               reinterpret_cast<const double *const *>(inputs), numInputs, count,
                               foldOp, stream);
    case ElementType::BF16:
      return cuda::foldBuffers(reinterpret_cast<__nv_bfloat16 *const *>(outputs), numOutputs,
                               reinterpret_cast<const __nv_bfloat16 *const *>(inputs), numInputs,
                               count, foldOp, stream);
    case ElementType::F16:
      return cuda::foldBuffers(reinterpret_cast<__half *const *>(outputs), numOutputs,
                               reinterpret_cast<const __half *const *>(inputs), numInputs, count,
                               foldOp, stream);
    }
  } catch (const cuda::CudaError &error) {
    fail(what + ": " + error.what());
  }
}

void CudaCommunicator::synchronize() {
  std::string what = "synchronize on rank " + std::to_string(rank());
  if (!lastCall.empty())
    what += " (the last call: " + lastCall + ")";
  checkNotFailed([&] { return what; });
  joinOverlapped();
  PARC_COMM_CUDA_CHECK(cudaSetDevice(device_), what);
  double seconds = std::min(std::max(timeoutSeconds(), 0.0), 365.0 * 24 * 3600);
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(seconds));
  for (;;) {
    cudaError_t status = cudaEventQuery(queued);
    if (status == cudaSuccess)
      return;
    if (status != cudaErrorNotReady)
      checkCuda(status, "cudaEventQuery",
                what + " (the error may come from any kernel queued before; "
                       "CUDA_LAUNCH_BLOCKING=1 reports it at its launch)");
    // Not an error, but the runtime keeps it as the thread's last error, which the next
    // kernel launch's check would then report as its own failure.
    (void)cudaGetLastError();
    checkTransport(what);
    if (std::chrono::steady_clock::now() > deadline) {
      std::string text;
      llvm::raw_string_ostream(text) << llvm::format("%g s", timeoutSeconds());
      fail("timed out after " + text + " in " + what +
           ", waiting for the device to complete the queued calls");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void CudaCommunicator::fail(const std::string &message) {
  if (failure.empty()) {
    failure = message;
    // No later call may run, so nothing in flight can be waited for either: a kernel left
    // waiting for peers would hold every later wait on this device, the destructors' too.
    abandonTransfers();
  }
  throw CommError(message);
}

void CudaCommunicator::checkNotFailed(llvm::function_ref<std::string()> what) {
  if (!failure.empty())
    throw CommError(what() + " gave up because the communicator failed: " + failure);
}

void CudaCommunicator::copyLocal(void *destination, const void *source, size_t bytes) {
  if (destination == source)
    return;
  std::string what = "the copy of a one-member collective on rank " + std::to_string(rank());
  PARC_COMM_CUDA_CHECK(cudaSetDevice(device_), what);
  PARC_COMM_CUDA_CHECK(
      cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, compute), what);
}

} // namespace parc::runtime
