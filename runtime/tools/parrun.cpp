//===- parrun.cpp - Execute the rank plans parc wrote ---------------------===//
//
//   parrun PLANS_DIR [--steps N] [--data FILE] [--comm=local|mpi|nccl]
//          [--precision=fp32|fp64|bf16|fp16] [--backend=cpu|cuda] [--log-every K]
//          [--timeout SECONDS] [--grad-bucket-mb MIB] [--attention=flash|unfused]
//          [--fuse-elementwise=true|false] [--threads N] [--profile] [--dump-weights FILE]
//          [--memory-json FILE]
//          [--loss-scale=dynamic|none|S] [--initial-loss-scale S] [--min-loss-scale S]
//          [--loss-scale-window N] [--loss-scale-hysteresis N]
//          [--save DIR [--save-every K]] [--resume DIR]
//
// --comm=local (the default outside mpirun) runs every rank as a thread of this process (on
// CUDA, all of them on GPU 0); --comm=nccl (CUDA) runs them as threads with a GPU each;
// --comm=mpi (the default when launched by mpirun) makes this process the rank MPI gives it:
// `mpirun -np WORLD parrun PLANS_DIR` (on CUDA, NCCL between the processes' GPUs).
//
//===----------------------------------------------------------------------===//

#include "parc/Plan/PlanJSON.h"
#include "parc/Runtime/Checkpoint.h"
#include "parc/Runtime/Executor.h"
#include "parc/Runtime/Kernels.h"
#include "parc/Support/FileOutput.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/WithColor.h"
#include "llvm/Support/raw_ostream.h"

#include <csignal>
#include <cstdlib>

using namespace llvm;

namespace {

void printVersion(raw_ostream &os) {
  os << "parrun (" << parc::plan::CompilerVersion << ", plan format " << parc::plan::FormatVersion
     << ")\n  CPU kernels on OpenBLAS's " << parc::runtime::cpu::blasCoreName() << " kernels";
  std::string wanted = parc::runtime::cpu::blasCoreForInstructionSets();
  if (!wanted.empty())
    os << " (this CPU's instruction sets call for " << wanted << ")";
  os << "\n";
}

enum class CommChoice { Default, Local, NCCL, MPI };

cl::OptionCategory parrunCategory("parrun options");
cl::opt<std::string> planDir(cl::Positional, cl::desc("<plans dir>"), cl::Required,
                             cl::cat(parrunCategory));
cl::opt<int64_t> steps("steps", cl::desc("Training steps (default: the plan's train.steps)"),
                       cl::value_desc("N"), cl::init(-1), cl::cat(parrunCategory));
cl::opt<std::string> dataPath("data",
                              cl::desc("Train on the bytes of FILE (vocab 256) instead of "
                                       "synthetic tokens"),
                              cl::value_desc("FILE"), cl::cat(parrunCategory));
cl::opt<CommChoice>
    commChoice("comm", cl::desc("How ranks talk (default: mpi under mpirun, else local)"),
               cl::init(CommChoice::Default),
               cl::values(clEnumValN(CommChoice::Local, "local",
                                     "every rank a thread of this process (on CUDA: all on GPU 0)"),
                          clEnumValN(CommChoice::NCCL, "nccl",
                                     "every rank a thread with a GPU of its own, NCCL (CUDA only)"),
                          clEnumValN(CommChoice::MPI, "mpi", "this process is one MPI rank")),
               cl::cat(parrunCategory));
cl::opt<parc::runtime::Precision>
    precision("precision", cl::desc("Element type of every weight, gradient and activation"),
              cl::init(parc::runtime::Precision::FP32),
              cl::values(clEnumValN(parc::runtime::Precision::FP32, "fp32", "float (default)"),
                         clEnumValN(parc::runtime::Precision::FP64, "fp64", "double (CPU only)"),
                         clEnumValN(parc::runtime::Precision::BF16, "bf16",
                                    "bfloat16, fp32 gradients and master weights (CUDA only)"),
                         clEnumValN(parc::runtime::Precision::FP16, "fp16",
                                    "float16, fp32 gradients and master weights (CUDA only)"),
                         clEnumValN(parc::runtime::Precision::Mixed, "mixed",
                                    "float, fp64 gradients and master weights (CPU only: the "
                                    "mixed-precision path without a GPU)")),
              cl::cat(parrunCategory));
cl::opt<parc::runtime::Backend>
    backend("backend", cl::desc("Where the ops run"), cl::init(parc::runtime::Backend::CPU),
            cl::values(clEnumValN(parc::runtime::Backend::CPU, "cpu", "OpenBLAS kernels (default)"),
                       clEnumValN(parc::runtime::Backend::CUDA, "cuda",
                                  "CUDA kernels, cuBLAS and NCCL on NVIDIA GPUs")),
            cl::cat(parrunCategory));
cl::opt<int64_t> logEvery("log-every", cl::desc("Print every K-th step (and the last)"),
                          cl::value_desc("K"), cl::init(1), cl::cat(parrunCategory));
cl::opt<double> timeoutSeconds("timeout",
                               cl::desc("Seconds any wait for another rank may take (default 300)"),
                               cl::value_desc("SECONDS"), cl::init(300), cl::cat(parrunCategory));
cl::opt<double> gradBucketMB(
    "grad-bucket-mb",
    cl::desc("Start the data-parallel gradient all-reduce in buckets of this many MiB during "
             "the backward; 0 waits for the plan's instruction (default 25)"),
    cl::value_desc("MIB"), cl::init(25), cl::cat(parrunCategory));
enum class AttentionChoice { Flash, Unfused };
cl::opt<AttentionChoice> attention(
    "attention", cl::desc("CUDA attention in bf16/fp16 (fp32 always takes the unfused path)"),
    cl::init(AttentionChoice::Flash),
    cl::values(clEnumValN(AttentionChoice::Flash, "flash",
                          "fused flash attention where seq and head size allow (default)"),
               clEnumValN(AttentionChoice::Unfused, "unfused",
                          "cuBLAS scores, a fused softmax kernel, cuBLAS again")),
    cl::cat(parrunCategory));
cl::opt<bool> fuseElementwise(
    "fuse-elementwise",
    cl::desc("Run each bias_add + gelu and residual_add + norm pair of the plans as one op "
             "(default true)"),
    cl::init(true), cl::cat(parrunCategory));
cl::opt<int64_t> threads("threads",
                         cl::desc("Threads each rank's CPU kernels use (default: the cores "
                                  "divided by the ranks sharing them)"),
                         cl::value_desc("N"), cl::init(0), cl::cat(parrunCategory));
cl::opt<bool> profile("profile",
                      cl::desc("Time every op and print a table of op kinds by time, calls "
                               "and GFLOP/s"),
                      cl::init(false), cl::cat(parrunCategory));
cl::opt<std::string> dumpWeights("dump-weights",
                                 cl::desc("After the last step, write every parameter (whole) "
                                          "and the per-step losses to FILE as JSON"),
                                 cl::value_desc("FILE"), cl::cat(parrunCategory));

cl::opt<std::string> memoryJson("memory-json",
                                cl::desc("After the run, write every rank's held and predicted "
                                         "peak bytes per memory category to FILE as JSON"),
                                cl::value_desc("FILE"), cl::cat(parrunCategory));

cl::opt<std::string> lossScale(
    "loss-scale",
    cl::desc("Scale the loss by S (a number), by a dynamic scale that skips overflowed steps "
             "(dynamic), or not (none); default dynamic with fp16, none otherwise"),
    cl::value_desc("dynamic|none|S"), cl::cat(parrunCategory));
cl::opt<double> initialLossScale("initial-loss-scale",
                                 cl::desc("Where the dynamic loss scale starts (default 65536)"),
                                 cl::value_desc("S"), cl::init(65536), cl::cat(parrunCategory));
cl::opt<double> minLossScale("min-loss-scale",
                             cl::desc("The dynamic loss scale's floor (default 1)"),
                             cl::value_desc("S"), cl::init(1), cl::cat(parrunCategory));
cl::opt<int64_t> lossScaleWindow(
    "loss-scale-window",
    cl::desc("Finite steps in a row after which the dynamic loss scale doubles (default 1000)"),
    cl::value_desc("N"), cl::init(1000), cl::cat(parrunCategory));
cl::opt<int64_t> lossScaleHysteresis(
    "loss-scale-hysteresis",
    cl::desc("Overflows since the scale last grew before each next one halves it (default 2)"),
    cl::value_desc("N"), cl::init(2), cl::cat(parrunCategory));

cl::opt<std::string> saveDir("save",
                             cl::desc("Save a checkpoint to DIR after the last step (replacing "
                                      "one there)"),
                             cl::value_desc("DIR"), cl::cat(parrunCategory));
cl::opt<int64_t> saveEvery("save-every", cl::desc("Also save the checkpoint after every K-th step"),
                           cl::value_desc("K"), cl::init(0), cl::cat(parrunCategory));
cl::opt<std::string> resumeDir("resume",
                               cl::desc("Start from the checkpoint in DIR (saved from these "
                                        "plans) and train up to --steps"),
                               cl::value_desc("DIR"), cl::cat(parrunCategory));

bool underMPILauncher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

int run(int argc, char **argv) {
  cl::HideUnrelatedOptions(parrunCategory);
  cl::SetVersionPrinter(printVersion);
  if (!cl::ParseCommandLineOptions(argc, argv, "parrun: execute the rank plans of `parc -o`\n"))
    return 2;
  auto usage = [](const Twine &message) {
    WithColor::error(errs(), "parrun") << message << "\n";
    return 2;
  };
  if (steps.getNumOccurrences() && steps < 0)
    return usage("--steps must be 0 or more, not " + Twine(int64_t(steps)));
  if (logEvery < 1)
    return usage("--log-every must be 1 or more, not " + Twine(int64_t(logEvery)));
  if (!(timeoutSeconds > 0))
    return usage("--timeout must be a positive number of seconds");
  if (!(gradBucketMB >= 0 && gradBucketMB <= 1 << 20))
    return usage("--grad-bucket-mb must be between 0 and 1048576");
  if (threads.getNumOccurrences() && (threads < 1 || threads > 1024))
    return usage("--threads must be between 1 and 1024, not " + Twine(int64_t(threads)));
  if (saveEvery.getNumOccurrences() && (saveEvery < 1 || saveDir.empty()))
    return usage("--save-every needs --save DIR and a K of 1 or more");

  parc::runtime::RunOptions options;
  options.planDir = planDir;
  if (steps.getNumOccurrences())
    options.steps = steps;
  options.dataPath = dataPath;
  options.precision = precision;
  options.backend = backend;
  options.logEvery = logEvery;
  options.timeoutSeconds = timeoutSeconds;
  options.dumpWeightsPath = dumpWeights;
  options.memoryJsonPath = memoryJson;
  options.gradBucketBytes = int64_t(gradBucketMB * double(1 << 20));
  options.flashAttention = attention == AttentionChoice::Flash;
  options.fuseElementwise = fuseElementwise;
  options.threadsPerRank = threads;
  options.profile = profile;
  // "ckpt/" from tab completion names the folder ckpt; its siblings ckpt.partial and ckpt.old
  // must not land inside it.
  auto folder = [](StringRef path) {
    while (path.size() > 1 && sys::path::is_separator(path.back()))
      path = path.drop_back();
    return path.str();
  };
  options.saveDir = folder(saveDir);
  options.saveEvery = saveEvery;
  options.resumeDir = folder(resumeDir);

  using LossScaleMode = parc::runtime::LossScaleOptions::Mode;
  parc::runtime::LossScaleOptions &scaling = options.lossScale;
  if (!lossScale.getNumOccurrences())
    scaling.mode =
        precision == parc::runtime::Precision::FP16 ? LossScaleMode::Dynamic : LossScaleMode::None;
  else if (lossScale == "dynamic")
    scaling.mode = LossScaleMode::Dynamic;
  else if (lossScale == "none")
    scaling.mode = LossScaleMode::None;
  else if (StringRef(lossScale).getAsDouble(scaling.initial))
    return usage("--loss-scale must be dynamic, none or a number, not '" + lossScale + "'");
  else
    scaling.mode = LossScaleMode::Static;
  if (scaling.mode == LossScaleMode::Dynamic) {
    scaling.initial = initialLossScale;
    scaling.min = minLossScale;
    scaling.window = lossScaleWindow;
    scaling.hysteresis = lossScaleHysteresis;
  } else {
    for (const cl::Option *option : std::initializer_list<const cl::Option *>{
             &initialLossScale, &minLossScale, &lossScaleWindow, &lossScaleHysteresis})
      if (option->getNumOccurrences())
        return usage("--" + option->ArgStr + " sets the dynamic loss scale; add " +
                     "--loss-scale=dynamic");
  }

  // Found now, not after the steps it was to keep.
  if (!options.saveDir.empty())
    if (std::string problem = parc::runtime::checkSaveLocation(options.saveDir); !problem.empty())
      return usage(problem);

  using parc::runtime::CommKind;
  CommKind comm = commChoice == CommChoice::NCCL    ? CommKind::NCCL
                  : commChoice == CommChoice::MPI   ? CommKind::MPI
                  : commChoice == CommChoice::Local ? CommKind::Local
                  : underMPILauncher()              ? CommKind::MPI
                                                    : CommKind::Local;
  std::string incompatible = parc::runtime::incompatibleOptions(options, comm);
  if (!incompatible.empty())
    return usage(incompatible);
  if (comm == CommKind::MPI)
    return parc::runtime::runMPI(&argc, &argv, options, outs(), errs());
  return parc::runtime::runLocal(options, comm, outs(), errs());
}

} // namespace

int main(int argc, char **argv) {
  parc::runtime::cpu::restartOnMatchingBlasCore(argv);
  InitLLVM init(argc, argv);
  // A file-size limit (ulimit -f) makes a write fail with EFBIG, reported like a full disk,
  // instead of ending the process by SIGXFSZ with its outputs half-written.
  std::signal(SIGXFSZ, SIG_IGN);
  int status = run(argc, argv);
  // Step lines that did not reach standard output are a failed write (exit 2).
  return parc::finishStandardOutput("parrun") ? status : parc::runtime::ExitWriteFailed;
}
