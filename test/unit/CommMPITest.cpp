//===- CommMPITest.cpp - The MPI communicator under mpirun -----------------===//
//
// Three uses, all registered with ctest by runtime/comm/CMakeLists.txt:
//   mpirun -np 4 parc_comm_mpi_tests              the collectives, transfers and agree, as
//                                                 gtest tests that every rank runs;
//   mpirun -np 4 parc_comm_mpi_tests --mode=M     a job that must fail: M is recv-timeout (a
//                                                 recv nobody answers), killed-rank (a rank
//                                                 dies in the middle of a collective) or
//                                                 group-creation-timeout (a member never
//                                                 joins its group);
//   parc_comm_mpi_tests --expect-job-failure=M -- COMMAND...
//                                                 runs COMMAND and checks that it failed
//                                                 quickly, and how.
//
//===----------------------------------------------------------------------===//

#include "CommReference.h"

#include "parc/Runtime/Communicator.h"

#include "gtest/gtest.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <numeric>
#include <random>
#include <sys/wait.h>
#include <thread>

using namespace parc::runtime;
using namespace parc::runtime::test;

namespace {

using Clock = std::chrono::steady_clock;

MPICommunicator *comm = nullptr;

// Whole, reversed, a non-contiguous pair, an unsorted triple, another pair, a singleton.
const std::vector<std::vector<int64_t>> Groups = {{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 3},
                                                  {3, 0, 2},    {0, 2},       {2}};
// Counts smaller than, not dividing and dividing the group size, and one large enough that
// MPI switches from eager sends to its rendezvous protocol.
constexpr size_t Counts[] = {0, 1, 2, 7, 1001, 20011};

bool isMember(llvm::ArrayRef<int64_t> group) {
  return positionIn(group, comm->rank()) < group.size();
}

template <typename T> void checkAllReduce(ReduceOp op) {
  for (size_t g = 0; g < Groups.size(); ++g) {
    if (!isMember(Groups[g]))
      continue;
    for (size_t count : Counts) {
      uint64_t seed = g * 1000 + count;
      std::vector<T> data = inputOf<T>(comm->rank(), count, seed);
      comm->allReduce(Groups[g], data.data(), data.size(), op);
      EXPECT_TRUE(bitwiseEqual(data, serialFold<T>(Groups[g], count, seed, op)))
          << "rank " << comm->rank() << " group " << formatGroup(Groups[g]) << " count " << count;
    }
  }
}

TEST(MPIComm, AllReduceSumF64) { checkAllReduce<double>(ReduceOp::Sum); }
TEST(MPIComm, AllReduceSumF32) { checkAllReduce<float>(ReduceOp::Sum); }
TEST(MPIComm, AllReduceMaxF64) { checkAllReduce<double>(ReduceOp::Max); }
TEST(MPIComm, AllReduceMaxF32) { checkAllReduce<float>(ReduceOp::Max); }

template <typename T> void checkReduceScatterAndAllGather() {
  for (size_t g = 0; g < Groups.size(); ++g) {
    if (!isMember(Groups[g]))
      continue;
    size_t position = positionIn(Groups[g], comm->rank()), members = Groups[g].size();
    for (size_t part : {size_t(0), size_t(1), size_t(333)}) {
      uint64_t seed = 17 + g * 1000 + part;
      std::vector<T> input = inputOf<T>(comm->rank(), part * members, seed);
      std::vector<T> output(part, T(-1));
      comm->reduceScatter(Groups[g], input.data(), output.data(), part);
      std::vector<T> full = serialFold<T>(Groups[g], part * members, seed, ReduceOp::Sum);
      EXPECT_TRUE(bitwiseEqual(output, std::vector<T>(full.begin() + position * part,
                                                      full.begin() + (position + 1) * part)))
          << "reduce_scatter, rank " << comm->rank() << " group " << formatGroup(Groups[g]);
      comm->reduceScatter(Groups[g], input.data(), input.data() + position * part, part);
      EXPECT_TRUE(bitwiseEqual(std::vector<T>(input.begin() + position * part,
                                              input.begin() + (position + 1) * part),
                               output))
          << "reduce_scatter in place, rank " << comm->rank();

      std::vector<T> mine = inputOf<T>(comm->rank(), part, seed);
      std::vector<T> gathered(part * members, T(-1));
      comm->allGather(Groups[g], mine.data(), gathered.data(), part);
      std::vector<T> expected = serialGather<T>(Groups[g], part, seed);
      EXPECT_TRUE(bitwiseEqual(gathered, expected))
          << "all_gather, rank " << comm->rank() << " group " << formatGroup(Groups[g]);

      std::vector<T> inPlace(part * members, T(-1));
      std::copy(mine.begin(), mine.end(), inPlace.begin() + position * part);
      comm->allGather(Groups[g], inPlace.data() + position * part, inPlace.data(), part);
      EXPECT_TRUE(bitwiseEqual(inPlace, expected))
          << "all_gather in place, rank " << comm->rank() << " group " << formatGroup(Groups[g]);
    }
  }
}

template <typename T> void checkAllToAll() {
  for (size_t g = 0; g < Groups.size(); ++g) {
    size_t position = positionIn(Groups[g], comm->rank());
    if (position == Groups[g].size())
      continue;
    for (uint64_t seed : {0, 1, 2}) {
      AllToAllCase c{Groups[g], seed + g * 10};
      std::vector<T> input = c.input<T>(position), expected = c.expected<T>(position);
      std::vector<T> output(expected.size(), T(-1));
      comm->allToAll(Groups[g], ElementTypeOf<T>::value, input.data(), c.sendCounts(position),
                     output.data(), c.recvCounts(position));
      EXPECT_TRUE(bitwiseEqual(output, expected))
          << "all_to_all, rank " << comm->rank() << " group " << formatGroup(Groups[g]);
    }
  }
}

TEST(MPIComm, AllToAllF64) { checkAllToAll<double>(); }
TEST(MPIComm, AllToAllF32) { checkAllToAll<float>(); }

TEST(MPIComm, ReduceScatterAndAllGatherF64) { checkReduceScatterAndAllGather<double>(); }
TEST(MPIComm, ReduceScatterAndAllGatherF32) { checkReduceScatterAndAllGather<float>(); }

TEST(MPIComm, DeterministicUnderRandomTiming) {
  std::vector<int64_t> group = {2, 0, 3, 1};
  std::vector<double> expected = serialFold<double>(group, 4097, 99, ReduceOp::Sum);
  std::mt19937 random(comm->rank());
  std::uniform_int_distribution<int> pause(0, 3000);
  for (int run = 0; run < 20; ++run) {
    std::this_thread::sleep_for(std::chrono::microseconds(pause(random)));
    std::vector<double> data = inputOf<double>(comm->rank(), 4097, 99);
    comm->allReduce(group, data.data(), data.size());
    EXPECT_TRUE(bitwiseEqual(data, expected)) << "run " << run << " rank " << comm->rank();
  }
}

TEST(MPIComm, ExchangeWhereEveryNeighbourSendsFirst) {
  int64_t next = (comm->rank() + 1) % 4, previous = (comm->rank() + 3) % 4;
  // Large enough for the rendezvous protocol, where a send waits for its receive.
  std::vector<double> out(1 << 20, double(comm->rank())), in(1 << 20, -1);
  comm->exchange({Transfer::send(next, 7, out.data(), out.size()),
                  Transfer::recv(previous, 7, in.data(), in.size())});
  EXPECT_EQ(in, std::vector<double>(1 << 20, double(previous)));
}

TEST(MPIComm, RecvMatchesByTagInAnyOrder) {
  if (comm->rank() == 0) {
    std::vector<std::vector<float>> messages;
    std::vector<Transfer> sends;
    for (int64_t tag = 0; tag < 6; ++tag)
      messages.emplace_back(100000, float(tag));
    for (int64_t tag = 0; tag < 6; ++tag)
      sends.push_back(Transfer::send(3, tag, messages[tag].data(), messages[tag].size()));
    comm->exchange(sends);
  } else if (comm->rank() == 3) {
    for (int64_t tag : {5, 2, 0, 4, 1, 3}) {
      std::vector<float> message(100000, -1);
      comm->recv(0, tag, message.data(), message.size());
      EXPECT_EQ(message, std::vector<float>(100000, float(tag)));
    }
  }
  comm->barrier({0, 1, 2, 3});
}

TEST(MPIComm, AgreeAndBarrier) {
  // Lengths differ and one is empty, as they would for mismatched plan ids.
  std::string mine = comm->rank() == 2 ? "" : "plan-" + std::string(comm->rank(), 'x');
  std::vector<std::string> all = comm->agree(mine);
  ASSERT_EQ(all.size(), 4u);
  for (int64_t rank = 0; rank < 4; ++rank)
    EXPECT_EQ(all[rank], rank == 2 ? "" : "plan-" + std::string(rank, 'x'));
  if (comm->rank() % 2)
    comm->barrier({3, 1});
  comm->barrier({0, 1, 2, 3});
}

/// A schedule instruction whose recv never completes: the job must end, naming it.
int recvTimeoutJob() {
  comm->setTimeoutSeconds(comm->rank() == 0 ? 1 : 30);
  comm->barrier({0, 1, 2, 3});
  if (comm->rank() == 0) {
    try {
      double value;
      comm->recv(1, 99, &value, 1);
    } catch (const CommError &error) {
      comm->abort(std::string("instruction 3 (recv_act) is stuck: ") + error.what());
    }
  }
  comm->barrier({0, 1, 2, 3});
  return 0;
}

/// A rank that dies while the others wait for it in a collective.
int killedRankJob() {
  comm->setTimeoutSeconds(30);
  std::vector<double> data(1000, 1.0);
  comm->allReduce({0, 1, 2, 3}, data.data(), data.size());
  if (comm->rank() == 2)
    std::raise(SIGKILL);
  comm->allReduce({0, 1, 2, 3}, data.data(), data.size());
  return 0;
}

/// A group one member never joins: creating its communicator blocks inside MPI, where only
/// the watchdog can end the wait.
int groupCreationTimeoutJob() {
  comm->setTimeoutSeconds(comm->rank() == 3 ? 30 : 1);
  if (comm->rank() == 3) {
    double value;
    comm->recv(0, 1, &value, 1);
    return 0;
  }
  comm->barrier({0, 1, 2, 3});
  return 0;
}

std::string shellQuote(const std::string &word) {
  std::string quoted = "'";
  for (char c : word)
    quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

/// Runs the job and checks that it failed well before the surviving ranks' 30 s deadline,
/// i.e. that the job was taken down rather than left to time out or hang.
int expectJobFailure(const std::string &mode, const std::vector<std::string> &command) {
  std::string line;
  for (const std::string &word : command)
    line += shellQuote(word) + " ";
  Clock::time_point start = Clock::now();
  FILE *pipe = popen((line + "2>&1").c_str(), "r");
  if (!pipe) {
    std::perror("popen");
    return 1;
  }
  std::string output;
  char buffer[4096];
  while (size_t read = std::fread(buffer, 1, sizeof(buffer), pipe))
    output.append(buffer, read);
  int status = pclose(pipe);
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  int exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::printf("%s\n--- exit code %d after %.1f s\n", output.c_str(), exitCode, seconds);

  std::string expected;
  if (mode == "recv-timeout")
    expected = "error: rank 0 aborted: instruction 3 (recv_act) is stuck: timed out after 1 s "
               "in recv from rank 1 with tag 99 on rank 0";
  else if (mode == "group-creation-timeout")
    expected = "error: timed out after 1 s in creating the communicator of group [0, 1, 2, 3] "
               "on rank ";
  bool ok = true;
  if (exitCode == 0 || exitCode == 124) {
    std::printf("FAIL: the job should have failed, not %s\n",
                exitCode ? "hung until timeout(1) killed it" : "succeeded");
    ok = false;
  }
  if (seconds > 20) {
    std::printf("FAIL: the job took %.1f s to end; a failure must end it at once\n", seconds);
    ok = false;
  }
  if (output.find(expected) == std::string::npos) {
    std::printf("FAIL: the output lacks \"%s\"\n", expected.c_str());
    ok = false;
  }
  std::printf("%s\n", ok ? "PASS" : "");
  return ok ? 0 : 1;
}

} // namespace

int main(int argc, char **argv) {
  std::string mode;
  for (int i = 1; i < argc; ++i) {
    llvm::StringRef arg = argv[i];
    if (arg.consume_front("--expect-job-failure=")) {
      if (i + 1 >= argc || llvm::StringRef(argv[i + 1]) != "--") {
        std::fprintf(stderr, "usage: %s --expect-job-failure=MODE -- COMMAND...\n", argv[0]);
        return 2;
      }
      return expectJobFailure(arg.str(), std::vector<std::string>(argv + i + 2, argv + argc));
    }
    if (arg.consume_front("--mode="))
      mode = arg.str();
  }

  std::unique_ptr<MPICommunicator> owned = MPICommunicator::create(&argc, &argv, {20});
  comm = owned.get();
  if (comm->world() != 4) {
    std::fprintf(stderr, "error: run under mpirun -np 4, not %lld ranks\n",
                 static_cast<long long>(comm->world()));
    return 2;
  }
  if (mode == "recv-timeout")
    return recvTimeoutJob();
  if (mode == "killed-rank")
    return killedRankJob();
  if (mode == "group-creation-timeout")
    return groupCreationTimeoutJob();
  if (!mode.empty()) {
    std::fprintf(stderr,
                 "error: unknown --mode=%s; use recv-timeout, killed-rank or "
                 "group-creation-timeout\n",
                 mode.c_str());
    return 2;
  }
  // Every rank runs every test; rank 0 tells the story and the others report failures only.
  // The flag picks the printer when gtest initialises, so it is set before.
  if (comm->rank() != 0)
    GTEST_FLAG_SET(brief, true);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
