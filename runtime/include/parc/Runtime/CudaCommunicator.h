//===- CudaCommunicator.h - Communicators whose buffers live on a GPU -----===//
//
// The Communicator interface on device memory: for these implementations every buffer passed
// to allReduce, reduceScatter, allGather and exchange is a device pointer on the rank's
// device(), and the calls are asynchronous. A call is ordered after the work queued on the
// rank's compute stream so far (through an event) and the stream's later work is ordered
// after the call, so kernels and collectives interleave on the device as they do on the host
// without the host waiting for either. synchronize() is the host's wait, with the deadline
// the interface promises; a stuck collective surfaces there (or in a later call) as a
// CommError.
//
// Reductions keep the interface's contract: the left fold in list order, the same bits on
// every member (cuda::foldBuffers does the arithmetic). Element types are the interface's
// F32 and F64.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_CUDACOMMUNICATOR_H
#define PARC_RUNTIME_CUDACOMMUNICATOR_H

#include "parc/Runtime/Communicator.h"

#include <cuda_runtime_api.h>

#include <string>

namespace parc::runtime {

class CudaCommunicator : public Communicator {
public:
  /// Creates the events of the stream ordering on `device`.
  CudaCommunicator(CommOptions options, int device);
  ~CudaCommunicator() override;

  int device() const { return device_; }
  /// The stream the calls order against; the legacy default stream until set.
  void setComputeStream(cudaStream_t stream) { compute = stream; }
  cudaStream_t computeStream() const { return compute; }

  /// Blocks until every call made so far, and the compute work queued before it, has
  /// completed on the device; throws CommError at the deadline or on a device error. Joins
  /// overlapped calls first.
  void synchronize();

  /// Overlapped calls end on a join stream instead of the compute stream; joinOverlapped()
  /// makes the compute stream wait for the join stream.
  void setOverlapping(bool overlapping) override { overlap = overlapping; }
  void joinOverlapped() override;

protected:
  /// Starts a call that runs on `stream`: selects the device and makes `stream` wait for the
  /// compute stream's work so far. `what` names the call in errors.
  void beginCall(cudaStream_t stream, const std::string &what);
  /// Ends it: the compute stream's later work waits for `stream`'s work so far.
  void endCall(cudaStream_t stream, const std::string &what);
  /// Ends a call whose work another rank queued: the compute stream waits for `event`.
  void endCallAfter(cudaEvent_t event, const std::string &what);

  /// Fails the communicator (CommError) when a CUDA call did not succeed.
  void checkCuda(cudaError_t status, const char *call, const std::string &what);
  /// The reduction step on the device: every outputs[o] = inputs folded in list order.
  void fold(ElementType type, ReduceOp op, void *const *outputs, size_t numOutputs,
            const void *const *inputs, size_t numInputs, size_t count, cudaStream_t stream,
            const std::string &what);

  /// Called while synchronize() waits: reports errors of the transport (NCCL's asynchronous
  /// ones) by failing the communicator.
  virtual void checkTransport(const std::string &what) { (void)what; }
  /// Called when the communicator fails (a timeout in synchronize(), a failed call): a
  /// chance to abort the transfers in flight.
  virtual void abandonTransfers() {}

  [[noreturn]] void fail(const std::string &message) override;
  void checkNotFailed(llvm::function_ref<std::string()> what) override;
  void copyLocal(void *destination, const void *source, size_t bytes) override;

private:
  int device_;
  cudaStream_t compute = nullptr;
  cudaEvent_t computeReady = nullptr, callDone = nullptr, queued = nullptr, joined = nullptr;
  cudaStream_t joinStream = nullptr;
  bool overlap = false, overlapPending = false;
  std::string failure, lastCall;
};

} // namespace parc::runtime

#define PARC_COMM_CUDA_CHECK(call, what) checkCuda((call), #call, (what))

#endif // PARC_RUNTIME_CUDACOMMUNICATOR_H
