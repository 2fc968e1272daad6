//===- LocalWorldState.h - What the ranks of a local world share ----------===//
//
// Private to LocalCommunicator.cpp: the collectives' slots, the mailboxes, the ranks' waits
// and the failure, all under State's one mutex, and the stall finder that names whose wait a
// stall started with.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_COMM_LOCALWORLDSTATE_H
#define PARC_RUNTIME_COMM_LOCALWORLDSTATE_H

#include "Deadline.h"
#include "Fibers.h"
#include "parc/Runtime/Communicator.h"

#include "llvm/ADT/STLExtras.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace parc::runtime {

namespace local {

using comm::Clock;
using comm::deadlineAfter;
using comm::formatSeconds;

enum class CollectiveKind { AllReduce, ReduceScatter, AllGather, AllToAll, Barrier, Agree };

inline llvm::StringRef spelling(CollectiveKind kind) {
  switch (kind) {
  case CollectiveKind::AllReduce:
    return "all_reduce";
  case CollectiveKind::ReduceScatter:
    return "reduce_scatter";
  case CollectiveKind::AllGather:
    return "all_gather";
  case CollectiveKind::AllToAll:
    return "all_to_all";
  case CollectiveKind::Barrier:
    return "barrier";
  case CollectiveKind::Agree:
    return "agree";
  }
  return "?";
}

/// What every member of one collective must agree on.
struct Signature {
  CollectiveKind kind;
  ReduceOp op = ReduceOp::Sum;
  ElementType type = ElementType::F64;
  size_t count = 0; // per member for reduce_scatter and all_gather

  bool operator==(const Signature &other) const {
    return std::tie(kind, op, type, count) ==
           std::tie(other.kind, other.op, other.type, other.count);
  }
  std::string str() const {
    std::string text = spelling(kind).str();
    if (kind == CollectiveKind::AllReduce || kind == CollectiveKind::ReduceScatter)
      text += " (" + spelling(op).str() + ")";
    if (kind == CollectiveKind::AllToAll)
      text += " of " + spelling(type).str();
    else if (kind != CollectiveKind::Barrier && kind != CollectiveKind::Agree)
      text += " of " + std::to_string(count) + " x " + spelling(type).str();
    return text;
  }
};

struct Slot {
  Signature signature;
  int64_t firstRank = -1;
  std::vector<std::vector<char>> inputs;   // all_to_all: copied, by position
  std::vector<void *> buffers;             // the in-place kinds: each member's input (an
                                           // all_reduce's is its output too)
  std::vector<void *> outputs;             // reduce_scatter, all_gather: each member's
  std::vector<std::string> strings;        // agree, by position
  std::vector<std::vector<size_t>> counts; // all_to_all: each member's send counts
  std::vector<bool> present;
  size_t arrivals = 0, departures = 0;
  bool folding = false, complete = false;

  /// Empties the slot for a collective of `members` that `signature` names, keeping what its
  /// vectors hold allocated, so that a reused slot allocates nothing.
  void reset(const Signature &called, int64_t first, size_t members) {
    signature = called;
    firstRank = first;
    auto clearEach = [members](auto &byPosition) {
      byPosition.resize(members);
      for (auto &entry : byPosition)
        entry.clear();
    };
    clearEach(inputs);
    clearEach(strings);
    clearEach(counts);
    buffers.assign(members, nullptr);
    outputs.assign(members, nullptr);
    present.assign(members, false);
    arrivals = departures = 0;
    folding = complete = false;
  }
  /// The bytes its copied inputs keep allocated.
  size_t heldBytes() const {
    size_t bytes = 0;
    for (const std::vector<char> &input : inputs)
      bytes += input.capacity();
    return bytes;
  }
};

struct Message {
  ElementType type;
  size_t count;
  std::vector<char> bytes;
};

/// Where a rank sleeps until a change may release it: on a condition variable when the ranks
/// are threads, off its thread when they are fibers. Waits and wakes hold State's mutex.
class RankWake {
public:
  template <typename Ready>
  bool waitUntil(std::unique_lock<std::mutex> &lock, Clock::time_point until, Ready ready) {
    fiber = comm::currentFiber();
    if (!fiber)
      return variable.wait_until(lock, until, ready);
    while (!ready()) {
      if (Clock::now() >= until)
        return false;
      comm::park(lock, until);
    }
    return true;
  }
  template <typename Ready> void wait(std::unique_lock<std::mutex> &lock, Ready ready) {
    fiber = comm::currentFiber();
    if (!fiber)
      return variable.wait(lock, ready);
    while (!ready())
      comm::park(lock, Clock::time_point::max());
  }
  void notify() {
    if (fiber)
      comm::wakeFiber(fiber);
    else
      variable.notify_one();
  }

private:
  std::condition_variable variable;
  comm::Fiber *fiber = nullptr;
};

} // namespace local

struct LocalWorld::State {
  using Clock = comm::Clock;
  using Message = local::Message;
  using Slot = local::Slot;

  State(int64_t world) : world(world), wake(size_t(world)) {}

  /// Records the first failure and wakes every waiting rank. The caller holds the mutex.
  void recordFailure(const std::string &message) {
    if (failure.empty())
      failure = message;
    failed.store(true, std::memory_order_release);
    wakeEveryone();
  }

  /// Each rank sleeps on its own condition variable, and a change wakes only the ranks it may
  /// release: with one variable for all, eight rank threads on two cores spent the step
  /// waking each other for nothing (tiny.par at tp 2 pp 2 dp 2 runs ~300 collectives a step).
  void wakeRank(int64_t rank) { wake[size_t(rank)].notify(); }
  void wakeEveryone() {
    for (local::RankWake &rank : wake)
      rank.notify();
  }

  /// Whose wait a stall started with. Following each blocked rank to a blocked rank it awaits
  /// ends either at a rank that awaits only running ones, which is stuck on its own, or in a
  /// cycle of waits, where the rank that blocked first was not made to wait by the others'
  /// blocking (they were running when it blocked). Deadlines alone would name whichever
  /// victim's thread the scheduler woke first.
  int64_t stallRoot(int64_t from) const {
    auto blockedEarlier = [&](int64_t a, int64_t b) {
      return blocked.at(a).since < blocked.at(b).since;
    };
    std::vector<int64_t> path;
    std::map<int64_t, size_t> position;
    for (int64_t rank = from;;) {
      position[rank] = path.size();
      path.push_back(rank);
      int64_t next = -1;
      // A rank whose peers have all arrived waits on a fold, which is running, not stuck.
      for (int64_t peer : blocked.at(rank).awaited())
        if (blocked.count(peer) && !blocked.at(peer).awaited().empty() &&
            (next < 0 || blockedEarlier(peer, next)))
          next = peer;
      if (next < 0)
        return rank;
      auto seen = position.find(next);
      if (seen != position.end()) {
        // In a cycle, a receive whose sender has already sent it a later message was skipped:
        // that is where the stall started, whatever the order the threads blocked in.
        for (auto it = path.begin() + seen->second; it != path.end(); ++it)
          if (senderMovedOn(*it))
            return *it;
        return *std::min_element(path.begin() + seen->second, path.end(), blockedEarlier);
      }
      rank = next;
    }
  }

  /// True when `rank` waits to receive from a peer that has already sent it a message with
  /// another tag: the one it waits for will not come.
  bool senderMovedOn(int64_t rank) const {
    const BlockedWait &wait = blocked.at(rank);
    if (!wait.receive)
      return false;
    auto [peer, tag] = *wait.receive;
    for (auto it = mailboxes.lower_bound(std::make_tuple(peer, rank, int64_t(INT64_MIN)));
         it != mailboxes.end() && std::get<0>(it->first) == peer &&
         std::get<1>(it->first) == rank;
         ++it)
      if (std::get<2>(it->first) != tag && !it->second.empty())
        return true;
    return false;
  }

  /// A rank blocked in a wait: since when, whom it still needs, and for a receive, from whom
  /// and with which tag.
  struct BlockedWait {
    Clock::time_point since;
    llvm::function_ref<std::vector<int64_t>()> awaited;
    std::optional<std::pair<int64_t, int64_t>> receive = std::nullopt;
  };

  int64_t world;
  mutable std::mutex mutex;
  std::vector<local::RankWake> wake; // by rank
  std::string failure;
  /// Set with `failure`, so that a rank checks for one before each call without the mutex.
  std::atomic<bool> failed{false};
  std::map<int64_t, BlockedWait> blocked;
  /// The rank told to report its wait as the job's timeout, for a stall that another rank's
  /// deadline found, and that rank's timeout.
  int64_t blamed = -1;
  double blamedAfterSeconds = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::deque<Message>> mailboxes;
  using Slots = std::map<std::pair<std::vector<int64_t>, uint64_t>, Slot>;
  Slots slots;
  /// Slots whose collective every member has left, kept as map nodes for the next ones: a
  /// step meets some 300 times (tiny.par at tp 2 pp 2 dp 2), each a node and six vectors.
  std::vector<Slots::node_type> spareSlots;
  static constexpr size_t kSpareSlots = 16;
  /// A slot that held more (an all_to_all's copied tokens) is freed, not kept for the next.
  static constexpr size_t kSpareSlotBytes = size_t(1) << 20;
  std::vector<std::unique_ptr<Communicator>> communicators;
};

} // namespace parc::runtime

#endif
