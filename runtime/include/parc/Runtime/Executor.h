//===- Executor.h - parrun: execute a directory of rank plans -------------===//
//
// Every rank runs the same sequence: load its plan (and the data), agree with all ranks that
// they belong to one compilation, initialise its shards, run the schedule once per step, and
// at the end report memory and optionally dump the gathered weights.
//
// Errors come in two kinds. An AgreedError is raised by every rank alike, from facts all ranks
// exchanged (a plan id mismatch, a non-finite loss): each rank exits non-zero and one prints
// it. Any other error is local to one rank (a timeout, a plan the rank cannot execute): that
// rank reports it with the schedule instruction it was in and the job is aborted, so that no
// rank waits on it.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_EXECUTOR_H
#define PARC_RUNTIME_EXECUTOR_H

#include "parc/Runtime/Communicator.h"
#include "parc/Runtime/LossScaler.h"

#include "llvm/Support/raw_ostream.h"

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace parc::runtime {

/// parrun's exit status for a job that failed, and for one whose output (a file, standard
/// output) could not be written (docs/runtime.md).
inline constexpr int ExitJobFailed = 1, ExitWriteFailed = 2;

/// A failure every rank raises alike, so that one message is printed.
class AgreedError : public std::runtime_error {
public:
  explicit AgreedError(const std::string &what, int exitStatus = ExitJobFailed)
      : std::runtime_error(what), status(exitStatus) {}
  int exitStatus() const { return status; }

private:
  int status;
};

/// A file this rank could not write (--dump-weights): the job ends with ExitWriteFailed.
class WriteError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// The element type of every weight, gradient and activation. FP64 runs only on the CPU,
/// BF16 and FP16 only on CUDA (with fp32 gradients, master weights and optimizer state); FP32
/// on both. Mixed, on the CPU only, stores fp32 and keeps fp64 gradients, master weights and
/// optimizer state: the arrangement of bf16 on CUDA, so that its path runs in the CPU tests.
enum class Precision { FP32, FP64, BF16, FP16, Mixed };
llvm::StringRef spelling(Precision precision);

/// Where the ops run. A run never falls back from one to the other.
enum class Backend { CPU, CUDA };

/// How the ranks of one parrun process talk. Local: threads sharing the machine (on CUDA, one
/// GPU through the in-process device communicator); NCCL: threads, each with a GPU of its
/// own, through NCCL (CUDA only); MPI: this process is one rank (NCCL between GPUs on CUDA).
enum class CommKind { Local, NCCL, MPI };

struct RunOptions {
  std::string planDir;
  std::optional<int64_t> steps; // default: the plan's train.steps
  std::string dataPath;         // empty: synthetic tokens
  Precision precision = Precision::FP32;
  Backend backend = Backend::CPU;
  int64_t logEvery = 1;
  double timeoutSeconds = 300;
  std::string dumpWeightsPath; // empty: no dump
  std::string memoryJsonPath;  // empty: the memory report only as text
  /// The data-parallel gradient sync starts in buckets of this many bytes during the backward
  /// (GradSyncOverlap.h); 0 waits for the plan's instruction. PyTorch DDP's default 25 MiB.
  int64_t gradBucketBytes = 25 << 20;
  /// CUDA, bf16/fp16: fused flash attention where its shapes allow (CudaFlashAttention.h);
  /// false keeps the cuBLAS + softmax path everywhere.
  bool flashAttention = true;
  /// Run each bias_add + gelu and residual_add + norm pair as one op (OpFusion.h).
  bool fuseElementwise = true;
  /// Threads each rank's kernels use (Kernels.h setKernelThreads); 0: the cores this process
  /// may run on divided by the ranks sharing them (OPENBLAS_NUM_THREADS, when set, instead).
  int64_t threadsPerRank = 0;
  /// Time every op and print a table of op kinds by time, calls and GFLOP/s (Profiler.h).
  bool profile = false;
  /// LossScaler.h; parrun turns on a dynamic scale for fp16.
  LossScaleOptions lossScale;
  /// Checkpoint.h: save to saveDir after the last step and every saveEvery steps (0: only
  /// the last); resume from resumeDir. Empty: neither.
  std::string saveDir;
  int64_t saveEvery = 0;
  std::string resumeDir;
};

/// What one rank saw, for the caller and the tests.
struct RankSummary {
  std::vector<double> losses, gradNorms; // per step, identical on every rank
};

/// Empty when this rank can execute on `backend`; otherwise why it cannot and what to use
/// instead. runRank checks it first, before the rank reads its plan or the data.
std::string backendUnavailable(Backend backend);
/// Empty when the options go together (backend, precision, communicator); otherwise why not.
std::string incompatibleOptions(const RunOptions &options, CommKind comm);

/// Runs one rank on `comm` to the end. Step lines and the memory report go to `out` from the
/// ranks that own them. On CUDA `comm` must be a CudaCommunicator, whose device the rank
/// uses. Throws AgreedError, CommError or std::runtime_error.
RankSummary runRank(Communicator &comm, const RunOptions &options, llvm::raw_ostream &out);

/// Every rank a thread of this process (CommKind Local or NCCL). Returns the exit code; errors
/// are printed to `errs`.
int runLocal(const RunOptions &options, CommKind comm, llvm::raw_ostream &out,
             llvm::raw_ostream &errs);

/// This process is one rank of an MPI job.
int runMPI(int *argc, char ***argv, const RunOptions &options, llvm::raw_ostream &out,
           llvm::raw_ostream &errs);

/// The cores this process may run on (its CPU affinity).
int64_t usableCores();
/// The kernel threads of each of `ranksSharingCores` ranks on this machine under `options`.
int64_t kernelThreadsPerRank(const RunOptions &options, int64_t ranksSharingCores);

/// The number of ranks of the plan directory, from its manifest.
llvm::Expected<int64_t> planWorldSize(llvm::StringRef planDir);

} // namespace parc::runtime

#endif
