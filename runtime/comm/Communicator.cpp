//===- Communicator.cpp - Argument checks shared by every communicator -----===//

#include "parc/Runtime/Communicator.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <cstring>
#include <optional>

using llvm::ArrayRef;
using llvm::StringRef;

namespace parc::runtime {

size_t sizeOf(ElementType type) {
  switch (type) {
  case ElementType::F32:
    return sizeof(float);
  case ElementType::F64:
    return sizeof(double);
  case ElementType::BF16:
  case ElementType::F16:
    return 2;
  }
  return 0;
}

StringRef spelling(ElementType type) {
  switch (type) {
  case ElementType::F32:
    return "f32";
  case ElementType::F64:
    return "f64";
  case ElementType::BF16:
    return "bf16";
  case ElementType::F16:
    return "f16";
  }
  return "?";
}

StringRef spelling(ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum:
    return "sum";
  case ReduceOp::Max:
    return "max";
  }
  return "?";
}

// Max propagates NaN: a NaN on either side wins.
template <typename T> [[gnu::always_inline]] inline T maxOf(T accumulated, T input) {
  bool take = !std::isnan(accumulated) && (input > accumulated || std::isnan(input));
  return take ? input : accumulated;
}

template <typename T>
static void accumulateTyped(ReduceOp op, T *accumulator, const T *input, size_t count) {
  switch (op) {
  case ReduceOp::Sum:
#pragma omp simd
    for (size_t k = 0; k < count; ++k)
      accumulator[k] += input[k];
    return;
  case ReduceOp::Max:
    for (size_t k = 0; k < count; ++k)
      accumulator[k] = maxOf(accumulator[k], input[k]);
    return;
  }
}

// The last member's buffer is added in the same pass that stores the result into it: with
// two members, the common tp and dp group, one pass instead of an accumulate and a copy.
template <typename T, typename Combine>
[[gnu::always_inline]] inline void combineIntoBoth(T *first, T *last, size_t count,
                                                   const Combine &combine) {
#pragma omp simd
  for (size_t k = 0; k < count; ++k)
    first[k] = last[k] = combine(first[k], last[k]);
}

template <typename T>
static void reduceAllTyped(ReduceOp op, ArrayRef<void *> buffers, size_t count) {
  if (buffers.size() < 2)
    return;
  T *first = static_cast<T *>(buffers.front()), *last = static_cast<T *>(buffers.back());
  ArrayRef<void *> middle = buffers.drop_front().drop_back();
  for (void *buffer : middle)
    accumulateTyped(op, first, static_cast<const T *>(buffer), count);
  if (op == ReduceOp::Sum)
    combineIntoBoth(first, last, count, [](T a, T b) { return a + b; });
  else
    combineIntoBoth(first, last, count, maxOf<T>);
  for (void *buffer : middle)
    std::memcpy(buffer, first, count * sizeof(T));
}

[[noreturn]] static void refuseHalf(ElementType type) {
  throw CommError("a host communicator cannot reduce " + spelling(type).str() +
                  " buffers; half-precision buffers live on a GPU and are reduced by the CUDA "
                  "communicators");
}

void accumulate(ReduceOp op, ElementType type, void *accumulator, const void *input, size_t count) {
  switch (type) {
  case ElementType::F32:
    return accumulateTyped(op, static_cast<float *>(accumulator), static_cast<const float *>(input),
                           count);
  case ElementType::F64:
    return accumulateTyped(op, static_cast<double *>(accumulator),
                           static_cast<const double *>(input), count);
  case ElementType::BF16:
  case ElementType::F16:
    refuseHalf(type);
  }
}

void reduceAll(ReduceOp op, ElementType type, ArrayRef<void *> buffers, size_t count) {
  switch (type) {
  case ElementType::F32:
    return reduceAllTyped<float>(op, buffers, count);
  case ElementType::F64:
    return reduceAllTyped<double>(op, buffers, count);
  case ElementType::BF16:
  case ElementType::F16:
    refuseHalf(type);
  }
}

std::string formatGroup(ArrayRef<int64_t> group) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << '[';
  llvm::interleaveComma(group, os);
  os << ']';
  return os.str();
}

Communicator::~Communicator() = default;

std::string Communicator::describe(StringRef op, Group group) const {
  std::string over = group.empty() ? "all ranks" : "group " + formatGroup(group);
  return (op + " over " + over + " on rank " + llvm::Twine(rank())).str();
}

std::string Communicator::describe(ArrayRef<Transfer> transfers) const {
  std::string text;
  for (const Transfer &transfer : transfers)
    text += (text.empty() ? "" : " and ") +
            std::string(transfer.kind == Transfer::Kind::Send ? "send to" : "recv from") +
            " rank " + std::to_string(transfer.peer) + " with tag " + std::to_string(transfer.tag);
  return text + " on rank " + std::to_string(rank());
}

void Communicator::copyLocal(void *destination, const void *source, size_t bytes) {
  std::memmove(destination, source, bytes);
}

GroupCall Communicator::locate(Group group, StringRef op) {
  checkNotFailed([&] { return describe(op, group); });
  auto invalid = [&](const llvm::Twine &why) { fail(describe(op, group) + ": " + why.str()); };
  if (group.empty())
    invalid("the group is empty; pass the plan's rank list of the group");
  std::optional<size_t> position;
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i] < 0 || group[i] >= world())
      invalid("rank " + llvm::Twine(group[i]) + " is outside the world of " + llvm::Twine(world()) +
              " ranks");
    for (size_t j = 0; j < i; ++j)
      if (group[j] == group[i])
        invalid("rank " + llvm::Twine(group[i]) + " appears twice");
    if (group[i] == rank())
      position = i;
  }
  if (!position)
    invalid("this rank is not a member; only members may call a group's collectives");
  return {group, *position};
}

void Communicator::allReduce(Group group, ReduceOp op, ElementType type, void *data, size_t count) {
  GroupCall call = locate(group, "all_reduce");
  if (group.size() > 1)
    allReduceImpl(call, op, type, data, count);
}

void Communicator::reduceScatter(Group group, ReduceOp op, ElementType type, const void *input,
                                 void *output, size_t countPerMember) {
  GroupCall call = locate(group, "reduce_scatter");
  if (group.size() > 1)
    return reduceScatterImpl(call, op, type, input, output, countPerMember);
  if (countPerMember)
    copyLocal(output, input, countPerMember * sizeOf(type));
}

void Communicator::allGather(Group group, ElementType type, const void *input, void *output,
                             size_t countPerMember) {
  GroupCall call = locate(group, "all_gather");
  if (group.size() > 1)
    return allGatherImpl(call, type, input, output, countPerMember);
  if (countPerMember)
    copyLocal(output, input, countPerMember * sizeOf(type));
}

void Communicator::allToAll(Group group, ElementType type, const void *input,
                            ArrayRef<size_t> sendCounts, void *output,
                            ArrayRef<size_t> recvCounts) {
  GroupCall call = locate(group, "all_to_all");
  if (sendCounts.size() != group.size() || recvCounts.size() != group.size())
    fail(describe("all_to_all", group) + ": " + std::to_string(sendCounts.size()) + " send and " +
         std::to_string(recvCounts.size()) + " receive counts for a group of " +
         std::to_string(group.size()));
  if (group.size() > 1)
    return allToAllImpl(call, type, input, sendCounts, output, recvCounts);
  if (sendCounts[0] != recvCounts[0])
    fail(describe("all_to_all", group) + ": sends itself " + std::to_string(sendCounts[0]) +
         " elements but expects " + std::to_string(recvCounts[0]));
  if (sendCounts[0])
    copyLocal(output, input, sendCounts[0] * sizeOf(type));
}

void Communicator::exchange(ArrayRef<Transfer> transfers) {
  checkNotFailed([&] { return describe(transfers); });
  for (const Transfer &transfer : transfers) {
    if (transfer.peer < 0 || transfer.peer >= world())
      fail(describe(transfer) + ": the peer is outside the world of " + std::to_string(world()) +
           " ranks");
    if (transfer.tag < 0)
      fail(describe(transfer) + ": the tag is negative; tags must be >= 0");
  }
  if (!transfers.empty())
    exchangeImpl(transfers);
}

void Communicator::barrier(Group group) {
  GroupCall call = locate(group, "barrier");
  if (group.size() > 1)
    barrierImpl(call);
}

std::vector<std::string> Communicator::agree(StringRef mine) {
  checkNotFailed([&] { return describe("agree", {}); });
  if (world() == 1)
    return {mine.str()};
  return agreeImpl(mine);
}

} // namespace parc::runtime
