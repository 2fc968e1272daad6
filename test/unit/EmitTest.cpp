#include "TestModels.h"
#include "parc/Cost/CommModel.h"
#include "parc/Cost/CostModel.h"
#include "parc/Emit/PipelineSVG.h"
#include "parc/Emit/PlanDirectory.h"
#include "parc/Plan/PlanStream.h"
#include "parc/Cost/StepTimeline.h"
#include "parc/Emit/Trace.h"
#include "parc/Lower/Lowering.h"
#include "parc/Lower/ScheduleVerifier.h"
#include "parc/Plan/PlanJSON.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
#include <gtest/gtest.h>

#include <map>

using namespace parc;
namespace fs = llvm::sys::fs;
namespace path = llvm::sys::path;

namespace {

using test::makeConfig;
using test::mapped;

//===--- Per-instruction times of the schedule verifier --------------------===//

// GPipe, pp 2, one microbatch, transfers 0.5. Stage 0 posts its send and the receive of the
// gradient together at 1; the send completes when stage 1 has posted its receive (at 0), the
// receive when stage 1 has run F and B (1.5 + 1 + 2) and sends back.
TEST(ScheduleTimings, GPipeOneMicrobatchByHand) {
  PipelineConfig config = makeConfig(ScheduleKind::GPipe, 2, 1);
  ScheduleCosts costs;
  costs.transfer = 0.5;
  ScheduleVerdict verdict = verifySchedule(config, buildPipelineSchedule(config), costs);
  ASSERT_TRUE(verdict.ok()) << verdict.error;
  ASSERT_EQ(verdict.timings.size(), 2u);
  auto spans = [](const std::vector<OpTiming> &timings) {
    std::vector<std::pair<double, double>> out;
    for (const OpTiming &t : timings)
      out.push_back({t.start, t.end});
    return out;
  };
  using Spans = std::vector<std::pair<double, double>>;
  // fwd, send_act, recv_grad, bwd
  EXPECT_EQ(spans(verdict.timings[0]), (Spans{{0, 1}, {1, 1.5}, {1, 5}, {5, 7}}));
  // recv_act, fwd, bwd, send_grad
  EXPECT_EQ(spans(verdict.timings[1]), (Spans{{0, 1.5}, {1.5, 2.5}, {2.5, 4.5}, {4.5, 5}}));
}

TEST(ScheduleTimings, ComputesNeverOverlapAndFitTheMakespan) {
  for (ScheduleKind kind :
       {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved}) {
    PipelineConfig config = makeConfig(kind, 4, 8, kind == ScheduleKind::Interleaved ? 2 : 1);
    ScheduleCosts costs;
    costs.transfer = 0.1;
    auto programs = buildPipelineSchedule(config);
    ScheduleVerdict verdict = verifySchedule(config, programs, costs);
    ASSERT_TRUE(verdict.ok()) << verdict.error;
    double lastEnd = 0;
    for (size_t stage = 0; stage < programs.size(); ++stage) {
      ASSERT_EQ(verdict.timings[stage].size(), programs[stage].size());
      double previousEnd = 0;
      for (size_t i = 0; i < programs[stage].size(); ++i) {
        const OpTiming &t = verdict.timings[stage][i];
        EXPECT_LE(t.start, t.end);
        if (programs[stage][i].isCompute()) {
          EXPECT_GE(t.start, previousEnd - 1e-12) << "stage " << stage << " op " << i;
          previousEnd = t.end;
        }
        lastEnd = std::max(lastEnd, t.end);
      }
    }
    EXPECT_DOUBLE_EQ(lastEnd, verdict.makespan);
  }
}

TEST(ScheduleTimings, PerVirtualStageCosts) {
  // 1F1B, pp 2, M 2: stage 1 is three times as slow, so it paces the pipeline.
  PipelineConfig config = makeConfig(ScheduleKind::OneFOneB, 2, 2);
  ScheduleCosts costs;
  costs.virtualStageForward = {1, 3};
  costs.virtualStageBackward = {2, 6};
  ScheduleVerdict verdict = verifySchedule(config, buildPipelineSchedule(config), costs);
  ASSERT_TRUE(verdict.ok()) << verdict.error;
  // F0 on stage 0 (1), then stage 1 runs F, B, F, B for 18, then B1 of stage 0 (2).
  EXPECT_DOUBLE_EQ(verdict.makespan, 1 + 18 + 2);

  costs.virtualStageBackward = {2};
  EXPECT_EQ(verifySchedule(config, buildPipelineSchedule(config), costs).error,
            "expected a compute cost per virtual stage (2), got 1");
}

//===--- The simulated step of a small job ---------------------------------===//

/// 8 blocks on 2 nodes x 4 GPUs: tp 2, pp 2 (across nodes with tp-dp-pp), dp 2, 4 microbatches.
Program smallProgram(ScheduleKind schedule, int64_t chunks) {
  Program p;
  p.model = test::eightBlockGPT();
  p.model.name = "small";
  p.cluster.name = "pair";
  p.cluster.nodes = 2;
  p.cluster.gpusPerNode = 4;
  p.cluster.gpuFlops = 1e12;
  p.cluster.gpuMemory = int64_t(80) << 30;
  p.cluster.intraNode = {1e11, 1e-6};
  p.cluster.interNode = {1e10, 5e-6};
  p.cluster.hasInterNode = true;
  p.parallel.tp = 2;
  p.parallel.pp = 2;
  p.parallel.dpAuto = true;
  p.parallel.globalBatch = 8;
  p.parallel.schedule = schedule;
  p.parallel.chunks = chunks;
  return p;
}

TEST(StepTimeline, FollowsTheWorkTableAndTheLink) {
  Program p = smallProgram(ScheduleKind::OneFOneB, 1);
  Mapping m = mapped(p);
  ASSERT_EQ(m.microbatches, 4);
  WorkTable work = buildWorkTable(p, m);
  llvm::Expected<StepTimeline> timeline = simulateStep(p, m);
  ASSERT_TRUE(bool(timeline)) << llvm::toString(timeline.takeError());
  ASSERT_EQ(timeline->forwardSeconds.size(), 2u);
  for (size_t v = 0; v < 2; ++v) {
    EXPECT_DOUBLE_EQ(timeline->forwardSeconds[v], work.virtualStages[v].forwardSeconds());
    EXPECT_DOUBLE_EQ(timeline->backwardSeconds[v], work.virtualStages[v].backwardSeconds());
    EXPECT_GT(timeline->backwardSeconds[v], timeline->forwardSeconds[v]);
  }
  // The last stage also runs the head and the loss.
  EXPECT_GT(timeline->forwardSeconds[1], timeline->forwardSeconds[0]);
  // Stage 1 is on the other node: a bf16 microbatch's 1/tp slice over the inter-node link.
  EXPECT_DOUBLE_EQ(timeline->messageBytes, 2.0 * 64 * 128 / 2);
  EXPECT_DOUBLE_EQ(timeline->transferSeconds,
                   CommModel(p.cluster).send(timeline->messageBytes, true));
  EXPECT_DOUBLE_EQ(timeline->idealBubble, 1.0 / 4);
  EXPECT_GT(timeline->simulatedBubble(), 0.1);
  EXPECT_GE(timeline->pipelineMakespan,
            4 * (timeline->forwardSeconds[1] + timeline->backwardSeconds[1]));
  // The step adds every stage's gradient sync and optimizer to its pipeline end.
  const StageTail &tail = timeline->tails[size_t(timeline->criticalStage())];
  EXPECT_GT(tail.gradSyncEnd, tail.pipelineEnd);
  EXPECT_DOUBLE_EQ(timeline->makespan, tail.end);
}

TEST(StepTimeline, ReportDiagramAndTraceShowOneStepTime) {
  Program p = smallProgram(ScheduleKind::Interleaved, 2);
  p.parallel.zero = 1;
  p.parallel.overlapGradReduce = true;
  Mapping m = mapped(p);
  CostEstimate cost = estimateCost(p, m);
  llvm::Expected<StepTimeline> timeline = simulateStep(p, m);
  ASSERT_TRUE(bool(timeline)) << llvm::toString(timeline.takeError());
  EXPECT_DOUBLE_EQ(cost.stepSeconds, timeline->makespan);
  EXPECT_NEAR(cost.breakdown.total(), cost.stepSeconds, 1e-12 * cost.stepSeconds);
  std::string trace, svg;
  llvm::raw_string_ostream traceStream(trace), svgStream(svg);
  writeTrace(*timeline, p, m, traceStream);
  writePipelineSVG(*timeline, p, m, svgStream);
  llvm::Expected<llvm::json::Value> json = llvm::json::parse(traceStream.str());
  ASSERT_TRUE(bool(json)) << llvm::toString(json.takeError());
  const llvm::json::Object *other = json->getAsObject()->getObject("otherData");
  EXPECT_DOUBLE_EQ(*other->getNumber("step_seconds"), cost.stepSeconds);
  // The diagram prints the step in its subtitle with three significant digits.
  double ms = cost.stepSeconds * 1e3;
  std::string shown = llvm::formatv("step {0} ms", llvm::format("%.3g", ms)).str();
  EXPECT_TRUE(llvm::StringRef(svgStream.str()).contains(shown)) << shown;
  // Every stage has its optimizer step on its compute track.
  EXPECT_EQ(llvm::StringRef(traceStream.str()).count("\"name\":\"optimizer\""), 2u);
}

/// Slices per stage and per kind in a trace, read back from its JSON.
std::map<int64_t, std::map<std::string, int>> traceSlices(const llvm::json::Value &trace) {
  std::map<int64_t, std::map<std::string, int>> slices;
  for (const llvm::json::Value &event : *trace.getAsObject()->getArray("traceEvents")) {
    const llvm::json::Object &object = *event.getAsObject();
    if (object.getString("ph") != llvm::Optional<llvm::StringRef>("X"))
      continue;
    ++slices[*object.getInteger("tid")][object.getString("cat")->str()];
  }
  return slices;
}

TEST(Trace, OneSlicePerInstructionOnItsStagesTrack) {
  Program p = smallProgram(ScheduleKind::Interleaved, 2);
  Mapping m = mapped(p);
  llvm::Expected<StepTimeline> timeline = simulateStep(p, m);
  ASSERT_TRUE(bool(timeline)) << llvm::toString(timeline.takeError());
  std::string text;
  llvm::raw_string_ostream os(text);
  writeTrace(*timeline, p, m, os);
  llvm::Expected<llvm::json::Value> trace = llvm::json::parse(os.str());
  ASSERT_TRUE(bool(trace)) << llvm::toString(trace.takeError());
  auto slices = traceSlices(*trace);
  for (int64_t stage = 0; stage < 2; ++stage) {
    // Tracks compute, tp, pp and dp: 2 chunks x 4 microbatches on the compute track; with
    // chunks the wrap-around makes both stages send both ways on the pp track.
    std::map<std::string, int> &compute = slices[stage * 4], &pp = slices[stage * 4 + 2];
    EXPECT_EQ(compute["forward"], 8);
    EXPECT_EQ(compute["backward"], 8);
    EXPECT_EQ(compute["optimizer"], 1);
    int transfers = pp["send"] + pp["recv"];
    EXPECT_EQ(size_t(8 + 8 + transfers), timeline->stages[size_t(stage)].size());
    EXPECT_GT(slices[stage * 4 + 1]["tp"], 0);
  }
  EXPECT_NE(os.str().find("\"name\":\"F mb3 c1\""), std::string::npos);
  EXPECT_NE(os.str().find("\"name\":\"recv grad mb0\""), std::string::npos);
  EXPECT_NE(os.str().find("\"args\":{\"name\":\"stage 1\"}"), std::string::npos);
  EXPECT_NE(os.str().find("\"args\":{\"name\":\"stage 1 dp\"}"), std::string::npos);
}

TEST(PipelineSVG, OneBoxPerComputeAndNumbersWhenTheyFit) {
  Program p = smallProgram(ScheduleKind::Interleaved, 2);
  Mapping m = mapped(p);
  llvm::Expected<StepTimeline> timeline = simulateStep(p, m);
  ASSERT_TRUE(bool(timeline)) << llvm::toString(timeline.takeError());
  std::string text;
  llvm::raw_string_ostream os(text);
  writePipelineSVG(*timeline, p, m, os);
  llvm::StringRef svg = os.str();
  EXPECT_EQ(svg.count("<rect class=\"op fwd\""), 2u * 2 * 4);
  EXPECT_EQ(svg.count("<rect class=\"op bwd\""), 2u * 2 * 4);
  EXPECT_TRUE(svg.startswith("<?xml"));
  EXPECT_TRUE(svg.endswith("</svg>\n"));
  EXPECT_TRUE(svg.contains("small on pair"));
  EXPECT_TRUE(svg.contains("bubble 12.5%"));
  EXPECT_TRUE(svg.contains("numbers: microbatch"));
}

//===--- Streamed rank plans -----------------------------------------------===//

/// What plan::writeRankPlan writes (pretty), or the compact print of the same tree.
std::string treeText(const plan::RankPlan &rankPlan, JSONLayout layout) {
  std::string text;
  llvm::raw_string_ostream os(text);
  if (layout == JSONLayout::Pretty)
    os << llvm::formatv("{0:2}", plan::toJSON(rankPlan)) << "\n";
  else
    os << plan::toJSON(rankPlan) << "\n";
  return os.str();
}

std::string streamedText(const plan::RankPlan &rankPlan, JSONLayout layout) {
  std::string text;
  llvm::raw_string_ostream os(text);
  streamRankPlan(os, rankPlan, layout);
  return os.str();
}

// Every rank of jobs that between them produce every op, attribute, instruction and
// parameter kind the lowering emits: tied and untied heads, GELU and SwiGLU, learned and
// rotary positions, grouped-query attention, sequence parallelism, each ZeRO stage and
// recomputation.
TEST(RankPlanStream, MatchesThePlanWriterByteForByte) {
  int jobs = 0;
  for (int variant = 0; variant < 4; ++variant) {
    Program p = smallProgram(variant % 2 ? ScheduleKind::Interleaved : ScheduleKind::OneFOneB,
                             variant % 2 ? 2 : 1);
    p.parallel.zero = variant;
    p.parallel.recompute = Recompute(variant % 3);
    p.parallel.sequenceParallel = variant >= 2;
    if (variant >= 2) {
      p.model.norm = Norm::RMSNorm;
      p.model.bias = LinearBias::None;
      p.model.position = Position::RoPE;
      p.model.mlp = p.model.layers[1].mlp = MLPKind::SwiGLU;
      p.model.kvHeads = p.model.layers[1].kvHeads = 2;
      p.model.layers.pop_back();
      LayerGroup head;
      head.kind = LayerGroup::LMHead;
      head.name = "head";
      p.model.layers.push_back(head);
    }
    Mapping m = mapped(p);
    llvm::Expected<std::vector<plan::RankPlan>> plans = lowerAllRanks(p, m);
    ASSERT_TRUE(bool(plans)) << llvm::toString(plans.takeError());
    for (const plan::RankPlan &rankPlan : *plans)
      for (JSONLayout layout : {JSONLayout::Pretty, JSONLayout::Compact})
        ASSERT_EQ(streamedText(rankPlan, layout), treeText(rankPlan, layout))
            << "variant " << variant << ", rank " << rankPlan.rank;
    ++jobs;
  }
  EXPECT_EQ(jobs, 4);
}

// Values the lowering never produces but the format allows: escapes, empty lists, every
// instruction operand and an attribute of each type.
TEST(RankPlanStream, MatchesThePlanWriterOnHandBuiltPlans) {
  plan::RankPlan rankPlan;
  rankPlan.planId = "0123456789abcdef";
  rankPlan.model.name = "quote\"back\\slash\ttab\x01 bell \xC2\xB5s";
  plan::Chunk chunk;
  chunk.tensors["x"] = plan::TensorType{{}, plan::DType::BF16};
  plan::Op op;
  op.attrs = {{"b", true}, {"i", int64_t(-3)}, {"n", 0.1}, {"s", std::string("tp")}};
  chunk.forward.push_back(op);
  rankPlan.chunks.push_back(chunk);
  plan::ParamShard shard;
  shard.init = plan::Init{plan::InitKind::Zeros, 0};
  rankPlan.params.push_back(shard);
  rankPlan.schedule = {plan::Instr::loadBatch(0),
                       plan::Instr::transfer(plan::InstrKind::RecvGrad, 3, 1, 2),
                       plan::Instr::gradCollective(plan::InstrKind::ReduceScatterGrads,
                                                   plan::Group::DP, true, {"w"}),
                       plan::Instr::allGatherParams(plan::Group::DP, {"w"}),
                       plan::Instr::releaseParams({}),
                       plan::Instr::optimizerStep({plan::Group::TP, plan::Group::PP})};
  for (JSONLayout layout : {JSONLayout::Pretty, JSONLayout::Compact})
    EXPECT_EQ(streamedText(rankPlan, layout), treeText(rankPlan, layout));
}

//===--- The plan directory --------------------------------------------===//

class PlanDirectoryTest : public ::testing::Test {
protected:
  void SetUp() override {
    ASSERT_FALSE(fs::createUniqueDirectory("parc-emit-test", root));
    dir = (root + "/plans").str();
  }
  void TearDown() override { fs::remove_directories(root); }

  /// A manifest that passes verifyManifest: one node, tp 2, two ranks.
  static plan::Manifest manifest(const std::string &planId) {
    plan::Manifest m;
    m.planId = planId;
    m.world = 2;
    m.model.name = "toy";
    m.model.dtype = plan::DType::FP32;
    m.model.vocab = m.model.paddedVocab = 256;
    m.model.seq = 8;
    m.model.hidden = 16;
    m.model.heads = m.model.kvHeads = m.model.headDim = 4;
    m.model.ffn = 64;
    m.model.layers = 2;
    m.model.tiedEmbeddings = true;
    m.cluster = plan::ClusterSummary{"box", 1, 2};
    m.parallel.tp = 2;
    m.parallel.microbatches = 2;
    m.parallel.globalBatch = 2;
    for (int64_t rank = 0; rank < 2; ++rank) {
      plan::RankEntry entry;
      entry.rank = entry.localRank = entry.coords.tp = rank;
      entry.file = plan::rankFileName(rank);
      m.ranks.push_back(entry);
    }
    return m;
  }
  static std::vector<plan::RankPlan> plans(const std::string &planId) {
    std::vector<plan::RankPlan> out(2);
    for (int64_t rank = 0; rank < 2; ++rank) {
      out[size_t(rank)].planId = planId;
      out[size_t(rank)].rank = rank;
    }
    return out;
  }
  /// Everything in the test's root directory, so that a leftover temporary shows.
  std::vector<std::string> rootEntries() const {
    std::vector<std::string> names;
    std::error_code ec;
    for (fs::directory_iterator it(root, ec), end; it != end && !ec; it.increment(ec))
      names.push_back(path::filename(it->path()).str());
    std::sort(names.begin(), names.end());
    return names;
  }
  std::string readManifestId() const {
    llvm::Expected<plan::Manifest> m = plan::readManifest(dir + "/manifest.json");
    if (!m)
      return "error: " + llvm::toString(m.takeError());
    return m->planId;
  }
  void touch(const std::string &file) const {
    std::error_code ec;
    llvm::raw_fd_ostream os(file, ec);
    ASSERT_FALSE(ec);
    os << "keep\n";
  }

  llvm::SmallString<128> root;
  std::string dir;
};

TEST_F(PlanDirectoryTest, WritesAndReplacesAPlanDirectory) {
  ASSERT_FALSE(bool(writePlanDirectory(dir, manifest("1111111111111111"), plans("1"))));
  EXPECT_EQ(readManifestId(), "1111111111111111");
  EXPECT_TRUE(fs::exists(dir + "/rank-00001.json"));
  touch(dir + "/marker");

  ASSERT_FALSE(bool(writePlanDirectory(dir + "/", manifest("2222222222222222"), plans("2"), 2)));
  EXPECT_EQ(readManifestId(), "2222222222222222");
  EXPECT_FALSE(fs::exists(dir + "/marker")); // the whole directory was replaced
  EXPECT_EQ(rootEntries(), std::vector<std::string>{"plans"});
}

TEST_F(PlanDirectoryTest, AFailedWriteLeavesTheOldPlansAndNoTemporary) {
  ASSERT_FALSE(bool(writePlanDirectory(dir, manifest("1111111111111111"), plans("1"))));
  touch(dir + "/marker");
  // A file name the file system refuses fails the write after the temporary exists.
  plan::Manifest tooLong = manifest("2222222222222222");
  tooLong.ranks[1].file = std::string(300, 'r') + ".json";
  llvm::Error error = writePlanDirectory(dir, tooLong, plans("2"));
  ASSERT_TRUE(bool(error));
  EXPECT_NE(llvm::toString(std::move(error)).find("cannot open for writing"), std::string::npos);
  EXPECT_EQ(readManifestId(), "1111111111111111");
  EXPECT_TRUE(fs::exists(dir + "/marker"));
  EXPECT_EQ(rootEntries(), std::vector<std::string>{"plans"});

  // An inconsistent input fails before anything is written.
  error = writePlanDirectory(dir, manifest("3333333333333333"), {});
  EXPECT_EQ(llvm::toString(std::move(error)),
            "internal error: the manifest lists 2 ranks but 0 rank plans were lowered");
  EXPECT_EQ(rootEntries(), std::vector<std::string>{"plans"});
}

TEST_F(PlanDirectoryTest, RefusesWhatIsNotAPlanDirectory) {
  ASSERT_FALSE(fs::create_directory(dir));
  // An empty directory holds nothing to lose.
  EXPECT_FALSE(bool(checkPlanDirectoryTarget(dir)));
  touch(dir + "/notes.txt");
  llvm::Error error = writePlanDirectory(dir, manifest("1111111111111111"), plans("1"));
  EXPECT_EQ(llvm::toString(std::move(error)),
            "cannot write plans to '" + dir +
                "': it is a directory with files but no manifest.json, not a parc plan "
                "directory, and parc replaces only plan directories; remove it or choose "
                "another output directory with -o");
  EXPECT_TRUE(fs::exists(dir + "/notes.txt"));

  touch(dir + "/manifest.json");
  error = checkPlanDirectoryTarget(dir);
  EXPECT_NE(llvm::toString(std::move(error)).find("its manifest.json is not a parc plan manifest"),
            std::string::npos);

  std::string file = (root + "/file").str();
  touch(file);
  error = writePlanDirectory(file, manifest("1111111111111111"), plans("1"));
  EXPECT_EQ(llvm::toString(std::move(error)),
            "cannot write plans to '" + file +
                "': it exists and is not a directory, and parc replaces only plan directories; "
                "remove it or choose another output directory with -o");
  EXPECT_EQ(rootEntries(), (std::vector<std::string>{"file", "plans"}));
}

TEST_F(PlanDirectoryTest, ReplacesAnEmptyDirectoryAndWritesSubdirectories) {
  ASSERT_FALSE(fs::create_directory(dir));
  plan::Manifest m = manifest("1111111111111111");
  m.ranks[0].file = "ranks/0.json";
  m.ranks[1].file = "ranks/1.json";
  ASSERT_FALSE(bool(writePlanDirectory(dir, m, plans("1"))));
  EXPECT_TRUE(fs::exists(dir + "/ranks/1.json"));
  EXPECT_EQ(readManifestId(), "1111111111111111");
}

TEST_F(PlanDirectoryTest, AMissingParentIsReported) {
  std::string deep = (root + "/missing/plans").str();
  llvm::Error error = writePlanDirectory(deep, manifest("1111111111111111"), plans("1"));
  EXPECT_EQ(llvm::toString(std::move(error)), "cannot write plans to '" + deep +
                                                  "': its parent directory '" + root.str().str() +
                                                  "/missing' does not exist; create it first");
}

} // namespace
