//===- PipelineRun.cpp - The timing run of a pipeline schedule ------------===//
#include "parc/Cost/PipelineRun.h"

#include <algorithm>
#include <memory>

namespace parc {

/// Every message of the schedule by (gradient, receiving virtual stage, microbatch), its
/// arrival slot FirstMessage + that index, and the instruction of its sender that posts it. A
/// message nobody sends is never posted: its receive waits and the schedule deadlocks.
class CompiledSchedule::Messages {
public:
  enum : uint32_t { FirstMessage = 2, NotSent = UINT32_MAX };
  struct Posted {
    uint32_t stage, instruction, slot; // the sending stage, its instruction, the arrival slot
  };

  Messages(const PipelineConfig &config, const std::vector<StageProgram> &programs)
      : config(config),
        posting(size_t(2 * config.virtualStages() * config.microbatches), NotSent) {
    for (size_t s = 0; s < programs.size(); ++s)
      for (size_t i = 0; i < programs[s].size(); ++i)
        if (programs[s][i].isSend())
          posting[index(programs[s][i], s).first] = uint32_t(i);
  }

  size_t slots() const { return FirstMessage + posting.size(); }

  /// The message `op` of `stage` sends or receives.
  Posted operator()(const PipeOp &op, size_t stage) const {
    auto [message, sender] = index(op, stage);
    return {uint32_t(sender), posting[message], uint32_t(FirstMessage + message)};
  }

private:
  /// The message's index and its sender: the op's peer, since the schedule has a transfer
  /// only between two stages (no division by the stage count on this per-instruction path).
  std::pair<size_t, int64_t> index(const PipeOp &op, size_t stage) const {
    const bool gradient = op.kind == PipeOpKind::SendGradient ||
                          op.kind == PipeOpKind::RecvGradient;
    const int64_t v = config.virtualStageOf(int64_t(stage), op.chunk);
    const int64_t to = op.isSend() ? v + (gradient ? -1 : 1) : v;
    const int64_t sender = op.isSend() || op.peer < 0 ? int64_t(stage) : op.peer;
    return {size_t(((gradient ? 1 : 0) * config.virtualStages() + to) * config.microbatches +
                   op.microbatch),
            sender};
  }

  const PipelineConfig &config;
  std::vector<uint32_t> posting;
};

CompiledSchedule::CompiledSchedule(const PipelineConfig &config)
    : shape(config), stagePrograms(buildPipelineSchedule(config)) {
  compile();
}

void CompiledSchedule::compile() {
  const size_t stages = stagePrograms.size();
  size_t instructions = 0;
  for (const StageProgram &program : stagePrograms)
    instructions += program.size();
  const Messages message(shape, stagePrograms);
  slots = message.slots();
  steps.reserve(instructions / 2);
  lastSend.assign(stages, SinkSlot);
  // A stage runs until a receive whose send has not run yet, then sleeps among its sender's
  // waiters until the sender has run past that send.
  std::vector<size_t> next(stages, 0);
  std::vector<int64_t> waiters(stages, -1), nextWaiter(stages, -1);
  std::vector<uint32_t> ready;
  for (size_t s = stages; s-- > 0;)
    ready.push_back(uint32_t(s));
  size_t done = 0;
  while (!ready.empty()) {
    const uint32_t s = ready.back();
    ready.pop_back();
    auto [end, sender] = addSegment(message, next, s);
    done += end - next[s];
    next[s] = end;
    if (sender >= 0) {
      nextWaiter[s] = waiters[size_t(sender)];
      waiters[size_t(sender)] = int64_t(s);
    }
    for (int64_t *link = &waiters[s]; *link >= 0;) {
      const size_t waiter = size_t(*link);
      if (message(stagePrograms[waiter][next[waiter]], waiter).instruction < next[s]) {
        *link = nextWaiter[waiter];
        ready.push_back(uint32_t(waiter));
      } else {
        link = &nextWaiter[waiter];
      }
    }
  }
  deadlocks = done != instructions;
}

std::pair<size_t, int64_t> CompiledSchedule::addSegment(const Messages &message,
                                                        const std::vector<size_t> &next,
                                                        size_t stage) {
  const StageProgram &program = stagePrograms[stage];
  const size_t size = program.size();
  const uint32_t backwardBase = uint32_t(1 + shape.virtualStages());
  size_t i = next[stage];
  int64_t sender = -1;
  uint32_t count = 0;
  Step step;
  struct {
    int receives = 0, computes = 0, sends = 0;
  } parts; // of `step`
  auto flush = [&] {
    steps.push_back(step);
    ++count;
    step = Step();
    parts = {};
  };
  for (; i < size; ++i) {
    const PipeOp &op = program[i];
    switch (op.kind) {
    case PipeOpKind::RecvActivation:
    case PipeOpKind::RecvGradient: {
      const Messages::Posted from = message(op, stage);
      if (next[from.stage] <= from.instruction) { // not posted yet
        sender = int64_t(from.stage);
        break;
      }
      if (parts.computes + parts.sends > 0 || parts.receives == 2)
        flush();
      step.wait[parts.receives++] = from.slot;
      continue;
    }
    case PipeOpKind::Forward:
    case PipeOpKind::Backward:
      if (parts.computes + parts.sends > 0)
        flush();
      step.duration = uint32_t(op.chunk * shape.stages + int64_t(stage)) +
                      (op.kind == PipeOpKind::Forward ? 1 : backwardBase);
      parts.computes = 1;
      continue;
    case PipeOpKind::SendActivation:
    case PipeOpKind::SendGradient:
      if (parts.sends == 2)
        flush();
      step.send[parts.sends++] = lastSend[stage] = message(op, stage).slot;
      continue;
    }
    break; // a receive waits
  }
  if (parts.receives + parts.computes + parts.sends > 0)
    flush();
  if (count > 0)
    segments.push_back({uint32_t(stage), count});
  return {i, sender};
}

template <bool KeepTimings> PipelineRun CompiledSchedule::runSteps(double transfer) {
  PipelineRun run;
  const size_t stages = stagePrograms.size();
  if (KeepTimings) {
    run.timings.resize(stages);
    for (size_t s = 0; s < stages; ++s)
      run.timings[s].resize(stagePrograms[s].size());
  }
  const Step *step = steps.data();
  std::vector<size_t> timed(KeepTimings ? stages : 0, 0); // per stage, instructions timed
  const double *seconds = durations.data();
  double *arrivals = arrival.data(), *began = starts.data();
  for (const Segment &segment : segments) {
    double now = clock[segment.stage];
    OpTiming *t = KeepTimings ? run.timings[segment.stage].data() + timed[segment.stage] : nullptr;
    for (const Step *end = step + segment.count; step != end; ++step) {
      // Each part is exact when absent: max(now, 0) is now, and adding 0 s changes nothing.
      const double received = std::max(now, arrivals[step->wait[0]]);
      const double start = std::max(received, arrivals[step->wait[1]]);
      began[step->duration] = start;
      const double finish = start + seconds[step->duration];
      arrivals[step->send[0]] = arrivals[step->send[1]] = finish + transfer;
      if (KeepTimings) { // the parts a step has, in their program order
        if (step->wait[0] != ZeroSlot)
          *t++ = {now, received};
        if (step->wait[1] != ZeroSlot)
          *t++ = {received, start};
        if (step->duration != 0)
          *t++ = {start, finish};
        for (uint32_t send : step->send)
          if (send != SinkSlot)
            *t++ = {finish, finish + transfer};
      }
      now = finish;
    }
    clock[segment.stage] = now;
    if (KeepTimings)
      timed[segment.stage] = size_t(t - run.timings[segment.stage].data());
  }
  // A stage's clock never goes back, so its last send's arrival is the latest.
  run.stageEnd.resize(stages);
  for (size_t s = 0; s < stages; ++s) {
    run.stageEnd[s] = std::max(clock[s], lastSend[s] == SinkSlot ? 0.0 : arrivals[lastSend[s]]);
    run.makespan = std::max(run.makespan, run.stageEnd[s]);
  }
  const size_t virtualStages = size_t(shape.virtualStages());
  run.lastBackwardStart.assign(starts.begin() + 1 + std::ptrdiff_t(virtualStages),
                               starts.end());
  return run;
}

llvm::Expected<PipelineRun> CompiledSchedule::run(llvm::ArrayRef<double> forward,
                                                  llvm::ArrayRef<double> backward,
                                                  double transfer, bool keepTimings) {
  const size_t virtualStages = size_t(shape.virtualStages());
  if (deadlocks)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "internal error: the pipeline schedule deadlocks in its "
                                   "timing run");
  if (forward.size() != virtualStages || backward.size() != virtualStages)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "internal error: the timing run wants a forward and a "
                                   "backward time per virtual stage");
  durations.resize(1 + 2 * virtualStages);
  durations[0] = 0;
  std::copy(forward.begin(), forward.end(), durations.begin() + 1);
  std::copy(backward.begin(), backward.end(),
            durations.begin() + 1 + std::ptrdiff_t(virtualStages));
  starts.assign(durations.size(), 0);
  arrival.resize(slots);
  arrival[ZeroSlot] = 0;
  clock.assign(stagePrograms.size(), 0);
  return keepTimings ? runSteps<true>(transfer) : runSteps<false>(transfer);
}

CompiledSchedule &compiledSchedule(const PipelineConfig &config) {
  thread_local std::vector<std::unique_ptr<CompiledSchedule>> cache;
  for (const std::unique_ptr<CompiledSchedule> &c : cache) {
    const PipelineConfig &shape = c->config();
    if (shape.kind == config.kind && shape.stages == config.stages &&
        shape.microbatches == config.microbatches && shape.chunks == config.chunks)
      return *c;
  }
  if (cache.size() >= 8)
    cache.erase(cache.begin());
  cache.push_back(std::make_unique<CompiledSchedule>(config));
  return *cache.back();
}

} // namespace parc
