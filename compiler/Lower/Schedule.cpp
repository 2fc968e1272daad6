//===- Schedule.cpp - Per-stage pipeline schedules of one training step ---===//
//
// GPipe and 1F1B place each receive right before the compute that needs it and each send right
// after the compute that produced it. Megatron's interleaved schedule cannot: its first and last
// stages exchange tensors in both directions (the chunk wrap-around), and with that placement
// stage 0 blocks sending a gradient to stage 1 while stage 1 blocks sending one back for the
// next compute (pp 2, chunks 2, M 4 deadlocks). Megatron instead receives the inputs of the
// next iteration together with the sends of this one, so the interleaved builder follows its
// loop step by step.
//
//===----------------------------------------------------------------------===//
#include "parc/Lower/Schedule.h"

#include <algorithm>
#include <cassert>

namespace parc {

const char *toString(PipeOpKind kind) {
  switch (kind) {
  case PipeOpKind::Forward:
    return "fwd";
  case PipeOpKind::Backward:
    return "bwd";
  case PipeOpKind::RecvActivation:
    return "recv_act";
  case PipeOpKind::SendActivation:
    return "send_act";
  case PipeOpKind::RecvGradient:
    return "recv_grad";
  case PipeOpKind::SendGradient:
    return "send_grad";
  }
  return "unknown";
}

std::string toString(const PipeOp &op) {
  std::string text = std::string(toString(op.kind)) + " c" + std::to_string(op.chunk) + " mb" +
                     std::to_string(op.microbatch);
  if (op.isCompute())
    return text;
  return text + (op.isSend() ? " to stage " : " from stage ") + std::to_string(op.peer);
}

std::string pipelineConfigProblem(const PipelineConfig &config) {
  if (config.stages < 1 || config.microbatches < 1 || config.chunks < 1)
    return "pipeline stages, microbatches and chunks must all be at least 1";
  if (config.stages * config.chunks > limits::MaxBlocks ||
      config.microbatches > limits::MaxMicrobatches)
    return "a schedule has at most " + std::to_string(limits::MaxBlocks) +
           " virtual stages (one block each) and " + std::to_string(limits::MaxMicrobatches) +
           " microbatches";
  if (config.kind != ScheduleKind::Interleaved && config.chunks != 1)
    return std::string("model chunks only apply to the interleaved schedule; use "
                       "interleaved(chunks = ") +
           std::to_string(config.chunks) + ") or one chunk with " + toString(config.kind);
  if (config.kind == ScheduleKind::Interleaved && config.microbatches % config.stages != 0)
    return "the interleaved schedule needs the number of microbatches (" +
           std::to_string(config.microbatches) + ") to be a multiple of pp (" +
           std::to_string(config.stages) + "); change the global batch or pp";
  return "";
}

namespace {

/// A (model chunk, microbatch) pair of one stage.
struct Slot {
  int64_t chunk = 0;
  int64_t microbatch = 0;
};

/// Appends the ops of one stage, adding a transfer only where the neighbouring virtual stage
/// lives on another stage.
class StageEmitter {
public:
  StageEmitter(const PipelineConfig &config, int64_t stage) : config(config), stage(stage) {
    // A forward and a backward per microbatch and chunk, each with at most a receive and a
    // send: reserving it keeps the schedule of a deep pipeline from reallocating.
    ops.reserve(size_t(6 * config.microbatches * config.chunks));
  }

  void forward(Slot slot) { append(PipeOpKind::Forward, slot, -1); }
  void backward(Slot slot) { append(PipeOpKind::Backward, slot, -1); }

  void sendActivationOf(Slot slot) {
    if (int64_t peer = remoteConsumer(slot.chunk); peer >= 0)
      append(PipeOpKind::SendActivation, slot, peer);
  }
  void sendGradientOf(Slot slot) {
    if (int64_t peer = remoteProducer(slot.chunk); peer >= 0)
      append(PipeOpKind::SendGradient, slot, peer);
  }
  void receiveActivationFor(Slot slot) {
    if (int64_t peer = remoteProducer(slot.chunk); peer >= 0)
      append(PipeOpKind::RecvActivation, slot, peer);
  }
  void receiveGradientFor(Slot slot) {
    if (int64_t peer = remoteConsumer(slot.chunk); peer >= 0)
      append(PipeOpKind::RecvGradient, slot, peer);
  }

  StageProgram take() { return std::move(ops); }

private:
  /// The stage holding the virtual stage before `chunk` of this stage, or -1 when the input
  /// comes from the data loader or from this same stage. Virtual stage v lives on stage
  /// v mod pp, so its neighbours are the neighbouring stages, wrapping around (no division:
  /// the report builds every instruction of a deep pipeline in each run).
  int64_t remoteProducer(int64_t chunk) const {
    if (config.virtualStageOf(stage, chunk) == 0 || config.stages == 1)
      return -1;
    return stage > 0 ? stage - 1 : config.stages - 1;
  }
  /// The stage holding the virtual stage after `chunk`, or -1 when this chunk computes the
  /// loss or the next one is local.
  int64_t remoteConsumer(int64_t chunk) const {
    if (config.virtualStageOf(stage, chunk) + 1 == config.virtualStages() || config.stages == 1)
      return -1;
    return stage + 1 < config.stages ? stage + 1 : 0;
  }
  void append(PipeOpKind kind, Slot slot, int64_t peer) {
    ops.push_back({kind, int16_t(slot.chunk), int16_t(slot.microbatch), int16_t(peer)});
  }

  const PipelineConfig &config;
  int64_t stage;
  StageProgram ops;
};

/// A compute of the single-chunk schedules, before its transfers are placed.
struct Compute {
  bool isForward;
  int64_t microbatch;
};

/// GPipe runs the backwards in microbatch order rather than in reverse: the makespan is the
/// same either way, and every schedule then frees activations first-in first-out, so the
/// runtime keeps one queue of saved activations whatever the schedule.
std::vector<Compute> gpipeOrder(const PipelineConfig &config) {
  std::vector<Compute> order;
  order.reserve(size_t(2 * config.microbatches));
  for (int64_t mb = 0; mb < config.microbatches; ++mb)
    order.push_back({true, mb});
  for (int64_t mb = 0; mb < config.microbatches; ++mb)
    order.push_back({false, mb});
  return order;
}

/// Megatron's 1F1B: each stage first fills the pipeline below it, then alternates one forward
/// with one backward, then drains.
std::vector<Compute> oneFOneBOrder(const PipelineConfig &config, int64_t stage) {
  int64_t warmup = std::min(config.stages - stage - 1, config.microbatches);
  int64_t steady = config.microbatches - warmup;
  std::vector<Compute> order;
  order.reserve(size_t(2 * config.microbatches));
  for (int64_t mb = 0; mb < warmup; ++mb)
    order.push_back({true, mb});
  for (int64_t i = 0; i < steady; ++i) {
    order.push_back({true, warmup + i});
    order.push_back({false, i});
  }
  for (int64_t mb = steady; mb < config.microbatches; ++mb)
    order.push_back({false, mb});
  return order;
}

StageProgram placeTransfersAroundComputes(const PipelineConfig &config, int64_t stage,
                                          const std::vector<Compute> &order) {
  StageEmitter emit(config, stage);
  for (const Compute &compute : order) {
    Slot slot{0, compute.microbatch};
    if (compute.isForward) {
      emit.receiveActivationFor(slot);
      emit.forward(slot);
      emit.sendActivationOf(slot);
    } else {
      emit.receiveGradientFor(slot);
      emit.backward(slot);
      emit.sendGradientOf(slot);
    }
  }
  return emit.take();
}

/// Megatron's forward_backward_pipelining_with_interleaving for one stage. Iteration k handles
/// the k-th "virtual microbatch": microbatches go through the chunks `stages` at a time, and
/// backwards visit the chunks in reverse. Received tensors are labelled the way Megatron files
/// them, first in first out per chunk; each chunk sees its microbatches in increasing order.
class InterleavedStageBuilder {
public:
  InterleavedStageBuilder(const PipelineConfig &config, int64_t stage)
      : config(config), stage(stage), emit(config, stage), activationsReceived(config.chunks, 0),
        gradientsReceived(config.chunks, 0) {
    total = config.microbatches * config.chunks;
    // With exactly pp microbatches Megatron runs every forward before any backward.
    allForwardsFirst = config.microbatches == config.stages;
    warmup = allForwardsFirst ? total : std::min(total, warmupForwards());
  }

  StageProgram build() {
    runWarmup();
    runSteadyState();
    runCooldown();
    return emit.take();
  }

private:
  /// Deeper stages start later, two steps per stage because each step of the steady state is
  /// a forward and a backward; every stage also fills (chunks - 1) rounds of pp first.
  int64_t warmupForwards() const {
    return (config.stages - stage - 1) * 2 + (config.chunks - 1) * config.stages;
  }
  bool isFirstStage() const { return stage == 0; }
  bool isLastStage() const { return stage == config.stages - 1; }

  /// In 32 bits, whose division is several times faster: k < M x chunks < 2^26 (Limits.h).
  Slot forwardSlot(int64_t k) const {
    const uint32_t index = uint32_t(k), stages = uint32_t(config.stages);
    const uint32_t round = index / stages, position = index - round * stages;
    const uint32_t chunks = uint32_t(config.chunks), group = round / chunks;
    return {int64_t(round - group * chunks), int64_t(group * stages + position)};
  }
  Slot backwardSlot(int64_t k) const {
    Slot slot = forwardSlot(k);
    slot.chunk = config.chunks - 1 - slot.chunk;
    return slot;
  }

  void receiveNextActivation(int64_t chunk) {
    emit.receiveActivationFor({chunk, activationsReceived[chunk]++});
  }
  void receiveNextGradient(int64_t chunk) {
    emit.receiveGradientFor({chunk, gradientsReceived[chunk]++});
  }

  void runWarmup() {
    receiveNextActivation(0);
    for (int64_t k = 0; k < warmup; ++k) {
      Slot slot = forwardSlot(k);
      emit.forward(slot);
      emit.sendActivationOf(slot);
      if (k + 1 < total)
        receiveNextActivation(forwardSlot(k + 1).chunk);
      // The first backward's gradient travels with the last warm-up transfers.
      if (k + 1 == warmup && !allForwardsFirst)
        receiveNextGradient(config.chunks - 1);
    }
  }

  void runSteadyState() {
    int64_t steady = total - warmup;
    for (int64_t i = 0; i < steady; ++i) {
      Slot forward = forwardSlot(warmup + i), backward = backwardSlot(i);
      emit.forward(forward);
      emit.backward(backward);
      emit.sendActivationOf(forward);
      emit.sendGradientOf(backward);
      if (i + 1 < steady)
        receiveActivationForNextStep(warmup + i);
      receiveGradientForNextStep(i);
    }
  }

  /// The first stage receives what the last stage forwards in this step, which runs pp - 1
  /// virtual microbatches behind it; its output is the input of the next chunk, if any.
  void receiveActivationForNextStep(int64_t forwardIndex) {
    if (!isFirstStage()) {
      receiveNextActivation(forwardSlot(forwardIndex + 1).chunk);
      return;
    }
    int64_t lastStageChunk = forwardSlot(forwardIndex - (config.stages - 1)).chunk;
    if (lastStageChunk + 1 < config.chunks)
      receiveNextActivation(lastStageChunk + 1);
  }

  /// Mirror image: the last stage receives the gradient of what the first stage runs backward
  /// in this step, pp - 1 steps behind it (nothing before the first stage started).
  void receiveGradientForNextStep(int64_t backwardIndex) {
    if (!isLastStage()) {
      receiveNextGradient(backwardSlot(backwardIndex + 1).chunk);
      return;
    }
    int64_t firstStageIndex = backwardIndex - (config.stages - 1);
    if (firstStageIndex < 0)
      return;
    int64_t firstStageChunk = backwardSlot(firstStageIndex).chunk;
    if (firstStageChunk > 0)
      receiveNextGradient(firstStageChunk - 1);
  }

  void runCooldown() {
    if (allForwardsFirst)
      receiveNextGradient(config.chunks - 1);
    for (int64_t k = total - warmup; k < total; ++k) {
      Slot slot = backwardSlot(k);
      emit.backward(slot);
      emit.sendGradientOf(slot);
      if (k + 1 < total)
        receiveNextGradient(backwardSlot(k + 1).chunk);
    }
  }

  const PipelineConfig &config;
  int64_t stage;
  StageEmitter emit;
  std::vector<int64_t> activationsReceived, gradientsReceived; // per chunk
  int64_t total = 0, warmup = 0;
  bool allForwardsFirst = false;
};

StageProgram buildStage(const PipelineConfig &config, int64_t stage) {
  switch (config.kind) {
  case ScheduleKind::GPipe:
    return placeTransfersAroundComputes(config, stage, gpipeOrder(config));
  case ScheduleKind::OneFOneB:
    return placeTransfersAroundComputes(config, stage, oneFOneBOrder(config, stage));
  case ScheduleKind::Interleaved:
    return InterleavedStageBuilder(config, stage).build();
  }
  return {};
}

} // namespace

std::vector<StageProgram> buildPipelineSchedule(const PipelineConfig &config) {
  assert(pipelineConfigProblem(config).empty() && "schedule of an invalid pipeline config");
  std::vector<StageProgram> programs;
  for (int64_t stage = 0; stage < config.stages; ++stage)
    programs.push_back(buildStage(config, stage));
  return programs;
}

} // namespace parc
