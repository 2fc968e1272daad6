//===- CudaLocalCommunicator.cpp - Ranks as threads sharing one GPU -------===//
//
// See CudaLocalCommunicator.h. Records of pointers and event handles travel through the
// host LocalWorld as doubles, bit for bit (its collectives and mailboxes copy bytes). Every
// rank's thread and streams use the same device and context, so any rank may read another
// rank's buffers and wait on its events.
//
// The folder's `done` event is reused by its next call; a member that waits on it after the
// folder has recorded it again waits for a later point of the folder's stream, which only
// delays it: cudaStreamWaitEvent captures work already queued, so no wait can depend on work
// queued after it, and no cycle can form.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/CudaLocalCommunicator.h"

#include "parc/Runtime/CudaCheck.h"

#include <array>
#include <cstring>

using llvm::ArrayRef;
using llvm::StringRef;

namespace parc::runtime {

namespace {

/// One member's side of a call: its buffers, the event after which they are ready, the
/// folder's completion event, and what it called, to catch mismatched calls.
struct Record {
  uint64_t input, output, ready, done;
  int64_t op, type, count;
};
constexpr size_t kWords = 7;
using Words = std::array<double, kWords>;
static_assert(sizeof(Record) == sizeof(Words), "a record travels as doubles");

Words pack(const Record &record) {
  Words words;
  std::memcpy(words.data(), &record, sizeof record);
  return words;
}

Record unpack(const double *words) {
  Record record{};
  std::memcpy(&record, words, sizeof record);
  return record;
}

uint64_t handle(const void *pointer) { return reinterpret_cast<uintptr_t>(pointer); }
template <typename P> P pointer(uint64_t bits) { return reinterpret_cast<P>(uintptr_t(bits)); }

std::string signature(StringRef op, const Record &record, bool reduces) {
  std::string text = op.str();
  if (reduces)
    text += " (" + spelling(ReduceOp(record.op)).str() + ")";
  return text + " of " + std::to_string(record.count) + " x " +
         spelling(ElementType(record.type)).str();
}

class CudaLocalCommunicator final : public CudaCommunicator {
public:
  CudaLocalCommunicator(Communicator &host, int device, CommOptions options)
      : CudaCommunicator(options, device), host(host) {
    std::string what =
        "setting up the CUDA local communicator of rank " + std::to_string(host.rank());
    PARC_COMM_CUDA_CHECK(cudaStreamCreateWithFlags(&foldStream, cudaStreamNonBlocking), what);
    PARC_COMM_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), what);
    PARC_COMM_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), what);
  }
  ~CudaLocalCommunicator() override {
    cudaSetDevice(device());
    cudaStreamSynchronize(foldStream);
    cudaStreamDestroy(foldStream);
    cudaEventDestroy(ready);
    cudaEventDestroy(done);
  }

  int64_t rank() const override { return host.rank(); }
  int64_t world() const override { return host.world(); }
  [[noreturn]] void abort(StringRef message) override {
    host.abort(message);
    fail(message.str()); // not reached: the host's abort does not return
  }

private:
  /// Shares `mine` with the group and returns every member's record in list order, after
  /// checking that all of them made the same call.
  std::vector<Record> meet(GroupCall group, Record mine, StringRef op, bool reduces,
                           const std::string &what) {
    beginCall(computeStream(), what);
    PARC_COMM_CUDA_CHECK(cudaEventRecord(ready, computeStream()), what);
    mine.ready = handle(ready);
    mine.done = handle(done);
    Words words = pack(mine);
    std::vector<double> all(kWords * group.ranks.size());
    host.allGather(group.ranks, words.data(), all.data(), kWords);
    std::vector<Record> records;
    for (size_t i = 0; i < group.ranks.size(); ++i) {
      records.push_back(unpack(all.data() + i * kWords));
      const Record &other = records.back();
      if (other.op != mine.op || other.type != mine.type || other.count != mine.count)
        fail("mismatched collectives over group " + formatGroup(group.ranks) + ": rank " +
             std::to_string(group.ranks[i]) + " called " + signature(op, other, reduces) +
             ", rank " + std::to_string(rank()) + " called " + signature(op, mine, reduces));
    }
    if (group.position == 0)
      for (const Record &record : records)
        PARC_COMM_CUDA_CHECK(cudaStreamWaitEvent(foldStream, pointer<cudaEvent_t>(record.ready), 0),
                             what);
    return records;
  }

  /// The folder marks its work done; once every member knows that, each compute stream
  /// waits for it.
  void finish(GroupCall group, const std::vector<Record> &records, const std::string &what) {
    if (group.position == 0)
      PARC_COMM_CUDA_CHECK(cudaEventRecord(done, foldStream), what);
    host.barrier(group.ranks);
    endCallAfter(pointer<cudaEvent_t>(records[0].done), what);
  }

  void allReduceImpl(GroupCall group, ReduceOp op, ElementType type, void *data,
                     size_t count) override {
    std::string what = describe("all_reduce", group.ranks);
    Record mine{handle(data), handle(data), 0, 0, int64_t(op), int64_t(type), int64_t(count)};
    std::vector<Record> records = meet(group, mine, "all_reduce", true, what);
    if (group.position == 0) {
      std::vector<void *> outputs;
      std::vector<const void *> inputs;
      for (const Record &record : records) {
        outputs.push_back(pointer<void *>(record.output));
        inputs.push_back(pointer<const void *>(record.input));
      }
      fold(type, op, outputs.data(), outputs.size(), inputs.data(), inputs.size(), count,
           foldStream, what);
    }
    finish(group, records, what);
  }

  void reduceScatterImpl(GroupCall group, ReduceOp op, ElementType type, const void *input,
                         void *output, size_t countPerMember) override {
    std::string what = describe("reduce_scatter", group.ranks);
    Record mine{handle(input), handle(output),         0, 0, int64_t(op),
                int64_t(type), int64_t(countPerMember)};
    std::vector<Record> records = meet(group, mine, "reduce_scatter", true, what);
    if (group.position == 0)
      for (size_t m = 0; m < records.size(); ++m) {
        // Member m keeps the fold of everyone's part m.
        void *memberOutput = pointer<void *>(records[m].output);
        std::vector<const void *> parts;
        for (const Record &record : records)
          parts.push_back(pointer<const char *>(record.input) + m * countPerMember * sizeOf(type));
        fold(type, op, &memberOutput, 1, parts.data(), parts.size(), countPerMember, foldStream,
             what);
      }
    finish(group, records, what);
  }

  void allGatherImpl(GroupCall group, ElementType type, const void *input, void *output,
                     size_t countPerMember) override {
    std::string what = describe("all_gather", group.ranks);
    Record mine{handle(input), handle(output), 0, 0, 0, int64_t(type), int64_t(countPerMember)};
    std::vector<Record> records = meet(group, mine, "all_gather", false, what);
    size_t partBytes = countPerMember * sizeOf(type);
    if (group.position == 0 && partBytes)
      for (const Record &destination : records)
        for (size_t i = 0; i < records.size(); ++i) {
          char *part = pointer<char *>(destination.output) + i * partBytes;
          const char *source = pointer<const char *>(records[i].input);
          if (part != source) // a member's own part, gathered in place
            PARC_COMM_CUDA_CHECK(
                cudaMemcpyAsync(part, source, partBytes, cudaMemcpyDeviceToDevice, foldStream),
                what);
        }
    finish(group, records, what);
  }

  /// The folder copies every member's parts; the counts travel beside the records so that
  /// each receiver's expectation is checked against its sender's.
  void allToAllImpl(GroupCall group, ElementType type, const void *input,
                    ArrayRef<size_t> sendCounts, void *output,
                    ArrayRef<size_t> recvCounts) override {
    std::string what = describe("all_to_all", group.ranks);
    size_t members = group.ranks.size(), size = sizeOf(type);
    std::vector<double> mine;
    for (ArrayRef<size_t> counts : {sendCounts, recvCounts})
      for (size_t count : counts)
        mine.push_back(double(count));
    std::vector<double> counts(2 * members * members);
    host.allGather(group.ranks, mine.data(), counts.data(), 2 * members);
    auto sent = [&](size_t from, size_t to) { return size_t(counts[from * 2 * members + to]); };
    auto expected = [&](size_t at, size_t from) {
      return size_t(counts[at * 2 * members + members + from]);
    };
    for (size_t i = 0; i < members; ++i)
      if (sent(i, group.position) != recvCounts[i])
        fail(what + ": rank " + std::to_string(group.ranks[i]) + " sends " +
             std::to_string(sent(i, group.position)) + " elements but " +
             std::to_string(recvCounts[i]) + " were expected");
    Record record{handle(input), handle(output), 0, 0, 0, int64_t(type), 0};
    std::vector<Record> records = meet(group, record, "all_to_all", false, what);
    if (group.position == 0)
      for (size_t to = 0; to < members; ++to) {
        size_t at = 0;
        for (size_t from = 0; from < members; ++from) {
          size_t offset = 0;
          for (size_t j = 0; j < to; ++j)
            offset += sent(from, j);
          if (size_t n = expected(to, from))
            PARC_COMM_CUDA_CHECK(
                cudaMemcpyAsync(pointer<char *>(records[to].output) + at * size,
                                pointer<const char *>(records[from].input) + offset * size,
                                n * size, cudaMemcpyDeviceToDevice, foldStream),
                what);
          at += expected(to, from);
        }
      }
    finish(group, records, what);
  }

  void exchangeImpl(ArrayRef<Transfer> transfers) override {
    std::string what = describe(transfers);
    beginCall(computeStream(), what);
    cudaStream_t stream = computeStream();
    std::vector<Words> messages(transfers.size());
    std::vector<Transfer> envelopes;
    for (size_t i = 0; i < transfers.size(); ++i) {
      const Transfer &transfer = transfers[i];
      if (transfer.kind == Transfer::Kind::Recv) {
        envelopes.push_back(
            Transfer::recv(transfer.peer, transfer.tag, messages[i].data(), kWords));
        continue;
      }
      // The sender may reuse its buffer at once, so the data travels in a copy that the
      // receiver frees once it has copied it out.
      Record record{0, 0, 0, 0, 0, int64_t(transfer.type), int64_t(transfer.count)};
      size_t bytes = transfer.count * sizeOf(transfer.type);
      void *copy = nullptr;
      cudaEvent_t sent;
      if (bytes) {
        PARC_COMM_CUDA_CHECK(cudaMallocAsync(&copy, bytes, stream), what);
        PARC_COMM_CUDA_CHECK(
            cudaMemcpyAsync(copy, transfer.data, bytes, cudaMemcpyDeviceToDevice, stream), what);
      }
      PARC_COMM_CUDA_CHECK(cudaEventCreateWithFlags(&sent, cudaEventDisableTiming), what);
      PARC_COMM_CUDA_CHECK(cudaEventRecord(sent, stream), what);
      record.input = handle(copy);
      record.ready = handle(sent);
      messages[i] = pack(record);
      envelopes.push_back(Transfer::send(transfer.peer, transfer.tag, messages[i].data(), kWords));
    }
    host.exchange(envelopes);
    for (size_t i = 0; i < transfers.size(); ++i) {
      const Transfer &transfer = transfers[i];
      if (transfer.kind != Transfer::Kind::Recv)
        continue;
      Record record = unpack(messages[i].data());
      if (record.type != int64_t(transfer.type) || record.count != int64_t(transfer.count))
        fail(describe(transfer) + ": rank " + std::to_string(transfer.peer) + " sent " +
             std::to_string(record.count) + " x " + spelling(ElementType(record.type)).str() +
             " but " + std::to_string(transfer.count) + " x " + spelling(transfer.type).str() +
             " were expected");
      cudaEvent_t sent = pointer<cudaEvent_t>(record.ready);
      PARC_COMM_CUDA_CHECK(cudaStreamWaitEvent(stream, sent, 0), what);
      PARC_COMM_CUDA_CHECK(cudaEventDestroy(sent), what);
      if (void *copy = pointer<void *>(record.input)) {
        PARC_COMM_CUDA_CHECK(cudaMemcpyAsync(transfer.data, copy,
                                             transfer.count * sizeOf(transfer.type),
                                             cudaMemcpyDeviceToDevice, stream),
                             what);
        PARC_COMM_CUDA_CHECK(cudaFreeAsync(copy, stream), what);
      }
    }
    endCall(stream, what);
  }

  void barrierImpl(GroupCall group) override { host.barrier(group.ranks); }

  std::vector<std::string> agreeImpl(StringRef mine) override { return host.agree(mine); }

  Communicator &host;
  cudaStream_t foldStream = nullptr;
  cudaEvent_t ready = nullptr, done = nullptr;
};

} // namespace

CudaLocalWorld::CudaLocalWorld(int64_t world, int device, CommOptions options)
    : device_(device), host(world, options) {
  for (int64_t rank = 0; rank < world; ++rank)
    communicators.push_back(
        std::make_unique<CudaLocalCommunicator>(host.communicator(rank), device, options));
}

CudaLocalWorld::~CudaLocalWorld() = default;

int64_t CudaLocalWorld::world() const { return host.world(); }

CudaCommunicator &CudaLocalWorld::communicator(int64_t rank) { return *communicators.at(rank); }

std::string CudaLocalWorld::failure() const { return host.failure(); }

std::vector<std::string> CudaLocalWorld::run(const std::function<void(CudaCommunicator &)> &body) {
  return host.run([&](Communicator &rankHost) {
    cudaError_t status = cudaSetDevice(device_);
    if (status != cudaSuccess)
      throw CommError("rank " + std::to_string(rankHost.rank()) + " cannot select CUDA device " +
                      std::to_string(device_) + ": " + cuda::errorText(status));
    body(*communicators[rankHost.rank()]);
  });
}

} // namespace parc::runtime
