//===- CudaCommTest.cpp - The device communicators against the serial fold -===//
//
// The same contract as CommTest: every collective bit for bit equal to the left fold of the
// members' buffers in list order (CommReference.h), now on device buffers. CudaLocalWorld
// needs one GPU; NCCLCommunicator runs one rank on one GPU, and one rank per GPU when there
// are several. Tests skip without a GPU (or without a second one).
//
//===----------------------------------------------------------------------===//

#include "CommReference.h"

#include "parc/Runtime/CudaCheck.h"
#include "parc/Runtime/CudaKernels.h"
#include "parc/Runtime/CudaLocalCommunicator.h"
#include "parc/Runtime/NCCLCommunicator.h"

#include "CudaTestSupport.h"

#include <gtest/gtest.h>

#include <numeric>

using namespace parc::runtime;
using namespace parc::runtime::test;

namespace {

/// A device copy of a host vector.
template <typename T> class DeviceVector {
public:
  explicit DeviceVector(const std::vector<T> &values) : count(values.size()) {
    PARC_CUDA_CHECK(cudaMalloc(&data, std::max<size_t>(count, 1) * sizeof(T)), "test buffer");
    PARC_CUDA_CHECK(cudaMemcpy(data, values.data(), count * sizeof(T), cudaMemcpyHostToDevice),
                    "upload");
  }
  ~DeviceVector() { cudaFree(data); }
  DeviceVector(const DeviceVector &) = delete;
  DeviceVector &operator=(const DeviceVector &) = delete;

  T *get() const { return static_cast<T *>(data); }
  /// Reads back after the communicator's queued calls completed.
  std::vector<T> read(CudaCommunicator &comm) const {
    comm.synchronize();
    std::vector<T> values(count);
    PARC_CUDA_CHECK(cudaMemcpy(values.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost),
                    "read");
    return values;
  }

private:
  void *data = nullptr;
  size_t count;
};

int deviceCount() {
  int count = 0;
  return cuda::cudaDeviceAvailable() && cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

#define SKIP_WITHOUT_DEVICES(n)                                                                    \
  do {                                                                                             \
    SKIP_WITHOUT_DEVICE();                                                                         \
    if (deviceCount() < (n))                                                                       \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices";                                          \
  } while (false)

void expectAllSucceeded(const std::vector<std::string> &errors) {
  for (size_t rank = 0; rank < errors.size(); ++rank)
    EXPECT_EQ(errors[rank], "") << "rank " << rank;
}

/// Every collective of `comm` on every group that holds it, against the serial references.
template <typename T> void checkCollectives(CudaCommunicator &comm, uint64_t seed) {
  int64_t world = comm.world(), rank = comm.rank();
  std::vector<int64_t> all(world), reversed;
  std::iota(all.begin(), all.end(), 0);
  reversed.assign(all.rbegin(), all.rend());
  for (const std::vector<int64_t> &group : {all, reversed, std::vector<int64_t>{world - 1}}) {
    if (std::find(group.begin(), group.end(), rank) == group.end())
      continue;
    size_t position = positionIn(group, rank), members = group.size();
    for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000)}) {
      SCOPED_TRACE(testing::Message() << "group " << formatGroup(group) << " count " << count);
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
        DeviceVector<T> data(inputOf<T>(rank, count, seed));
        comm.allReduce(group, data.get(), count, op);
        EXPECT_TRUE(bitwiseEqual(data.read(comm), serialFold<T>(group, count, seed, op)));
        DeviceVector<T> input(inputOf<T>(rank, count * members, seed));
        DeviceVector<T> output{std::vector<T>(count)};
        comm.reduceScatter(group, input.get(), output.get(), count, op);
        std::vector<T> folded = serialFold<T>(group, count * members, seed, op);
        std::vector<T> mine(folded.begin() + position * count,
                            folded.begin() + (position + 1) * count);
        EXPECT_TRUE(bitwiseEqual(output.read(comm), mine));
        // In place, as ZeRO reduces a bucket: the member's part of the input is its output.
        comm.reduceScatter(group, input.get(), input.get() + position * count, count, op);
        std::vector<T> reduced = input.read(comm);
        EXPECT_TRUE(bitwiseEqual(std::vector<T>(reduced.begin() + position * count,
                                                reduced.begin() + (position + 1) * count),
                                 mine));
      }
      // all_gather out of place, then in place (the input is the member's own part)
      DeviceVector<T> part(inputOf<T>(rank, count, seed));
      DeviceVector<T> gathered{std::vector<T>(count * members)};
      comm.allGather(group, part.get(), gathered.get(), count);
      EXPECT_TRUE(bitwiseEqual(gathered.read(comm), serialGather<T>(group, count, seed)));
      std::vector<T> own(count * members);
      std::vector<T> mine = inputOf<T>(rank, count, seed);
      std::copy(mine.begin(), mine.end(), own.begin() + position * count);
      DeviceVector<T> inPlace(own);
      comm.allGather(group, inPlace.get() + position * count, inPlace.get(), count);
      EXPECT_TRUE(bitwiseEqual(inPlace.read(comm), serialGather<T>(group, count, seed)));
    }
  }
  // all_to_all with counts that differ per pair (zero for some), as the token exchange has.
  for (const std::vector<int64_t> &group : {all, reversed}) {
    size_t position = positionIn(group, rank);
    if (position == group.size())
      continue;
    AllToAllCase c{group, seed};
    DeviceVector<T> input(c.input<T>(position));
    std::vector<T> expected = c.expected<T>(position);
    DeviceVector<T> output{std::vector<T>(expected.size())};
    comm.allToAll(group, input.get(), c.sendCounts(position), output.get(),
                  c.recvCounts(position));
    EXPECT_TRUE(bitwiseEqual(output.read(comm), expected)) << "all_to_all " << formatGroup(group);
  }
  // A ring of transfers whose receives are posted in the other tag order.
  if (world > 1) {
    int64_t next = (rank + 1) % world, previous = (rank + world - 1) % world;
    DeviceVector<T> first(inputOf<T>(rank, 33, 5)), second(inputOf<T>(rank, 33, 6));
    DeviceVector<T> gotFirst{std::vector<T>(33)}, gotSecond{std::vector<T>(33)};
    comm.exchange({Transfer::send(next, 5, first.get(), 33),
                   Transfer::send(next, 6, second.get(), 33),
                   Transfer::recv(previous, 6, gotSecond.get(), 33),
                   Transfer::recv(previous, 5, gotFirst.get(), 33)});
    EXPECT_TRUE(bitwiseEqual(gotFirst.read(comm), inputOf<T>(previous, 33, 5)));
    EXPECT_TRUE(bitwiseEqual(gotSecond.read(comm), inputOf<T>(previous, 33, 6)));
  }
}

TEST(CudaLocalComm, CollectivesAreTheSerialFoldBitwise) {
  SKIP_WITHOUT_DEVICES(1);
  CudaLocalWorld world(4);
  expectAllSucceeded(world.run([](CudaCommunicator &comm) {
    checkCollectives<float>(comm, 11);
    checkCollectives<double>(comm, 12);
  }));
}

TEST(CudaLocalComm, CallsAreOrderedAgainstTheComputeStream) {
  SKIP_WITHOUT_DEVICES(1);
  CudaLocalWorld world(3);
  expectAllSucceeded(world.run([](CudaCommunicator &comm) {
    cudaStream_t stream;
    PARC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "test stream");
    comm.setComputeStream(stream);
    std::vector<float> values(4096, float(comm.rank() + 1));
    DeviceVector<float> data(values);
    // Kernels before and after the collective, with no host wait in between.
    cuda::scale(data.get(), 4096, 2.0, stream);
    comm.allReduce({0, 1, 2}, data.get(), 4096);
    cuda::scale(data.get(), 4096, 3.0, stream);
    // synchronize() covers the calls, not the compute work queued after them.
    PARC_CUDA_CHECK(cudaStreamSynchronize(stream), "test stream");
    EXPECT_EQ(data.read(comm), std::vector<float>(4096, 36.0f)); // (2 + 4 + 6) * 3
    cudaStreamDestroy(stream);
  }));
}

TEST(CudaLocalComm, MismatchedCollectivesFail) {
  SKIP_WITHOUT_DEVICES(1);
  CudaLocalWorld world(2, 0, CommOptions{10});
  std::vector<std::string> errors = world.run([](CudaCommunicator &comm) {
    DeviceVector<float> data{std::vector<float>(4, 1.0f)};
    comm.allReduce({0, 1}, data.get(), comm.rank() == 0 ? 3 : 4);
  });
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[0].find("mismatched collectives over group [0, 1]"), std::string::npos)
      << errors[0];
}

TEST(NCCLComm, OneRankOnOneDevice) {
  SKIP_WITHOUT_DEVICES(1);
  LocalWorld host(1);
  std::unique_ptr<NCCLCommunicator> comm = NCCLCommunicator::create(host.communicator(0), 0);
  comm->splitGroups({{0}, {}});
  std::vector<float> values = inputOf<float>(0, 100, 3);
  DeviceVector<float> data(values), received{std::vector<float>(100)}, gathered(values);
  comm->allReduce({0}, data.get(), 100);
  comm->exchange(
      {Transfer::send(0, 1, data.get(), 100), Transfer::recv(0, 1, received.get(), 100)});
  comm->allGather({0}, data.get(), gathered.get(), 100);
  EXPECT_TRUE(bitwiseEqual(data.read(*comm), values));
  EXPECT_TRUE(bitwiseEqual(received.read(*comm), values));
  EXPECT_TRUE(bitwiseEqual(gathered.read(*comm), values));
}

TEST(NCCLComm, OneRankPerDevice) {
  SKIP_WITHOUT_DEVICES(2);
  LocalWorld host(std::min(deviceCount(), 4));
  expectAllSucceeded(host.run([](Communicator &hostComm) {
    int device = static_cast<int>(hostComm.rank());
    PARC_CUDA_CHECK(cudaSetDevice(device), "test device");
    std::unique_ptr<NCCLCommunicator> comm = NCCLCommunicator::create(hostComm, device);
    std::vector<int64_t> all(hostComm.world());
    std::iota(all.begin(), all.end(), 0);
    comm->splitGroups({all}); // the reversed group is created on first use instead
    checkCollectives<float>(*comm, 21);
    checkCollectives<double>(*comm, 22);
  }));
}

} // namespace
