//===- Communicator.h - How the ranks of parrun talk to each other --------===//
//
// The runtime only sees plans, whose groups are ordered lists of global ranks, so every call
// names its group as such a list and the caller's position is found in it. Member i of a
// reduce-scatter keeps part i and member i of an all-gather supplies part i, as the plan format
// says.
//
// Reductions are deterministic: every element is the left fold of the members' buffers in list
// order, ((a0 + a1) + a2) + ..., whatever the timing, the implementation or the rank that
// computes it. The runtime must train any mapping to the same numbers as a single rank (to
// 1e-10 relative in fp64), and a library all-reduce that adds in an unspecified order would
// break that; so would one whose result differs between members.
//
// Every wait has a deadline. A call that cannot complete throws CommError naming what it waited
// for (op, group, peer, tag), and the communicator is then failed: a later call fails at once
// (the local one throws, MPI aborts the job). The caller reports the stuck instruction and
// calls abort(), which ends the whole job.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_COMMUNICATOR_H
#define PARC_RUNTIME_COMMUNICATOR_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace parc::runtime {

/// BF16 and F16 are the storage of the CUDA backend's mixed precision: only the device
/// communicators move and reduce them (folding in fp32); the host ones refuse them.
enum class ElementType { F32, F64, BF16, F16 };

template <typename T> struct ElementTypeOf;
template <> struct ElementTypeOf<float> { static constexpr ElementType value = ElementType::F32; };
template <> struct ElementTypeOf<double> { static constexpr ElementType value = ElementType::F64; };

size_t sizeOf(ElementType type);
llvm::StringRef spelling(ElementType type);

/// Max exists for the cross-entropy's global max over the vocabulary shards.
enum class ReduceOp { Sum, Max };
llvm::StringRef spelling(ReduceOp op);

/// `accumulator[k] = accumulator[k] op input[k]` for every k: the one step of the fold that every
/// implementation uses, so all of them round alike. Max propagates NaN. The two must not
/// overlap (the sum is vectorised).
void accumulate(ReduceOp op, ElementType type, void *accumulator, const void *input, size_t count);
/// Every buffer's elements become the reduction of all the buffers', accumulated in buffer
/// order (the bits of accumulate() into buffers[0] and copying it out), a pass fewer.
void reduceAll(ReduceOp op, ElementType type, llvm::ArrayRef<void *> buffers, size_t count);

/// "[1, 3]"
std::string formatGroup(llvm::ArrayRef<int64_t> group);

class CommError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct CommOptions {
  /// How long any single call may wait for its peers.
  double timeoutSeconds = 300;
};

/// One point-to-point transfer. A send's buffer is only read.
struct Transfer {
  enum class Kind { Send, Recv };
  Kind kind;
  int64_t peer;
  int64_t tag;
  ElementType type;
  void *data;
  size_t count;

  template <typename T>
  static Transfer send(int64_t peer, int64_t tag, const T *data, size_t count) {
    return {Kind::Send, peer, tag, ElementTypeOf<T>::value, const_cast<T *>(data), count};
  }
  template <typename T> static Transfer recv(int64_t peer, int64_t tag, T *data, size_t count) {
    return {Kind::Recv, peer, tag, ElementTypeOf<T>::value, data, count};
  }
};

/// The caller's view of one group: its ranks in list order and the caller's position in them.
struct GroupCall {
  llvm::ArrayRef<int64_t> ranks;
  size_t position;
};

class Communicator {
public:
  using Group = llvm::ArrayRef<int64_t>;

  explicit Communicator(CommOptions options) : options(options) {}
  virtual ~Communicator();
  Communicator(const Communicator &) = delete;
  Communicator &operator=(const Communicator &) = delete;

  virtual int64_t rank() const = 0;
  virtual int64_t world() const = 0;

  double timeoutSeconds() const { return options.timeoutSeconds; }
  void setTimeoutSeconds(double seconds) { options.timeoutSeconds = seconds; }

  /// In place: every member ends with the fold of all members' `data`, bitwise alike.
  void allReduce(Group group, ReduceOp op, ElementType type, void *data, size_t count);
  /// `input` holds `countPerMember * group.size()` elements; member i receives the fold of
  /// part i, elements [i * countPerMember, (i + 1) * countPerMember). Padding a buffer to a
  /// multiple of the group size is the caller's business (the plan's ZeRO partitions say how).
  /// `output` may be the caller's own part of `input` (ZeRO's reduction of a bucket in place).
  void reduceScatter(Group group, ReduceOp op, ElementType type, const void *input, void *output,
                     size_t countPerMember);
  /// `output` holds `countPerMember * group.size()` elements, member i's input as part i.
  /// `input` may be the caller's own part of `output` (ZeRO's gather of a partition in place).
  void allGather(Group group, ElementType type, const void *input, void *output,
                 size_t countPerMember);
  /// Member i sends sendCounts[j] elements to member j and receives recvCounts[j] from it:
  /// `input` holds the parts for members 0, 1, ... back to back, and `output` receives them
  /// the same way (MPI_Alltoallv with packed displacements). Member i's sendCounts[j] must be
  /// member j's recvCounts[i]; a mismatch is a CommError. The expert-parallel token exchange.
  void allToAll(Group group, ElementType type, const void *input,
                llvm::ArrayRef<size_t> sendCounts, void *output,
                llvm::ArrayRef<size_t> recvCounts);
  /// Posts every transfer of a run at once and returns when all completed, as the plan's
  /// "maximal run of consecutive transfers" demands: a send never waits for its receive before
  /// the next transfer is posted, so two neighbours that both send first do not deadlock.
  /// A receive matches the send with the same (source, destination, tag), in any order.
  void exchange(llvm::ArrayRef<Transfer> transfers);
  void barrier(Group group);
  /// The start-up handshake: every rank contributes a string (its plan id) and every rank gets
  /// all of them back, indexed by rank, so that all ranks report a mismatch alike.
  std::vector<std::string> agree(llvm::StringRef mine);
  /// Ends the job: the local communicator fails every rank and throws; MPI aborts the job.
  [[noreturn]] virtual void abort(llvm::StringRef message) = 0;

  /// Overlap: calls made while `setOverlapping(true)` holds may complete after the caller's
  /// later work, until joinOverlapped(); the caller promises not to touch their buffers in
  /// between. This is how the data-parallel gradient sync runs beside the rest of the backward
  /// (as in llm.c and Megatron-LM). A device communicator then leaves the compute stream free
  /// instead of ordering it after the call; host communicators complete every call before
  /// returning, so for them both are no-ops.
  virtual void setOverlapping(bool overlapping) { (void)overlapping; }
  virtual void joinOverlapped() {}

  /// Why the job failed, when this communicator learns of a peer's failure without waiting
  /// for it (the ranks of a LocalWorld share theirs); empty otherwise. A device communicator
  /// that waits on its device polls it, so that a failed peer ends the wait at once.
  virtual std::string jobFailure() const { return ""; }

  template <typename T>
  void allReduce(Group group, T *data, size_t count, ReduceOp op = ReduceOp::Sum) {
    allReduce(group, op, ElementTypeOf<T>::value, data, count);
  }
  template <typename T>
  void reduceScatter(Group group, const T *input, T *output, size_t countPerMember,
                     ReduceOp op = ReduceOp::Sum) {
    reduceScatter(group, op, ElementTypeOf<T>::value, input, output, countPerMember);
  }
  template <typename T>
  void allGather(Group group, const T *input, T *output, size_t countPerMember) {
    allGather(group, ElementTypeOf<T>::value, input, output, countPerMember);
  }
  template <typename T>
  void allToAll(Group group, const T *input, llvm::ArrayRef<size_t> sendCounts, T *output,
                llvm::ArrayRef<size_t> recvCounts) {
    allToAll(group, ElementTypeOf<T>::value, input, sendCounts, output, recvCounts);
  }
  template <typename T> void send(int64_t peer, int64_t tag, const T *data, size_t count) {
    exchange({Transfer::send(peer, tag, data, count)});
  }
  template <typename T> void recv(int64_t peer, int64_t tag, T *data, size_t count) {
    exchange({Transfer::recv(peer, tag, data, count)});
  }

protected:
  /// How errors name a call: "all_reduce over group [1, 3] on rank 1"; an empty group is
  /// all ranks ("agree over all ranks on rank 1").
  std::string describe(llvm::StringRef op, Group group) const;
  /// "send to rank 2 with tag 3 and recv from rank 1 with tag 5 on rank 0"
  std::string describe(llvm::ArrayRef<Transfer> transfers) const;

  /// Throws CommError, and marks this communicator failed, so that later calls fail too.
  [[noreturn]] virtual void fail(const std::string &message) = 0;
  /// Ends the call `what()` describes when this communicator has already failed.
  virtual void checkNotFailed(llvm::function_ref<std::string()> what) = 0;
  /// The copy of a one-member reduce_scatter or all_gather; the buffers may overlap. Host
  /// memory here; the CUDA communicators copy on the device.
  virtual void copyLocal(void *destination, const void *source, size_t bytes);

private:
  // Arguments were checked and groups of one member handled before these are called.
  virtual void allReduceImpl(GroupCall group, ReduceOp op, ElementType type, void *data,
                             size_t count) = 0;
  virtual void reduceScatterImpl(GroupCall group, ReduceOp op, ElementType type, const void *input,
                                 void *output, size_t countPerMember) = 0;
  virtual void allGatherImpl(GroupCall group, ElementType type, const void *input, void *output,
                             size_t countPerMember) = 0;
  virtual void allToAllImpl(GroupCall group, ElementType type, const void *input,
                            llvm::ArrayRef<size_t> sendCounts, void *output,
                            llvm::ArrayRef<size_t> recvCounts) = 0;
  virtual void exchangeImpl(llvm::ArrayRef<Transfer> transfers) = 0;
  virtual void barrierImpl(GroupCall group) = 0;
  virtual std::vector<std::string> agreeImpl(llvm::StringRef mine) = 0;

  GroupCall locate(Group group, llvm::StringRef op);

  CommOptions options;
};

/// Every rank a thread of one process, or a fiber of a few threads. Collectives meet in slots
/// keyed by group and sequence number; sends are copied into per-(source, destination, tag)
/// mailboxes and never wait. An all_reduce is summed in its members' own buffers; every other
/// call costs a copy of its buffer, and all share one lock: meant for tests and small models on
/// one machine.
class LocalWorld {
public:
  /// With 0 < `fiberThreads` < `world`, run() runs the ranks as fibers on that many threads:
  /// for ranks that each compute on one thread, more of them than there are cores.
  LocalWorld(int64_t world, CommOptions options = {}, int64_t fiberThreads = 0);
  ~LocalWorld();

  int64_t world() const;
  Communicator &communicator(int64_t rank);

  /// Runs `body` on every rank (a thread or fiber each) and returns one message per rank,
  /// empty when that rank finished. A rank that throws fails the world, which wakes every waiting rank with an
  /// error instead of leaving it to its deadline.
  std::vector<std::string> run(const std::function<void(Communicator &)> &body);

  /// The first failure, empty while there is none.
  std::string failure() const;

  struct State;

private:
  std::unique_ptr<State> state;
  int64_t fiberThreads;
};

/// MPI_COMM_WORLD; see MPICommunicator.cpp for how each call maps onto MPI and what it costs.
class MPICommunicator final : public Communicator {
public:
  /// Initialises MPI unless the program already did, and finalises it on destruction when it
  /// did so here. A failed communicator aborts the job on destruction instead: finalising
  /// would wait for ranks that may never arrive.
  static std::unique_ptr<MPICommunicator> create(int *argc, char ***argv, CommOptions options = {});
  ~MPICommunicator() override;

  int64_t rank() const override;
  int64_t world() const override;
  [[noreturn]] void abort(llvm::StringRef message) override;

  struct Impl;

private:
  explicit MPICommunicator(CommOptions options);

  [[noreturn]] void fail(const std::string &message) override;
  void checkNotFailed(llvm::function_ref<std::string()> what) override;
  void allReduceImpl(GroupCall group, ReduceOp op, ElementType type, void *data,
                     size_t count) override;
  void reduceScatterImpl(GroupCall group, ReduceOp op, ElementType type, const void *input,
                         void *output, size_t countPerMember) override;
  void allGatherImpl(GroupCall group, ElementType type, const void *input, void *output,
                     size_t countPerMember) override;
  void allToAllImpl(GroupCall group, ElementType type, const void *input,
                    llvm::ArrayRef<size_t> sendCounts, void *output,
                    llvm::ArrayRef<size_t> recvCounts) override;
  void exchangeImpl(llvm::ArrayRef<Transfer> transfers) override;
  void barrierImpl(GroupCall group) override;
  std::vector<std::string> agreeImpl(llvm::StringRef mine) override;

  std::unique_ptr<Impl> impl;
};

} // namespace parc::runtime

#endif // PARC_RUNTIME_COMMUNICATOR_H
