//===- CudaRun.cpp - Ranks on GPUs: device communicators and precisions ---===//

#include "CudaRun.h"

#include "RankLoop.h"
#include "parc/Runtime/CudaCheck.h"
#include "parc/Runtime/CudaDevice.h"
#include "parc/Runtime/CudaLocalCommunicator.h"
#include "parc/Runtime/NCCLCommunicator.h"

#include <cuda_runtime_api.h>

namespace parc::runtime {

namespace {
/// The communicator orders its calls against the device's stream while the rank runs, and
/// forgets the stream before the device destroys it.
class ComputeStreamBinding {
public:
  ComputeStreamBinding(CudaCommunicator &comm, cudaStream_t stream) : comm(comm) {
    comm.setComputeStream(stream);
  }
  ~ComputeStreamBinding() { comm.setComputeStream(nullptr); }
  ComputeStreamBinding(const ComputeStreamBinding &) = delete;
  ComputeStreamBinding &operator=(const ComputeStreamBinding &) = delete;

private:
  CudaCommunicator &comm;
};

template <typename T>
RankSummary runWithPrecision(CudaCommunicator &comm, const RunOptions &options,
                             const LoadedJob &job, llvm::raw_ostream &out) {
  CudaDevice<T> device(comm.device());
  ComputeStreamBinding binding(comm, device.stream());
  RankSummary summary = runOnDevice(device, comm, options, job, out);
  comm.synchronize();
  return summary;
}
} // namespace

RankSummary runRankOnCuda(Communicator &comm, const RunOptions &options, const LoadedJob &job,
                          llvm::raw_ostream &out) {
  auto *deviceComm = dynamic_cast<CudaCommunicator *>(&comm);
  if (!deviceComm)
    throw std::runtime_error("the CUDA backend needs a device communicator (the in-process GPU "
                             "communicator or NCCL), not a host one");
  switch (options.precision) {
  case Precision::FP32:
    return runWithPrecision<float>(*deviceComm, options, job, out);
  case Precision::BF16:
    return runWithPrecision<__nv_bfloat16>(*deviceComm, options, job, out);
  case Precision::FP16:
    return runWithPrecision<__half>(*deviceComm, options, job, out);
  case Precision::FP64:
    break;
  }
  throw std::runtime_error(incompatibleOptions(options, CommKind::Local));
}

std::vector<std::string> runCudaThreads(int64_t world, CommKind kind, CommOptions options,
                                        const std::function<void(Communicator &)> &body,
                                        std::string &failure) {
  if (kind != CommKind::NCCL) {
    CudaLocalWorld local(world, /*device=*/0, options);
    std::vector<std::string> errors = local.run([&](CudaCommunicator &comm) { body(comm); });
    failure = local.failure();
    return errors;
  }
  int devices = 0;
  PARC_CUDA_CHECK(cudaGetDeviceCount(&devices), "counting the GPUs for --comm=nccl");
  if (world > devices)
    throw std::runtime_error("--comm=nccl runs one rank per GPU, but the plan has " +
                             std::to_string(world) + " ranks and this machine " +
                             std::to_string(devices) + (devices == 1 ? " GPU" : " GPUs") +
                             "; use --comm=local to run every rank on one GPU");
  LocalWorld host(world, options);
  std::vector<std::string> errors = host.run([&](Communicator &hostComm) {
    std::unique_ptr<NCCLCommunicator> nccl =
        NCCLCommunicator::create(hostComm, int(hostComm.rank()), options);
    body(*nccl);
  });
  failure = host.failure();
  return errors;
}

std::unique_ptr<Communicator> createNCCLCommunicator(Communicator &host, CommOptions options) {
  return NCCLCommunicator::create(host, NCCLCommunicator::defaultDevice(host.rank()), options);
}

} // namespace parc::runtime
