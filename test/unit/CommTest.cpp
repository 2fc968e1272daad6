//===- CommTest.cpp - The local communicator: ranks as threads or fibers --===//

#include "CommReference.h"

#include "parc/Runtime/Communicator.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <thread>

using namespace parc::runtime;
using namespace parc::runtime::test;

namespace {

using Clock = std::chrono::steady_clock;

/// Groups of a world of `world` ranks: whole, reversed, even, odd, non-contiguous pairs, and
/// singletons, so that collectives on disjoint groups run at the same time.
std::vector<std::vector<int64_t>> groupsOf(int64_t world) {
  std::vector<int64_t> all(world);
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::vector<int64_t>> candidates = {all, {all.rbegin(), all.rend()}};
  std::vector<int64_t> even, odd;
  for (int64_t rank : all)
    (rank % 2 ? odd : even).push_back(rank);
  candidates.push_back(even);
  candidates.push_back(odd);
  if (world >= 4) {
    candidates.push_back({1, 3});
    candidates.push_back({3, 0, 2});
  }
  if (world >= 8)
    candidates.push_back({6, 1});
  candidates.push_back({world - 1});
  std::vector<std::vector<int64_t>> groups;
  for (std::vector<int64_t> &group : candidates)
    if (!group.empty() && std::find(groups.begin(), groups.end(), group) == groups.end())
      groups.push_back(std::move(group));
  return groups;
}

bool contains(llvm::ArrayRef<int64_t> group, int64_t rank) {
  return std::find(group.begin(), group.end(), rank) != group.end();
}

void expectAllSucceeded(const std::vector<std::string> &errors) {
  for (size_t rank = 0; rank < errors.size(); ++rank)
    EXPECT_EQ(errors[rank], "") << "rank " << rank;
}

// Counts that do and do not divide by the group size, and one smaller than it.
constexpr size_t Counts[] = {0, 1, 7, 96, 1001};

/// A world's ranks, as threads (fiberThreads 0) or as fibers on that many threads: on one, a
/// wait that spins instead of parking would hang the test.
struct Ranks {
  int64_t world;
  int64_t fiberThreads;
};

class LocalCollectives : public testing::TestWithParam<Ranks> {};

template <typename T> void checkAllReduce(Ranks ranks, ReduceOp op) {
  int64_t world = ranks.world;
  LocalWorld local(world, {/*timeoutSeconds=*/20}, ranks.fiberThreads);
  std::vector<std::vector<int64_t>> groups = groupsOf(world);
  std::atomic<int> checked{0};
  expectAllSucceeded(local.run([&](Communicator &comm) {
    for (size_t g = 0; g < groups.size(); ++g) {
      if (!contains(groups[g], comm.rank()))
        continue;
      for (size_t count : Counts) {
        uint64_t seed = g * 100 + count;
        std::vector<T> data = inputOf<T>(comm.rank(), count, seed);
        comm.allReduce(groups[g], data.data(), data.size(), op);
        EXPECT_TRUE(bitwiseEqual(data, serialFold<T>(groups[g], count, seed, op)))
            << "group " << formatGroup(groups[g]) << " count " << count << " rank " << comm.rank();
        ++checked;
      }
    }
  }));
  EXPECT_GT(checked, 0);
}

TEST_P(LocalCollectives, AllReduceSumF64) { checkAllReduce<double>(GetParam(), ReduceOp::Sum); }
TEST_P(LocalCollectives, AllReduceSumF32) { checkAllReduce<float>(GetParam(), ReduceOp::Sum); }
TEST_P(LocalCollectives, AllReduceMaxF64) { checkAllReduce<double>(GetParam(), ReduceOp::Max); }
TEST_P(LocalCollectives, AllReduceMaxF32) { checkAllReduce<float>(GetParam(), ReduceOp::Max); }

template <typename T> void checkReduceScatter(Ranks ranks) {
  int64_t world = ranks.world;
  LocalWorld local(world, {20}, ranks.fiberThreads);
  std::vector<std::vector<int64_t>> groups = groupsOf(world);
  expectAllSucceeded(local.run([&](Communicator &comm) {
    for (size_t g = 0; g < groups.size(); ++g) {
      auto it = std::find(groups[g].begin(), groups[g].end(), comm.rank());
      if (it == groups[g].end())
        continue;
      size_t position = it - groups[g].begin(), members = groups[g].size();
      // 1500: more than one of the fold's blocks (4096 bytes) a part.
      for (size_t part : {size_t(0), size_t(1), size_t(33), size_t(1500)}) {
        uint64_t seed = 7 + g * 100 + part;
        std::vector<T> input = inputOf<T>(comm.rank(), part * members, seed);
        std::vector<T> output(part, T(-1));
        comm.reduceScatter(groups[g], input.data(), output.data(), part);
        std::vector<T> full = serialFold<T>(groups[g], part * members, seed, ReduceOp::Sum);
        std::vector<T> expected(full.begin() + position * part,
                                full.begin() + (position + 1) * part);
        EXPECT_TRUE(bitwiseEqual(output, expected))
            << "group " << formatGroup(groups[g]) << " part " << part;
        // In place, as ZeRO reduces a bucket: the member's part of the input is its output.
        comm.reduceScatter(groups[g], input.data(), input.data() + position * part, part);
        EXPECT_TRUE(bitwiseEqual(std::vector<T>(input.begin() + position * part,
                                                input.begin() + (position + 1) * part),
                                 expected))
            << "in place, group " << formatGroup(groups[g]) << " part " << part;
      }
    }
  }));
}

TEST_P(LocalCollectives, ReduceScatterF64) { checkReduceScatter<double>(GetParam()); }
TEST_P(LocalCollectives, ReduceScatterF32) { checkReduceScatter<float>(GetParam()); }

template <typename T> void checkAllGather(Ranks ranks) {
  int64_t world = ranks.world;
  LocalWorld local(world, {20}, ranks.fiberThreads);
  std::vector<std::vector<int64_t>> groups = groupsOf(world);
  expectAllSucceeded(local.run([&](Communicator &comm) {
    for (size_t g = 0; g < groups.size(); ++g) {
      auto it = std::find(groups[g].begin(), groups[g].end(), comm.rank());
      if (it == groups[g].end())
        continue;
      size_t position = it - groups[g].begin(), members = groups[g].size();
      for (size_t part : {size_t(0), size_t(5)}) {
        uint64_t seed = 13 + g * 100 + part;
        std::vector<T> expected = serialGather<T>(groups[g], part, seed);
        std::vector<T> input = inputOf<T>(comm.rank(), part, seed);
        std::vector<T> output(part * members, T(-1));
        comm.allGather(groups[g], input.data(), output.data(), part);
        EXPECT_TRUE(bitwiseEqual(output, expected)) << "group " << formatGroup(groups[g]);

        // In place, as ZeRO's all_gather_params holds its own partition inside the buffer.
        std::vector<T> inPlace(part * members, T(-1));
        std::copy(input.begin(), input.end(), inPlace.begin() + position * part);
        comm.allGather(groups[g], inPlace.data() + position * part, inPlace.data(), part);
        EXPECT_TRUE(bitwiseEqual(inPlace, expected)) << "in place, " << formatGroup(groups[g]);
      }
    }
  }));
}

TEST_P(LocalCollectives, AllGatherF64) { checkAllGather<double>(GetParam()); }
TEST_P(LocalCollectives, AllGatherF32) { checkAllGather<float>(GetParam()); }

template <typename T> void checkAllToAll(Ranks ranks) {
  int64_t world = ranks.world;
  LocalWorld local(world, {20}, ranks.fiberThreads);
  std::vector<std::vector<int64_t>> groups = groupsOf(world);
  expectAllSucceeded(local.run([&](Communicator &comm) {
    for (size_t g = 0; g < groups.size(); ++g) {
      size_t position = positionIn(groups[g], comm.rank());
      if (position == groups[g].size())
        continue;
      for (uint64_t seed : {0, 1, 2}) {
        AllToAllCase c{groups[g], seed + g * 10};
        std::vector<T> input = c.input<T>(position), expected = c.expected<T>(position);
        std::vector<T> output(expected.size(), T(-1));
        comm.allToAll(groups[g], ElementTypeOf<T>::value, input.data(), c.sendCounts(position),
                      output.data(), c.recvCounts(position));
        EXPECT_TRUE(bitwiseEqual(output, expected))
            << "group " << formatGroup(groups[g]) << " seed " << seed << " rank " << comm.rank();
      }
    }
  }));
}

TEST_P(LocalCollectives, AllToAllF64) { checkAllToAll<double>(GetParam()); }
TEST_P(LocalCollectives, AllToAllF32) { checkAllToAll<float>(GetParam()); }

TEST_P(LocalCollectives, BarrierAndAgree) {
  int64_t world = GetParam().world;
  LocalWorld local(world, {20}, GetParam().fiberThreads);
  std::atomic<int> arrived{0};
  expectAllSucceeded(local.run([&](Communicator &comm) {
    ++arrived;
    comm.barrier(groupsOf(world)[0]);
    EXPECT_EQ(arrived, world);
    std::vector<std::string> ids = comm.agree("plan-" + std::string(comm.rank(), 'x'));
    ASSERT_EQ(ids.size(), static_cast<size_t>(world));
    for (int64_t rank = 0; rank < world; ++rank)
      EXPECT_EQ(ids[rank], "plan-" + std::string(rank, 'x'));
  }));
}

INSTANTIATE_TEST_SUITE_P(Worlds, LocalCollectives,
                         testing::Values(Ranks{1, 0}, Ranks{2, 0}, Ranks{4, 0}, Ranks{8, 0},
                                         Ranks{4, 1}, Ranks{8, 1}, Ranks{8, 3}),
                         [](const testing::TestParamInfo<Ranks> &info) {
                           return "world" + std::to_string(info.param.world) +
                                  (info.param.fiberThreads
                                       ? "_fibers" + std::to_string(info.param.fiberThreads)
                                       : "");
                         });

/// The LocalComm tests take the fiber threads as their parameter.
class LocalComm : public testing::TestWithParam<int64_t> {};

TEST(LocalAccumulate, OrderMattersForTheInputs) {
  // Without this the bitwise checks could not tell list order from any other order.
  std::vector<int64_t> group = {0, 1, 2, 3}, reversed = {3, 2, 1, 0};
  EXPECT_FALSE(bitwiseEqual(serialFold<double>(group, 1001, 5, ReduceOp::Sum),
                            serialFold<double>(reversed, 1001, 5, ReduceOp::Sum)));
}

TEST_P(LocalComm, DeterministicUnderRandomTiming) {
  std::vector<int64_t> group = {2, 0, 3, 1};
  std::vector<double> expected = serialFold<double>(group, 257, 99, ReduceOp::Sum);
  for (int run = 0; run < 20; ++run) {
    LocalWorld local(4, {20}, GetParam());
    expectAllSucceeded(local.run([&](Communicator &comm) {
      std::mt19937 random(run * 4 + comm.rank());
      std::uniform_int_distribution<int> pause(0, 2000);
      for (int repeat = 0; repeat < 3; ++repeat) {
        std::this_thread::sleep_for(std::chrono::microseconds(pause(random)));
        std::vector<double> data = inputOf<double>(comm.rank(), 257, 99);
        comm.allReduce(group, data.data(), data.size());
        EXPECT_TRUE(bitwiseEqual(data, expected)) << "run " << run << " rank " << comm.rank();
      }
    }));
  }
}

TEST_P(LocalComm, RecvMatchesByTagInAnyOrder) {
  LocalWorld local(2, {20}, GetParam());
  expectAllSucceeded(local.run([&](Communicator &comm) {
    if (comm.rank() == 0) {
      for (int64_t tag = 0; tag < 6; ++tag) {
        double value = 10.0 * tag;
        comm.send(1, tag, &value, 1);
      }
      double second = 51; // same tag twice: first sent, first received
      comm.send(1, 5, &second, 1);
      return;
    }
    for (int64_t tag : {5, 2, 0, 4, 1, 3}) {
      double value = -1;
      comm.recv(0, tag, &value, 1);
      EXPECT_EQ(value, 10.0 * tag);
    }
    double value = -1;
    comm.recv(0, 5, &value, 1);
    EXPECT_EQ(value, 51);
  }));
}

TEST_P(LocalComm, ExchangeWhereEveryNeighbourSendsFirst) {
  LocalWorld local(4, {20}, GetParam());
  expectAllSucceeded(local.run([&](Communicator &comm) {
    int64_t next = (comm.rank() + 1) % 4, previous = (comm.rank() + 3) % 4;
    std::vector<float> out(1000, float(comm.rank())), in(1000, -1);
    comm.exchange({Transfer::send(next, 1, out.data(), out.size()),
                   Transfer::recv(previous, 1, in.data(), in.size())});
    EXPECT_EQ(in, std::vector<float>(1000, float(previous)));
  }));
}

TEST_P(LocalComm, TimeoutNamesTheCollective) {
  LocalWorld local(4, {0.2}, GetParam());
  Clock::time_point start = Clock::now();
  std::vector<std::string> errors = local.run([&](Communicator &comm) {
    if (comm.rank() == 1) {
      std::vector<double> data(3, 1.0);
      comm.allReduce({1, 3}, data.data(), data.size());
    }
  });
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(errors[1], "timed out after 0.2 s in all_reduce over group [1, 3] on rank 1, "
                       "waiting for rank 3");
  EXPECT_EQ(errors[0], "");
  EXPECT_GE(seconds, 0.2);
  EXPECT_LT(seconds, 5);
}

TEST_P(LocalComm, TimeoutNamesThePeerAndTag) {
  LocalWorld local(2, {0.2}, GetParam());
  std::vector<std::string> errors = local.run([&](Communicator &comm) {
    if (comm.rank() == 0) {
      double value;
      comm.recv(1, 7, &value, 1);
    }
  });
  EXPECT_EQ(errors[0], "timed out after 0.2 s in recv from rank 1 with tag 7 on rank 0, "
                       "waiting for the matching send of rank 1");
}

TEST_P(LocalComm, TimeoutOfOneRankWakesTheOthers) {
  LocalWorld local(3, {0.2}, GetParam());
  local.communicator(2).setTimeoutSeconds(30);
  Clock::time_point start = Clock::now();
  std::vector<std::string> errors = local.run([&](Communicator &comm) {
    double value = 0;
    if (comm.rank() == 0)
      comm.barrier({0, 1});
    if (comm.rank() == 2)
      comm.recv(1, 0, &value, 1);
  });
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5);
  EXPECT_EQ(errors[0], "timed out after 0.2 s in barrier over group [0, 1] on rank 0, waiting "
                       "for rank 1");
  EXPECT_EQ(errors[2],
            "recv from rank 1 with tag 0 on rank 2 gave up because the job failed: " + errors[0]);
}

// Rank 2 times out first, but it only waits for rank 0, which is stuck in a cycle of waits with
// rank 1 that rank 0 entered first: the report is rank 0's wait, whose thread throws it.
TEST_P(LocalComm, TimeoutReportsTheWaitTheStallStartedWith) {
  LocalWorld local(3, {30}, GetParam());
  local.communicator(2).setTimeoutSeconds(0.2);
  Clock::time_point start = Clock::now();
  std::vector<std::string> errors = local.run([&](Communicator &comm) {
    double value = 0;
    if (comm.rank() == 0)
      comm.recv(1, 0, &value, 1);
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      comm.recv(0, 0, &value, 1);
    }
    if (comm.rank() == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      comm.allReduce({0, 2}, &value, 1);
    }
  });
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5);
  EXPECT_EQ(errors[0], "timed out after 0.2 s in recv from rank 1 with tag 0 on rank 0, "
                       "waiting for the matching send of rank 1");
  EXPECT_EQ(errors[1],
            "recv from rank 0 with tag 0 on rank 1 gave up because the job failed: " + errors[0]);
  EXPECT_EQ(errors[2],
            "all_reduce over group [0, 2] on rank 2 gave up because the job failed: " + errors[0]);
}

TEST_P(LocalComm, AbortWakesEveryWaitingRank) {
  LocalWorld local(4, {30}, GetParam());
  Clock::time_point start = Clock::now();
  std::vector<std::string> errors = local.run([&](Communicator &comm) {
    std::vector<double> data(4, 1.0);
    switch (comm.rank()) {
    case 0:
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      return comm.abort("stuck in instruction 12");
    case 1:
      return comm.allReduce({0, 1, 2, 3}, data.data(), data.size());
    case 2:
      return comm.recv(0, 3, data.data(), data.size());
    default:
      return comm.barrier({1, 3});
    }
  });
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5);
  EXPECT_EQ(errors[0], "rank 0 aborted: stuck in instruction 12");
  for (int rank = 1; rank < 4; ++rank)
    EXPECT_NE(errors[rank].find("gave up because the job failed: rank 0 aborted: stuck in "
                                "instruction 12"),
              std::string::npos)
        << errors[rank];
  EXPECT_EQ(local.failure(), "rank 0 aborted: stuck in instruction 12");
  // A failed world refuses every later call at once.
  EXPECT_THROW(local.communicator(1).barrier({1}), CommError);
}

TEST_P(LocalComm, ARankThatThrowsWakesTheOthers) {
  LocalWorld local(2, {30}, GetParam());
  Clock::time_point start = Clock::now();
  std::vector<std::string> errors = local.run([&](Communicator &comm) {
    if (comm.rank() == 0)
      throw std::runtime_error("matmul shapes disagree");
    comm.barrier({0, 1});
  });
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5);
  EXPECT_EQ(errors[0], "matmul shapes disagree");
  EXPECT_EQ(errors[1], "barrier over group [0, 1] on rank 1 gave up because the job failed: "
                       "rank 0 failed: matmul shapes disagree");
}

// A rank that waits elsewhere than in the local world (NCCL's kernels on a GPU) polls for a
// peer's failure instead of waiting until its deadline.
TEST_P(LocalComm, PeersSeeTheJobFailureWithoutWaiting) {
  LocalWorld local(2, {30}, GetParam());
  std::vector<std::string> errors = local.run([&](Communicator &comm) {
    if (comm.rank() == 0)
      throw std::runtime_error("attention shapes disagree");
    Clock::time_point start = Clock::now();
    while (comm.jobFailure().empty() &&
           std::chrono::duration<double>(Clock::now() - start).count() < 10)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(comm.jobFailure(), "rank 0 failed: attention shapes disagree");
  });
  EXPECT_EQ(errors[1], "");
}

TEST_P(LocalComm, MismatchedCollectivesFail) {
  LocalWorld local(2, {5}, GetParam());
  std::vector<std::string> errors = local.run([&](Communicator &comm) {
    std::vector<float> data(4 + comm.rank());
    comm.allReduce({0, 1}, data.data(), data.size());
  });
  std::string expected0 = "mismatched collectives over group [0, 1]: rank 0 called all_reduce "
                          "(sum) of 4 x f32, rank 1 called all_reduce (sum) of 5 x f32 "
                          "(collective 0 of this group)";
  std::string expected1 = "mismatched collectives over group [0, 1]: rank 1 called all_reduce "
                          "(sum) of 5 x f32, rank 0 called all_reduce (sum) of 4 x f32 "
                          "(collective 0 of this group)";
  // Whichever rank arrives second reports; the first is woken by it.
  EXPECT_TRUE(errors[0] == expected1 || errors[1] == expected0) << errors[0] << errors[1];
}

TEST_P(LocalComm, AllToAllWithMismatchedCountsFails) {
  // Rank 1 expects 3 elements from rank 0, which sends it 2.
  LocalWorld local(2, {5}, GetParam());
  std::vector<std::string> errors = local.run([&](Communicator &comm) {
    std::vector<double> input(4, 1.0), output(5, 0.0);
    std::vector<size_t> send = {2, 2}, recv = comm.rank() == 0 ? std::vector<size_t>{2, 2}
                                                                : std::vector<size_t>{3, 2};
    comm.allToAll(std::vector<int64_t>{0, 1}, ElementType::F64, input.data(), send,
                  output.data(), recv);
  });
  EXPECT_NE(errors[1].find("rank 0 sends 2 elements but 3 were expected"), std::string::npos)
      << errors[1];
}

TEST_P(LocalComm, MismatchedMessageFails) {
  LocalWorld local(2, {5}, GetParam());
  std::vector<std::string> errors = local.run([&](Communicator &comm) {
    std::vector<double> data(3);
    if (comm.rank() == 0)
      comm.send(1, 4, data.data(), 3);
    else
      comm.recv(0, 4, data.data(), 2);
  });
  EXPECT_EQ(errors[1], "recv from rank 0 with tag 4 on rank 1: rank 0 sent 3 x f64 but 2 x "
                       "f64 were expected");
}

TEST_P(LocalComm, CallerOutsideTheGroupFails) {
  LocalWorld local(3, {5}, GetParam());
  std::vector<std::string> errors = local.run([&](Communicator &comm) {
    if (comm.rank() == 2)
      comm.barrier({0, 1});
  });
  EXPECT_EQ(errors[2], "barrier over group [0, 1] on rank 2: this rank is not a member; only "
                       "members may call a group's collectives");
}

// An all_reduce is folded by its last member in the others' buffers while they wait, and their
// waits do not time out on a fold: a fold that throws must still free them at once.
TEST_P(LocalComm, AFoldThatFailsFailsEveryMember) {
  LocalWorld local(3, {30}, GetParam());
  Clock::time_point start = Clock::now();
  std::vector<std::string> errors = local.run([&](Communicator &comm) {
    std::vector<uint16_t> halves(4, 0x3f80); // bf16 ones, which the host cannot add
    comm.allReduce({0, 1, 2}, ReduceOp::Sum, ElementType::BF16, halves.data(), halves.size());
  });
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5);
  for (const std::string &error : errors)
    EXPECT_NE(error.find("a host communicator cannot reduce bf16 buffers"), std::string::npos)
        << error;
}

// The fold sums the members' buffers where they lie, so one buffer passed by two ranks would
// be summed into itself: refused, on every member.
TEST_P(LocalComm, AllReduceRefusesOverlappingBuffers) {
  LocalWorld local(2, {30}, GetParam());
  std::vector<double> shared(8, 1.0);
  std::vector<std::string> errors = local.run([&](Communicator &comm) {
    comm.allReduce({0, 1}, shared.data() + comm.rank(), 4);
  });
  for (const std::string &error : errors)
    EXPECT_NE(error.find("ranks 0 and 1 passed overlapping buffers"), std::string::npos) << error;
}

// A reduce_scatter and an all_gather read and write the members' buffers where they lie too:
// a member's own part may be its other buffer (in place), any other overlap is refused.
TEST_P(LocalComm, ReduceScatterRefusesAnOutputInsideAnotherPart) {
  LocalWorld local(2, {30}, GetParam());
  std::vector<std::string> errors = local.run([&](Communicator &comm) {
    // The start of the input: rank 0's own part for rank 0, but for rank 1 the part of its
    // input that the fold reads for rank 0.
    std::vector<double> input(8, 1.0);
    comm.reduceScatter({0, 1}, input.data(), input.data(), 4);
  });
  for (const std::string &error : errors)
    EXPECT_NE(error.find("rank 1 passed an input and output that overlap other than at its "
                         "own part"),
              std::string::npos)
        << error;
}

TEST_P(LocalComm, AllGatherRefusesOverlappingOutputs) {
  LocalWorld local(2, {30}, GetParam());
  std::vector<double> shared(6, 0.0);
  std::vector<std::string> errors = local.run([&](Communicator &comm) {
    double part[2] = {double(comm.rank()), double(comm.rank())};
    comm.allGather({0, 1}, part, shared.data() + 2 * comm.rank(), 2);
  });
  for (const std::string &error : errors)
    EXPECT_NE(error.find("ranks 0 and 1 passed overlapping buffers"), std::string::npos) << error;
}

TEST(LocalAccumulate, MaxPropagatesNaN) {
  double accumulator[3] = {1, NAN, 5};
  double input[3] = {NAN, 2, 4};
  accumulate(ReduceOp::Max, ElementType::F64, accumulator, input, 3);
  EXPECT_TRUE(std::isnan(accumulator[0]));
  EXPECT_TRUE(std::isnan(accumulator[1]));
  EXPECT_EQ(accumulator[2], 5);
}

// reduceAll is the fold of the local all_reduce: the bits of accumulating into the first
// buffer in member order and copying that out, for any number of members.
TEST(LocalAccumulate, ReduceAllIsAccumulateInMemberOrder) {
  for (size_t members = 1; members <= 4; ++members)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      std::vector<std::vector<float>> buffers(members);
      for (size_t i = 0; i < members; ++i)
        for (int k = 0; k < 37; ++k) // sums whose rounding depends on the order
          buffers[i].push_back(float(k % 5 == int(i) ? NAN : 1e7 * (k % 3) + 0.3 * i - k));
      if (op == ReduceOp::Sum)
        for (std::vector<float> &buffer : buffers)
          for (float &value : buffer)
            value = std::isnan(value) ? 1.5f : value;
      std::vector<float> folded = buffers[0];
      for (size_t i = 1; i < members; ++i)
        accumulate(op, ElementType::F32, folded.data(), buffers[i].data(), folded.size());
      std::vector<void *> pointers;
      for (std::vector<float> &buffer : buffers)
        pointers.push_back(buffer.data());
      reduceAll(op, ElementType::F32, pointers, folded.size());
      for (size_t i = 0; i < members; ++i)
        for (size_t k = 0; k < folded.size(); ++k) {
          if (std::isnan(folded[k]))
            EXPECT_TRUE(std::isnan(buffers[i][k])) << members << " members, element " << k;
          else
            EXPECT_EQ(buffers[i][k], folded[k]) << members << " members, element " << k;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(RanksAs, LocalComm, testing::Values(0, 1, 2),
                         [](const testing::TestParamInfo<int64_t> &info) {
                           return info.param ? "fibers" + std::to_string(info.param) : "threads";
                         });

} // namespace
