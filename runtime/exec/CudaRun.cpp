//===- CudaRun.cpp - Ranks on GPUs: device communicators and precisions ---===//

#include "CudaRun.h"

#include "RankLoop.h"
#include "parc/Runtime/CudaCheck.h"
#include "parc/Runtime/CudaDevice.h"
#include "parc/Runtime/CudaLocalCommunicator.h"
#include "parc/Runtime/NCCLCommunicator.h"

#include <cuda_runtime_api.h>

#include <exception>

namespace parc::runtime {

namespace {
/// The communicator orders its calls against the device's stream, and the device's host waits
/// go through the communicator's deadline, while the rank runs. A rank that fails may leave
/// collectives in flight that no peer will complete; the device's destructor waits for its
/// stream, so those calls must end first: completed, or abandoned (NCCL aborted) at the
/// communicator's deadline, instead of holding the rank for ever. Overlapped calls are joined
/// first: they may still write gradients whose pool the device's destructor releases.
template <typename T> class RankBinding {
public:
  RankBinding(CudaDevice<T> &device, CudaCommunicator &comm)
      : device(device), comm(comm), unwinding(std::uncaught_exceptions()) {
    device.bindCommunicator(&comm);
  }
  ~RankBinding() {
    if (std::uncaught_exceptions() > unwinding) {
      try {
        comm.joinOverlapped();
        comm.synchronize();
      } catch (const std::exception &) {
        // The error on its way out says what went wrong first.
      }
    }
    device.bindCommunicator(nullptr);
  }
  RankBinding(const RankBinding &) = delete;
  RankBinding &operator=(const RankBinding &) = delete;

private:
  CudaDevice<T> &device;
  CudaCommunicator &comm;
  int unwinding;
};

/// NCCL communicators for the plan's groups, created together before the first collective:
/// created lazily, a group's ncclCommInitRank would run while other communicators' kernels
/// wait for this rank, and NCCL's initialisation may synchronise the device (NCCL's "using
/// multiple communicators concurrently"). Every rank splits the same entries in the same
/// order; a group of one member needs no communicator.
void createGroups(NCCLCommunicator &nccl, const plan::RankPlan &plan) {
  std::vector<std::vector<int64_t>> entries;
  for (plan::Group group : plan::kAllGroups) {
    const std::vector<int64_t> &ranks = plan.groups.get(group);
    // Without context parallelism dp_cp is the dp group again; without expert parallelism
    // expert_dp is dp_cp.
    bool duplicate = (group == plan::Group::DPCP && plan.parallel.cp == 1) ||
                     (group == plan::Group::ExpertDP && plan.parallel.ep == 1);
    entries.push_back(ranks.size() > 1 && !duplicate ? ranks : std::vector<int64_t>());
  }
  nccl.splitGroups(entries);
}

template <typename T>
RankSummary runWithPrecision(CudaCommunicator &comm, const RunOptions &options,
                             const LoadedJob &job, llvm::raw_ostream &out) {
  CudaDevice<T> device(comm.device(), options.flashAttention);
  RankBinding<T> binding(device, comm);
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
  if (auto *nccl = dynamic_cast<NCCLCommunicator *>(deviceComm); nccl && comm.world() > 1)
    createGroups(*nccl, job.plan);
  switch (options.precision) {
  case Precision::FP32:
    return runWithPrecision<float>(*deviceComm, options, job, out);
  case Precision::BF16:
    return runWithPrecision<__nv_bfloat16>(*deviceComm, options, job, out);
  case Precision::FP16:
    return runWithPrecision<__half>(*deviceComm, options, job, out);
  case Precision::FP64:
  case Precision::Mixed:
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
