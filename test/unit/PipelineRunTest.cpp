#include "TestModels.h"
#include "parc/Cost/PipelineRun.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

using namespace parc;

namespace {

using test::makeConfig;

/// The timing run's meaning, instruction by instruction: stages take turns, each runs until a
/// receive whose message is not posted yet; a send posts `transfer` after its stage's clock,
/// a receive moves the clock to the arrival. The compiled run must give the same times, bit
/// for bit.
PipelineRun referenceRun(const PipelineConfig &config, const std::vector<StageProgram> &programs,
                         const std::vector<double> &forward, const std::vector<double> &backward,
                         double transfer) {
  const int64_t stages = config.stages, virtualStages = config.virtualStages();
  std::vector<double> arrival(size_t(2 * virtualStages * config.microbatches), -1);
  auto slot = [&](bool gradient, int64_t v, int64_t mb) -> double & {
    return arrival[size_t(((gradient ? 1 : 0) * virtualStages + v) * config.microbatches + mb)];
  };
  PipelineRun run;
  run.stageEnd.assign(size_t(stages), 0);
  run.lastBackwardStart.assign(size_t(virtualStages), 0);
  run.timings.resize(size_t(stages));
  for (int64_t s = 0; s < stages; ++s)
    run.timings[size_t(s)].resize(programs[size_t(s)].size());
  std::vector<size_t> next(size_t(stages), 0);
  std::vector<double> clock(size_t(stages), 0);
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int64_t s = 0; s < stages; ++s) {
      double &now = clock[size_t(s)];
      for (size_t &i = next[size_t(s)]; i < programs[size_t(s)].size(); ++i) {
        const PipeOp &op = programs[size_t(s)][i];
        const int64_t v = config.virtualStageOf(s, op.chunk);
        OpTiming t{now, now};
        if (op.isCompute()) {
          if (op.kind == PipeOpKind::Backward)
            run.lastBackwardStart[size_t(v)] = now;
          now += op.kind == PipeOpKind::Forward ? forward[size_t(v)] : backward[size_t(v)];
          t.end = now;
        } else if (op.isSend()) {
          bool gradient = op.kind == PipeOpKind::SendGradient;
          t.end = slot(gradient, gradient ? v - 1 : v + 1, op.microbatch) = now + transfer;
        } else {
          double at = slot(op.kind == PipeOpKind::RecvGradient, v, op.microbatch);
          if (at < 0)
            break;
          t.end = now = std::max(now, at);
        }
        run.stageEnd[size_t(s)] = std::max(run.stageEnd[size_t(s)], t.end);
        run.timings[size_t(s)][i] = t;
        progressed = true;
      }
    }
  }
  for (double end : run.stageEnd)
    run.makespan = std::max(run.makespan, end);
  return run;
}

void expectSameRun(const PipelineRun &expected, const PipelineRun &actual, bool withTimings) {
  EXPECT_EQ(expected.makespan, actual.makespan);
  EXPECT_EQ(expected.stageEnd, actual.stageEnd);
  EXPECT_EQ(expected.lastBackwardStart, actual.lastBackwardStart);
  if (!withTimings)
    return;
  ASSERT_EQ(expected.timings.size(), actual.timings.size());
  for (size_t s = 0; s < expected.timings.size(); ++s) {
    ASSERT_EQ(expected.timings[s].size(), actual.timings[s].size());
    for (size_t i = 0; i < expected.timings[s].size(); ++i) {
      EXPECT_EQ(expected.timings[s][i].start, actual.timings[s][i].start) << s << " " << i;
      EXPECT_EQ(expected.timings[s][i].end, actual.timings[s][i].end) << s << " " << i;
    }
  }
}

TEST(PipelineRun, EqualsTheInstructionByInstructionRunBitForBit) {
  std::mt19937_64 random(11);
  std::uniform_real_distribution<double> seconds(1e-4, 3e-2);
  int shapes = 0;
  for (ScheduleKind kind :
       {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved})
    for (int64_t stages : {1, 2, 3, 4, 7, 8})
      for (int64_t chunks : {1, 2, 3})
        for (int64_t microbatches : {1, 2, 3, 4, 7, 8, 16, 24, 64}) {
          PipelineConfig config = makeConfig(kind, stages, microbatches, chunks);
          if (!pipelineConfigProblem(config).empty())
            continue;
          ++shapes;
          CompiledSchedule &compiled = compiledSchedule(config);
          ASSERT_EQ(compiled.programs(), buildPipelineSchedule(config));
          for (double transfer : {0.0, seconds(random)}) {
            // Uneven virtual stages, as stage_layers and the embedding and head make them.
            std::vector<double> forward, backward;
            for (int64_t v = 0; v < config.virtualStages(); ++v) {
              forward.push_back(seconds(random));
              backward.push_back(2 * seconds(random));
            }
            PipelineRun expected =
                referenceRun(config, compiled.programs(), forward, backward, transfer);
            for (bool withTimings : {false, true}) {
              SCOPED_TRACE(std::string(toString(kind)) + " pp " +
                           std::to_string(stages) + " chunks " + std::to_string(chunks) +
                           " M " + std::to_string(microbatches));
              llvm::Expected<PipelineRun> actual =
                  compiled.run(forward, backward, transfer, withTimings);
              ASSERT_TRUE(bool(actual)) << llvm::toString(actual.takeError());
              expectSameRun(expected, *actual, withTimings);
              EXPECT_EQ(actual->timings.empty(), !withTimings);
            }
          }
        }
  EXPECT_GT(shapes, 100);
}

TEST(PipelineRun, RefusesTimesOfAnotherShape) {
  CompiledSchedule &compiled = compiledSchedule(makeConfig(ScheduleKind::OneFOneB, 2, 4));
  llvm::Expected<PipelineRun> run = compiled.run({1.0}, {2.0}, 0.1, false);
  ASSERT_FALSE(bool(run));
  EXPECT_EQ(llvm::toString(run.takeError()),
            "internal error: the timing run wants a forward and a backward time per virtual "
            "stage");
}

} // namespace
