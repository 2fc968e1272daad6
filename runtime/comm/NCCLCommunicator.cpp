//===- NCCLCommunicator.cpp - One rank per GPU, NCCL for the data ---------===//
//
// See NCCLCommunicator.h for the cost of each call. Communicators: the world one (for
// exchange, ncclCommSplit and the group of all ranks in rank order), and one per group, split
// from the world by splitGroups() or created on first use from a ncclUniqueId that the
// group's first member draws and all-gathers through the host communicator. Every NCCL and
// CUDA call is checked; a failure fails this communicator with a CommError that names the
// call, the collective and the rank. synchronize() also polls NCCL's asynchronous errors, and
// any failure (a timeout too) aborts every NCCL communicator so that no kernel is left
// spinning on a peer that will never come.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/NCCLCommunicator.h"

#include "parc/Runtime/CudaCheck.h"

#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

using llvm::ArrayRef;
using llvm::StringRef;

namespace parc::runtime {

namespace {

ncclDataType_t ncclType(ElementType type) {
  switch (type) {
  case ElementType::F32:
    return ncclFloat32;
  case ElementType::F64:
    return ncclFloat64;
  case ElementType::BF16:
    return ncclBfloat16;
  case ElementType::F16:
    return ncclFloat16;
  }
  return ncclFloat32;
}

constexpr size_t kIdWords = sizeof(ncclUniqueId) / sizeof(double);
static_assert(kIdWords * sizeof(double) == sizeof(ncclUniqueId), "an id travels as doubles");

std::string toHex(const ncclUniqueId &id) {
  static const char digits[] = "0123456789abcdef";
  std::string text;
  for (unsigned char byte : id.internal) {
    text += digits[byte >> 4];
    text += digits[byte & 15];
  }
  return text;
}

bool fromHex(const std::string &text, ncclUniqueId &id) {
  if (text.size() != 2 * sizeof(id.internal))
    return false;
  auto digit = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i < sizeof(id.internal); ++i)
    id.internal[i] = static_cast<char>(digit(text[2 * i]) * 16 + digit(text[2 * i + 1]));
  return true;
}

} // namespace

struct NCCLCommunicator::Impl {
  Impl(NCCLCommunicator &owner, Communicator &host) : owner(owner), host(host) {}

  void checkNccl(ncclResult_t status, const char *call, const std::string &what,
                 ncclComm_t comm = nullptr) {
    if (status == ncclSuccess)
      return;
    std::string detail = comm ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
    owner.fail(what + ": " + call + " failed: " + ncclGetErrorString(status) +
               (detail.empty() ? "" : " (" + detail + ")"));
  }

  std::vector<ncclComm_t> all() const {
    std::vector<ncclComm_t> comms = spare;
    for (const auto &entry : groups)
      comms.push_back(entry.second);
    if (world)
      comms.push_back(world);
    return comms;
  }

  /// The group's communicator, created by its members on first use.
  ncclComm_t group(GroupCall call, const std::string &what) {
    std::vector<int64_t> key(call.ranks.begin(), call.ranks.end());
    auto it = groups.find(key);
    if (it != groups.end())
      return it->second;
    // All ranks in rank order (the loss's all-reduce): the world communicator is that group.
    bool everyRank = true;
    for (size_t i = 0; i < key.size(); ++i)
      everyRank = everyRank && key[i] == int64_t(i);
    if (everyRank && int64_t(key.size()) == host.world())
      return world;
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (call.position == 0)
      checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId", what);
    double mine[kIdWords];
    std::memcpy(mine, &id, sizeof id);
    std::vector<double> everyone(kIdWords * call.ranks.size());
    host.allGather(call.ranks, mine, everyone.data(), kIdWords);
    std::memcpy(&id, everyone.data(), sizeof id); // the first member's
    ncclComm_t comm = nullptr;
    checkNccl(ncclCommInitRank(&comm, static_cast<int>(call.ranks.size()), id,
                               static_cast<int>(call.position)),
              "ncclCommInitRank", what);
    groups.emplace(std::move(key), comm);
    return comm;
  }

  /// Member i receives part i of every member's buffer: sendPart(i) of recvCount... each.
  template <typename SendPart, typename RecvPart>
  void scatterParts(ncclComm_t comm, GroupCall call, ElementType type, SendPart sendPart,
                    RecvPart recvPart, size_t recvCount, const std::string &what) {
    checkNccl(ncclGroupStart(), "ncclGroupStart", what);
    for (size_t i = 0; i < call.ranks.size(); ++i) {
      if (i == call.position)
        continue;
      auto [data, count] = sendPart(i);
      int peer = static_cast<int>(i);
      if (count)
        checkNccl(ncclSend(data, count, ncclType(type), peer, comm, stream), "ncclSend", what,
                  comm);
      if (recvCount)
        checkNccl(ncclRecv(recvPart(i), recvCount, ncclType(type), peer, comm, stream), "ncclRecv",
                  what, comm);
    }
    checkNccl(ncclGroupEnd(), "ncclGroupEnd", what, comm);
  }

  void *allocate(size_t bytes, const std::string &what) {
    void *data = nullptr;
    if (bytes)
      owner.checkCuda(cudaMallocAsync(&data, bytes, stream), "cudaMallocAsync", what);
    return data;
  }
  void release(void *data, const std::string &what) {
    if (data)
      owner.checkCuda(cudaFreeAsync(data, stream), "cudaFreeAsync", what);
  }

  NCCLCommunicator &owner;
  Communicator &host;
  cudaStream_t stream = nullptr;
  ncclComm_t world = nullptr;
  std::map<std::vector<int64_t>, ncclComm_t> groups;
  std::vector<ncclComm_t> spare; // splits of a group that was already there
  bool aborted = false;
};

NCCLCommunicator::NCCLCommunicator(Communicator &host, int device, CommOptions options)
    : CudaCommunicator(options, device), impl(std::make_unique<Impl>(*this, host)) {
  checkCuda(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking),
            "cudaStreamCreateWithFlags",
            "creating the NCCL stream on rank " + std::to_string(host.rank()));
}

std::unique_ptr<NCCLCommunicator> NCCLCommunicator::create(Communicator &host, int device,
                                                           CommOptions options) {
  std::unique_ptr<NCCLCommunicator> comm(new NCCLCommunicator(host, device, options));
  std::string what = "creating the NCCL world communicator on rank " + std::to_string(host.rank());
  ncclUniqueId id;
  std::string mine;
  if (host.rank() == 0) {
    comm->impl->checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId", what);
    mine = toHex(id);
  }
  std::vector<std::string> everyone = host.agree(mine);
  if (!fromHex(everyone.at(0), id))
    comm->fail(what + ": rank 0 sent no NCCL id; did every rank create an NCCL communicator?");
  comm->checkCuda(cudaSetDevice(device), "cudaSetDevice", what);
  comm->impl->checkNccl(ncclCommInitRank(&comm->impl->world, static_cast<int>(host.world()), id,
                                         static_cast<int>(host.rank())),
                        "ncclCommInitRank", what);
  return comm;
}

int NCCLCommunicator::defaultDevice(int64_t rank) {
  int64_t local = rank;
  for (const char *name :
       {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"})
    if (const char *value = std::getenv(name)) {
      local = std::atoll(value);
      break;
    }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices <= 0)
    return 0;
  return static_cast<int>(local % devices);
}

NCCLCommunicator::~NCCLCommunicator() {
  // Destroying a communicator waits for its operations: only do so when they completed.
  try {
    synchronize();
  } catch (const CommError &) {
    abandonTransfers();
  }
  // Destroying finalizes, which can wait on peers (NCCL 2.23 on); a failed peer thread never
  // comes, and aborting waits for none.
  if (!impl->host.jobFailure().empty())
    abandonTransfers();
  if (!impl->aborted)
    for (ncclComm_t comm : impl->all())
      ncclCommDestroy(comm);
  cudaStreamDestroy(impl->stream);
}

void NCCLCommunicator::splitGroups(ArrayRef<std::vector<int64_t>> groups) {
  std::string what = "splitting the NCCL groups on rank " + std::to_string(rank());
  checkNotFailed([&] { return what; });
  checkCuda(cudaSetDevice(device()), "cudaSetDevice", what);
  for (const std::vector<int64_t> &group : groups) {
    int color = NCCL_SPLIT_NOCOLOR, key = 0;
    if (!group.empty()) {
      auto self = std::find(group.begin(), group.end(), rank());
      if (self == group.end())
        fail(what + ": rank " + std::to_string(rank()) + " is not in group " + formatGroup(group) +
             "; pass this rank's own groups");
      color = static_cast<int>(*std::min_element(group.begin(), group.end()));
      key = static_cast<int>(self - group.begin());
    }
    ncclComm_t comm = nullptr;
    impl->checkNccl(ncclCommSplit(impl->world, color, key, &comm, nullptr), "ncclCommSplit", what,
                    impl->world);
    if (group.empty())
      continue;
    if (!impl->groups.emplace(group, comm).second)
      impl->spare.push_back(comm);
  }
}

int64_t NCCLCommunicator::rank() const { return impl->host.rank(); }
int64_t NCCLCommunicator::world() const { return impl->host.world(); }

void NCCLCommunicator::abort(StringRef message) {
  abandonTransfers();
  impl->host.abort(message);
  fail(message.str()); // not reached: the host's abort does not return
}

void NCCLCommunicator::checkTransport(const std::string &what) {
  if (impl->aborted)
    return;
  // Ranks that are threads of one process learn of a peer's failure through the host world;
  // NCCL would wait for that peer until the deadline.
  std::string failure = impl->host.jobFailure();
  if (!failure.empty()) {
    abandonTransfers();
    fail(what + " gave up because the job failed: " + failure);
  }
  for (ncclComm_t comm : impl->all()) {
    ncclResult_t status = ncclSuccess;
    impl->checkNccl(ncclCommGetAsyncError(comm, &status), "ncclCommGetAsyncError", what, comm);
    if (status != ncclSuccess && status != ncclInProgress) {
      std::string detail = ncclGetLastError(comm);
      abandonTransfers();
      fail(what + ": NCCL failed asynchronously: " + ncclGetErrorString(status) +
           (detail.empty() ? "" : " (" + detail + ")"));
    }
  }
}

void NCCLCommunicator::abandonTransfers() {
  if (impl->aborted)
    return;
  impl->aborted = true;
  for (ncclComm_t comm : impl->all())
    ncclCommAbort(comm);
}

void NCCLCommunicator::allReduceImpl(GroupCall group, ReduceOp op, ElementType type, void *data,
                                     size_t count) {
  std::string what = describe("all_reduce", group.ranks);
  beginCall(impl->stream, what);
  ncclComm_t comm = impl->group(group, what);
  size_t members = group.ranks.size(), position = group.position, size = sizeOf(type);
  size_t chunk = (count + members - 1) / members;
  auto partCount = [&](size_t i) {
    return i * chunk >= count ? 0 : std::min(chunk, count - i * chunk);
  };
  char *bytes = static_cast<char *>(data);
  char *scratch = static_cast<char *>(impl->allocate(members * chunk * size, what));
  if (count) {
    impl->scatterParts(
        comm, group, type,
        [&](size_t i) { return std::make_pair(bytes + i * chunk * size, partCount(i)); },
        [&](size_t i) { return scratch + i * chunk * size; }, partCount(position), what);
    std::vector<const void *> parts;
    for (size_t i = 0; i < members; ++i)
      parts.push_back((i == position ? bytes : scratch) + i * chunk * size);
    void *folded = scratch + position * chunk * size;
    fold(type, op, &folded, 1, parts.data(), members, partCount(position), impl->stream, what);
    impl->checkNccl(ncclAllGather(folded, scratch, chunk, ncclType(type), comm, impl->stream),
                    "ncclAllGather", what, comm);
    checkCuda(cudaMemcpyAsync(data, scratch, count * size, cudaMemcpyDeviceToDevice, impl->stream),
              "cudaMemcpyAsync", what);
  }
  impl->release(scratch, what);
  endCall(impl->stream, what);
}

void NCCLCommunicator::reduceScatterImpl(GroupCall group, ReduceOp op, ElementType type,
                                         const void *input, void *output, size_t countPerMember) {
  std::string what = describe("reduce_scatter", group.ranks);
  beginCall(impl->stream, what);
  ncclComm_t comm = impl->group(group, what);
  size_t members = group.ranks.size(), partBytes = countPerMember * sizeOf(type);
  const char *bytes = static_cast<const char *>(input);
  char *scratch = static_cast<char *>(impl->allocate(members * partBytes, what));
  if (countPerMember) {
    impl->scatterParts(
        comm, group, type,
        [&](size_t i) { return std::make_pair(bytes + i * partBytes, countPerMember); },
        [&](size_t i) { return scratch + i * partBytes; }, countPerMember, what);
    std::vector<const void *> parts;
    for (size_t i = 0; i < members; ++i)
      parts.push_back(i == group.position ? bytes + i * partBytes : scratch + i * partBytes);
    fold(type, op, &output, 1, parts.data(), members, countPerMember, impl->stream, what);
  }
  impl->release(scratch, what);
  endCall(impl->stream, what);
}

void NCCLCommunicator::allGatherImpl(GroupCall group, ElementType type, const void *input,
                                     void *output, size_t countPerMember) {
  // In place when input is this member's part of output, as NCCL expects it.
  std::string what = describe("all_gather", group.ranks);
  beginCall(impl->stream, what);
  ncclComm_t comm = impl->group(group, what);
  if (countPerMember)
    impl->checkNccl(
        ncclAllGather(input, output, countPerMember, ncclType(type), comm, impl->stream),
        "ncclAllGather", what, comm);
  endCall(impl->stream, what);
}

void NCCLCommunicator::allToAllImpl(GroupCall group, ElementType type, const void *input,
                                    ArrayRef<size_t> sendCounts, void *output,
                                    ArrayRef<size_t> recvCounts) {
  std::string what = describe("all_to_all", group.ranks);
  size_t self = group.position, size = sizeOf(type);
  if (sendCounts[self] != recvCounts[self])
    fail(what + ": sends itself " + std::to_string(sendCounts[self]) + " elements but expects " +
         std::to_string(recvCounts[self]));
  beginCall(impl->stream, what);
  ncclComm_t comm = impl->group(group, what);
  const char *in = static_cast<const char *>(input);
  char *out = static_cast<char *>(output);
  size_t sendOffset = 0, recvOffset = 0, selfSend = 0, selfRecv = 0;
  impl->checkNccl(ncclGroupStart(), "ncclGroupStart", what);
  for (size_t j = 0; j < group.ranks.size(); ++j) {
    int peer = static_cast<int>(j);
    if (j == self) {
      selfSend = sendOffset;
      selfRecv = recvOffset;
    } else {
      if (sendCounts[j])
        impl->checkNccl(ncclSend(in + sendOffset * size, sendCounts[j], ncclType(type), peer, comm,
                                 impl->stream),
                        "ncclSend", what, comm);
      if (recvCounts[j])
        impl->checkNccl(ncclRecv(out + recvOffset * size, recvCounts[j], ncclType(type), peer,
                                 comm, impl->stream),
                        "ncclRecv", what, comm);
    }
    sendOffset += sendCounts[j];
    recvOffset += recvCounts[j];
  }
  impl->checkNccl(ncclGroupEnd(), "ncclGroupEnd", what, comm);
  if (sendCounts[self])
    checkCuda(cudaMemcpyAsync(out + selfRecv * size, in + selfSend * size, sendCounts[self] * size,
                              cudaMemcpyDeviceToDevice, impl->stream),
              "cudaMemcpyAsync", what);
  endCall(impl->stream, what);
}

void NCCLCommunicator::exchangeImpl(ArrayRef<Transfer> transfers) {
  std::string what = describe(transfers);
  beginCall(impl->stream, what);
  std::vector<const Transfer *> ordered;
  for (const Transfer &transfer : transfers)
    ordered.push_back(&transfer);
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const Transfer *a, const Transfer *b) { return a->tag < b->tag; });
  impl->checkNccl(ncclGroupStart(), "ncclGroupStart", what);
  for (const Transfer *transfer : ordered) {
    int peer = static_cast<int>(transfer->peer);
    if (transfer->kind == Transfer::Kind::Send)
      impl->checkNccl(ncclSend(transfer->data, transfer->count, ncclType(transfer->type), peer,
                               impl->world, impl->stream),
                      "ncclSend", what, impl->world);
    else
      impl->checkNccl(ncclRecv(transfer->data, transfer->count, ncclType(transfer->type), peer,
                               impl->world, impl->stream),
                      "ncclRecv", what, impl->world);
  }
  impl->checkNccl(ncclGroupEnd(), "ncclGroupEnd", what, impl->world);
  endCall(impl->stream, what);
}

void NCCLCommunicator::barrierImpl(GroupCall group) { impl->host.barrier(group.ranks); }

std::vector<std::string> NCCLCommunicator::agreeImpl(StringRef mine) {
  return impl->host.agree(mine);
}

} // namespace parc::runtime
