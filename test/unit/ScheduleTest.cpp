#include "TestModels.h"
#include "parc/Lower/Schedule.h"
#include "parc/Lower/ScheduleVerifier.h"

#include <gtest/gtest.h>

using namespace parc;

namespace {

using test::makeConfig;

/// The computes only: "F3" / "B3", or "F1.3" (chunk 1, microbatch 3) when `withChunk`.
std::string computeOrder(const StageProgram &program, bool withChunk = false) {
  std::string text;
  for (const PipeOp &op : program) {
    if (!op.isCompute())
      continue;
    if (!text.empty())
      text += ' ';
    text += op.kind == PipeOpKind::Forward ? 'F' : 'B';
    if (withChunk)
      text += std::to_string(op.chunk) + '.';
    text += std::to_string(op.microbatch);
  }
  return text;
}

std::string listing(const StageProgram &program) {
  std::string text;
  for (const PipeOp &op : program)
    text += toString(op) + "\n";
  return text;
}

PipeOp fwd(int16_t chunk, int16_t mb) { return {PipeOpKind::Forward, chunk, mb, -1}; }
PipeOp bwd(int16_t chunk, int16_t mb) { return {PipeOpKind::Backward, chunk, mb, -1}; }
PipeOp sendAct(int16_t chunk, int16_t mb, int16_t peer) {
  return {PipeOpKind::SendActivation, chunk, mb, peer};
}
PipeOp recvAct(int16_t chunk, int16_t mb, int16_t peer) {
  return {PipeOpKind::RecvActivation, chunk, mb, peer};
}
PipeOp sendGrad(int16_t chunk, int16_t mb, int16_t peer) {
  return {PipeOpKind::SendGradient, chunk, mb, peer};
}
PipeOp recvGrad(int16_t chunk, int16_t mb, int16_t peer) {
  return {PipeOpKind::RecvGradient, chunk, mb, peer};
}

} // namespace

//===--- The generated orders ---------------------------------------------===//

TEST(Schedule, OneFOneBFollowsMegatron) {
  auto programs = buildPipelineSchedule(makeConfig(ScheduleKind::OneFOneB, 4, 8));
  ASSERT_EQ(programs.size(), 4u);
  EXPECT_EQ(computeOrder(programs[0]), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(computeOrder(programs[2]), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  EXPECT_EQ(computeOrder(programs[3]), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  // Fewer microbatches than the warm-up wants: all forwards, then all backwards.
  auto few = buildPipelineSchedule(makeConfig(ScheduleKind::OneFOneB, 4, 2));
  EXPECT_EQ(computeOrder(few[0]), "F0 F1 B0 B1");
}

TEST(Schedule, OneFOneBPlacesTransfersNextToTheirComputes) {
  auto programs = buildPipelineSchedule(makeConfig(ScheduleKind::OneFOneB, 3, 3));
  EXPECT_EQ(listing(programs[1]), "recv_act c0 mb0 from stage 0\n"
                                  "fwd c0 mb0\n"
                                  "send_act c0 mb0 to stage 2\n"
                                  "recv_act c0 mb1 from stage 0\n"
                                  "fwd c0 mb1\n"
                                  "send_act c0 mb1 to stage 2\n"
                                  "recv_grad c0 mb0 from stage 2\n"
                                  "bwd c0 mb0\n"
                                  "send_grad c0 mb0 to stage 0\n"
                                  "recv_act c0 mb2 from stage 0\n"
                                  "fwd c0 mb2\n"
                                  "send_act c0 mb2 to stage 2\n"
                                  "recv_grad c0 mb1 from stage 2\n"
                                  "bwd c0 mb1\n"
                                  "send_grad c0 mb1 to stage 0\n"
                                  "recv_grad c0 mb2 from stage 2\n"
                                  "bwd c0 mb2\n"
                                  "send_grad c0 mb2 to stage 0\n");
}

TEST(Schedule, GPipeRunsEveryForwardThenEveryBackward) {
  auto programs = buildPipelineSchedule(makeConfig(ScheduleKind::GPipe, 2, 3));
  EXPECT_EQ(computeOrder(programs[0]), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(listing(programs[1]), "recv_act c0 mb0 from stage 0\n"
                                  "fwd c0 mb0\n"
                                  "recv_act c0 mb1 from stage 0\n"
                                  "fwd c0 mb1\n"
                                  "recv_act c0 mb2 from stage 0\n"
                                  "fwd c0 mb2\n"
                                  "bwd c0 mb0\n"
                                  "send_grad c0 mb0 to stage 0\n"
                                  "bwd c0 mb1\n"
                                  "send_grad c0 mb1 to stage 0\n"
                                  "bwd c0 mb2\n"
                                  "send_grad c0 mb2 to stage 0\n");
}

TEST(Schedule, SingleStageHasNoTransfers) {
  auto programs = buildPipelineSchedule(makeConfig(ScheduleKind::Interleaved, 1, 2, 2));
  EXPECT_EQ(listing(programs[0]), "fwd c0 mb0\nfwd c1 mb0\nbwd c1 mb0\nfwd c0 mb1\n"
                                  "bwd c0 mb0\nfwd c1 mb1\nbwd c1 mb1\nbwd c0 mb1\n");
}

// Figure 4 of Narayanan et al. 2021 (pp 4, 2 chunks, 8 microbatches): device 1 runs
// forwards 1-4 of both chunks, then 5 and 6 of chunk 0 before its first backward.
TEST(Schedule, InterleavedFollowsMegatronFigure) {
  auto programs = buildPipelineSchedule(makeConfig(ScheduleKind::Interleaved, 4, 8, 2));
  EXPECT_EQ(computeOrder(programs[0], true),
            "F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 F1.3 F0.4 F0.5 "
            "F0.6 B1.0 F0.7 B1.1 F1.4 B1.2 F1.5 B1.3 F1.6 B0.0 F1.7 B0.1 "
            "B0.2 B0.3 B1.4 B1.5 B1.6 B1.7 B0.4 B0.5 B0.6 B0.7");
  EXPECT_EQ(computeOrder(programs[3], true),
            "F0.0 F0.1 F0.2 F0.3 "
            "F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 F1.3 B1.3 F0.4 B0.0 F0.5 B0.1 F0.6 B0.2 F0.7 B0.3 "
            "F1.4 B1.4 F1.5 B1.5 F1.6 B1.6 F1.7 B1.7 "
            "B0.4 B0.5 B0.6 B0.7");
}

// Megatron's loop for pp 2, 2 chunks, 4 microbatches, derived by hand: receives are posted
// with the previous step's sends, e.g. stage 0 takes the gradient of its next backward before
// running its next forward.
TEST(Schedule, InterleavedPostsReceivesLikeMegatron) {
  auto programs = buildPipelineSchedule(makeConfig(ScheduleKind::Interleaved, 2, 4, 2));
  // A step of Megatron's loop per line (wrapped when long): computes, then the transfer batch.
  // clang-format off
  StageProgram first = {
      fwd(0, 0), sendAct(0, 0, 1),
      fwd(0, 1), sendAct(0, 1, 1), recvAct(1, 0, 1),
      fwd(1, 0), sendAct(1, 0, 1), recvAct(1, 1, 1),
      fwd(1, 1), sendAct(1, 1, 1), recvGrad(1, 0, 1),
      fwd(0, 2), bwd(1, 0), sendAct(0, 2, 1), sendGrad(1, 0, 1), recvGrad(1, 1, 1),
      fwd(0, 3), bwd(1, 1), sendAct(0, 3, 1), sendGrad(1, 1, 1), recvAct(1, 2, 1),
      recvGrad(0, 0, 1),
      fwd(1, 2), bwd(0, 0), sendAct(1, 2, 1), recvAct(1, 3, 1), recvGrad(0, 1, 1),
      fwd(1, 3), bwd(0, 1), sendAct(1, 3, 1), recvGrad(1, 2, 1),
      bwd(1, 2), sendGrad(1, 2, 1), recvGrad(1, 3, 1),
      bwd(1, 3), sendGrad(1, 3, 1), recvGrad(0, 2, 1),
      bwd(0, 2), recvGrad(0, 3, 1),
      bwd(0, 3)};
  StageProgram last = {
      recvAct(0, 0, 0),
      fwd(0, 0), sendAct(0, 0, 0), recvAct(0, 1, 0),
      fwd(0, 1), sendAct(0, 1, 0), recvAct(1, 0, 0),
      fwd(1, 0), bwd(1, 0), sendGrad(1, 0, 0), recvAct(1, 1, 0),
      fwd(1, 1), bwd(1, 1), sendGrad(1, 1, 0), recvAct(0, 2, 0), recvGrad(0, 0, 0),
      fwd(0, 2), bwd(0, 0), sendAct(0, 2, 0), sendGrad(0, 0, 0), recvAct(0, 3, 0),
      recvGrad(0, 1, 0),
      fwd(0, 3), bwd(0, 1), sendAct(0, 3, 0), sendGrad(0, 1, 0), recvAct(1, 2, 0),
      fwd(1, 2), bwd(1, 2), sendGrad(1, 2, 0), recvAct(1, 3, 0),
      fwd(1, 3), bwd(1, 3), sendGrad(1, 3, 0), recvGrad(0, 2, 0),
      bwd(0, 2), sendGrad(0, 2, 0), recvGrad(0, 3, 0),
      bwd(0, 3), sendGrad(0, 3, 0)};
  // clang-format on
  EXPECT_EQ(listing(programs[0]), listing(first));
  EXPECT_EQ(listing(programs[1]), listing(last));
}

// With exactly pp microbatches Megatron runs every forward first and receives the first
// gradient only before the cool-down.
TEST(Schedule, InterleavedWithPPMicrobatchesRunsForwardsFirst) {
  auto programs = buildPipelineSchedule(makeConfig(ScheduleKind::Interleaved, 2, 2, 2));
  // clang-format off
  StageProgram first = {
      fwd(0, 0), sendAct(0, 0, 1),
      fwd(0, 1), sendAct(0, 1, 1), recvAct(1, 0, 1),
      fwd(1, 0), sendAct(1, 0, 1), recvAct(1, 1, 1),
      fwd(1, 1), sendAct(1, 1, 1), recvGrad(1, 0, 1),
      bwd(1, 0), sendGrad(1, 0, 1), recvGrad(1, 1, 1),
      bwd(1, 1), sendGrad(1, 1, 1), recvGrad(0, 0, 1),
      bwd(0, 0), recvGrad(0, 1, 1),
      bwd(0, 1)};
  // clang-format on
  EXPECT_EQ(listing(programs[0]), listing(first));
  EXPECT_EQ(computeOrder(programs[1], true), "F0.0 F0.1 F1.0 F1.1 B1.0 B1.1 B0.0 B0.1");
}

TEST(Schedule, RejectsConfigsItCannotSchedule) {
  EXPECT_EQ(pipelineConfigProblem(makeConfig(ScheduleKind::Interleaved, 4, 6, 2)),
            "the interleaved schedule needs the number of microbatches (6) to be a multiple "
            "of pp (4); change the global batch or pp");
  EXPECT_EQ(pipelineConfigProblem(makeConfig(ScheduleKind::OneFOneB, 4, 8, 2)),
            "model chunks only apply to the interleaved schedule; use interleaved(chunks = 2) "
            "or one chunk with 1f1b");
  EXPECT_NE(pipelineConfigProblem(makeConfig(ScheduleKind::GPipe, 0, 8)), "");
  EXPECT_EQ(pipelineConfigProblem(makeConfig(ScheduleKind::Interleaved, 4, 8, 3)), "");
}

//===--- The verifier -----------------------------------------------------===//

// Every valid combination: consistent, and exactly the ideal makespan of each schedule. For
// GPipe and 1F1B that is (M + pp - 1)(f + b). For interleaved, Megatron's order with these
// rendezvous transfers also reaches the formula exactly, M(f + b) + (pp - 1)(f + b) / chunks,
// i.e. the bubble fraction (pp - 1) / (chunks M) of Narayanan et al.
TEST(ScheduleVerifier, EveryValidScheduleIsConsistentAndReachesTheIdealMakespan) {
  const ScheduleKind kinds[] = {ScheduleKind::GPipe, ScheduleKind::OneFOneB,
                                ScheduleKind::Interleaved};
  ScheduleCosts unitCosts; // forward 1, backward 2, transfers free
  ScheduleCosts evenCosts;
  evenCosts.backward = 1;
  int verified = 0;
  for (ScheduleKind kind : kinds)
    for (int64_t stages = 1; stages <= 8; ++stages)
      for (int64_t chunks = 1; chunks <= 4; ++chunks)
        for (int64_t microbatches = 1; microbatches <= 32; ++microbatches) {
          PipelineConfig config = makeConfig(kind, stages, microbatches, chunks);
          bool valid = (kind == ScheduleKind::Interleaved || chunks == 1) &&
                       (kind != ScheduleKind::Interleaved || microbatches % stages == 0);
          std::string name = std::string(toString(kind)) + " pp " + std::to_string(stages) +
                             " chunks " + std::to_string(chunks) + " M " +
                             std::to_string(microbatches);
          ASSERT_EQ(pipelineConfigProblem(config).empty(), valid) << name;
          if (!valid)
            continue;
          auto programs = buildPipelineSchedule(config);
          for (const ScheduleCosts &costs : {unitCosts, evenCosts}) {
            ScheduleVerdict verdict = verifySchedule(config, programs, costs);
            ASSERT_TRUE(verdict.ok()) << name << ": " << verdict.error;
            double ideal = idealMakespan(config, costs);
            ASSERT_NEAR(verdict.makespan, ideal, 1e-9 * ideal) << name;
          }
          ++verified;
        }
  EXPECT_EQ(verified, 2 * 8 * 32 + 4 * (32 + 16 + 10 + 8 + 6 + 5 + 4 + 4));
}

TEST(ScheduleVerifier, UnitCostMakespansByHand) {
  auto config = makeConfig(ScheduleKind::OneFOneB, 4, 8);
  EXPECT_DOUBLE_EQ(verifySchedule(config, buildPipelineSchedule(config)).makespan,
                   (8 + 4 - 1) * 3.0);
  config = makeConfig(ScheduleKind::Interleaved, 4, 8, 2);
  EXPECT_DOUBLE_EQ(verifySchedule(config, buildPipelineSchedule(config)).makespan,
                   8 * 3.0 + 3 * 3.0 / 2);
}

// GPipe, pp 2, one microbatch: F on stage 0, transfer, F and B on stage 1, transfer, B on
// stage 0 = 1 + 0.5 + 1 + 2 + 0.5 + 2.
TEST(ScheduleVerifier, TransfersAddTheirCost) {
  auto config = makeConfig(ScheduleKind::GPipe, 2, 1);
  ScheduleCosts costs;
  costs.transfer = 0.5;
  ScheduleVerdict verdict = verifySchedule(config, buildPipelineSchedule(config), costs);
  ASSERT_TRUE(verdict.ok()) << verdict.error;
  EXPECT_DOUBLE_EQ(verdict.makespan, 7.0);
}

// Why the lowering batches adjacent transfers: posted one at a time, Megatron's 1F1B stalls
// with stage 0 sending its second activation while stage 1 sends its first gradient.
TEST(ScheduleVerifier, OneAtATimeTransfersDeadlockOneFOneB) {
  auto config = makeConfig(ScheduleKind::OneFOneB, 2, 2);
  ScheduleCosts costs;
  costs.batchAdjacentTransfers = false;
  ScheduleVerdict verdict = verifySchedule(config, buildPipelineSchedule(config), costs);
  EXPECT_EQ(verdict.error,
            "stage 0, instruction 3 (send_act c0 mb1 to stage 1): deadlock: it never meets a "
            "matching transfer while stage 1 waits at instruction 3 (send_grad c0 mb0 to "
            "stage 0)");
}

namespace {

/// `program` with each receive moved right before the compute that needs it and each send
/// right after the compute that produced it.
StageProgram withTransfersNextToComputes(const StageProgram &program) {
  StageProgram placed;
  for (size_t i = 0; i < program.size(); ++i) {
    if (!program[i].isCompute())
      continue;
    bool forward = program[i].kind == PipeOpKind::Forward;
    for (const PipeOp &op : program)
      if (op.kind == (forward ? PipeOpKind::RecvActivation : PipeOpKind::RecvGradient) &&
          op.chunk == program[i].chunk && op.microbatch == program[i].microbatch)
        placed.push_back(op);
    placed.push_back(program[i]);
    for (const PipeOp &op : program)
      if (op.kind == (forward ? PipeOpKind::SendActivation : PipeOpKind::SendGradient) &&
          op.chunk == program[i].chunk && op.microbatch == program[i].microbatch)
        placed.push_back(op);
  }
  return placed;
}

} // namespace

// Why the interleaved builder posts receives early, as Megatron does: placed next to their
// computes, stage 0 and stage 1 each block sending a gradient the other receives only after
// its next compute.
TEST(ScheduleVerifier, InterleavedNeedsEarlyReceives) {
  auto config = makeConfig(ScheduleKind::Interleaved, 2, 4, 2);
  auto programs = buildPipelineSchedule(config);
  for (StageProgram &program : programs)
    program = withTransfersNextToComputes(program);
  EXPECT_EQ(verifySchedule(config, programs).error,
            "stage 0, instruction 14 (send_grad c1 mb0 to stage 1): deadlock: it never meets a "
            "matching transfer while stage 1 waits at instruction 13 (send_grad c1 mb1 to "
            "stage 0)");
}

TEST(ScheduleVerifier, ReportsAWrongMicrobatchAsADeadlock) {
  auto config = makeConfig(ScheduleKind::GPipe, 2, 2);
  auto programs = buildPipelineSchedule(config);
  ASSERT_EQ(programs[1][0], recvAct(0, 0, 0));
  programs[1][0].microbatch = 1;
  EXPECT_EQ(verifySchedule(config, programs).error,
            "stage 0, instruction 1 (send_act c0 mb0 to stage 1): deadlock: it never meets a "
            "matching transfer while stage 1 waits at instruction 0 (recv_act c0 mb1 from "
            "stage 0)");
}

// Stage 1 sends chunk 0's output to stage 0's chunk 1; a receive filed under chunk 2 (also
// fed by stage 1) is another tensor.
TEST(ScheduleVerifier, ReportsAWrongChunkAsADeadlock) {
  auto config = makeConfig(ScheduleKind::Interleaved, 2, 2, 3);
  auto programs = buildPipelineSchedule(config);
  ASSERT_EQ(programs[0][4], recvAct(1, 0, 1));
  programs[0][4].chunk = 2;
  EXPECT_EQ(verifySchedule(config, programs).error,
            "stage 0, instruction 4 (recv_act c2 mb0 from stage 1): deadlock: it never meets a "
            "matching transfer while stage 1 waits at instruction 2 (send_act c0 mb0 to "
            "stage 0)");
}

TEST(ScheduleVerifier, ReportsAStageWaitingOnAFinishedPeer) {
  auto config = makeConfig(ScheduleKind::GPipe, 2, 1);
  std::vector<StageProgram> programs = {{fwd(0, 0), sendAct(0, 0, 1), recvGrad(0, 0, 1), bwd(0, 0)},
                                        {recvAct(0, 0, 0), fwd(0, 0), bwd(0, 0)}};
  EXPECT_EQ(verifySchedule(config, programs).error,
            "stage 0, instruction 2 (recv_grad c0 mb0 from stage 1): deadlock: it never meets "
            "a matching transfer while stage 1 has finished");
}

TEST(ScheduleVerifier, RejectsComputesOutOfOrder) {
  auto config = makeConfig(ScheduleKind::GPipe, 1, 2);
  EXPECT_EQ(verifySchedule(config, {{bwd(0, 0), fwd(0, 0)}}).error,
            "stage 0, instruction 0 (bwd c0 mb0): runs before its own forward; move it after "
            "that forward");
  EXPECT_EQ(verifySchedule(config, {{fwd(0, 0), fwd(0, 0)}}).error,
            "stage 0, instruction 1 (fwd c0 mb0): runs a second time; each stage runs the "
            "forward of each chunk and microbatch once");
  EXPECT_EQ(verifySchedule(config, {{fwd(0, 0), bwd(0, 0), fwd(0, 1)}}).error,
            "stage 0 never runs the backward of c0 mb1; add it to its program");
}

TEST(ScheduleVerifier, RejectsComputesBeforeTheirInputArrived) {
  auto config = makeConfig(ScheduleKind::GPipe, 2, 1);
  std::vector<StageProgram> programs = {
      {fwd(0, 0), sendAct(0, 0, 1), recvGrad(0, 0, 1), bwd(0, 0)},
      {fwd(0, 0), recvAct(0, 0, 0), bwd(0, 0), sendGrad(0, 0, 0)}};
  EXPECT_EQ(verifySchedule(config, programs).error,
            "stage 1, instruction 0 (fwd c0 mb0): runs before its input activation arrived; "
            "receive it from stage 0 first");
  // One stage, two chunks: chunk 1 consumes chunk 0's output locally.
  auto local = makeConfig(ScheduleKind::Interleaved, 1, 1, 2);
  EXPECT_EQ(verifySchedule(local, {{fwd(1, 0), fwd(0, 0), bwd(1, 0), bwd(0, 0)}}).error,
            "stage 0, instruction 0 (fwd c1 mb0): runs before the forward of c0 on this stage "
            "produced its input");
}

TEST(ScheduleVerifier, RejectsSendsBeforeTheirCompute) {
  auto config = makeConfig(ScheduleKind::GPipe, 2, 1);
  std::vector<StageProgram> programs = {
      {sendAct(0, 0, 1), fwd(0, 0), recvGrad(0, 0, 1), bwd(0, 0)},
      {recvAct(0, 0, 0), fwd(0, 0), bwd(0, 0), sendGrad(0, 0, 0)}};
  EXPECT_EQ(verifySchedule(config, programs).error,
            "stage 0, instruction 0 (send_act c0 mb0 to stage 1): sends an activation its "
            "forward has not computed yet");
}

TEST(ScheduleVerifier, RejectsTransfersWithTheWrongPeer) {
  auto config = makeConfig(ScheduleKind::Interleaved, 2, 2, 2);
  auto programs = buildPipelineSchedule(config);
  programs[1].insert(programs[1].begin() + 1, sendAct(1, 0, 0));
  EXPECT_EQ(verifySchedule(config, programs).error,
            "stage 1, instruction 1 (send_act c1 mb0 to stage 0): virtual stage 3 computes the "
            "loss and has no later stage to exchange with; drop this transfer");
  programs = buildPipelineSchedule(makeConfig(ScheduleKind::OneFOneB, 3, 2));
  programs[0][1].peer = 2;
  EXPECT_EQ(verifySchedule(makeConfig(ScheduleKind::OneFOneB, 3, 2), programs).error,
            "stage 0, instruction 1 (send_act c0 mb0 to stage 2): the peer must be stage 1, "
            "which holds virtual stage 1");
}

TEST(ScheduleVerifier, RejectsATensorReceivedTwice) {
  auto config = makeConfig(ScheduleKind::GPipe, 2, 1);
  std::vector<StageProgram> programs = {
      {fwd(0, 0), sendAct(0, 0, 1), sendAct(0, 0, 1), recvGrad(0, 0, 1), bwd(0, 0)},
      {recvAct(0, 0, 0), recvAct(0, 0, 0), fwd(0, 0), bwd(0, 0), sendGrad(0, 0, 0)}};
  EXPECT_EQ(verifySchedule(config, programs).error,
            "stage 1, instruction 1 (recv_act c0 mb0 from stage 0): receives a tensor a second "
            "time; each one is sent once");
}
