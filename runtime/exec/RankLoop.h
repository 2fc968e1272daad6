//===- RankLoop.h - One rank's steps on a device, for every backend -------===//
//
// The part of runRank after the plan is loaded, written once over the device D (CpuDevice.h,
// CudaDevice.h): initialise the shards, run the steps, report memory, dump the weights.
// Private to runtime/exec: Executor.cpp instantiates it for the CPU, CudaRun.cpp for CUDA.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_EXEC_RANKLOOP_H
#define PARC_RUNTIME_EXEC_RANKLOOP_H

#include "parc/Runtime/Checkpoint.h"
#include "parc/Runtime/Executor.h"
#include "parc/Runtime/Kernels.h"
#include "parc/Runtime/OpFusion.h"
#include "parc/Runtime/PlanLoader.h"
#include "parc/Runtime/ScheduleRunner.h"
#include "parc/Runtime/WeightDump.h"

#include "llvm/Support/Format.h"

#include <algorithm>
#include <array>
#include <chrono>

namespace parc::runtime {

/// This rank's line of the memory report: its peaks per category beside the plan's prediction,
/// and the device's pool peaks per category (-1 where it has no pools).
std::string encodeMemoryRow(const plan::RankPlan &plan, const MemoryTracker &memory,
                            const std::array<int64_t, NumMemoryCategories> &poolPeaks);
/// "step 3 loss 6.2253 lr 1.00e-02 grad_norm 0.540 tokens/s 7664", then the loss scale when
/// one is set and whether a dynamic one skipped the step.
std::string formatStepLine(int64_t step, const StepResult &result, double tokensPerSecond,
                           bool showLossScale);
/// Prints the report from every rank's encoded row.
void printMemory(llvm::ArrayRef<std::string> encoded, const RunOptions &options,
                 plan::DType modelDtype, llvm::raw_ostream &out);
/// Writes the report as JSON (parrun-memory/1) to options.memoryJsonPath.
void writeMemoryJson(llvm::ArrayRef<std::string> encoded, const RunOptions &options);

template <typename D>
RankSummary runOnDevice(D &device, Communicator &comm, const RunOptions &options,
                        const LoadedJob &job, llvm::raw_ostream &out) {
  plan::RankPlan plan = job.plan;
  if (options.fuseElementwise)
    for (plan::Chunk &chunk : plan.chunks) {
      fuseBiasGELU(chunk);
      fuseResidualNorm(chunk);
    }
  ParamStore<D> params(plan, device);
  if (llvm::Error error = params.buildPartitions())
    throw std::runtime_error("the plan cannot be executed: " + llvm::toString(std::move(error)));
  params.initialize(uint64_t(plan.train.seed));
  ScheduleRunner<D> runner(plan, comm, params, job.data, options.gradBucketBytes,
                           options.lossScale);

  int64_t steps = options.steps.value_or(plan.train.steps);
  int64_t logEvery = std::max<int64_t>(1, options.logEvery);
  double tokensPerStep = double(plan.parallel.globalBatch * plan.model.seq);
  RankSummary summary;
  int64_t firstStep = 0;
  CheckpointRun checkpointRun{spelling(options.precision).str(), job.data.describe(),
                              options.lossScale};
  if (!options.resumeDir.empty()) {
    CheckpointState resumed = loadCheckpoint(comm, params, plan, checkpointRun, options.resumeDir);
    // Every rank read the same manifest, so every rank stops here alike.
    if (resumed.step > steps)
      throw AgreedError("--resume " + options.resumeDir + " is after step " +
                        std::to_string(resumed.step) + ", beyond this run's " +
                        std::to_string(steps) + (steps == 1 ? " step" : " steps") +
                        "; give --steps " + std::to_string(resumed.step) + " or more");
    runner.restore(resumed.updates, resumed.lossScale);
    summary.losses = resumed.losses;
    summary.gradNorms = resumed.gradNorms;
    firstStep = resumed.step;
    if (runner.reportsLoss())
      out << "resume   from " << options.resumeDir << " after step " << firstStep << "\n";
  }
  device.synchronize();
  OpProfile profile;
  for (int64_t step = firstStep; step < steps; ++step) {
    // The first step pays for first touches; it is profiled only when it is the only one.
    bool profiled = options.profile && (step > firstStep || steps - firstStep == 1);
    runner.setProfile(profiled ? &profile : nullptr);
    auto start = std::chrono::steady_clock::now();
    // Ends with the loss all-reduce, which waits for everything the step queued on the device.
    StepResult result = runner.runStep(step);
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (profiled)
      profile.addStep(seconds);
    summary.losses.push_back(result.loss);
    summary.gradNorms.push_back(result.optimizer.gradNorm);
    if (runner.reportsLoss() && ((step + 1) % logEvery == 0 || step + 1 == steps)) {
      out << formatStepLine(step, result, tokensPerStep / std::max(seconds, 1e-9),
                            options.lossScale.mode != LossScaleOptions::Mode::None)
          << "\n";
      out.flush();
    }
    bool save =
        !options.saveDir.empty() &&
        (step + 1 == steps || (options.saveEvery > 0 && (step + 1) % options.saveEvery == 0));
    if (save) {
      saveCheckpoint(comm, params, plan, checkpointRun,
                     {step + 1, runner.updatesApplied(), runner.lossScaleState(), summary.losses,
                      summary.gradNorms},
                     options.saveDir);
      if (runner.reportsLoss())
        out << "saved    " << options.saveDir << " after step " << step + 1 << "\n";
    }
  }

  // Only when it happened: with buckets larger than the gradients there is nothing to say.
  if (runner.reportsLoss() && runner.gradSync().earlyLaunchesThisStep() > 0)
    out << llvm::format("overlap  %lld all-reduces of the data-parallel gradient sync per step "
                        "started during the backward (buckets of %.3g MiB)\n",
                        (long long)runner.gradSync().earlyLaunchesThisStep(),
                        double(options.gradBucketBytes) / double(1 << 20));
  runner.setProfile(nullptr);
  if (options.profile) {
    std::vector<std::string> profiles = comm.agree(profile.encode());
    if (runner.reportsLoss())
      OpProfile::merge(profiles).print(out, plan.world, cpu::kernelThreads());
  }
  // Taken before the dump, whose gathers are not part of training.
  // Printed by the rank that printed the steps, so that under mpirun, which forwards each
  // process's output on its own, the lines keep their order.
  std::array<int64_t, NumMemoryCategories> poolPeaks;
  for (size_t c = 0; c < NumMemoryCategories; ++c)
    poolPeaks[c] = device.poolPeakBytes(static_cast<MemoryCategory>(c));
  std::vector<std::string> rows = comm.agree(encodeMemoryRow(plan, device.memory(), poolPeaks));
  if (runner.reportsLoss()) {
    printMemory(rows, options, plan.model.dtype, out);
    if (!options.memoryJsonPath.empty())
      writeMemoryJson(rows, options);
  }
  if (!options.dumpWeightsPath.empty())
    dumpWeights(comm, params, plan, summary, spelling(options.precision), options.dumpWeightsPath);
  return summary;
}

} // namespace parc::runtime

#endif
