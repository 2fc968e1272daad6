//===- ParamStore.cpp - Shards, gradients and the ZeRO collectives --------===//

#include "parc/Runtime/ParamStore.h"

#include "Devices.h"

#include "llvm/ADT/Twine.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace parc::runtime {

namespace {
llvm::Error planError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

bool isPartitionInstr(plan::InstrKind op) {
  return op == plan::InstrKind::ReduceScatterGrads || op == plan::InstrKind::AllGatherParams ||
         op == plan::InstrKind::ReleaseParams;
}
} // namespace

template <typename D>
ParamStore<D>::ParamStore(const plan::RankPlan &plan, D &device)
    : plan(plan), dev(device), memory(device.memory()) {
  params.resize(plan.params.size());
  for (size_t i = 0; i < plan.params.size(); ++i) {
    Param &param = params[i];
    param.shard = &plan.params[i];
    param.localShape = param.shard->localShape();
    param.numel = 1;
    for (int64_t dim : param.localShape)
      param.numel *= dim;
    param.ownedEnd = param.numel;
    byName[param.shard->name] = i;
  }
}

template <typename D> llvm::Error ParamStore<D>::buildPartitions() {
  for (size_t index = 0; index < plan.schedule.size(); ++index) {
    const plan::Instr &instr = plan.schedule[index];
    if (!isPartitionInstr(instr.op))
      continue;
    std::vector<size_t> members = resolve(instr);
    const Param &first = params[members.front()];
    if (first.partition >= 0) {
      Partition &partition = parts[size_t(first.partition)];
      if (partition.params != members)
        return planError("schedule[" + llvm::Twine(index) + "] (" + plan::spelling(instr.op) +
                         ") partitions '" + first.shard->name +
                         "' with another params list than an earlier instruction; every ZeRO "
                         "instruction naming a parameter must use the same list");
      if (instr.op == plan::InstrKind::ReleaseParams)
        partition.zero3 = true;
      else if (partition.group != plan.groups.get(instr.group))
        return planError("schedule[" + llvm::Twine(index) + "] partitions '" + first.shard->name +
                         "' over another group than an earlier instruction");
      continue;
    }
    if (instr.op == plan::InstrKind::ReleaseParams)
      return planError("schedule[" + llvm::Twine(index) +
                       "] (release_params) comes before any all_gather_params or "
                       "reduce_scatter_grads of its parameters, so their partition is unknown");
    Partition partition;
    partition.params = members;
    partition.group = plan.groups.get(instr.group);
    auto self = std::find(partition.group.begin(), partition.group.end(), plan.rank);
    partition.position = self - partition.group.begin();
    int64_t g = int64_t(partition.group.size());
    for (size_t i : members) {
      if (params[i].partition >= 0)
        return planError("schedule[" + llvm::Twine(index) + "] partitions '" +
                         params[i].shard->name + "' a second time in another list");
      params[i].partition = int64_t(parts.size());
      params[i].flatOffset = partition.elements;
      partition.elements += params[i].numel;
    }
    partition.perMember = (partition.elements + g - 1) / g;
    for (size_t i : members) {
      Param &param = params[i];
      int64_t begin = std::max(param.flatOffset, partition.ownedLo());
      int64_t end = std::min(param.flatOffset + param.numel, partition.ownedHi());
      // A shard outside the owned range owns nothing.
      param.ownedBegin = end > begin ? begin - param.flatOffset : 0;
      param.ownedEnd = end > begin ? end - param.flatOffset : 0;
    }
    parts.push_back(std::move(partition));
  }
  return llvm::Error::success();
}

template <typename D> void ParamStore<D>::initShard(T *values, uint64_t seed, const Param &param) {
  const plan::ParamShard &shard = *param.shard;
  dev.initShard(values, seed, shard);
  // Rows past init.rows (the vocabulary's padding) are zero; they are the shard's last rows.
  if (shard.init.kind != plan::InitKind::Normal || shard.init.rows <= 0 || shard.slice.empty())
    return;
  int64_t rowElements = param.localShape.empty() ? 1 : param.numel / param.localShape[0];
  int64_t firstPadded = std::clamp<int64_t>(shard.init.rows - shard.slice[0].offset, 0,
                                            shard.slice[0].size);
  dev.fill(values + firstPadded * rowElements, (shard.slice[0].size - firstPadded) * rowElements,
           0.0);
}

template <typename D> void ParamStore<D>::initialize(uint64_t seed) {
  int64_t gradElements = 0;
  for (const Param &param : params)
    if (param.partition < 0)
      gradElements += param.numel;
  gradStorage = Buffer<Grad>(memory, MemoryCategory::Grads, size_t(gradElements));
  Grad *nextGrad = gradStorage.data();
  for (Param &param : params) {
    if (param.partition >= 0)
      continue;
    param.grad = nextGrad;
    nextGrad += param.numel;
    param.storage = Buffer<T>(memory, MemoryCategory::Weights, size_t(param.numel));
    param.value = param.storage.data();
    initShard(param.value, seed, param);
  }
  for (Partition &partition : parts) {
    partition.weights = Buffer<T>(memory, MemoryCategory::Weights, size_t(partition.padded()));
    pointInto(partition);
    for (size_t i : partition.params)
      initShard(params[i].value, seed, params[i]);
    if (partition.zero3) {
      partition.owned = Buffer<T>(memory, MemoryCategory::Weights, size_t(partition.perMember));
      dev.copy(partition.owned.data(), partition.weights.data() + partition.ownedLo(),
               partition.perMember);
      release(partition);
    }
  }
}

template <typename D> typename ParamStore<D>::Param *ParamStore<D>::find(llvm::StringRef name) {
  auto it = byName.find(name);
  return it == byName.end() ? nullptr : &params[it->second];
}

template <typename D>
typename ParamStore<D>::Param *ParamStore<D>::gradOwner(llvm::StringRef gradName) {
  if (!gradName.consume_back(".grad"))
    return nullptr;
  return find(gradName);
}

template <typename D> std::vector<size_t> ParamStore<D>::resolve(const plan::Instr &instr) const {
  std::vector<size_t> indices;
  for (const std::string &name : instr.params) {
    auto it = byName.find(name);
    if (it == byName.end())
      throw std::runtime_error(plan::spelling(instr.op).str() + " names '" + name +
                               "', which is not a parameter of this rank");
    indices.push_back(it->second);
  }
  return indices;
}

template <typename D>
typename ParamStore<D>::Partition &ParamStore<D>::partitionOf(const plan::Instr &instr) {
  std::vector<size_t> members = resolve(instr);
  int64_t index = params[members.front()].partition;
  if (index < 0 || parts[size_t(index)].params != members)
    throw std::runtime_error(plan::spelling(instr.op).str() +
                             " names parameters that form no ZeRO partition");
  return parts[size_t(index)];
}

template <typename D> typename D::Grad *ParamStore<D>::writableGrad(Param &param) {
  if (param.partition >= 0) {
    Partition &partition = parts[size_t(param.partition)];
    if (!partition.grads.allocated()) {
      partition.grads = Buffer<Grad>(memory, MemoryCategory::Grads, size_t(partition.padded()));
      pointGradsInto(partition);
    }
  }
  return param.grad;
}

template <typename D> void ParamStore<D>::pointGradsInto(Partition &partition) {
  for (size_t i : partition.params)
    params[i].grad =
        partition.grads.allocated() ? partition.grads.data() + params[i].flatOffset : nullptr;
}

template <typename D>
std::pair<typename D::Grad *, int64_t> ParamStore<D>::heldGrad(Param &param) {
  if (param.grad)
    return {param.grad, param.numel};
  if (param.partition >= 0 && parts[size_t(param.partition)].ownedGrads.allocated())
    return {ownedGrad(param), param.ownedCount()};
  throw std::runtime_error("the gradient of '" + param.shard->name +
                           "' was not written in this step");
}

template <typename D>
void ParamStore<D>::allReduceGrads(Communicator &comm, const plan::Instr &instr) {
  // One collective per run of adjacent gradients, in place: the whole list for the
  // data-parallel all-reduce, a run per MoE block's experts when the dense parameters
  // between them are reduced over another group. No scratch, as the memory model assumes.
  std::vector<std::pair<Grad *, int64_t>> runs;
  for (size_t i : resolve(instr)) {
    std::pair<Grad *, int64_t> part = heldGrad(params[i]);
    if (part.second == 0)
      continue;
    if (!runs.empty() && part.first == runs.back().first + runs.back().second)
      runs.back().second += part.second;
    else
      runs.push_back(part);
  }
  const std::vector<int64_t> &group = plan.groups.get(instr.group);
  for (auto [data, count] : runs) {
    comm.allReduce(group, data, size_t(count));
    if (instr.average)
      dev.scale(data, count, 1.0 / double(plan::averagingDivisor(plan, instr.group)));
  }
}

template <typename D>
void ParamStore<D>::reduceScatterGrads(Communicator &comm, const plan::Instr &instr) {
  Partition &partition = partitionOf(instr);
  if (!partition.grads.allocated())
    throw std::runtime_error("no op wrote the gradients of this partition since its last "
                             "reduce_scatter_grads");
  Grad *mine = partition.grads.data() + partition.ownedLo();
  comm.reduceScatter(partition.group, partition.grads.data(), mine, size_t(partition.perMember));
  if (instr.average)
    dev.scale(mine, partition.perMember, 1.0 / double(plan::averagingDivisor(plan, instr.group)));
  if (!partition.ownedGrads.allocated()) {
    partition.ownedGrads =
        Buffer<Grad>(memory, MemoryCategory::Grads, size_t(partition.perMember));
    dev.copy(partition.ownedGrads.data(), mine, partition.perMember);
  } else {
    dev.addGrads(partition.ownedGrads.data(), mine, partition.perMember);
  }
  partition.grads.reset();
  pointGradsInto(partition);
}

template <typename D> void ParamStore<D>::pointInto(Partition &partition) {
  for (size_t i : partition.params)
    params[i].value =
        partition.weights.allocated() ? partition.weights.data() + params[i].flatOffset : nullptr;
}

template <typename D> void ParamStore<D>::release(Partition &partition) {
  if (!partition.weights.allocated())
    return;
  // Nothing to copy back: `weights` was gathered from `owned` (the initialisation copied its
  // part itself), the computes only read it, and the update writes `owned` (ownedWeights).
  partition.weights.reset();
  pointInto(partition);
}

template <typename D> void ParamStore<D>::gather(Communicator &comm, Partition &partition) {
  if (!partition.weights.allocated()) {
    // Every part is written below: this member's here, the others' by the all_gather.
    partition.weights = Buffer<T>(memory, MemoryCategory::Weights, size_t(partition.padded()),
                                  Init::Overwritten);
    dev.copy(partition.weights.data() + partition.ownedLo(), partition.owned.data(),
             partition.perMember);
    pointInto(partition);
  }
  // In place: this member's part of the buffer is its input.
  comm.allGather(partition.group, partition.weights.data() + partition.ownedLo(),
                 partition.weights.data(), size_t(partition.perMember));
}

template <typename D>
void ParamStore<D>::allGatherParams(Communicator &comm, const plan::Instr &instr) {
  gather(comm, partitionOf(instr));
}

template <typename D> void ParamStore<D>::releaseParams(const plan::Instr &instr) {
  release(partitionOf(instr));
}

template <typename D> void ParamStore<D>::gatherAll(Communicator &comm) {
  for (Partition &partition : parts)
    if (!partition.weights.allocated())
      gather(comm, partition);
}

template <typename D> void ParamStore<D>::clearGrads() {
  dev.fill(gradStorage.data(), int64_t(gradStorage.size()), 0.0);
  for (Partition &partition : parts) {
    partition.grads.reset();
    partition.ownedGrads.reset();
    pointGradsInto(partition);
  }
}

template <typename D> typename D::Value *ParamStore<D>::ownedWeights(Param &param) {
  if (param.ownedCount() == 0)
    return nullptr;
  if (param.partition < 0 || !parts[size_t(param.partition)].zero3)
    return param.value + param.ownedBegin;
  Partition &partition = parts[size_t(param.partition)];
  return partition.owned.data() + param.flatOffset + param.ownedBegin - partition.ownedLo();
}

template <typename D> typename D::Grad *ParamStore<D>::ownedGrad(Param &param) {
  if (param.ownedCount() == 0)
    return nullptr;
  if (param.partition < 0)
    return param.grad + param.ownedBegin;
  Partition &partition = parts[size_t(param.partition)];
  if (!partition.ownedGrads.allocated())
    return nullptr;
  return partition.ownedGrads.data() + param.flatOffset + param.ownedBegin - partition.ownedLo();
}

#define INSTANTIATE(D) template class ParamStore<D>;
PARC_FOR_EACH_DEVICE(INSTANTIATE)
#undef INSTANTIATE

} // namespace parc::runtime
