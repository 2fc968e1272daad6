//===- Executor.cpp - A rank from start-up to the memory report -----------===//

#include "parc/Runtime/Executor.h"

#include "RankLoop.h"
#include "parc/Runtime/CpuDevice.h"
#include "parc/Runtime/Kernels.h"
#include "parc/Runtime/PlanLoader.h"

#ifdef PARC_HAVE_CUDA
#include "CudaRun.h"
#endif

#include "parc/Support/FileOutput.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include <array>
#include <cmath>
#include <cstdlib>
#include <thread>

#include <sched.h>

namespace parc::runtime {

namespace {

std::string formatBytes(int64_t bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = double(bytes);
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(units)) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0)
    return std::to_string(bytes) + " B";
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::format("%.2f ", value) << units[unit];
  return os.str();
}

/// One rank's part of the memory report, exchanged so that the printing rank shows every
/// rank: its stage, its peaks and the plan's prediction, per category and in total, and on a
/// GPU the peak of each category's memory pool as the driver measured it (-1: no pools).
struct MemoryRow {
  static constexpr size_t Columns = NumMemoryCategories + 1; // the categories, then the total
  int64_t stage = 0, reserve = 0;
  std::array<int64_t, Columns> held{}, predicted{};
  std::array<int64_t, NumMemoryCategories> pools{-1, -1, -1, -1};

  MemoryRow() = default;
  MemoryRow(const plan::RankPlan &plan, const MemoryTracker &memory,
            const std::array<int64_t, NumMemoryCategories> &poolPeaks)
      : pools(poolPeaks) {
    stage = plan.coords.pp;
    reserve = plan.predictedMemory.reserve;
    for (size_t c = 0; c < NumMemoryCategories; ++c)
      held[c] = memory.peak(static_cast<MemoryCategory>(c));
    held[NumMemoryCategories] = memory.peakTotal();
    const plan::PredictedMemory &model = plan.predictedMemory;
    predicted = {model.weights, model.grads, model.optimizer, model.activations,
                 model.weights + model.grads + model.optimizer + model.activations};
  }

  std::string encode() const {
    std::string text = std::to_string(stage) + " " + std::to_string(reserve);
    for (size_t c = 0; c < Columns; ++c)
      text += " " + std::to_string(held[c]) + " " + std::to_string(predicted[c]);
    for (int64_t bytes : pools)
      text += " " + std::to_string(bytes);
    return text;
  }
  static MemoryRow decode(llvm::StringRef text) {
    llvm::SmallVector<llvm::StringRef, 12> fields;
    text.split(fields, ' ');
    std::vector<int64_t> numbers;
    for (llvm::StringRef field : fields) {
      int64_t value = 0;
      field.getAsInteger(10, value);
      numbers.push_back(value);
    }
    numbers.resize(2 + 2 * Columns + NumMemoryCategories, -1);
    MemoryRow row;
    row.stage = numbers[0];
    row.reserve = numbers[1];
    for (size_t c = 0; c < Columns; ++c) {
      row.held[c] = numbers[2 + 2 * c];
      row.predicted[c] = numbers[3 + 2 * c];
    }
    for (size_t c = 0; c < NumMemoryCategories; ++c) {
      row.pools[c] = numbers[2 + 2 * Columns + c];
    }
    return row;
  }
};

std::string formatDifference(int64_t held, int64_t predicted) {
  if (predicted == 0)
    return held == 0 ? "+0.0%" : "n/a";
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::format("%+.1f%%", 100.0 * double(held - predicted) / double(predicted));
  return os.str();
}

} // namespace

std::string formatStepLine(int64_t step, const StepResult &result, double tokensPerSecond,
                           bool showLossScale) {
  // A skipped step's norm is nan or inf; printf would sign a nan.
  double norm = result.optimizer.gradNorm;
  std::string normText = std::isnan(norm) ? "nan" : std::isinf(norm) ? "inf" : "";
  if (normText.empty())
    llvm::raw_string_ostream(normText) << llvm::format("%.3f", norm);
  std::string line;
  llvm::raw_string_ostream os(line);
  os << llvm::format("step %lld loss %.4f lr %.2e grad_norm %s tokens/s %.0f",
                     (long long)(step + 1), result.loss, result.optimizer.lr, normText.c_str(),
                     tokensPerSecond);
  if (showLossScale)
    os << " loss_scale " << formatLossScale(result.optimizer.lossScale);
  if (result.optimizer.skipped)
    os << " skipped (gradients overflowed)";
  return os.str();
}

std::string encodeMemoryRow(const plan::RankPlan &plan, const MemoryTracker &memory,
                            const std::array<int64_t, NumMemoryCategories> &poolPeaks) {
  return MemoryRow(plan, memory, poolPeaks).encode();
}

void printMemory(llvm::ArrayRef<std::string> encoded, const RunOptions &options,
                 plan::DType modelDtype, llvm::raw_ostream &out) {
  std::vector<MemoryRow> rows;
  for (const std::string &text : encoded)
    rows.push_back(MemoryRow::decode(text));
  out << "memory   peak bytes per rank: held by parrun in " << spelling(options.precision)
      << (options.backend == Backend::CUDA ? " on the GPU" : "")
      << ", predicted by parc's memory model at the model's " << plan::spelling(modelDtype);
  if (!rows.empty() && rows.front().reserve > 0)
    out << " (plus a reserve of " << formatBytes(rows.front().reserve)
        << " per rank that parrun does not hold)";
  out << "\n";
  auto cells = [&](llvm::StringRef rank, llvm::StringRef stage, llvm::StringRef label) {
    out << llvm::right_justify(rank, 6) << llvm::right_justify(stage, 6) << "  "
        << llvm::left_justify(label, 5);
  };
  cells("rank", "stage", "");
  for (const char *column : {"weights", "grads", "optimizer", "activations", "total"})
    out << llvm::right_justify(column, 13);
  out << "\n";
  for (size_t r = 0; r < rows.size(); ++r) {
    const MemoryRow &row = rows[r];
    cells(std::to_string(r), std::to_string(row.stage), "held");
    for (int64_t bytes : row.held)
      out << llvm::right_justify(formatBytes(bytes), 13);
    out << "\n";
    if (row.pools[0] >= 0) {
      cells("", "", "pool");
      for (int64_t bytes : row.pools)
        out << llvm::right_justify(formatBytes(bytes), 13);
      out << "\n";
    }
    cells("", "", "model");
    for (int64_t bytes : row.predicted)
      out << llvm::right_justify(formatBytes(bytes), 13);
    out << "\n";
    cells("", "", "diff");
    for (size_t c = 0; c < MemoryRow::Columns; ++c)
      out << llvm::right_justify(formatDifference(row.held[c], row.predicted[c]), 13);
    out << "\n";
  }
  out.flush();
}

void writeMemoryJson(llvm::ArrayRef<std::string> encoded, const RunOptions &options) {
  static constexpr const char *columns[] = {"weights", "grads", "optimizer", "activations",
                                            "total"};
  llvm::json::Array ranks;
  for (size_t r = 0; r < encoded.size(); ++r) {
    MemoryRow row = MemoryRow::decode(encoded[r]);
    llvm::json::Object held, predicted;
    for (size_t c = 0; c < MemoryRow::Columns; ++c) {
      held[columns[c]] = row.held[c];
      predicted[columns[c]] = row.predicted[c];
    }
    ranks.push_back(llvm::json::Object{{"rank", int64_t(r)},
                                       {"stage", row.stage},
                                       {"held", std::move(held)},
                                       {"predicted", std::move(predicted)}});
  }
  llvm::json::Object report{{"format", "parrun-memory/1"},
                            {"precision", spelling(options.precision)},
                            {"ranks", std::move(ranks)}};
  if (llvm::Error error = writeFile(options.memoryJsonPath, [&](llvm::raw_ostream &os) {
        os << llvm::formatv("{0:2}", llvm::json::Value(std::move(report))) << "\n";
      }))
    throw std::runtime_error("cannot write --memory-json file: " +
                             llvm::toString(std::move(error)));
}

namespace {
std::string describeJob(const plan::RankPlan &plan, const RunOptions &options,
                        const TokenStream &data, int64_t steps) {
  const plan::ParallelSummary &p = plan.parallel;
  std::string text;
  llvm::raw_string_ostream os(text);
  os << "parrun   " << plan.world << (plan.world == 1 ? " rank" : " ranks") << " (tp " << p.tp
     << ", pp " << p.pp << ", dp " << p.dp << (p.cp > 1 ? ", cp " + std::to_string(p.cp) : "")
     << ", " << plan::spelling(p.schedule) << ", zero "
     << p.zero << ", recompute " << plan::spelling(p.recompute)
     << (p.sequenceParallel ? ", sequence parallel" : "") << "), plan " << plan.planId << ", "
     << steps << (steps == 1 ? " step" : " steps") << ", " << spelling(options.precision)
     << (options.backend == Backend::CUDA ? " on CUDA" : "")
     << (options.backend == Backend::CUDA && options.precision != Precision::FP32
             ? (options.flashAttention ? " (flash attention)" : " (unfused attention)")
             : "")
     << (options.lossScale.mode != LossScaleOptions::Mode::None
             ? ", " + options.lossScale.describe()
             : "")
     << ", data " << data.describe() << "\n";
  return os.str();
}

} // namespace

int64_t usableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

int64_t kernelThreadsPerRank(const RunOptions &options, int64_t ranksSharingCores) {
  if (options.threadsPerRank > 0)
    return options.threadsPerRank;
  // As before the kernels had their own threads, an explicit OpenBLAS setting is respected.
  if (const char *blas = std::getenv("OPENBLAS_NUM_THREADS"))
    if (int64_t threads = std::atoll(blas); threads > 0)
      return threads;
  return std::max<int64_t>(1, usableCores() / std::max<int64_t>(1, ranksSharingCores));
}

llvm::Expected<int64_t> planWorldSize(llvm::StringRef planDir) {
  llvm::Expected<plan::Manifest> manifest = loadManifest(planDir);
  if (!manifest)
    return manifest.takeError();
  return manifest->world;
}

llvm::StringRef spelling(Precision precision) {
  switch (precision) {
  case Precision::FP32:
    return "fp32";
  case Precision::FP64:
    return "fp64";
  case Precision::BF16:
    return "bf16";
  case Precision::FP16:
    return "fp16";
  case Precision::Mixed:
    return "mixed";
  }
  return "?";
}

std::string incompatibleOptions(const RunOptions &options, CommKind comm) {
  bool halfPrecision = options.precision == Precision::BF16 || options.precision == Precision::FP16;
  if (options.backend == Backend::CPU && halfPrecision)
    return "--precision=" + spelling(options.precision).str() +
           " runs only with --backend=cuda; the CPU backend computes in fp32 or fp64";
  if (options.backend == Backend::CUDA && options.precision == Precision::FP64)
    return "--precision=fp64 runs only on the CPU backend; on CUDA use fp32, bf16 or fp16";
  if (options.backend == Backend::CUDA && options.precision == Precision::Mixed)
    return "--precision=mixed is the CPU's stand-in for mixed precision; on CUDA use bf16 or "
           "fp16, which keep fp32 gradients and master weights";
  if (options.backend == Backend::CPU && comm == CommKind::NCCL)
    return "--comm=nccl needs --backend=cuda (NCCL moves GPU buffers)";
  return options.lossScale.validate();
}

RankSummary runRank(Communicator &comm, const RunOptions &options, llvm::raw_ostream &out) {
  // Each rank checks its own device: under MPI the ranks may sit on different machines, and a
  // rank that cannot run must end the job before its peers wait for it.
  std::string unavailable = backendUnavailable(options.backend);
  if (!unavailable.empty())
    throw std::runtime_error(unavailable);
  std::string incompatible = incompatibleOptions(options, CommKind::Local);
  if (!incompatible.empty())
    throw std::runtime_error(incompatible);
  LoadedJob job = loadAndAgree(comm, options);
  if (reportsLoss(job.plan)) {
    out << describeJob(job.plan, options, job.data, options.steps.value_or(job.plan.train.steps));
    out.flush();
  }
  if (options.backend == Backend::CUDA) {
#ifdef PARC_HAVE_CUDA
    return runRankOnCuda(comm, options, job, out);
#endif
  }
  if (options.precision == Precision::FP64) {
    CpuDevice<double> device;
    return runOnDevice(device, comm, options, job, out);
  }
  if (options.precision == Precision::Mixed) {
    CpuDevice<float, double> device;
    return runOnDevice(device, comm, options, job, out);
  }
  CpuDevice<float> device;
  return runOnDevice(device, comm, options, job, out);
}

namespace {
/// The ranks of an MPI job on this machine, as the launcher says (else all of them).
int64_t ranksOnThisNode(int64_t world) {
  for (const char *name :
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char *value = std::getenv(name))
      if (int64_t ranks = std::atoll(value); ranks > 0)
        return ranks;
  return world;
}

/// Runs `body` on every rank as a thread of this process, over the communicator `kind` asks
/// for; returns one message per rank, empty when it finished, and the world's first failure.
std::vector<std::string> runThreads(int64_t world, CommKind kind, const RunOptions &options,
                                    const std::function<void(Communicator &)> &body,
                                    std::string &failure) {
  CommOptions commOptions;
  commOptions.timeoutSeconds = options.timeoutSeconds;
#ifdef PARC_HAVE_CUDA
  if (options.backend == Backend::CUDA)
    return runCudaThreads(world, kind, commOptions, body, failure);
#endif
  (void)kind;
  // Ranks that compute on one thread each run as fibers on the cores' threads: the kernel's
  // scheduler let a core idle while two ranks time-shared the other (LocalWorld, Fibers.h).
  int64_t fiberThreads = cpu::kernelThreads() == 1 ? usableCores() : 0;
  LocalWorld local(world, commOptions, fiberThreads);
  std::vector<std::string> errors = local.run(body);
  failure = local.failure();
  return errors;
}
} // namespace

int runLocal(const RunOptions &options, CommKind commKind, llvm::raw_ostream &out,
             llvm::raw_ostream &errs) {
  llvm::Expected<int64_t> world = planWorldSize(options.planDir);
  if (!world) {
    errs << "parrun: error: " << llvm::toString(world.takeError()) << "\n";
    return 1;
  }
  // The ranks are threads sharing this machine's cores.
  cpu::setKernelThreads(kernelThreadsPerRank(options, *world));

  // One message per failed rank. When one rank fails, the local communicator ends every
  // other rank's wait with "... gave up because the job failed: ..."; those only echo the
  // cause, so the message printed is the first rank's that is not such an echo.
  std::vector<std::string> messages(static_cast<size_t>(*world));
  // Not vector<bool>: the rank threads write them concurrently.
  std::vector<char> agreed(static_cast<size_t>(*world), false);
  std::vector<int> status(static_cast<size_t>(*world), ExitJobFailed);
  // The device communicators need a device before any rank exists to report its absence.
  std::string unavailable = backendUnavailable(options.backend);
  if (!unavailable.empty()) {
    errs << "parrun: error: " << unavailable << "\n";
    return 1;
  }
  std::string failure;
  std::vector<std::string> errors;
  try {
    errors = runThreads(
        *world, commKind, options,
        [&](Communicator &comm) {
          size_t rank = size_t(comm.rank());
          try {
            runRank(comm, options, out);
          } catch (const AgreedError &error) {
            messages[rank] = error.what();
            agreed[rank] = true;
            status[rank] = error.exitStatus();
            throw;
          } catch (const std::exception &error) {
            messages[rank] = "rank " + std::to_string(rank) + ": " + error.what();
            if (dynamic_cast<const WriteError *>(&error))
              status[rank] = ExitWriteFailed;
            throw;
          }
        },
        failure);
  } catch (const std::exception &error) {
    // Setting up the ranks' communicators failed (a GPU that cannot be used, NCCL).
    errs << "parrun: error: " << error.what() << "\n";
    return 1;
  }
  if (llvm::all_of(errors, [](const std::string &e) { return e.empty(); }))
    return 0;
  auto echoes = [](llvm::StringRef message) {
    return message.contains("gave up because the job failed");
  };
  std::string cause;
  int exitStatus = ExitJobFailed;
  for (size_t rank = 0; rank < messages.size() && cause.empty(); ++rank)
    if (agreed[rank] || (!messages[rank].empty() && !echoes(messages[rank]))) {
      cause = messages[rank];
      exitStatus = status[rank];
    }
  if (cause.empty())
    for (const std::string &error : errors)
      if (cause.empty() && !error.empty())
        cause = error;
  errs << "parrun: error: " << (cause.empty() ? failure : cause) << "\n";
  return exitStatus;
}

int runMPI(int *argc, char ***argv, const RunOptions &options, llvm::raw_ostream &out,
           llvm::raw_ostream &errs) {
  CommOptions commOptions;
  commOptions.timeoutSeconds = options.timeoutSeconds;
  std::unique_ptr<MPICommunicator> comm = MPICommunicator::create(argc, argv, commOptions);
  cpu::setKernelThreads(kernelThreadsPerRank(options, ranksOnThisNode(comm->world())));
  try {
#ifdef PARC_HAVE_CUDA
    if (options.backend == Backend::CUDA) {
      // Checked before NCCL starts, which would fail less plainly without a device.
      std::string unavailable = backendUnavailable(options.backend);
      if (!unavailable.empty())
        throw std::runtime_error(unavailable);
      std::unique_ptr<Communicator> nccl = createNCCLCommunicator(*comm, commOptions);
      runRank(*nccl, options, out);
      return 0;
    }
#endif
    runRank(*comm, options, out);
    return 0;
  } catch (const AgreedError &error) {
    // Every rank raises it alike; one message is enough.
    if (comm->rank() == 0)
      errs << "parrun: error: " << error.what() << "\n";
    errs.flush();
    return error.exitStatus();
  } catch (const WriteError &error) {
    // Only this rank wrote the file, after the job's last collective: the others end well.
    errs << "parrun: error: rank " << comm->rank() << ": " << error.what() << "\n";
    errs.flush();
    return ExitWriteFailed;
  } catch (const std::exception &error) {
    // Prints "error: rank R aborted: MESSAGE" and ends every process of the job.
    errs.flush();
    comm->abort(error.what());
  }
}

} // namespace parc::runtime
