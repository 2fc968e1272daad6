//===- LocalCommunicator.cpp - Ranks as threads or fibers of one process --===//
//
// All ranks share one State (LocalWorldState.h) under one mutex; they are threads, or fibers
// (Fibers.h) when there are more of them than threads to run them. A collective meets in a slot
// keyed by its group and the group's sequence number on the caller; the last member to arrive
// folds it in list order, so every member reads the same bytes. An all_reduce, a reduce_scatter
// and an all_gather read the members' inputs and write their outputs where they lie (the members
// wait in the call until it is done); the others fold copied inputs, whose result each member
// then copies out. Sends copy into a mailbox and return; receives wait on their
// mailbox. The first failure (a timeout, an abort, a rank whose body threw) is recorded in the
// State and every wait checks for it, so no rank waits on one that will never come.
//
//===----------------------------------------------------------------------===//

#include "BriefLock.h"
#include "LocalWorldState.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <optional>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

using llvm::ArrayRef;
using llvm::StringRef;

namespace parc::runtime {

using namespace local;

namespace {

class LocalCommunicator final : public Communicator {
public:
  LocalCommunicator(LocalWorld::State &state, int64_t rank, CommOptions options)
      : Communicator(options), state(state), myRank(rank) {}

  int64_t rank() const override { return myRank; }
  int64_t world() const override { return state.world; }

  [[noreturn]] void abort(StringRef message) override {
    fail(("rank " + llvm::Twine(myRank) + " aborted: " + message).str());
  }

  std::string jobFailure() const override {
    Lock lock = comm::lockedBriefly(state.mutex);
    return state.failure;
  }

private:
  using Lock = std::unique_lock<std::mutex>;

  [[noreturn]] void fail(const std::string &message) override {
    Lock lock = comm::lockedBriefly(state.mutex);
    failLocked(message);
  }
  [[noreturn]] void failLocked(const std::string &message) {
    state.recordFailure(message);
    throw CommError(message);
  }
  void checkNotFailed(llvm::function_ref<std::string()> what) override {
    if (!state.failed.load(std::memory_order_acquire))
      return;
    Lock lock = comm::lockedBriefly(state.mutex);
    checkNotFailedLocked(what);
  }
  /// `what` names the call in an error; it is built only then, not on every call.
  void checkNotFailedLocked(llvm::function_ref<std::string()> what) {
    if (!state.failure.empty())
      throw CommError(what() + " gave up because the job failed: " + state.failure);
  }

  /// Waits until `ready()`, or throws when the job fails or the deadline passes; `awaited`
  /// names the ranks the caller still needs, and `describe` says so in the timeout message.
  /// The stall is reported by the rank whose wait started it (State::stallRoot), under its own
  /// instruction, whichever rank's deadline passed first.
  template <typename Ready, typename Awaited, typename Describe>
  void wait(Lock &lock, Clock::time_point deadline, llvm::function_ref<std::string()> what,
            Ready ready,
            Awaited awaited, Describe describe,
            std::optional<std::pair<int64_t, int64_t>> receive = std::nullopt) {
    state.blocked[myRank] = {Clock::now(), awaited, receive};
    auto unblock = llvm::make_scope_exit([&] {
      state.blocked.erase(myRank);
      if (state.blamed == myRank)
        state.blamed = -1;
    });
    // A blamed rank that was released meanwhile reports nothing; the finder then looks again.
    constexpr std::chrono::seconds kBlameGrace(1);
    for (Clock::time_point until = deadline;;) {
      state.wake[size_t(myRank)].waitUntil(
          lock, until, [&] { return ready() || !state.failure.empty() || state.blamed == myRank; });
      checkNotFailedLocked(what);
      if (ready())
        return;
      if (state.blamed != myRank) {
        if (Clock::now() < until)
          continue;
        // Every peer has arrived and one of them folds the collective (an all_reduce in this
        // rank's own buffer): that is work, not a stall, and the fold ends or fails the job.
        if (awaited().empty()) {
          until = Clock::now() + kBlameGrace;
          continue;
        }
        int64_t root = state.stallRoot(myRank);
        if (root != myRank) {
          state.blamed = root;
          state.blamedAfterSeconds = timeoutSeconds();
          state.wakeRank(root);
          until = Clock::now() + kBlameGrace;
          continue;
        }
      }
      double after = state.blamed == myRank ? state.blamedAfterSeconds : timeoutSeconds();
      failLocked("timed out after " + formatSeconds(after) + " in " + what() + ", waiting for " +
                 describe(awaited()));
    }
  }

  /// Contributes `input` (or `text`, for agree) to the group's next collective and returns the
  /// completed slot; the caller copies its result out (the in-place kinds have none: the fold
  /// wrote each member's `output`, an all_reduce's being its input) and then calls depart().
  Slot &meet(GroupCall group, const Signature &signature, const void *input, size_t inputBytes,
             StringRef text, std::pair<std::vector<int64_t>, uint64_t> &key,
             ArrayRef<size_t> counts = {}, void *output = nullptr) {
    key.first.assign(group.ranks.begin(), group.ranks.end());
    key.second = nextSequence[key.first]++;
    auto what = [&] {
      return describe(spelling(signature.kind),
                      signature.kind == CollectiveKind::Agree ? Group() : group.ranks);
    };
    Clock::time_point deadline = deadlineAfter(timeoutSeconds());
    // The in-place kinds read and write their members' buffers where they lie: each member is
    // blocked in this call until the fold is complete, so they stay valid. Any other
    // collective's input is copied, as its caller may reuse it before the others have read it.
    bool inPlace = signature.kind == CollectiveKind::AllReduce ||
                   signature.kind == CollectiveKind::ReduceScatter ||
                   signature.kind == CollectiveKind::AllGather;
    const char *bytes = static_cast<const char *>(input);
    std::vector<char> copy;
    if (!inPlace)
      copy.assign(bytes, bytes + inputBytes);
    size_t members = group.ranks.size();

    Lock lock = comm::lockedBriefly(state.mutex);
    checkNotFailedLocked(what);
    auto it = state.slots.find(key);
    if (it == state.slots.end()) {
      if (state.spareSlots.empty()) {
        it = state.slots.try_emplace(key).first;
      } else {
        LocalWorld::State::Slots::node_type node = std::move(state.spareSlots.back());
        state.spareSlots.pop_back();
        node.key() = key;
        it = state.slots.insert(std::move(node)).position;
      }
      it->second.reset(signature, myRank, members);
    }
    Slot &slot = it->second;
    if (!(slot.signature == signature))
      failLocked("mismatched collectives over group " + formatGroup(group.ranks) + ": rank " +
                 std::to_string(slot.firstRank) + " called " + slot.signature.str() + ", rank " +
                 std::to_string(myRank) + " called " + signature.str() + " (collective " +
                 std::to_string(key.second) + " of this group)");
    slot.inputs[group.position] = std::move(copy);
    slot.buffers[group.position] = inPlace ? const_cast<void *>(input) : nullptr;
    slot.outputs[group.position] = output;
    slot.strings[group.position] = text.str();
    slot.counts[group.position].assign(counts.begin(), counts.end());
    slot.present[group.position] = true;
    if (++slot.arrivals < members) {
      // A member that leaves on the job's failure while the fold still runs in its buffer
      // (an all_reduce) waits for the fold first, so that the buffer outlives it; outside
      // the handler, as a fiber must not wait inside one (Fibers.h).
      std::exception_ptr failed;
      try {
        waitForFold(lock, deadline, what, slot, group, members);
      } catch (...) {
        failed = std::current_exception();
      }
      if (failed) {
        state.wake[size_t(myRank)].wait(lock, [&] { return !slot.folding; });
        std::rethrow_exception(failed);
      }
      return slot;
    }
    // Every member has arrived and none touches the slot until it is complete, so the fold
    // can run without the lock; std::map keeps the slot in place while others insert.
    slot.folding = true;
    lock.unlock();
    auto endFold = llvm::make_scope_exit([&] {
      if (!lock.owns_lock())
        comm::lockBriefly(lock);
      slot.folding = false;
      for (int64_t member : group.ranks)
        state.wakeRank(member);
    });
    try {
      fold(slot, group);
    } catch (const CommError &error) {
      // The others wait for this fold without a deadline (it is work, not a stall).
      comm::lockBriefly(lock);
      failLocked(describe(spelling(signature.kind), group.ranks) + ": " + error.what());
    }
    comm::lockBriefly(lock);
    slot.complete = true;
    return slot;
  }

  /// The wait of a member that did not arrive last: until the slot is complete.
  void waitForFold(Lock &lock, Clock::time_point deadline, llvm::function_ref<std::string()> what,
                   Slot &slot,
                   GroupCall group, size_t members) {
    wait(
        lock, deadline, what, [&] { return slot.complete; },
        [&] {
          std::vector<int64_t> missing;
          for (size_t i = 0; i < members; ++i)
            if (!slot.present[i])
              missing.push_back(group.ranks[i]);
          return missing;
        },
        [](const std::vector<int64_t> &missing) {
          std::string text = missing.size() == 1 ? "rank " : "ranks ";
          llvm::raw_string_ostream os(text);
          llvm::interleaveComma(missing, os);
          return os.str();
        });
  }

  void depart(const std::pair<std::vector<int64_t>, uint64_t> &key, size_t members) {
    Lock lock = comm::lockedBriefly(state.mutex);
    auto it = state.slots.find(key);
    if (++it->second.departures < members)
      return;
    LocalWorld::State::Slots::node_type node = state.slots.extract(it);
    if (state.spareSlots.size() < LocalWorld::State::kSpareSlots &&
        node.mapped().heldBytes() <= LocalWorld::State::kSpareSlotBytes)
      state.spareSlots.push_back(std::move(node));
  }

  /// The in-place kinds read and write the members' buffers where they lie, so no two may
  /// overlap, except that a reduce_scatter's or all_gather's member may pass its own part of
  /// one buffer as the other (Communicator.h). An all_reduce's buffers are each `part` bytes;
  /// of a reduce_scatter's or all_gather's two, the larger is the members' parts together.
  static void checkBuffersApart(const Slot &slot, GroupCall group, size_t part) {
    struct Region {
      const char *begin;
      size_t bytes;
      size_t member;
    };
    CollectiveKind kind = slot.signature.kind;
    size_t members = group.ranks.size();
    llvm::SmallVector<Region, 16> regions;
    for (size_t m = 0; m < members; ++m) {
      auto *in = static_cast<const char *>(slot.buffers[m]);
      if (kind == CollectiveKind::AllReduce) {
        regions.push_back({in, part, m});
        continue;
      }
      auto *out = static_cast<const char *>(slot.outputs[m]);
      bool gathers = kind == CollectiveKind::AllGather;
      const char *large = gathers ? out : in, *small = gathers ? in : out;
      regions.push_back({large, part * members, m});
      if (small != large + m * part)
        regions.push_back({small, part, m});
    }
    for (size_t i = 0; i < regions.size(); ++i)
      for (size_t j = i + 1; j < regions.size(); ++j) {
        const Region &a = regions[i], &b = regions[j];
        if (a.begin < b.begin + b.bytes && b.begin < a.begin + a.bytes)
          throw CommError(a.member == b.member
                              ? "rank " + std::to_string(group.ranks[a.member]) +
                                    " passed an input and output that overlap other than at "
                                    "its own part"
                              : "ranks " + std::to_string(group.ranks[a.member]) + " and " +
                                    std::to_string(group.ranks[b.member]) +
                                    " passed overlapping buffers");
      }
  }

  /// Member m's output: part m of every input, combined in member order (the same bits on
  /// every member), a block at a time through a buffer, so that an output that is its own
  /// part of its input is read before it is written.
  static void reduceScatterInPlace(const Slot &slot, size_t members) {
    const Signature &signature = slot.signature;
    size_t size = sizeOf(signature.type);
    constexpr size_t kBlockBytes = 4096;
    alignas(64) char block[kBlockBytes];
    size_t perBlock = kBlockBytes / size;
    for (size_t m = 0; m < members; ++m)
      for (size_t at = 0; at < signature.count; at += perBlock) {
        size_t count = std::min(perBlock, signature.count - at);
        size_t offset = (m * signature.count + at) * size;
        std::memcpy(block, static_cast<const char *>(slot.buffers[0]) + offset, count * size);
        for (size_t i = 1; i < members; ++i)
          accumulate(signature.op, signature.type, block,
                     static_cast<const char *>(slot.buffers[i]) + offset, count);
        std::memcpy(static_cast<char *>(slot.outputs[m]) + at * size, block, count * size);
      }
  }

  static void fold(Slot &slot, GroupCall group) {
    const Signature &signature = slot.signature;
    size_t members = group.ranks.size();
    size_t part = signature.count * sizeOf(signature.type);
    switch (signature.kind) {
    case CollectiveKind::AllReduce: {
      if (part == 0)
        return;
      checkBuffersApart(slot, group, part);
      // Added in member order: the same bits on every member.
      reduceAll(signature.op, signature.type, slot.buffers, signature.count);
      return;
    }
    case CollectiveKind::ReduceScatter:
      if (part == 0)
        return;
      checkBuffersApart(slot, group, part);
      reduceScatterInPlace(slot, members);
      return;
    case CollectiveKind::AllGather:
      if (part == 0)
        return;
      checkBuffersApart(slot, group, part);
      for (size_t m = 0; m < members; ++m)
        for (size_t i = 0; i < members; ++i) {
          char *to = static_cast<char *>(slot.outputs[m]) + i * part;
          if (to != slot.buffers[i])
            std::memcpy(to, slot.buffers[i], part);
        }
      return;
    case CollectiveKind::AllToAll: // each member reads its parts out of the inputs
    case CollectiveKind::Barrier:
    case CollectiveKind::Agree:
      return;
    }
  }

  void allReduceImpl(GroupCall group, ReduceOp op, ElementType type, void *data,
                     size_t count) override {
    size_t bytes = count * sizeOf(type);
    std::pair<std::vector<int64_t>, uint64_t> key;
    meet(group, {CollectiveKind::AllReduce, op, type, count}, data, bytes, "", key);
    depart(key, group.ranks.size());
  }

  void reduceScatterImpl(GroupCall group, ReduceOp op, ElementType type, const void *input,
                         void *output, size_t countPerMember) override {
    size_t partBytes = countPerMember * sizeOf(type);
    std::pair<std::vector<int64_t>, uint64_t> key;
    meet(group, {CollectiveKind::ReduceScatter, op, type, countPerMember}, input,
         partBytes * group.ranks.size(), "", key, {}, output);
    depart(key, group.ranks.size());
  }

  void allGatherImpl(GroupCall group, ElementType type, const void *input, void *output,
                     size_t countPerMember) override {
    size_t partBytes = countPerMember * sizeOf(type);
    std::pair<std::vector<int64_t>, uint64_t> key;
    meet(group, {CollectiveKind::AllGather, ReduceOp::Sum, type, countPerMember}, input,
         partBytes, "", key, {}, output);
    depart(key, group.ranks.size());
  }

  void allToAllImpl(GroupCall group, ElementType type, const void *input,
                    ArrayRef<size_t> sendCounts, void *output,
                    ArrayRef<size_t> recvCounts) override {
    size_t size = sizeOf(type), members = group.ranks.size(), total = 0;
    for (size_t count : sendCounts)
      total += count;
    std::pair<std::vector<int64_t>, uint64_t> key;
    Slot &slot = meet(group, {CollectiveKind::AllToAll, ReduceOp::Sum, type, 0}, input,
                      total * size, "", key, sendCounts);
    std::string problem;
    char *out = static_cast<char *>(output);
    for (size_t i = 0; i < members && problem.empty(); ++i) {
      const std::vector<size_t> &theirs = slot.counts[i];
      size_t offset = 0;
      for (size_t j = 0; j < group.position; ++j)
        offset += theirs[j];
      if (theirs[group.position] != recvCounts[i]) {
        problem = describe("all_to_all", group.ranks) + ": rank " +
                  std::to_string(group.ranks[i]) + " sends " +
                  std::to_string(theirs[group.position]) + " elements but " +
                  std::to_string(recvCounts[i]) + " were expected";
        break;
      }
      if (recvCounts[i])
        std::memcpy(out, slot.inputs[i].data() + offset * size, recvCounts[i] * size);
      out += recvCounts[i] * size;
    }
    depart(key, members);
    if (!problem.empty())
      fail(problem);
  }

  void barrierImpl(GroupCall group) override {
    std::pair<std::vector<int64_t>, uint64_t> key;
    meet(group, {CollectiveKind::Barrier}, nullptr, 0, "", key);
    depart(key, group.ranks.size());
  }

  std::vector<std::string> agreeImpl(StringRef mine) override {
    std::vector<int64_t> everyone(state.world);
    for (int64_t rank = 0; rank < state.world; ++rank)
      everyone[rank] = rank;
    std::pair<std::vector<int64_t>, uint64_t> key;
    Slot &slot = meet({everyone, static_cast<size_t>(myRank)}, {CollectiveKind::Agree}, nullptr, 0,
                      mine, key);
    std::vector<std::string> all = slot.strings;
    depart(key, everyone.size());
    return all;
  }

  void exchangeImpl(ArrayRef<Transfer> transfers) override {
    Clock::time_point deadline = deadlineAfter(timeoutSeconds());
    std::vector<Message> outgoing;
    for (const Transfer &transfer : transfers) {
      if (transfer.kind != Transfer::Kind::Send)
        continue;
      const char *bytes = static_cast<const char *>(transfer.data);
      std::vector<char> copy;
      if (!spareBytes.empty()) {
        copy = std::move(spareBytes.back());
        spareBytes.pop_back();
      }
      copy.assign(bytes, bytes + transfer.count * sizeOf(transfer.type));
      outgoing.push_back({transfer.type, transfer.count, std::move(copy)});
    }
    Lock lock = comm::lockedBriefly(state.mutex);
    if (!state.failure.empty())
      checkNotFailedLocked([&] { return describe(transfers); });
    size_t next = 0;
    for (const Transfer &transfer : transfers)
      if (transfer.kind == Transfer::Kind::Send)
        state.mailboxes[{myRank, transfer.peer, transfer.tag}].push_back(
            std::move(outgoing[next++]));
    for (const Transfer &transfer : transfers)
      if (transfer.kind == Transfer::Kind::Send)
        state.wakeRank(transfer.peer);

    for (const Transfer &transfer : transfers) {
      if (transfer.kind != Transfer::Kind::Recv)
        continue;
      auto what = [&] { return describe(transfer); };
      std::tuple<int64_t, int64_t, int64_t> box{transfer.peer, myRank, transfer.tag};
      wait(
          lock, deadline, what,
          [&] {
            auto it = state.mailboxes.find(box);
            return it != state.mailboxes.end() && !it->second.empty();
          },
          [&] { return std::vector<int64_t>{transfer.peer}; },
          [&](const std::vector<int64_t> &) {
            return "the matching send of rank " + std::to_string(transfer.peer);
          },
          std::make_pair(transfer.peer, transfer.tag));
      auto it = state.mailboxes.find(box);
      Message message = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty())
        state.mailboxes.erase(it);
      if (message.type != transfer.type || message.count != transfer.count)
        failLocked(what() + ": rank " + std::to_string(transfer.peer) + " sent " +
                   std::to_string(message.count) + " x " + spelling(message.type).str() + " but " +
                   std::to_string(transfer.count) + " x " + spelling(transfer.type).str() +
                   " were expected");
      lock.unlock();
      if (!message.bytes.empty())
        std::memcpy(transfer.data, message.bytes.data(), message.bytes.size());
      if (spareBytes.size() < kSpareMessages)
        spareBytes.push_back(std::move(message.bytes));
      comm::lockBriefly(lock);
    }
  }

  LocalWorld::State &state;
  int64_t myRank;
  /// Touched only by this rank's thread.
  std::map<std::vector<int64_t>, uint64_t> nextSequence;
  /// Received messages' buffers, refilled by this rank's next sends so that a step's
  /// transfers allocate nothing (a pipeline stage receives about as many as it sends, of
  /// the same sizes); at most kSpareMessages, so a rank that only receives holds few.
  static constexpr size_t kSpareMessages = 8;
  std::vector<std::vector<char>> spareBytes;
};

} // namespace

LocalWorld::LocalWorld(int64_t world, CommOptions options, int64_t fiberThreads)
    : state(std::make_unique<State>(world)), fiberThreads(fiberThreads) {
  if (world < 1)
    throw CommError("a local world needs at least one rank, not " + std::to_string(world));
  for (int64_t rank = 0; rank < world; ++rank)
    state->communicators.push_back(std::make_unique<LocalCommunicator>(*state, rank, options));
}

LocalWorld::~LocalWorld() = default;

int64_t LocalWorld::world() const { return state->world; }

Communicator &LocalWorld::communicator(int64_t rank) { return *state->communicators.at(rank); }

std::string LocalWorld::failure() const {
  std::lock_guard<std::mutex> lock(state->mutex);
  return state->failure;
}

std::vector<std::string> LocalWorld::run(const std::function<void(Communicator &)> &body) {
  std::vector<std::string> errors(state->world);
  auto runRank = [&](int64_t rank) {
    auto failed = [&](const std::string &message) {
      errors[rank] = message;
      std::lock_guard<std::mutex> lock(state->mutex);
      state->recordFailure("rank " + std::to_string(rank) + " failed: " + message);
    };
    try {
      body(*state->communicators[rank]);
    } catch (const std::exception &error) {
      failed(error.what());
    } catch (...) {
      failed("an exception that is not a std::exception");
    }
  };
  if (fiberThreads > 0 && fiberThreads < state->world) {
    std::vector<std::function<void()>> ranks;
    for (int64_t rank = 0; rank < state->world; ++rank)
      ranks.push_back([&runRank, rank] { runRank(rank); });
    comm::runFibers(ranks, fiberThreads);
    return errors;
  }
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < state->world; ++rank)
    threads.emplace_back(runRank, rank);
  for (std::thread &thread : threads)
    thread.join();
  return errors;
}

} // namespace parc::runtime
