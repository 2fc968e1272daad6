//===- MPICommunicator.cpp - The ranks of an MPI job ----------------------===//
//
// Every group gets its own communicator, created on first use with MPI_Comm_create_group so
// that only its members take part, ordered as the plan lists it (position = rank in it), and
// cached. MPI_Allreduce and friends are not used: the standard leaves their summation order
// open, so the reductions are built from data movement and a local fold in list order.
//
// Cost per call on a group of g members and n elements:
//  * all_reduce: an MPI_Ialltoallv sends every member part i of every buffer, member i folds
//    part i in list order, an MPI_Iallgatherv shares the parts. Each rank sends and receives
//    2 (g - 1) n / g elements, as a ring all-reduce does, but in g - 1 messages per phase
//    rather than pipelined chunks, and holds an n-element scratch buffer.
//  * reduce_scatter: one MPI_Ialltoall and the fold, (g - 1) n / g elements each way.
//  * all_gather: MPI_Iallgather; barrier: MPI_Ibarrier; agree: two MPI_Iallgather(v).
//  * all_to_all: an MPI_Ialltoall of the counts, which every receiver checks against its
//    own, then MPI_Ialltoallv of the data.
//  * send/recv: MPI_Isend/MPI_Irecv on a duplicate of MPI_COMM_WORLD.
// Each call posts non-blocking operations and polls them with MPI_Testsome until its deadline,
// so a call that waits on a rank that never comes throws a CommError naming what it waited
// for. Creating a communicator has no non-blocking form; a watchdog thread aborts the job
// when that takes longer than the timeout. A rank that dies takes the job down through the
// launcher and the default error handler (MPI_ERRORS_ARE_FATAL), and the deadline covers a
// rank that is left waiting for it.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Communicator.h"
#include "Deadline.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

using llvm::ArrayRef;
using llvm::StringRef;

namespace parc::runtime {

namespace {

using comm::Clock;
using comm::deadlineAfter;
using comm::formatSeconds;



/// Half types only move as bits here (accumulate() refuses to reduce them on the host).
MPI_Datatype mpiType(ElementType type) {
  switch (type) {
  case ElementType::F32:
    return MPI_FLOAT;
  case ElementType::F64:
    return MPI_DOUBLE;
  case ElementType::BF16:
  case ElementType::F16:
    return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

[[noreturn]] void abortJob(const std::string &message, bool mayCallMPI) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::fflush(stderr);
  if (mayCallMPI)
    MPI_Abort(MPI_COMM_WORLD, 1);
  // Without MPI (or should MPI_Abort return), a rank that exits without finalising still
  // makes the launcher end the job.
  std::_Exit(1);
}

/// Aborts the job when a blocking MPI call outlives its deadline.
class Watchdog {
public:
  explicit Watchdog(bool mayCallMPI) : mayCallMPI(mayCallMPI), thread([this] { loop(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    changed.notify_all();
    thread.join();
  }

  void arm(std::string what, double seconds) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      armed = true;
      deadline = deadlineAfter(seconds);
      message = "timed out after " + formatSeconds(seconds) + " in " + what + "; aborting the job";
    }
    changed.notify_all();
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mutex);
    armed = false;
  }

private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex);
    while (!stopping) {
      if (!armed) {
        changed.wait(lock, [&] { return armed || stopping; });
        continue;
      }
      if (!changed.wait_until(lock, deadline, [&] { return !armed || stopping; }))
        abortJob(message, mayCallMPI);
    }
  }

  // The thread level the program got: calling MPI_Abort from here needs MPI_THREAD_MULTIPLE.
  bool mayCallMPI;
  std::mutex mutex;
  std::condition_variable changed;
  bool stopping = false, armed = false;
  Clock::time_point deadline;
  std::string message;
  std::thread thread;
};

/// Parts of `count` elements over `members`: the first `count % members` one element longer.
struct Parts {
  Parts(size_t count, size_t members) : base(count / members), extra(count % members) {}
  size_t size(size_t i) const { return base + (i < extra ? 1 : 0); }
  size_t offset(size_t i) const { return i * base + std::min(i, extra); }
  size_t base, extra;
};

} // namespace

struct MPICommunicator::Impl {
  /// Throws CommError and remembers it: the destructor must abort rather than finalise.
  [[noreturn]] void fail(const std::string &message) {
    if (failure.empty())
      failure = message;
    throw CommError(message);
  }

  std::string where() const { return "rank " + std::to_string(rank); }

  int toMPICount(size_t count, const std::string &what) {
    if (count > static_cast<size_t>(INT_MAX))
      fail(what + ": " + std::to_string(count) + " elements exceed MPI's limit of " +
           std::to_string(INT_MAX) + " per call; split the buffer");
    return static_cast<int>(count);
  }

  /// Polls until every request completed; `describe(pending)` says what the requests at
  /// those indices wait for.
  void complete(llvm::MutableArrayRef<MPI_Request> requests, Clock::time_point deadline,
                double timeoutSeconds, llvm::function_ref<std::string(ArrayRef<size_t>)> describe,
                std::vector<MPI_Status> *statuses = nullptr) {
    std::vector<int> indices(requests.size());
    std::vector<MPI_Status> done(requests.size());
    if (statuses)
      statuses->resize(requests.size());
    Clock::time_point start = Clock::now();
    while (true) {
      int completed = 0;
      MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &completed, indices.data(),
                   done.data());
      if (completed == MPI_UNDEFINED)
        return; // every request is MPI_REQUEST_NULL
      if (statuses)
        for (int k = 0; k < completed; ++k)
          (*statuses)[indices[k]] = done[k];
      if (completed > 0)
        continue;
      Clock::time_point now = Clock::now();
      if (now >= deadline) {
        std::vector<size_t> pending;
        for (size_t i = 0; i < requests.size(); ++i)
          if (requests[i] != MPI_REQUEST_NULL)
            pending.push_back(i);
        fail("timed out after " + formatSeconds(timeoutSeconds) + " in " + describe(pending));
      }
      // MPI makes progress only inside its calls, so poll often at first; then sleep, so that
      // ranks sharing a core (oversubscribed jobs) leave it to the rank they wait for.
      if (now - start < std::chrono::milliseconds(2))
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  MPI_Comm groupCommunicator(ArrayRef<int64_t> group, double timeoutSeconds) {
    std::vector<int64_t> key(group.begin(), group.end());
    auto it = groups.find(key);
    if (it != groups.end())
      return it->second;
    MPI_Group all, members;
    MPI_Comm_group(traffic, &all);
    std::vector<int> ranks(group.begin(), group.end());
    MPI_Group_incl(all, static_cast<int>(ranks.size()), ranks.data(), &members);
    watchdog->arm("creating the communicator of group " + formatGroup(group) + " on " + where(),
                  timeoutSeconds);
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_create_group(traffic, members, /*tag=*/0, &comm);
    watchdog->disarm();
    MPI_Group_free(&members);
    MPI_Group_free(&all);
    groups.emplace(std::move(key), comm);
    return comm;
  }

  bool initialisedHere = false;
  bool threadMultiple = false;
  int rank = 0, world = 1;
  int64_t tagUpperBound = 32767; // the least the standard allows
  MPI_Comm traffic = MPI_COMM_NULL;
  std::map<std::vector<int64_t>, MPI_Comm> groups;
  std::string failure;
  std::unique_ptr<Watchdog> watchdog;
};

MPICommunicator::MPICommunicator(CommOptions options)
    : Communicator(options), impl(std::make_unique<Impl>()) {}

std::unique_ptr<MPICommunicator> MPICommunicator::create(int *argc, char ***argv,
                                                         CommOptions options) {
  std::unique_ptr<MPICommunicator> comm(new MPICommunicator(options));
  Impl &impl = *comm->impl;
  int initialised = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialised);
  if (!initialised) {
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    impl.initialisedHere = true;
  } else {
    MPI_Query_thread(&provided);
  }
  impl.threadMultiple = provided == MPI_THREAD_MULTIPLE;
  MPI_Comm_rank(MPI_COMM_WORLD, &impl.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &impl.world);
  void *upperBound = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &upperBound, &found);
  if (found)
    impl.tagUpperBound = *static_cast<int *>(upperBound);
  impl.watchdog = std::make_unique<Watchdog>(impl.threadMultiple);
  // Our own traffic stays apart from any other MPI use of the program.
  impl.watchdog->arm("duplicating MPI_COMM_WORLD on " + impl.where(), options.timeoutSeconds);
  MPI_Comm_dup(MPI_COMM_WORLD, &impl.traffic);
  impl.watchdog->disarm();
  return comm;
}

MPICommunicator::~MPICommunicator() {
  if (!impl->failure.empty())
    abortJob(impl->failure, true);
  for (auto &entry : impl->groups)
    MPI_Comm_free(&entry.second);
  MPI_Comm_free(&impl->traffic);
  if (impl->initialisedHere) {
    impl->watchdog->arm("finalising MPI on " + impl->where(), timeoutSeconds());
    MPI_Finalize();
    impl->watchdog->disarm();
  }
}

int64_t MPICommunicator::rank() const { return impl->rank; }
int64_t MPICommunicator::world() const { return impl->world; }

void MPICommunicator::abort(StringRef message) {
  abortJob(impl->where() + " aborted: " + message.str(), true);
}

void MPICommunicator::fail(const std::string &message) { impl->fail(message); }

void MPICommunicator::checkNotFailed(llvm::function_ref<std::string()> what) {
  // The caller ignored an earlier CommError instead of aborting; carrying on would use MPI
  // requests that are still pending.
  if (!impl->failure.empty())
    abortJob(what() + " after an earlier failure: " + impl->failure, true);
}

void MPICommunicator::allReduceImpl(GroupCall group, ReduceOp op, ElementType type, void *data,
                                    size_t count) {
  Clock::time_point deadline = deadlineAfter(timeoutSeconds());
  std::string what = describe("all_reduce", group.ranks);
  impl->toMPICount(count, what);
  MPI_Comm comm = impl->groupCommunicator(group.ranks, timeoutSeconds());
  size_t members = group.ranks.size(), elementSize = sizeOf(type);
  Parts parts(count, members);
  size_t mine = parts.size(group.position);
  std::vector<int> sendCounts(members), sendOffsets(members), recvCounts(members),
      recvOffsets(members);
  for (size_t j = 0; j < members; ++j) {
    sendCounts[j] = static_cast<int>(parts.size(j));
    sendOffsets[j] = static_cast<int>(parts.offset(j));
    recvCounts[j] = static_cast<int>(mine);
    recvOffsets[j] = static_cast<int>(j * mine);
  }
  std::vector<char> gathered(members * mine * elementSize);
  MPI_Request request;
  MPI_Ialltoallv(data, sendCounts.data(), sendOffsets.data(), mpiType(type), gathered.data(),
                 recvCounts.data(), recvOffsets.data(), mpiType(type), comm, &request);
  impl->complete(request, deadline, timeoutSeconds(),
                 [&](auto) { return what + " (exchanging parts)"; });

  char *part = static_cast<char *>(data) + parts.offset(group.position) * elementSize;
  if (mine) {
    std::memcpy(part, gathered.data(), mine * elementSize);
    for (size_t j = 1; j < members; ++j)
      accumulate(op, type, part, gathered.data() + j * mine * elementSize, mine);
  }
  MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, sendCounts.data(), sendOffsets.data(),
                  mpiType(type), comm, &request);
  impl->complete(request, deadline, timeoutSeconds(),
                 [&](auto) { return what + " (sharing the sums)"; });
}

void MPICommunicator::reduceScatterImpl(GroupCall group, ReduceOp op, ElementType type,
                                        const void *input, void *output, size_t countPerMember) {
  Clock::time_point deadline = deadlineAfter(timeoutSeconds());
  std::string what = describe("reduce_scatter", group.ranks);
  size_t members = group.ranks.size(), elementSize = sizeOf(type);
  int count = impl->toMPICount(countPerMember * members, what) / members;
  MPI_Comm comm = impl->groupCommunicator(group.ranks, timeoutSeconds());
  std::vector<char> gathered(members * countPerMember * elementSize);
  MPI_Request request;
  MPI_Ialltoall(input, count, mpiType(type), gathered.data(), count, mpiType(type), comm, &request);
  impl->complete(request, deadline, timeoutSeconds(), [&](auto) { return what; });
  if (!countPerMember)
    return;
  std::memcpy(output, gathered.data(), countPerMember * elementSize);
  for (size_t j = 1; j < members; ++j)
    accumulate(op, type, output, gathered.data() + j * countPerMember * elementSize,
               countPerMember);
}

void MPICommunicator::allGatherImpl(GroupCall group, ElementType type, const void *input,
                                    void *output, size_t countPerMember) {
  Clock::time_point deadline = deadlineAfter(timeoutSeconds());
  std::string what = describe("all_gather", group.ranks);
  size_t members = group.ranks.size(), elementSize = sizeOf(type);
  int count = impl->toMPICount(countPerMember * members, what) / members;
  MPI_Comm comm = impl->groupCommunicator(group.ranks, timeoutSeconds());
  // MPI forbids overlapping buffers; a member that already holds its part in place says so.
  const void *send = input;
  if (input == static_cast<char *>(output) + group.position * countPerMember * elementSize)
    send = MPI_IN_PLACE;
  MPI_Request request;
  MPI_Iallgather(send, count, mpiType(type), output, count, mpiType(type), comm, &request);
  impl->complete(request, deadline, timeoutSeconds(), [&](auto) { return what; });
}

void MPICommunicator::allToAllImpl(GroupCall group, ElementType type, const void *input,
                                   ArrayRef<size_t> sendCounts, void *output,
                                   ArrayRef<size_t> recvCounts) {
  Clock::time_point deadline = deadlineAfter(timeoutSeconds());
  std::string what = describe("all_to_all", group.ranks);
  MPI_Comm comm = impl->groupCommunicator(group.ranks, timeoutSeconds());
  size_t members = group.ranks.size();
  std::vector<int> sends(members), sendOffsets(members), recvs(members), recvOffsets(members),
      announced(members);
  size_t sendTotal = 0, recvTotal = 0;
  for (size_t j = 0; j < members; ++j) {
    sends[j] = impl->toMPICount(sendCounts[j], what);
    recvs[j] = impl->toMPICount(recvCounts[j], what);
    sendOffsets[j] = impl->toMPICount(sendTotal, what);
    recvOffsets[j] = impl->toMPICount(recvTotal, what);
    sendTotal += sendCounts[j];
    recvTotal += recvCounts[j];
  }
  MPI_Request request;
  MPI_Ialltoall(sends.data(), 1, MPI_INT, announced.data(), 1, MPI_INT, comm, &request);
  impl->complete(request, deadline, timeoutSeconds(),
                 [&](auto) { return what + " (exchanging the counts)"; });
  for (size_t j = 0; j < members; ++j)
    if (announced[j] != recvs[j])
      fail(what + ": rank " + std::to_string(group.ranks[j]) + " sends " +
           std::to_string(announced[j]) + " elements but " + std::to_string(recvs[j]) +
           " were expected");
  MPI_Ialltoallv(input, sends.data(), sendOffsets.data(), mpiType(type), output, recvs.data(),
                 recvOffsets.data(), mpiType(type), comm, &request);
  impl->complete(request, deadline, timeoutSeconds(), [&](auto) { return what; });
}

void MPICommunicator::barrierImpl(GroupCall group) {
  Clock::time_point deadline = deadlineAfter(timeoutSeconds());
  std::string what = describe("barrier", group.ranks);
  MPI_Comm comm = impl->groupCommunicator(group.ranks, timeoutSeconds());
  MPI_Request request;
  MPI_Ibarrier(comm, &request);
  impl->complete(request, deadline, timeoutSeconds(), [&](auto) { return what; });
}

std::vector<std::string> MPICommunicator::agreeImpl(StringRef mine) {
  Clock::time_point deadline = deadlineAfter(timeoutSeconds());
  std::string agreeing = describe("agree", {});
  auto what = [&](auto) { return agreeing; };
  int length = impl->toMPICount(mine.size(), agreeing);
  std::vector<int> lengths(impl->world), offsets(impl->world);
  MPI_Request request;
  MPI_Iallgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, impl->traffic, &request);
  impl->complete(request, deadline, timeoutSeconds(), what);
  size_t total = 0;
  for (int rank = 0; rank < impl->world; ++rank) {
    offsets[rank] = impl->toMPICount(total, agreeing);
    total += lengths[rank];
  }
  std::vector<char> all(total);
  MPI_Iallgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                  MPI_CHAR, impl->traffic, &request);
  impl->complete(request, deadline, timeoutSeconds(), what);
  std::vector<std::string> strings;
  for (int rank = 0; rank < impl->world; ++rank)
    strings.emplace_back(all.data() + offsets[rank], lengths[rank]);
  return strings;
}

void MPICommunicator::exchangeImpl(ArrayRef<Transfer> transfers) {
  Clock::time_point deadline = deadlineAfter(timeoutSeconds());
  std::vector<MPI_Request> requests(transfers.size());
  for (size_t i = 0; i < transfers.size(); ++i) {
    const Transfer &transfer = transfers[i];
    if (transfer.tag > impl->tagUpperBound)
      fail(describe(transfer) + ": the tag exceeds this MPI's MPI_TAG_UB of " +
           std::to_string(impl->tagUpperBound));
    int count = impl->toMPICount(transfer.count, describe(transfer));
    int peer = static_cast<int>(transfer.peer), tag = static_cast<int>(transfer.tag);
    if (transfer.kind == Transfer::Kind::Send)
      MPI_Isend(transfer.data, count, mpiType(transfer.type), peer, tag, impl->traffic,
                &requests[i]);
    else
      MPI_Irecv(transfer.data, count, mpiType(transfer.type), peer, tag, impl->traffic,
                &requests[i]);
  }
  std::vector<MPI_Status> statuses;
  auto describePending = [&](ArrayRef<size_t> pending) {
    std::vector<Transfer> waiting;
    for (size_t i : pending)
      waiting.push_back(transfers[i]);
    return describe(waiting);
  };
  impl->complete(requests, deadline, timeoutSeconds(), describePending, &statuses);
  // A longer message than posted is MPI_ERR_TRUNCATE, fatal; a shorter one needs this check.
  for (size_t i = 0; i < transfers.size(); ++i) {
    const Transfer &transfer = transfers[i];
    if (transfer.kind != Transfer::Kind::Recv)
      continue;
    int received = 0;
    MPI_Get_count(&statuses[i], mpiType(transfer.type), &received);
    if (static_cast<size_t>(received) != transfer.count)
      fail(describe(transfer) + ": rank " + std::to_string(transfer.peer) + " sent " +
           std::to_string(received) + " x " + spelling(transfer.type).str() + " but " +
           std::to_string(transfer.count) + " x " + spelling(transfer.type).str() +
           " were expected");
  }
}

} // namespace parc::runtime
