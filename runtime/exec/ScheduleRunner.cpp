//===- ScheduleRunner.cpp - The instructions of one training step ---------===//

#include "parc/Runtime/ScheduleRunner.h"

#include "Devices.h"
#include "parc/Runtime/Executor.h"

#include "llvm/ADT/STLExtras.h"

#include <cmath>
#include <numeric>
#include <stdexcept>

namespace parc::runtime {

using plan::InstrKind;

namespace {
[[noreturn]] void scheduleError(const std::string &message) { throw std::runtime_error(message); }

std::string rankNames(const std::vector<int64_t> &ranks) {
  std::string text;
  for (int64_t rank : ranks)
    text += (text.empty() ? "" : ", ") + std::to_string(rank);
  return (ranks.size() == 1 ? "rank " : "ranks ") + text;
}
} // namespace

std::string describeInstr(const plan::Instr &instr) {
  std::string op = plan::spelling(instr.op).str();
  auto where = [&] {
    return "chunk " + std::to_string(instr.chunk) + ", mb " + std::to_string(instr.microbatch);
  };
  switch (instr.op) {
  case InstrKind::LoadBatch:
    return op + " mb " + std::to_string(instr.microbatch);
  case InstrKind::Forward:
  case InstrKind::Backward:
    return op + " " + where();
  case InstrKind::SendAct:
  case InstrKind::SendGrad:
    return op + " to rank " + std::to_string(instr.peer) + " (" + where() + ")";
  case InstrKind::RecvAct:
  case InstrKind::RecvGrad:
    return op + " from rank " + std::to_string(instr.peer) + " (" + where() + ")";
  case InstrKind::AllReduceGrads:
  case InstrKind::ReduceScatterGrads:
  case InstrKind::AllGatherParams:
    return op + " over " + plan::spelling(instr.group).str() + " (" +
           std::to_string(instr.params.size()) + " params)";
  case InstrKind::ReleaseParams:
    return op + " (" + std::to_string(instr.params.size()) + " params)";
  case InstrKind::OptimizerStep:
    return op;
  }
  return op;
}

template <typename D>
ScheduleRunner<D>::ScheduleRunner(const plan::RankPlan &plan, Communicator &comm,
                                  ParamStore<D> &params, const TokenStream &data,
                                  int64_t gradBucketBytes, const LossScaleOptions &lossScale)
    : plan(plan), comm(comm), params(params), dev(params.device()), memory(dev.memory()),
      data(data), interpreter(plan, params, comm), gradSyncOverlap(plan, params, gradBucketBytes),
      within(plan), worldRanks(size_t(plan.world)), scaler(lossScale) {
  std::iota(worldRanks.begin(), worldRanks.end(), 0);
  spareEnvs.resize(plan.chunks.size());
  names.reserve(plan.chunks.size());
  for (const plan::Chunk &chunk : plan.chunks) {
    liveness.push_back(ChunkLiveness::analyze(chunk));
    names.emplace_back(chunk);
    names.back().bindParams(params);
    freed.emplace_back(names.back().freed(liveness.back().afterForward),
                       names.back().freed(liveness.back().afterBackward));
  }
}

bool reportsLoss(const plan::RankPlan &plan) {
  return plan.coords.tp == 0 && plan.coords.dp == 0 && plan.coords.cp == 0 &&
         llvm::any_of(plan.chunks, [](const plan::Chunk &c) { return c.hasHead; });
}

template <typename D> bool ScheduleRunner<D>::reportsLoss() const {
  return runtime::reportsLoss(plan);
}

template <typename D> const plan::Chunk &ScheduleRunner<D>::chunkAt(int64_t index) const {
  if (index < 0 || index >= int64_t(plan.chunks.size()))
    scheduleError("chunk " + std::to_string(index) + " does not exist on this rank");
  return plan.chunks[size_t(index)];
}

template <typename D>
std::vector<int64_t> ScheduleRunner<D>::declaredShape(const plan::Chunk &chunk,
                                                      const std::string &name) const {
  auto it = chunk.tensors.find(name);
  if (it == chunk.tensors.end())
    scheduleError("'" + name + "' is missing from the tensor table of chunk " +
                  std::to_string(chunk.index));
  return it->second.shape;
}

template <typename D>
int64_t ScheduleRunner<D>::transferTag(int64_t boundary, int64_t microbatch, bool gradient) const {
  return (boundary * plan.parallel.microbatches + microbatch) * 2 + (gradient ? 1 : 0);
}

template <typename D>
Tensor<typename D::Value> ScheduleRunner<D>::takeFrom(Key key, const std::string &name, bool copy) {
  auto env = envs.find(key);
  Tensor<T> *source = env == envs.end() ? nullptr : env->second.value(name);
  if (!source)
    scheduleError("'" + name + "' of chunk " + std::to_string(key.first) + ", mb " +
                  std::to_string(key.second) + " is not available to hand over");
  if (!copy)
    return std::move(*source);
  Tensor<T> result(memory, MemoryCategory::Activations, source->shape);
  dev.copy(result.data(), source->data(), source->numel());
  return result;
}

template <typename D> ChunkEnv<typename D::Value> &ScheduleRunner<D>::envOf(Key key) {
  chunkAt(key.first);
  auto found = envs.find(key);
  if (found != envs.end())
    return found->second;
  std::vector<ChunkEnv<T>> &spares = spareEnvs[size_t(key.first)];
  if (spares.empty())
    return envs.try_emplace(key, names[size_t(key.first)]).first->second;
  ChunkEnv<T> &env = envs.try_emplace(key, std::move(spares.back())).first->second;
  spares.pop_back();
  return env;
}

template <typename D>
void ScheduleRunner<D>::retire(typename std::map<Key, ChunkEnv<T>>::iterator it) {
  it->second.clear();
  spareEnvs[size_t(it->first.first)].push_back(std::move(it->second));
  envs.erase(it);
}

template <typename D> StepResult ScheduleRunner<D>::runStep(int64_t step) {
  stepLossSum = 0;
  stepped = false;
  interpreter.setLossScale(scaler.scale());
  gradSyncOverlap.beginStep();
  llvm::ArrayRef<plan::Instr> schedule = plan.schedule;
  for (size_t i = 0; i < schedule.size();) {
    if (within.runsWithin(i)) {
      ++i;
      continue;
    }
    size_t end = i + 1;
    if (plan::isTransfer(schedule[i].op))
      while (end < schedule.size() && plan::isTransfer(schedule[end].op))
        ++end;
    auto where = [&] {
      return "step " + std::to_string(step + 1) + ", schedule[" + std::to_string(i) +
             (end > i + 1 ? ".." + std::to_string(end - 1) : "") + "] (" +
             describeInstr(schedule[i]) +
             (end > i + 1 ? " and " + std::to_string(end - i - 1) + " more" : "") + "): ";
    };
    try {
      StopWatch watch;
      if (plan::isTransfer(schedule[i].op))
        runTransfers(schedule.slice(i, end - i));
      else
        runInstr(i, step);
      // Forward and backward are timed op by op; their remainder is outside any op.
      bool inOps = schedule[i].op == InstrKind::Forward || schedule[i].op == InstrKind::Backward;
      if (profile && !inOps) {
        dev.synchronize();
        profile->add(plan::isTransfer(schedule[i].op) ? std::string("send/recv")
                                                      : plan::spelling(schedule[i].op).str(),
                     watch.seconds());
      }
    } catch (const AgreedError &) {
      throw;
    } catch (const CommError &error) {
      throw CommError(where() + error.what());
    } catch (const std::runtime_error &error) {
      throw std::runtime_error(where() + error.what());
    }
    i = end;
  }
  if (!stepped)
    scheduleError("step " + std::to_string(step + 1) + ": the schedule has no optimizer_step");
  while (!envs.empty())
    retire(envs.begin());

  // Every rank learns the loss: the loss-holding ranks (tp rank 0 of the last stage, one per
  // replica and cp rank) contribute their sum, in a world-wide fold that is the same
  // everywhere. A cp rank's loss is the mean over its share of each sequence, all shares of
  // one size, so the mean over the cp ranks is the mean over the whole sequences.
  std::vector<double> losses(size_t(plan.world), 0.0);
  bool holdsLoss = plan.coords.tp == 0 &&
                   llvm::any_of(plan.chunks, [](const plan::Chunk &c) { return c.hasHead; });
  if (holdsLoss)
    losses[size_t(plan.rank)] = stepLossSum;
  std::string where = "step " + std::to_string(step + 1) +
                      ", after the schedule (the loss all-reduce over all ranks): ";
  try {
    dev.allReduceHost(comm, worldRanks, losses.data(), losses.size());
  } catch (const CommError &error) {
    throw CommError(where + error.what());
  } catch (const std::runtime_error &error) {
    // A device error surfacing at the wait (a CudaError) is reported with the step too.
    throw std::runtime_error(where + error.what());
  }
  std::vector<int64_t> nonFinite;
  double total = 0;
  for (size_t r = 0; r < losses.size(); ++r) {
    total += losses[r];
    if (!std::isfinite(losses[r]))
      nonFinite.push_back(int64_t(r));
  }
  if (!nonFinite.empty())
    throw AgreedError("step " + std::to_string(step + 1) + ": the loss is not finite on " +
                      rankNames(nonFinite) +
                      "; stopping (lower the learning rate or check the data)");
  StepResult result;
  result.loss =
      total / double(plan.parallel.dp * plan.parallel.cp * plan.parallel.microbatches);
  result.optimizer = lastStats;
  return result;
}

template <typename D> void ScheduleRunner<D>::runInstr(size_t index, int64_t step) {
  const plan::Instr &instr = plan.schedule[index];
  switch (instr.op) {
  case InstrKind::LoadBatch:
    return loadBatch(instr.microbatch, step);
  case InstrKind::Forward:
    return forward(instr.chunk, instr.microbatch, index);
  case InstrKind::Backward:
    return backward(instr.chunk, instr.microbatch, index);
  case InstrKind::AllReduceGrads:
    if (!gradSyncOverlap.finishSync(comm, index))
      params.allReduceGrads(comm, instr);
    return;
  case InstrKind::ReduceScatterGrads:
  case InstrKind::AllGatherParams:
  case InstrKind::ReleaseParams:
    return runParamInstr(index);
  case InstrKind::OptimizerStep:
    lastStats = optimizerStep(params, comm, plan, instr, updates, 1.0 / scaler.scale());
    lastStats.lossScale = scaler.scale();
    stepped = true;
    return afterOptimizer(step);
  case InstrKind::SendAct:
  case InstrKind::RecvAct:
  case InstrKind::SendGrad:
  case InstrKind::RecvGrad:
    return runTransfers(instr);
  }
}

template <typename D> void ScheduleRunner<D>::runParamInstr(size_t index) {
  const plan::Instr &instr = plan.schedule[index];
  switch (instr.op) {
  case InstrKind::ReduceScatterGrads:
    return params.reduceScatterGrads(comm, instr);
  case InstrKind::AllGatherParams:
    return params.allGatherParams(comm, instr);
  case InstrKind::ReleaseParams:
    return params.releaseParams(instr);
  default:
    scheduleError(describeInstr(instr) + " is not a ZeRO instruction");
  }
}

template <typename D>
void ScheduleRunner<D>::runOps(const plan::Chunk &chunk, bool backward, size_t index,
                               ChunkEnv<T> &env) {
  const std::vector<WithinPlacement::Hook> &hooks = within.hooksOf(index);
  auto runHooks = [&](size_t op, bool before) {
    for (const WithinPlacement::Hook &hook : hooks)
      if (hook.op == op && hook.before == before) {
        try {
          runParamInstr(hook.instr);
        } catch (const CommError &error) {
          throw CommError("schedule[" + std::to_string(hook.instr) + "] (" +
                          describeInstr(plan.schedule[hook.instr]) + ", within): " + error.what());
        } catch (const std::runtime_error &error) {
          throw std::runtime_error("schedule[" + std::to_string(hook.instr) + "] (" +
                                   describeInstr(plan.schedule[hook.instr]) +
                                   ", within): " + error.what());
        }
      }
  };
  const auto &frees = freed[size_t(chunk.index)];
  llvm::ArrayRef<plan::Op> ops = backward ? chunk.backward : chunk.forward;
  if (ops.empty()) {
    runHooks(0, true);
    runHooks(0, false);
    return;
  }
  interpreter.run(
      chunk, backward, ops, backward ? frees.second : frees.first, env,
      [&](size_t op) {
        runHooks(op, false);
        if (backward)
          gradSyncOverlap.afterBackwardOp(comm, index, op);
      },
      [&](size_t op) { runHooks(op, true); });
}

template <typename D> void ScheduleRunner<D>::afterOptimizer(int64_t step) {
  const StepStats &stats = lastStats;
  if (stats.updated) {
    scaler.finiteStep();
    ++updates;
    return;
  }
  // The norm is global and every rank's scaler has seen the same steps: all decide alike.
  if (scaler.overflow()) {
    params.clearGrads();
    lastStats.skipped = true;
    return;
  }
  // The norm is global, so every rank is here; find out together whose gradients broke it.
  std::vector<double> flags(size_t(plan.world), 0.0);
  flags[size_t(plan.rank)] = std::isfinite(stats.localSquares) ? 0.0 : 1.0;
  dev.allReduceHost(comm, worldRanks, flags.data(), flags.size());
  std::vector<int64_t> culprits;
  for (size_t r = 0; r < flags.size(); ++r)
    if (flags[r] != 0)
      culprits.push_back(int64_t(r));
  std::string norm = std::isnan(stats.gradNorm) ? "nan" : "inf";
  std::string hint =
      scaler.enabled()
          ? scaler.exhaustedHint()
          : "; stopping before the update (lower the learning rate or enable grad_clip)";
  throw AgreedError("step " + std::to_string(step + 1) + ": the gradient norm is " + norm +
                    (culprits.empty() ? std::string()
                                      : " (non-finite gradients on " + rankNames(culprits) + ")") +
                    hint);
}

namespace {
/// A context-parallel rank's positions of [batch, seq] ids: its two chunks, in order.
std::vector<int64_t> contextChunks(const std::vector<int64_t> &ids, int64_t batch, int64_t seq,
                                   int64_t cp, int64_t cpRank) {
  int64_t chunk = seq / (2 * cp);
  std::vector<int64_t> local;
  local.reserve(size_t(batch * 2 * chunk));
  for (int64_t b = 0; b < batch; ++b)
    for (int half = 0; half < 2; ++half) {
      auto first = ids.begin() + b * seq + plan::contextChunkStart(seq, cp, cpRank, half);
      local.insert(local.end(), first, first + chunk);
    }
  return local;
}
} // namespace

template <typename D> void ScheduleRunner<D>::loadBatch(int64_t microbatch, int64_t step) {
  int64_t seq = plan.model.seq, batch = plan.parallel.microBatch, cp = plan.parallel.cp;
  std::vector<int64_t> tokens(size_t(batch * seq)), labels(size_t(batch * seq));
  data.microbatch(uint64_t(plan.train.seed), step, plan.parallel, plan.coords.dp, microbatch, seq,
                  tokens.data(), labels.data());
  if (cp > 1) {
    tokens = contextChunks(tokens, batch, seq, cp, plan.coords.cp);
    labels = contextChunks(labels, batch, seq, cp, plan.coords.cp);
    seq /= cp;
  }
  for (const plan::Chunk &chunk : plan.chunks) {
    auto place = [&](const std::string &name, const std::vector<int64_t> &values) {
      std::vector<int64_t> shape = declaredShape(chunk, name);
      if (shape != std::vector<int64_t>{batch, seq})
        scheduleError("'" + name + "' of chunk " + std::to_string(chunk.index) +
                      " is not declared [micro_batch, seq / cp]");
      Tensor<int64_t> &tensor = envOf({chunk.index, microbatch}).setIds(name);
      tensor = Tensor<int64_t>(memory, MemoryCategory::Activations, shape);
      dev.uploadIds(tensor.data(), values.data(), int64_t(values.size()));
    };
    if (chunk.hasEmbedding)
      place("tokens", tokens);
    if (chunk.hasHead)
      place("labels", labels);
  }
}

template <typename D>
void ScheduleRunner<D>::forward(int64_t index, int64_t microbatch, size_t instr) {
  const plan::Chunk &chunk = chunkAt(index);
  ChunkEnv<T> &env = envOf({index, microbatch});
  if (!chunk.input.empty() && !env.has(chunk.input)) {
    // With one pipeline stage the previous virtual stage is this rank's previous chunk.
    if (plan.parallel.pp != 1 || index == 0)
      scheduleError("the input '" + chunk.input + "' was not received before this forward");
    const plan::Chunk &previous = chunkAt(index - 1);
    bool keep = llvm::is_contained(liveness[size_t(index - 1)].readByBackward, previous.output);
    env.setValue(chunk.input) = takeFrom({index - 1, microbatch}, previous.output, keep);
  }
  if (chunk.hasEmbedding && !env.ids("tokens"))
    scheduleError("no load_batch before the forward of the embedding chunk");
  if (chunk.hasHead && !env.ids("labels"))
    scheduleError("no load_batch before the forward of the head chunk");
  runOps(chunk, /*backward=*/false, instr, env);
  if (chunk.hasHead) {
    if (!env.value("loss"))
      scheduleError("the head chunk's forward did not write 'loss'");
    stepLossSum += interpreter.lastLoss();
  }
}

template <typename D>
void ScheduleRunner<D>::backward(int64_t index, int64_t microbatch, size_t instr) {
  const plan::Chunk &chunk = chunkAt(index);
  auto found = envs.find({index, microbatch});
  if (found == envs.end())
    scheduleError("backward before the forward of this microbatch");
  ChunkEnv<T> &env = found->second;
  if (chunk.hasHead) {
    // Each microbatch's loss is a mean over its tokens; 1/M makes the step's gradient that of
    // the mean over all of this replica's tokens.
    Tensor<T> &seed = env.setValue("loss.grad");
    seed = Tensor<T>(memory, MemoryCategory::Activations, declaredShape(chunk, "loss.grad"),
                     Init::Overwritten);
    dev.fill(seed.data(), seed.numel(), 1.0 / double(plan.parallel.microbatches));
  }
  std::string outputGrad = chunk.output.empty() ? "" : plan::gradName(chunk.output);
  if (!outputGrad.empty() && !env.has(outputGrad)) {
    if (plan.parallel.pp != 1 || index + 1 >= int64_t(plan.chunks.size()))
      scheduleError("the gradient '" + outputGrad + "' was not received before this backward");
    const plan::Chunk &next = chunkAt(index + 1);
    env.setValue(outputGrad) =
        takeFrom({index + 1, microbatch}, plan::gradName(next.input), /*copy=*/false);
    retire(envs.find({index + 1, microbatch}));
  }
  runOps(chunk, /*backward=*/true, instr, env);
  // Only the input gradient outlives the backward, until it is sent or handed over.
  std::string inputGrad = chunk.input.empty() ? "" : plan::gradName(chunk.input);
  Tensor<T> kept;
  if (Tensor<T> *grad = inputGrad.empty() ? nullptr : env.value(inputGrad))
    kept = std::move(*grad);
  env.clear();
  if (kept.buffer.allocated())
    env.setValue(inputGrad) = std::move(kept);
  else
    retire(found);
}

template <typename D> void ScheduleRunner<D>::runTransfers(llvm::ArrayRef<plan::Instr> run) {
  std::vector<Transfer> transfers;
  for (const plan::Instr &instr : run) {
    const plan::Chunk &chunk = chunkAt(instr.chunk);
    ChunkEnv<T> &env = envOf({instr.chunk, instr.microbatch});
    int64_t stage = chunk.virtualStage;
    auto sendTensor = [&](const std::string &name, int64_t boundary, bool gradient) {
      Tensor<T> *tensor = env.value(name);
      if (!tensor)
        scheduleError(describeInstr(instr) + ": '" + name + "' has not been computed yet");
      transfers.push_back(Transfer::send(instr.peer,
                                         transferTag(boundary, instr.microbatch, gradient),
                                         tensor->data(), size_t(tensor->numel())));
    };
    auto recvTensor = [&](const std::string &name, int64_t boundary, bool gradient) {
      if (env.has(name))
        scheduleError(describeInstr(instr) + ": '" + name + "' was already received");
      Tensor<T> &tensor = env.setValue(name);
      // The receive writes every element (its count is checked against the send's).
      tensor = Tensor<T>(memory, MemoryCategory::Activations, declaredShape(chunk, name),
                         Init::Overwritten);
      transfers.push_back(Transfer::recv(instr.peer,
                                         transferTag(boundary, instr.microbatch, gradient),
                                         tensor.data(), size_t(tensor.numel())));
    };
    switch (instr.op) {
    case InstrKind::SendAct:
      sendTensor(chunk.output, stage, false);
      break;
    case InstrKind::RecvAct:
      recvTensor(chunk.input, stage - 1, false);
      break;
    case InstrKind::SendGrad:
      sendTensor(plan::gradName(chunk.input), stage - 1, true);
      break;
    case InstrKind::RecvGrad:
      recvTensor(plan::gradName(chunk.output), stage, true);
      break;
    default:
      scheduleError(describeInstr(instr) + " is not a transfer");
    }
  }
  comm.exchange(transfers);
  // Sent tensors are dead unless the backward still reads them.
  for (const plan::Instr &instr : run) {
    const plan::Chunk &chunk = chunkAt(instr.chunk);
    Key key{instr.chunk, instr.microbatch};
    if (instr.op == InstrKind::SendAct &&
        !llvm::is_contained(liveness[size_t(instr.chunk)].readByBackward, chunk.output))
      envOf(key).erase(chunk.output);
    if (instr.op == InstrKind::SendGrad)
      if (auto found = envs.find(key); found != envs.end())
        retire(found);
  }
}

#define INSTANTIATE(D) template class ScheduleRunner<D>;
PARC_FOR_EACH_DEVICE(INSTANTIATE)
#undef INSTANTIATE

} // namespace parc::runtime
