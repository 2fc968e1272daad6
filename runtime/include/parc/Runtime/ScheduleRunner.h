//===- ScheduleRunner.h - One rank's training steps -----------------------===//
//
// Runs the plan's schedule once per step: loads microbatches, runs chunk forwards and
// backwards through the OpInterpreter, moves activations and gradients between pipeline
// stages (a maximal run of adjacent transfers is one Communicator::exchange, so neighbours
// that both send first cannot deadlock), synchronises gradients and parameters and steps the
// optimizer. A failure inside an instruction is rethrown naming the step, the instruction's
// index and what it is, so a stuck rank says where it waited.
//
// Transfer tags name the boundary between virtual stages v and v+1 and the microbatch, so a
// send and its receive agree on the tag although their chunk indices differ (interleaved).
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_SCHEDULERUNNER_H
#define PARC_RUNTIME_SCHEDULERUNNER_H

#include "parc/Plan/Plan.h"
#include "parc/Runtime/Buffer.h"
#include "parc/Runtime/Communicator.h"
#include "parc/Runtime/Data.h"
#include "parc/Runtime/GradSyncOverlap.h"
#include "parc/Runtime/LossScaler.h"
#include "parc/Runtime/OpInterpreter.h"
#include "parc/Runtime/Optimizer.h"
#include "parc/Runtime/ParamStore.h"
#include "parc/Runtime/WithinPlacement.h"

#include <map>
#include <utility>

namespace parc::runtime {

/// What one step produced, identical on every rank.
struct StepResult {
  double loss = 0; // mean over all microbatches of all data-parallel replicas
  StepStats optimizer;
};

/// "send_act to rank 4 (chunk 0, mb 3)"
std::string describeInstr(const plan::Instr &instr);

/// Whether this rank prints the run's output: it holds the loss (last pipeline stage, tp rank
/// 0, dp rank 0).
bool reportsLoss(const plan::RankPlan &plan);

/// D is the rank's device (CpuDevice.h).
template <typename D> class ScheduleRunner {
public:
  using T = typename D::Value;

  /// gradBucketBytes: see GradSyncOverlap.h (0: every sync at its instruction).
  ScheduleRunner(const plan::RankPlan &plan, Communicator &comm, ParamStore<D> &params,
                 const TokenStream &data, int64_t gradBucketBytes = 0,
                 const LossScaleOptions &lossScale = {});

  /// Runs 0-based step `step`. Throws AgreedError when the loss is not finite, or the gradient
  /// norm is not finite and the loss scale cannot skip the step.
  StepResult runStep(int64_t step);

  bool reportsLoss() const;
  const GradSyncOverlap<D> &gradSync() const { return gradSyncOverlap; }

  /// What a checkpoint keeps of the runner: the updates applied and the loss scaler.
  int64_t updatesApplied() const { return updates; }
  LossScaler::State lossScaleState() const { return scaler.state(); }
  void restore(int64_t updatesApplied, const LossScaler::State &lossScale) {
    updates = updatesApplied;
    scaler.restore(lossScale);
  }
  /// From now on, time every op and instruction into `profile` (null: stop); Profiler.h.
  void setProfile(OpProfile *target) {
    profile = target;
    interpreter.setProfile(target);
  }

private:
  using Key = std::pair<int64_t, int64_t>; // (chunk, microbatch)

  void runInstr(size_t index, int64_t step);
  /// The ZeRO instruction at `index`, which may also run inside a compute.
  void runParamInstr(size_t index);
  /// Runs the op list of the compute at schedule[index] with the instructions within it.
  void runOps(const plan::Chunk &chunk, bool backward, size_t index, ChunkEnv<T> &env);
  void runTransfers(llvm::ArrayRef<plan::Instr> run);
  void loadBatch(int64_t microbatch, int64_t step);
  void forward(int64_t chunk, int64_t microbatch, size_t index);
  void backward(int64_t chunk, int64_t microbatch, size_t index);
  /// Counts the update, skips an overflowed step, or stops the run.
  void afterOptimizer(int64_t step);
  const plan::Chunk &chunkAt(int64_t index) const;
  /// The tensor table's shape of `name` in `chunk`.
  std::vector<int64_t> declaredShape(const plan::Chunk &chunk, const std::string &name) const;
  int64_t transferTag(int64_t boundary, int64_t microbatch, bool gradient) const;
  Tensor<T> takeFrom(Key key, const std::string &name, bool copy);
  /// The environment of (chunk, microbatch), made empty if there is none yet.
  ChunkEnv<T> &envOf(Key key);
  /// Ends the environment at `it`: its tensors go back to the arena and the emptied table is
  /// kept for the chunk's next microbatch, so that the step loop allocates none.
  void retire(typename std::map<Key, ChunkEnv<T>>::iterator it);

  const plan::RankPlan &plan;
  Communicator &comm;
  ParamStore<D> &params;
  D &dev;
  MemoryTracker &memory;
  const TokenStream &data;
  OpInterpreter<D> interpreter;
  GradSyncOverlap<D> gradSyncOverlap;
  WithinPlacement within;
  std::vector<ChunkLiveness> liveness;
  std::vector<ChunkNames> names; // per chunk; the environments point into it
  /// Per chunk, its liveness's afterForward and afterBackward by slot.
  std::vector<std::pair<std::vector<ChunkNames::Freed>, std::vector<ChunkNames::Freed>>> freed;
  std::vector<int64_t> worldRanks;
  std::map<Key, ChunkEnv<T>> envs;
  std::vector<std::vector<ChunkEnv<T>>> spareEnvs; // per chunk, emptied by retire
  double stepLossSum = 0;
  StepStats lastStats;
  bool stepped = false;
  LossScaler scaler;
  int64_t updates = 0; // applied so far: the learning-rate schedule's and Adam's step
  OpProfile *profile = nullptr;
};

extern template class ScheduleRunner<CpuDevice<float>>;
extern template class ScheduleRunner<CpuDevice<double>>;

} // namespace parc::runtime

#endif
