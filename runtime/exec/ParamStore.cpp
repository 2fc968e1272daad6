//===- ParamStore.cpp - Shards, gradients and the ZeRO collectives --------===//

#include "parc/Runtime/ParamStore.h"

#include "parc/Runtime/Init.h"
#include "parc/Runtime/Kernels.h"

#include "llvm/ADT/Twine.h"

#include <algorithm>
#include <stdexcept>

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

template <typename T>
ParamStore<T>::ParamStore(const plan::RankPlan &plan, MemoryTracker &memory)
    : plan(plan), memory(memory) {
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

template <typename T> llvm::Error ParamStore<T>::buildPartitions() {
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

template <typename T> void ParamStore<T>::initialize(uint64_t seed) {
  int64_t gradElements = 0;
  for (const Partition &partition : parts)
    gradElements += partition.padded();
  for (const Param &param : params)
    if (param.partition < 0)
      gradElements += param.numel;
  gradStorage = Buffer<T>(memory, MemoryCategory::Grads, size_t(gradElements));
  T *nextGrad = gradStorage.data();
  for (Partition &partition : parts) {
    partition.grads = nextGrad;
    for (size_t i : partition.params)
      params[i].grad = nextGrad + params[i].flatOffset;
    nextGrad += partition.padded();
  }
  for (Param &param : params) {
    if (param.partition >= 0)
      continue;
    param.grad = nextGrad;
    nextGrad += param.numel;
    param.storage = Buffer<T>(memory, MemoryCategory::Weights, size_t(param.numel));
    param.value = param.storage.data();
    initShard(param.value, seed, *param.shard);
  }
  for (Partition &partition : parts) {
    partition.weights = Buffer<T>(memory, MemoryCategory::Weights, size_t(partition.padded()));
    pointInto(partition);
    for (size_t i : partition.params)
      initShard(params[i].value, seed, *params[i].shard);
    if (partition.zero3)
      release(partition);
  }
}

template <typename T> typename ParamStore<T>::Param *ParamStore<T>::find(llvm::StringRef name) {
  auto it = byName.find(name);
  return it == byName.end() ? nullptr : &params[it->second];
}

template <typename T>
typename ParamStore<T>::Param *ParamStore<T>::gradOwner(llvm::StringRef gradName) {
  if (!gradName.consume_back(".grad"))
    return nullptr;
  return find(gradName);
}

template <typename T> std::vector<size_t> ParamStore<T>::resolve(const plan::Instr &instr) const {
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

template <typename T>
typename ParamStore<T>::Partition &ParamStore<T>::partitionOf(const plan::Instr &instr) {
  std::vector<size_t> members = resolve(instr);
  int64_t index = params[members.front()].partition;
  if (index < 0 || parts[size_t(index)].params != members)
    throw std::runtime_error(plan::spelling(instr.op).str() +
                             " names parameters that form no ZeRO partition");
  return parts[size_t(index)];
}

template <typename T>
void ParamStore<T>::allReduceGrads(Communicator &comm, const plan::Instr &instr) {
  std::vector<size_t> members = resolve(instr);
  int64_t total = 0;
  bool adjacent = true;
  for (size_t k = 0; k < members.size(); ++k) {
    const Param &param = params[members[k]];
    if (k > 0 && param.grad != params[members[k - 1]].grad + params[members[k - 1]].numel)
      adjacent = false;
    total += param.numel;
  }
  // One collective for the whole list: in place when the shards are adjacent in the gradient
  // buffer, as they are for the data-parallel all-reduce, else through a copy.
  Buffer<T> scratch;
  T *flat = params[members.front()].grad;
  if (!adjacent) {
    scratch = Buffer<T>(memory, MemoryCategory::Grads, size_t(total));
    flat = scratch.data();
    int64_t offset = 0;
    for (size_t i : members) {
      std::copy_n(params[i].grad, params[i].numel, flat + offset);
      offset += params[i].numel;
    }
  }
  const std::vector<int64_t> &group = plan.groups.get(instr.group);
  comm.allReduce(group, flat, size_t(total));
  if (instr.average)
    cpu::scale(flat, total, 1.0 / double(group.size()));
  if (adjacent)
    return;
  int64_t offset = 0;
  for (size_t i : members) {
    std::copy_n(flat + offset, params[i].numel, params[i].grad);
    offset += params[i].numel;
  }
}

template <typename T>
void ParamStore<T>::reduceScatterGrads(Communicator &comm, const plan::Instr &instr) {
  Partition &partition = partitionOf(instr);
  Buffer<T> owned(memory, MemoryCategory::Grads, size_t(partition.perMember));
  comm.reduceScatter(partition.group, partition.grads, owned.data(), size_t(partition.perMember));
  if (instr.average)
    cpu::scale(owned.data(), partition.perMember, 1.0 / double(partition.group.size()));
  // Only the owned range is meaningful afterwards; the optimizer reads nothing else.
  std::copy_n(owned.data(), partition.perMember, partition.grads + partition.ownedLo());
}

template <typename T> void ParamStore<T>::pointInto(Partition &partition) {
  for (size_t i : partition.params)
    params[i].value =
        partition.weights.allocated() ? partition.weights.data() + params[i].flatOffset : nullptr;
}

template <typename T> void ParamStore<T>::release(Partition &partition) {
  if (!partition.weights.allocated())
    return;
  partition.owned = Buffer<T>(memory, MemoryCategory::Weights, size_t(partition.perMember));
  std::copy_n(partition.weights.data() + partition.ownedLo(), partition.perMember,
              partition.owned.data());
  partition.weights.reset();
  pointInto(partition);
}

template <typename T> void ParamStore<T>::gather(Communicator &comm, Partition &partition) {
  if (!partition.weights.allocated()) {
    partition.weights = Buffer<T>(memory, MemoryCategory::Weights, size_t(partition.padded()));
    std::copy_n(partition.owned.data(), partition.perMember,
                partition.weights.data() + partition.ownedLo());
    partition.owned.reset();
    pointInto(partition);
  }
  // In place: this member's part of the buffer is its input.
  comm.allGather(partition.group, partition.weights.data() + partition.ownedLo(),
                 partition.weights.data(), size_t(partition.perMember));
}

template <typename T>
void ParamStore<T>::allGatherParams(Communicator &comm, const plan::Instr &instr) {
  gather(comm, partitionOf(instr));
}

template <typename T> void ParamStore<T>::releaseParams(const plan::Instr &instr) {
  release(partitionOf(instr));
}

template <typename T> void ParamStore<T>::gatherAll(Communicator &comm) {
  for (Partition &partition : parts)
    if (!partition.weights.allocated())
      gather(comm, partition);
}

template <typename T> void ParamStore<T>::clearGrads() {
  std::fill_n(gradStorage.data(), gradStorage.size(), T(0));
}

template <typename T> T *ParamStore<T>::ownedWeights(Param &param) {
  if (param.value)
    return param.value + param.ownedBegin;
  Partition &partition = parts[size_t(param.partition)];
  return partition.owned.data() + param.flatOffset + param.ownedBegin - partition.ownedLo();
}

template class ParamStore<float>;
template class ParamStore<double>;

} // namespace parc::runtime
