//===- CudaRun.h - What runRank needs from the CUDA backend ---------------===//
//
// Private to runtime/exec and built only with the CUDA backend: the device communicators a
// run can use and the rank loop on a CudaDevice of the precision asked for.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_EXEC_CUDARUN_H
#define PARC_RUNTIME_EXEC_CUDARUN_H

#include "parc/Runtime/Communicator.h"
#include "parc/Runtime/Executor.h"
#include "parc/Runtime/PlanLoader.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace parc::runtime {

/// The rank loop on the GPU of `comm`, which must be a CudaCommunicator.
RankSummary runRankOnCuda(Communicator &comm, const RunOptions &options, const LoadedJob &job,
                          llvm::raw_ostream &out);

/// Every rank a thread: CommKind::Local shares GPU 0 through CudaLocalWorld, CommKind::NCCL
/// gives rank r GPU r and talks through NCCL. As LocalWorld::run: one message per rank.
std::vector<std::string> runCudaThreads(int64_t world, CommKind kind, CommOptions options,
                                        const std::function<void(Communicator &)> &body,
                                        std::string &failure);

/// NCCL for this process's rank of `host` (an MPI job), on the launcher's local GPU.
std::unique_ptr<Communicator> createNCCLCommunicator(Communicator &host, CommOptions options);

} // namespace parc::runtime

#endif
