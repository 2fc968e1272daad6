//===- ScheduleVerifier.cpp - Prove per-stage pipeline schedules consistent ===//
//
// An event-driven run of all stages. A stage executes computes until it reaches a batch of
// transfers, posts the batch, and stays there until every transfer in it met its match in the
// batch its peer has posted. Each match wakes the peer, so the run costs time linear in the
// number of instructions, and when no stage can move the ones left unfinished are deadlocked.
//
//===----------------------------------------------------------------------===//
#include "parc/Lower/ScheduleVerifier.h"

#include <algorithm>
#include <deque>

namespace parc {

namespace {

/// Per (chunk, microbatch) flags of one stage.
class SlotFlags {
public:
  SlotFlags(int64_t chunks, int64_t microbatches)
      : microbatches(microbatches), flags(chunks * microbatches, false) {}
  bool test(int64_t chunk, int64_t mb) const { return flags[chunk * microbatches + mb]; }
  void set(int64_t chunk, int64_t mb) { flags[chunk * microbatches + mb] = true; }

private:
  int64_t microbatches;
  std::vector<bool> flags;
};

struct StageState {
  StageState(const PipelineConfig &config, size_t programSize)
      : transferDone(programSize, false), timings(programSize),
        forwardDone(config.chunks, config.microbatches),
        backwardDone(config.chunks, config.microbatches),
        activationArrived(config.chunks, config.microbatches),
        gradientArrived(config.chunks, config.microbatches) {}

  size_t pc = 0;       // first instruction not completed
  size_t batchEnd = 0; // one past the posted batch; meaningful while `posted`
  bool posted = false;
  double clock = 0; // when the stage finished its last compute or batch
  std::vector<bool> transferDone;
  std::vector<OpTiming> timings;
  SlotFlags forwardDone, backwardDone, activationArrived, gradientArrived;
};

bool isActivationTransfer(PipeOpKind kind) {
  return kind == PipeOpKind::SendActivation || kind == PipeOpKind::RecvActivation;
}

class ScheduleSimulator {
public:
  ScheduleSimulator(const PipelineConfig &config, llvm::ArrayRef<StageProgram> programs,
                    const ScheduleCosts &costs)
      : config(config), programs(programs), costs(costs) {}

  ScheduleVerdict run() {
    if (std::string problem = pipelineConfigProblem(config); !problem.empty())
      return {problem};
    if (int64_t(programs.size()) != config.stages)
      return {"expected one program per pipeline stage (" + std::to_string(config.stages) +
              "), got " + std::to_string(programs.size())};
    for (const std::vector<double> *perVirtualStage :
         {&costs.virtualStageForward, &costs.virtualStageBackward})
      if (!perVirtualStage->empty() && int64_t(perVirtualStage->size()) != config.virtualStages())
        return {"expected a compute cost per virtual stage (" +
                std::to_string(config.virtualStages()) + "), got " +
                std::to_string(perVirtualStage->size())};
    for (int64_t stage = 0; stage < config.stages; ++stage)
      if (!checkInstructions(stage))
        return {error};
    if (!runUntilStuck())
      return {error};
    if (!checkAllFinished() || !checkEverySlotComputed())
      return {error};
    ScheduleVerdict verdict;
    for (StageState &state : states) {
      verdict.makespan = std::max(verdict.makespan, state.clock);
      verdict.timings.push_back(std::move(state.timings));
    }
    return verdict;
  }

private:
  bool fail(int64_t stage, size_t index, const std::string &message) {
    error = "stage " + std::to_string(stage) + ", instruction " + std::to_string(index) + " (" +
            toString(programs[stage][index]) + "): " + message;
    return false;
  }

  //===--- Instructions on their own ---------------------------------------===//

  bool checkInstructions(int64_t stage) {
    for (size_t index = 0; index < programs[stage].size(); ++index) {
      const PipeOp &op = programs[stage][index];
      if (op.chunk < 0 || op.chunk >= config.chunks)
        return fail(stage, index, "no such chunk; each stage has " + std::to_string(config.chunks));
      if (op.microbatch < 0 || op.microbatch >= config.microbatches)
        return fail(stage, index,
                    "no such microbatch; the step has " + std::to_string(config.microbatches));
      if (!op.isCompute() && !checkPeer(stage, index))
        return false;
    }
    return true;
  }

  /// A transfer must name the stage that holds the neighbouring virtual stage it talks to.
  bool checkPeer(int64_t stage, size_t index) {
    const PipeOp &op = programs[stage][index];
    int64_t self = config.virtualStageOf(stage, op.chunk);
    bool towardsLoss = op.kind == PipeOpKind::SendActivation || op.kind == PipeOpKind::RecvGradient;
    int64_t neighbour = towardsLoss ? self + 1 : self - 1;
    if (neighbour < 0)
      return fail(stage, index,
                  "virtual stage 0 reads the data loader and has no earlier "
                  "stage to exchange with; drop this transfer");
    if (neighbour == config.virtualStages())
      return fail(stage, index,
                  "virtual stage " + std::to_string(self) +
                      " computes the loss and has no later stage to exchange "
                      "with; drop this transfer");
    int64_t expectedPeer = config.stageOfVirtual(neighbour);
    if (expectedPeer == stage)
      return fail(stage, index,
                  "virtual stage " + std::to_string(neighbour) +
                      " is on this stage, so the tensor needs no transfer");
    if (op.peer != expectedPeer)
      return fail(stage, index,
                  "the peer must be stage " + std::to_string(expectedPeer) +
                      ", which holds virtual stage " + std::to_string(neighbour));
    return true;
  }

  //===--- The run ----------------------------------------------------------===//

  bool runUntilStuck() {
    states.clear();
    for (const StageProgram &program : programs)
      states.emplace_back(config, program.size());
    std::deque<int64_t> ready;
    for (int64_t stage = 0; stage < config.stages; ++stage)
      ready.push_back(stage);
    while (!ready.empty()) {
      int64_t stage = ready.front();
      ready.pop_front();
      std::vector<int64_t> woken;
      if (!advance(stage, woken))
        return false;
      ready.insert(ready.end(), woken.begin(), woken.end());
    }
    return true;
  }

  /// Runs `stage` until it finishes or blocks on a batch; `woken` gets each peer whose
  /// transfers it completed.
  bool advance(int64_t stage, std::vector<int64_t> &woken) {
    StageState &state = states[stage];
    const StageProgram &program = programs[stage];
    while (state.pc < program.size()) {
      if (program[state.pc].isCompute()) {
        if (!execute(stage, state.pc))
          return false;
        ++state.pc;
        continue;
      }
      if (!state.posted && !post(stage))
        return false;
      for (size_t index = state.pc; index < state.batchEnd; ++index)
        if (!state.transferDone[index] && !matchWithPeer(stage, index, woken))
          return false;
      if (!batchComplete(state))
        return true;
      for (size_t index = state.pc; index < state.batchEnd; ++index)
        state.clock = std::max(state.clock, state.timings[index].end);
      state.pc = state.batchEnd;
      state.posted = false;
    }
    return true;
  }

  bool execute(int64_t stage, size_t index) {
    const PipeOp &op = programs[stage][index];
    StageState &state = states[stage];
    bool forward = op.kind == PipeOpKind::Forward;
    SlotFlags &done = forward ? state.forwardDone : state.backwardDone;
    if (done.test(op.chunk, op.microbatch))
      return fail(stage, index,
                  std::string("runs a second time; each stage runs the ") +
                      (forward ? "forward" : "backward") + " of each chunk and microbatch once");
    if (!(forward ? forwardInputReady(stage, index) : backwardInputReady(stage, index)))
      return false;
    done.set(op.chunk, op.microbatch);
    state.timings[index].start = state.clock;
    state.clock += computeCost(forward, config.virtualStageOf(stage, op.chunk));
    state.timings[index].end = state.clock;
    return true;
  }

  double computeCost(bool forward, int64_t virtualStage) const {
    const std::vector<double> &perVirtualStage =
        forward ? costs.virtualStageForward : costs.virtualStageBackward;
    if (!perVirtualStage.empty())
      return perVirtualStage[virtualStage];
    return (forward ? costs.forward : costs.backward) / double(config.chunks);
  }

  bool forwardInputReady(int64_t stage, size_t index) {
    const PipeOp &op = programs[stage][index];
    const StageState &state = states[stage];
    int64_t self = config.virtualStageOf(stage, op.chunk);
    if (self == 0)
      return true;
    if (config.stageOfVirtual(self - 1) == stage) {
      if (state.forwardDone.test(op.chunk - 1, op.microbatch))
        return true;
      return fail(stage, index,
                  "runs before the forward of c" + std::to_string(op.chunk - 1) +
                      " on this stage produced its input");
    }
    if (state.activationArrived.test(op.chunk, op.microbatch))
      return true;
    return fail(stage, index,
                "runs before its input activation arrived; receive it from "
                "stage " +
                    std::to_string(config.stageOfVirtual(self - 1)) + " first");
  }

  bool backwardInputReady(int64_t stage, size_t index) {
    const PipeOp &op = programs[stage][index];
    const StageState &state = states[stage];
    if (!state.forwardDone.test(op.chunk, op.microbatch))
      return fail(stage, index, "runs before its own forward; move it after that forward");
    int64_t self = config.virtualStageOf(stage, op.chunk);
    if (self + 1 == config.virtualStages())
      return true;
    if (config.stageOfVirtual(self + 1) == stage) {
      if (state.backwardDone.test(op.chunk + 1, op.microbatch))
        return true;
      return fail(stage, index,
                  "runs before the backward of c" + std::to_string(op.chunk + 1) +
                      " on this stage produced its output gradient");
    }
    if (state.gradientArrived.test(op.chunk, op.microbatch))
      return true;
    return fail(stage, index,
                "runs before its output gradient arrived; receive it from "
                "stage " +
                    std::to_string(config.stageOfVirtual(self + 1)) + " first");
  }

  /// Posts the batch starting at pc; a send must follow the compute that produced its tensor.
  bool post(int64_t stage) {
    StageState &state = states[stage];
    const StageProgram &program = programs[stage];
    size_t end = state.pc + 1;
    if (costs.batchAdjacentTransfers)
      while (end < program.size() && !program[end].isCompute())
        ++end;
    for (size_t index = state.pc; index < end; ++index) {
      const PipeOp &op = program[index];
      if (op.kind == PipeOpKind::SendActivation && !state.forwardDone.test(op.chunk, op.microbatch))
        return fail(stage, index, "sends an activation its forward has not computed yet");
      if (op.kind == PipeOpKind::SendGradient && !state.backwardDone.test(op.chunk, op.microbatch))
        return fail(stage, index, "sends a gradient its backward has not computed yet");
    }
    for (size_t index = state.pc; index < end; ++index)
      state.timings[index].start = state.clock;
    state.batchEnd = end;
    state.posted = true;
    return true;
  }

  /// Whether `theirs` on stage `them` is the other end of `mine` on stage `me`: the opposite
  /// direction of the same tensor (kind, microbatch and the virtual stage boundary it crosses).
  bool isOtherEnd(int64_t me, const PipeOp &mine, int64_t them, const PipeOp &theirs) const {
    if (theirs.peer != me || theirs.microbatch != mine.microbatch ||
        theirs.isSend() == mine.isSend() ||
        isActivationTransfer(theirs.kind) != isActivationTransfer(mine.kind))
      return false;
    const PipeOp &sent = mine.isSend() ? mine : theirs;
    int64_t sender = mine.isSend() ? me : them;
    const PipeOp &received = mine.isSend() ? theirs : mine;
    int64_t receiver = mine.isSend() ? them : me;
    int64_t step = isActivationTransfer(sent.kind) ? 1 : -1;
    return config.virtualStageOf(sender, sent.chunk) + step ==
           config.virtualStageOf(receiver, received.chunk);
  }

  bool matchWithPeer(int64_t stage, size_t index, std::vector<int64_t> &woken) {
    const PipeOp &mine = programs[stage][index];
    int64_t peer = mine.peer;
    StageState &them = states[peer];
    if (!them.posted)
      return true;
    for (size_t other = them.pc; other < them.batchEnd; ++other) {
      if (them.transferDone[other] || !isOtherEnd(stage, mine, peer, programs[peer][other]))
        continue;
      double time = std::max(states[stage].clock, them.clock) + costs.transfer;
      complete(stage, index, time);
      complete(peer, other, time);
      woken.push_back(peer);
      return recordArrival(mine.isSend() ? peer : stage, mine.isSend() ? other : index);
    }
    return true;
  }

  void complete(int64_t stage, size_t index, double time) {
    states[stage].transferDone[index] = true;
    states[stage].timings[index].end = time;
  }

  bool recordArrival(int64_t stage, size_t index) {
    const PipeOp &op = programs[stage][index];
    StageState &state = states[stage];
    SlotFlags &arrived =
        op.kind == PipeOpKind::RecvActivation ? state.activationArrived : state.gradientArrived;
    if (arrived.test(op.chunk, op.microbatch))
      return fail(stage, index, "receives a tensor a second time; each one is sent once");
    arrived.set(op.chunk, op.microbatch);
    return true;
  }

  static bool batchComplete(const StageState &state) {
    for (size_t index = state.pc; index < state.batchEnd; ++index)
      if (!state.transferDone[index])
        return false;
    return true;
  }

  //===--- After the run -----------------------------------------------------===//

  bool finished(int64_t stage) const { return states[stage].pc == programs[stage].size(); }

  size_t firstPendingTransfer(int64_t stage) const {
    const StageState &state = states[stage];
    for (size_t index = state.pc; index < state.batchEnd; ++index)
      if (!state.transferDone[index])
        return index;
    return state.pc;
  }

  std::string describeWait(int64_t stage) const {
    if (finished(stage))
      return "stage " + std::to_string(stage) + " has finished";
    size_t index = firstPendingTransfer(stage);
    return "stage " + std::to_string(stage) + " waits at instruction " + std::to_string(index) +
           " (" + toString(programs[stage][index]) + ")";
  }

  bool checkAllFinished() {
    for (int64_t stage = 0; stage < config.stages; ++stage) {
      if (finished(stage))
        continue;
      size_t index = firstPendingTransfer(stage);
      return fail(stage, index,
                  "deadlock: it never meets a matching transfer while " +
                      describeWait(programs[stage][index].peer));
    }
    return true;
  }

  bool checkEverySlotComputed() {
    for (int64_t stage = 0; stage < config.stages; ++stage)
      for (int64_t chunk = 0; chunk < config.chunks; ++chunk)
        for (int64_t mb = 0; mb < config.microbatches; ++mb)
          if (!states[stage].forwardDone.test(chunk, mb) ||
              !states[stage].backwardDone.test(chunk, mb)) {
            bool forward = !states[stage].forwardDone.test(chunk, mb);
            error = "stage " + std::to_string(stage) + " never runs the " +
                    (forward ? "forward" : "backward") + " of c" + std::to_string(chunk) + " mb" +
                    std::to_string(mb) + "; add it to its program";
            return false;
          }
    return true;
  }

  const PipelineConfig &config;
  llvm::ArrayRef<StageProgram> programs;
  const ScheduleCosts &costs;
  std::vector<StageState> states;
  std::string error;
};

} // namespace

ScheduleVerdict verifySchedule(const PipelineConfig &config, llvm::ArrayRef<StageProgram> programs,
                               const ScheduleCosts &costs) {
  return ScheduleSimulator(config, programs, costs).run();
}

double idealMakespan(const PipelineConfig &config, const ScheduleCosts &costs) {
  double perMicrobatch = costs.forward + costs.backward;
  double bubble = double(config.stages - 1) * perMicrobatch / double(config.chunks);
  return double(config.microbatches) * perMicrobatch + bubble;
}

} // namespace parc
