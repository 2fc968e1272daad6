//===- NCCLCommunicator.h - One rank per GPU, NCCL for the data -----------===//
//
// The device communicator of a multi-GPU job: every rank drives one GPU, NCCL moves the
// data, and a host communicator (MPICommunicator under mpirun; a LocalWorld's rank when the
// ranks are threads of one process with a GPU each) carries the rest: the ncclUniqueIds,
// agree(), barrier() and abort(). Buffers are device pointers on device() and the calls are
// asynchronous (see CudaCommunicator.h); NCCL runs on a stream of its own.
//
// NCCL's all-reduce and reduce-scatter add in an order of their choosing, which the
// interface forbids, so reductions are data movement plus cuda::foldBuffers, as the MPI
// communicator does: member i receives part i of every member's buffer (grouped
// ncclSend/ncclRecv), folds the parts in list order and, for an all-reduce, ncclAllGather
// shares the folded parts. Each rank moves 2 (g - 1) n / g elements per all-reduce, as a
// ring all-reduce does, in g - 1 messages per phase, with an n-element scratch buffer.
//
// all_to_all is one group of ncclSend/ncclRecv to every other member (Megatron-Core's token
// dispatcher does the same); NCCL cannot see a count that differs from its peer's.
//
// NCCL has no tags: between two ranks, sends and receives pair up in the order they are
// posted. exchange() posts one run's transfers to each peer in tag order, so runs whose tags
// both sides post in the same order (the plan's transfers, one per chunk and microbatch)
// pair up as their tags say; a mismatch in count cannot be detected.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_NCCLCOMMUNICATOR_H
#define PARC_RUNTIME_NCCLCOMMUNICATOR_H

#include "parc/Runtime/CudaCommunicator.h"

#include <memory>
#include <vector>

namespace parc::runtime {

class NCCLCommunicator final : public CudaCommunicator {
public:
  /// Collective over every rank of `host`: rank 0's ncclUniqueId reaches the others through
  /// host.agree() and each rank joins the world communicator on `device`. `host` must
  /// outlive the result.
  static std::unique_ptr<NCCLCommunicator> create(Communicator &host, int device,
                                                  CommOptions options = {});
  /// The device of this process under a launcher: its local rank (OMPI_COMM_WORLD_LOCAL_RANK,
  /// MPI_LOCALRANKID, SLURM_LOCALID or LOCAL_RANK; else `rank`) modulo the visible devices.
  static int defaultDevice(int64_t rank);
  ~NCCLCommunicator() override;

  /// Collective over every rank: splits the world communicator with ncclCommSplit into the
  /// groups this rank belongs to, one split per entry, so every rank must pass its groups of
  /// the same kinds in the same order (the plan's tp, pp, dp, model, embedding); an empty
  /// entry joins no group of that split. The groups of one entry must be disjoint, as the
  /// plan's are. A group first used without being split here is created then by its members
  /// alone, with a ncclUniqueId shared through the host communicator; that creation may wait
  /// for this device's other NCCL kernels, so runs split their groups before the first call.
  void splitGroups(llvm::ArrayRef<std::vector<int64_t>> groups);

  int64_t rank() const override;
  int64_t world() const override;
  [[noreturn]] void abort(llvm::StringRef message) override;

  struct Impl;

private:
  NCCLCommunicator(Communicator &host, int device, CommOptions options);

  void checkTransport(const std::string &what) override;
  void abandonTransfers() override;
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

#endif // PARC_RUNTIME_NCCLCOMMUNICATOR_H
