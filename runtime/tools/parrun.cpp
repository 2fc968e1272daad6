//===- parrun.cpp - Execute the rank plans parc wrote ---------------------===//
//
//   parrun PLANS_DIR [--steps N] [--data FILE] [--comm=local|mpi] [--precision=fp32|fp64]
//          [--backend=cpu|cuda] [--log-every K] [--timeout SECONDS] [--dump-weights FILE]
//
// --comm=local (the default outside mpirun) runs every rank as a thread of this process;
// --comm=mpi (the default when launched by mpirun) makes this process the rank MPI gives it:
// `mpirun -np WORLD parrun PLANS_DIR`.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Executor.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/WithColor.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdlib>

using namespace llvm;

namespace {

enum class CommKind { Default, Local, MPI };

cl::OptionCategory parrunCategory("parrun options");
cl::opt<std::string> planDir(cl::Positional, cl::desc("<plans dir>"), cl::Required,
                             cl::cat(parrunCategory));
cl::opt<int64_t> steps("steps", cl::desc("Training steps (default: the plan's train.steps)"),
                       cl::value_desc("N"), cl::init(-1), cl::cat(parrunCategory));
cl::opt<std::string> dataPath("data",
                              cl::desc("Train on the bytes of FILE (vocab 256) instead of "
                                       "synthetic tokens"),
                              cl::value_desc("FILE"), cl::cat(parrunCategory));
cl::opt<CommKind>
    commKind("comm", cl::desc("How ranks talk (default: mpi under mpirun, else local)"),
             cl::init(CommKind::Default),
             cl::values(clEnumValN(CommKind::Local, "local", "every rank a thread of this process"),
                        clEnumValN(CommKind::MPI, "mpi", "this process is one MPI rank")),
             cl::cat(parrunCategory));
cl::opt<parc::runtime::Precision>
    precision("precision", cl::desc("Arithmetic precision of every buffer"),
              cl::init(parc::runtime::Precision::FP32),
              cl::values(clEnumValN(parc::runtime::Precision::FP32, "fp32", "float (default)"),
                         clEnumValN(parc::runtime::Precision::FP64, "fp64", "double")),
              cl::cat(parrunCategory));
cl::opt<parc::runtime::Backend> backend(
    "backend", cl::desc("Where the ops run"), cl::init(parc::runtime::Backend::CPU),
    cl::values(clEnumValN(parc::runtime::Backend::CPU, "cpu", "OpenBLAS kernels (default)"),
               clEnumValN(parc::runtime::Backend::CUDA, "cuda",
                          "CUDA kernels; not implemented yet: fails, naming why")),
    cl::cat(parrunCategory));
cl::opt<int64_t> logEvery("log-every", cl::desc("Print every K-th step (and the last)"),
                          cl::value_desc("K"), cl::init(1), cl::cat(parrunCategory));
cl::opt<double> timeoutSeconds("timeout",
                               cl::desc("Seconds any wait for another rank may take (default 300)"),
                               cl::value_desc("SECONDS"), cl::init(300), cl::cat(parrunCategory));
cl::opt<std::string> dumpWeights("dump-weights",
                                 cl::desc("After the last step, write every parameter (whole) "
                                          "and the per-step losses to FILE as JSON"),
                                 cl::value_desc("FILE"), cl::cat(parrunCategory));

bool underMPILauncher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

} // namespace

int main(int argc, char **argv) {
  InitLLVM init(argc, argv);
  cl::HideUnrelatedOptions(parrunCategory);
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

  bool mpi = commKind == CommKind::MPI || (commKind == CommKind::Default && underMPILauncher());
  if (mpi)
    return parc::runtime::runMPI(&argc, &argv, options, outs(), errs());
  return parc::runtime::runLocal(options, outs(), errs());
}
