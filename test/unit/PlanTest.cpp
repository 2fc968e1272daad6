#include "PlanTestSupport.h"
#include "parc/Plan/PlanJSON.h"
#include "parc/Plan/PlanTraffic.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
#include <gtest/gtest.h>

#include <functional>
#include <variant>

using namespace parc::plan;
namespace json = llvm::json;

namespace {

using namespace parc::plan::testing;

TEST(Plan, HandBuiltPlansAreValid) {
  EXPECT_FALSE(static_cast<bool>(verifyRankPlan(stageZeroPlan())));
  EXPECT_FALSE(static_cast<bool>(verifyRankPlan(singleRankPlan())));
}

TEST(Plan, RankPlanRoundTripsThroughText) {
  for (const RankPlan &plan : {stageZeroPlan(), singleRankPlan()}) {
    std::string written = text(toJSON(plan));
    llvm::Expected<RankPlan> read = parseRankPlan(written);
    ASSERT_TRUE(static_cast<bool>(read)) << llvm::toString(read.takeError());
    EXPECT_EQ(text(toJSON(*read)), written);
    EXPECT_EQ(canonicalText(*read), canonicalText(plan));
  }
  llvm::Expected<RankPlan> read = parseRankPlan(text(toJSON(stageZeroPlan())));
  ASSERT_TRUE(static_cast<bool>(read));
  const Op &split = read->chunks[0].forward[5];
  EXPECT_EQ(split.kind, OpKind::Split);
  EXPECT_EQ(split.outputs, (std::vector<std::string>{"q", "k", "v"}));
  EXPECT_EQ(split.intAttr("dim"), 2);
  EXPECT_EQ(read->chunks[0].forward[3].numberAttr("eps"), 1e-5);
  EXPECT_TRUE(read->chunks[0].forward[4].boolAttr("trans_b"));
  EXPECT_EQ(read->chunks[0].forward[1].groupAttr("group"), Group::TP);
  EXPECT_EQ(read->params[4].localShape(), (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(read->schedule[2].peer, 2);
  EXPECT_EQ(read->schedule[10].group, Group::Embedding);
  EXPECT_TRUE(read->schedule[11].average);
  EXPECT_EQ(read->train.lr, 1e-3);
  EXPECT_EQ(read->groups.embedding, (std::vector<int64_t>{0, 2}));
}

TEST(Plan, FilesRoundTripAndErrorsNameThePath) {
  llvm::SmallString<128> dir;
  ASSERT_FALSE(llvm::sys::fs::createUniqueDirectory("parc-plan-test", dir));
  RankPlan plan = singleRankPlan();
  Manifest manifest = manifestFor(plan);
  plan.planId = manifest.planId;
  std::string rankPath = (dir + "/" + rankFileName(0)).str();
  std::string manifestPath = (dir + "/" + ManifestFileName).str();
  ASSERT_FALSE(static_cast<bool>(writeRankPlan(rankPath, plan)));
  ASSERT_FALSE(static_cast<bool>(writeManifest(manifestPath, manifest)));
  llvm::Expected<RankPlan> readPlan = readRankPlan(rankPath);
  ASSERT_TRUE(static_cast<bool>(readPlan)) << llvm::toString(readPlan.takeError());
  llvm::Expected<Manifest> readBack = readManifest(manifestPath);
  ASSERT_TRUE(static_cast<bool>(readBack)) << llvm::toString(readBack.takeError());
  EXPECT_EQ(text(toJSON(*readBack)), text(toJSON(manifest)));
  EXPECT_EQ(canonicalText(*readPlan), canonicalText(plan));
  EXPECT_FALSE(static_cast<bool>(verifyPlanSet(*readBack, {*readPlan})));

  std::string missing = (dir + "/rank-00001.json").str();
  llvm::Expected<RankPlan> absent = readRankPlan(missing);
  ASSERT_FALSE(static_cast<bool>(absent));
  EXPECT_EQ(llvm::toString(absent.takeError()).rfind(missing + ": cannot read: ", 0), 0u);
  {
    std::error_code ec;
    llvm::raw_fd_ostream os(rankPath, ec);
    os << "{\"format\": \"parc-plan/1\", \"plan_id\": 7}";
  }
  llvm::Expected<RankPlan> bad = readRankPlan(rankPath);
  ASSERT_FALSE(static_cast<bool>(bad));
  EXPECT_EQ(llvm::toString(bad.takeError()),
            rankPath + ": rank plan: field \"plan_id\": expected a string, got an integer");
  llvm::sys::fs::remove_directories(dir);
}

TEST(Plan, CanonicalTextAndPlanId) {
  RankPlan a = stageZeroPlan(), b = stageZeroPlan();
  b.planId = "ffff";
  EXPECT_EQ(canonicalText(a), canonicalText(b));
  EXPECT_EQ(canonicalText(a).find("plan_id"), std::string::npos);
  EXPECT_EQ(canonicalText(a).rfind("{\"chunks\":[", 0), 0u) << "keys are sorted";
  std::string id = computePlanId({canonicalText(a)});
  EXPECT_EQ(id.size(), 16u);
  EXPECT_EQ(id, computePlanId({canonicalText(b)}));
  b.chunks[0].forward[3].attrs["eps"] = 1e-6;
  EXPECT_NE(id, computePlanId({canonicalText(b)}));
  EXPECT_NE(computePlanId({"ab", "c"}), computePlanId({"a", "bc"}));
  // xxHash64 of "1:a\n": pinned so that plan ids stay comparable across parc builds.
  EXPECT_EQ(computePlanId({"a"}), "0f3409a118ecf564");
}

TEST(Plan, RejectsOtherFormatVersion) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(set(plan, {"format"}, "parc-plan/2"),
            "rank plan: field \"format\": expected \"parc-plan/1\", got \"parc-plan/2\"; this "
            "reader understands only that version: regenerate the plan with the parc that "
            "matches this runtime");
  EXPECT_EQ(erase(plan, {"format"}), "rank plan: field \"format\": missing required field");
  Manifest manifest = manifestFor(singleRankPlan());
  json::Value value = toJSON(manifest);
  (*value.getAsObject())["format"] = "parc-plan/0";
  llvm::Expected<Manifest> read = manifestFromJSON(value);
  ASSERT_FALSE(static_cast<bool>(read));
  EXPECT_EQ(llvm::toString(read.takeError())
                .rfind("plan manifest: field \"format\": expected "
                       "\"parc-plan/1\", got \"parc-plan/0\"",
                       0),
            0u);
}

TEST(Plan, RejectsMissingWrongTypedAndUnknownFields) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(erase(plan, {"coords", "tp"}),
            "rank plan: field \"coords.tp\": missing required field");
  EXPECT_EQ(erase(plan, {"chunks", "0", "forward", "3", "attrs", "eps"}),
            "rank plan: field \"chunks[0].forward[3].attrs.eps\": missing required field");
  EXPECT_EQ(set(plan, {"coords", "tp"}, "0"),
            "rank plan: field \"coords.tp\": expected an integer, got a string");
  EXPECT_EQ(set(plan, {"coords", "tp"}, 0.5),
            "rank plan: field \"coords.tp\": expected an integer, got a fractional number");
  EXPECT_EQ(set(plan, {"coords", "tp"}, 1e300), "rank plan: field \"coords.tp\": integer out "
                                                "of range");
  EXPECT_EQ(set(plan, {"params", "2", "shape"}, json::Object{}),
            "rank plan: field \"params[2].shape\": expected an array, got an object");
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "4", "attrs", "trans_b"}, 1),
            "rank plan: field \"chunks[0].forward[4].attrs.trans_b\": expected a boolean, got "
            "an integer");
  EXPECT_EQ(set(plan, {"model", "dtype"}, "bf61"),
            "rank plan: field \"model.dtype\": unknown dtype 'bf61'; did you mean 'bf16'?");
  EXPECT_EQ(set(plan, {"model", "dtype"}, "complex64"),
            "rank plan: field \"model.dtype\": unknown dtype 'complex64'; expected one of "
            "fp32, bf16, fp16, int64");
  EXPECT_EQ(
      rejection(plan, [](json::Value &root) { (*at(root, {"coords"})->getAsObject())["tq"] = 0; }),
      "rank plan: field \"coords.tq\": unknown field; did you mean 'tp'?");
  EXPECT_EQ(set(plan, {}, json::Array{}), "rank plan: expected an object, got an array");
}

TEST(Plan, RejectsUnknownOps) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(set(plan, {"schedule", "1", "op"}, "fwdd"),
            "rank plan: field \"schedule[1].op\": unknown op 'fwdd'; did you mean 'fwd'?");
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "4", "op"}, "matmull"),
            "rank plan: field \"chunks[0].forward[4].op\": unknown op 'matmull'; did you mean "
            "'matmul'?");
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "4", "inputs"}, json::Array{"ln1"}),
            "rank plan: field \"chunks[0].forward[4].inputs\": 'matmul' takes 2 inputs, got 1");
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "4", "op"}, "matmul_bwd"),
            "rank plan: field \"chunks[0].forward[4].inputs\": 'matmul_bwd' takes 3 inputs, "
            "got 2");
}

TEST(Plan, VerifierChecksPlansBuiltInMemory) {
  RankPlan plan = stageZeroPlan();
  plan.chunks[0].forward[3].attrs.erase("eps");
  EXPECT_EQ(llvm::toString(verifyRankPlan(plan)),
            "rank plan: field \"chunks[0].forward[3].attrs.eps\": missing required field");
  plan = stageZeroPlan();
  plan.chunks[0].forward[1].attrs["group"] = std::string("everyone");
  EXPECT_EQ(llvm::toString(verifyRankPlan(plan)),
            "rank plan: field \"chunks[0].forward[1].attrs.group\": expected a group name");
  plan = stageZeroPlan();
  plan.chunks[0].backward[3].inputs.resize(1);
  EXPECT_EQ(llvm::toString(verifyRankPlan(plan)),
            "rank plan: field \"chunks[0].backward[3].inputs\": 'split_bwd' takes at least 2 "
            "inputs, got 1");
  plan = stageZeroPlan();
  plan.chunks[0].forward[0].attrs["eps"] = 1e-5;
  EXPECT_EQ(llvm::toString(verifyRankPlan(plan)),
            "rank plan: field \"chunks[0].forward[0].attrs.eps\": 'embedding' has no attribute "
            "'eps'");
  plan = stageZeroPlan();
  plan.planId.clear();
  EXPECT_EQ(llvm::toString(verifyRankPlan(plan)),
            "rank plan: field \"plan_id\": expected the hexadecimal plan hash, got \"\"");
}

TEST(Plan, RejectsTruncatedText) {
  std::string full = text(toJSON(stageZeroPlan()));
  ASSERT_TRUE(static_cast<bool>(parseRankPlan(full)));
  for (size_t length = 0; length < full.size(); length += 1 + length / 64) {
    llvm::Expected<RankPlan> read = parseRankPlan(llvm::StringRef(full).take_front(length));
    ASSERT_FALSE(static_cast<bool>(read)) << length;
    EXPECT_EQ(llvm::toString(read.takeError()).rfind("rank plan: malformed JSON: ", 0), 0u);
  }
  llvm::Expected<RankPlan> deep = parseRankPlan(std::string(100000, '['));
  ASSERT_FALSE(static_cast<bool>(deep));
  EXPECT_EQ(llvm::toString(deep.takeError()),
            "rank plan: malformed JSON: nested deeper than 64 levels");
}

TEST(Plan, RejectsRanksOutsideTheWorld) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(set(plan, {"rank"}, -1),
            "rank plan: field \"rank\": -1 is outside the 4 ranks of the world (0 to 3)");
  EXPECT_EQ(set(plan, {"rank"}, 4),
            "rank plan: field \"rank\": 4 is outside the 4 ranks of the world (0 to 3)");
  EXPECT_EQ(set(plan, {"groups", "pp", "1"}, 9),
            "rank plan: field \"groups.pp[1]\": 9 is outside the 4 ranks of the world (0 to 3)");
  EXPECT_EQ(set(plan, {"schedule", "2", "peer"}, 3),
            "rank plan: field \"schedule[2].peer\": the next virtual stage of chunk 0 is on "
            "rank 2, not 3");
  EXPECT_EQ(set(plan, {"coords", "dp"}, 1),
            "rank plan: field \"coords.dp\": 1 is outside the 1 dp ranks (0 to 0)");
  EXPECT_EQ(set(plan, {"coords", "tp"}, 1),
            "rank plan: field \"coords\": (tp 1, pp 0, dp 0, cp 0) do not match rank 0, which "
            "the parallel.order layout puts at (tp 0, pp 0, dp 0, cp 0)");
}

TEST(Plan, RejectsHugeCountsWithoutAllocatingThem) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(rejection(plan,
                      [](json::Value &root) {
                        *at(root, {"parallel", "microbatches"}) = int64_t(1) << 50;
                        *at(root, {"parallel", "global_batch"}) = int64_t(1) << 50;
                      }),
            "rank plan: field \"parallel.microbatches\": 1125899906842624 is more than the "
            "limit of 8192");
  EXPECT_EQ(set(plan, {"groups", "dp"}, json::Array{0, 1, 2}),
            "rank plan: field \"groups.dp\": has 3 ranks but the layout gives 1");
}

TEST(Plan, RejectsSummaryValuesOutOfRange) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(set(plan, {"model", "heads"}, 0),
            "rank plan: field \"model.heads\": must be at least 1, got 0");
  EXPECT_EQ(set(plan, {"train", "betas", "1"}, 1.5),
            "rank plan: field \"train.betas[1]\": must be in [0, 1), got 1.5");
  EXPECT_EQ(set(plan, {"parallel", "order"}, json::Array{"tp", "pp", "tp", "cp"}),
            "rank plan: field \"parallel.order\": must list each of tp, cp, dp and pp exactly "
            "once");
  EXPECT_EQ(set(plan, {"parallel", "order"}, json::Array{"tp", "dp", "pp"}),
            "rank plan: field \"parallel.order\": expected the 4 axes tp, cp, dp and pp, got 3 "
            "entries");
}

TEST(Plan, RejectsGroupsWithoutTheRank) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(set(plan, {"groups", "tp"}, json::Array{1, 3}),
            "rank plan: field \"groups.tp\": [1, 3] does not contain this rank (0); a rank's "
            "group lists must include the rank itself");
  EXPECT_EQ(set(plan, {"groups", "model"}, json::Array{0, 1, 1, 3}),
            "rank plan: field \"groups.model[2]\": rank 1 is listed twice");
  EXPECT_EQ(set(plan, {"groups", "tp"}, json::Array{0, 2}),
            "rank plan: field \"groups.tp\": expected [0, 1] from the rank layout, got [0, 2]");
  EXPECT_EQ(set(plan, {"groups", "embedding"}, json::Array{}),
            "rank plan: field \"groups.embedding\": expected [0, 2] from the rank layout, got "
            "[]");
}

TEST(Plan, RejectsSlicesOutsideTheShape) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(set(plan, {"params", "0", "slice", "0", "offset"}, 200),
            "rank plan: field \"params[0].slice[0]\": slice [200, 200 + 128) lies outside "
            "dimension 0 of size 256");
  EXPECT_EQ(set(plan, {"params", "4", "slice", "0", "size"}, 0),
            "rank plan: field \"params[4].slice[0]\": slice [0, 0 + 0) lies outside dimension "
            "0 of size 48");
  EXPECT_EQ(
      set(plan, {"params", "5", "slice"}, json::Array{json::Object{{"offset", 0}, {"size", 16}}}),
      "rank plan: field \"params[5].slice\": has 1 entries but the shape has 2 "
      "dimensions");
  EXPECT_EQ(set(plan, {"params", "4", "kind"}, "row"),
            "rank plan: field \"params[4].slice[0]\": a row parameter is not split along "
            "dimension 0; column splits dim 0 (dim 1 of stacked experts), vocab dim 0, row the "
            "last, ep dim 0 of stacked experts, replicated none");
}

TEST(Plan, RejectsBrokenDataFlow) {
  RankPlan plan = stageZeroPlan();
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "3", "inputs", "0"}, "x1"),
            "rank plan: field \"chunks[0].forward[3].inputs[0]\": 'x1' is read before any op "
            "writes it");
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "4", "outputs", "0"}, "x0"),
            "rank plan: field \"chunks[0].forward[4].outputs[0]\": 'x0' is written twice; only "
            "parameter gradients accumulate");
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "4", "inputs", "0"}, "nowhere"),
            "rank plan: field \"chunks[0].forward[4].inputs[0]\": 'nowhere' is neither a "
            "parameter nor in the chunk's tensors");
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "1", "attrs", "group"}, "embeding"),
            "rank plan: field \"chunks[0].forward[1].attrs.group\": unknown group "
            "'embeding'; did you mean 'embedding'?");
  EXPECT_EQ(set(plan, {"chunks", "0", "forward", "5", "attrs", "dim"}, 3),
            "rank plan: field \"chunks[0].forward[5].attrs.dim\": dimension 3 does not exist "
            "in 'qkv', which has 3");
}

TEST(Plan, RejectsIncompleteSchedules) {
  RankPlan plan = stageZeroPlan();
  auto without = [&](size_t index) {
    return rejection(plan, [&](json::Value &root) {
      json::Array &schedule = *at(root, {"schedule"})->getAsArray();
      json::Array kept;
      for (size_t i = 0; i < schedule.size(); ++i)
        if (i != index)
          kept.push_back(schedule[i]);
      schedule = std::move(kept);
    });
  };
  EXPECT_EQ(without(9), "rank plan: field \"schedule\": has no 'bwd' of chunk 0 for "
                        "microbatch 1; every chunk runs every microbatch forward and backward "
                        "once");
  EXPECT_EQ(without(0), "rank plan: field \"schedule[0]\": 'fwd' of chunk 0 microbatch 0 runs "
                        "before load_batch of its microbatch");
  EXPECT_EQ(without(12), "rank plan: field \"schedule\": has no optimizer_step");
  EXPECT_EQ(set(plan, {"schedule", "4", "op"}, "bwd"),
            "rank plan: field \"schedule[4]\": 'bwd' of chunk 0 microbatch 1 comes before its "
            "'fwd'");
  EXPECT_EQ(set(plan, {"schedule", "7", "mb"}, 1),
            "rank plan: field \"schedule[8]\": 'recv_grad' of chunk 0 microbatch 1 comes "
            "after the 'bwd' that needs it");
  EXPECT_EQ(set(plan, {"schedule", "10", "params", "0"}, "embedding.word.weights"),
            "rank plan: field \"schedule[10].params[0]\": 'embedding.word.weights' is not a "
            "parameter of this rank");
}

TEST(Plan, ManifestChecksItsRankList) {
  Manifest manifest = manifestFor(singleRankPlan());
  auto rejectManifest = [&](const std::function<void(Manifest &)> &mutate) {
    Manifest copy = manifest;
    mutate(copy);
    llvm::Expected<Manifest> read = manifestFromJSON(toJSON(copy));
    return read ? std::string("accepted") : llvm::toString(read.takeError());
  };
  EXPECT_EQ(rejectManifest([](Manifest &) {}), "accepted");
  EXPECT_EQ(rejectManifest([](Manifest &m) { m.ranks[0].file = "../rank-00000.json"; }),
            "plan manifest: field \"ranks[0].file\": \"../rank-00000.json\" is not a path "
            "relative to the manifest's directory and inside it");
  EXPECT_EQ(rejectManifest([](Manifest &m) { m.ranks.clear(); }),
            "plan manifest: field \"ranks\": lists 0 ranks but world = 1");
  EXPECT_EQ(rejectManifest([](Manifest &m) { m.parallel.globalBatch = 3; }),
            "plan manifest: field \"parallel.global_batch\": global_batch = 3 is not "
            "micro_batch x microbatches x dp = 1 x 2 x 1");
}

TEST(Plan, PlanSetMustHashToTheManifestId) {
  RankPlan plan = singleRankPlan();
  Manifest manifest = manifestFor(plan);
  plan.planId = manifest.planId;
  EXPECT_FALSE(static_cast<bool>(verifyPlanSet(manifest, {plan})));
  EXPECT_EQ(manifest.planId, computeJobPlanId(manifest));
  // The rank list follows from the job description and is not hashed.
  Manifest withoutRanks = manifest;
  withoutRanks.ranks.clear();
  EXPECT_EQ(computeJobPlanId(withoutRanks), manifest.planId);
  EXPECT_EQ(canonicalText(manifest).find("plan_id"), std::string::npos);
  Manifest changed = manifest;
  changed.train.lr = 1;
  EXPECT_EQ(llvm::toString(verifyPlanSet(changed, {plan})),
            "plan set: field \"plan_id\": the manifest's job hashes to " +
                computeJobPlanId(changed) + ", not " + manifest.planId +
                "; the manifest was changed after compilation or comes from a release other "
                "than parc 0.1.0");
  RankPlan edited = plan;
  edited.train.lr = 1;
  EXPECT_EQ(llvm::toString(verifyPlanSet(manifest, {edited})),
            "plan set: rank plan rank-00000.json: field \"train.lr\": 1 differs from the "
            "manifest's 0.001; every rank plan carries the manifest's job: regenerate the plan "
            "directory");
  edited = plan;
  edited.coords.dp = 1;
  EXPECT_EQ(llvm::toString(verifyPlanMatchesManifest(manifest, edited)),
            "rank plan: field \"coords.dp\": 1 differs from the manifest's 0; every rank plan "
            "carries the manifest's job: regenerate the plan directory");
  edited = plan;
  edited.planId = "0123";
  EXPECT_EQ(llvm::toString(verifyPlanSet(manifest, {edited})),
            "plan set: rank plan rank-00000.json: field \"plan_id\": \"0123\" differs from the "
            "manifest's \"" +
                manifest.planId + "\"; the files come from different compilations");
  EXPECT_EQ(llvm::toString(verifyPlanSet(manifest, {})),
            "plan set: the manifest describes 1 ranks but 0 rank plans were given");
}

/// Every node replaced by every wrong kind of value, and every key removed: the reader must
/// answer each with an error or a plan, never crash.
TEST(Plan, SurvivesEveryWrongValue) {
  json::Value original = toJSON(stageZeroPlan());
  std::vector<std::vector<std::string>> paths;
  std::function<void(const json::Value &, std::vector<std::string> &)> collect =
      [&](const json::Value &node, std::vector<std::string> &path) {
        paths.push_back(path);
        if (const json::Object *object = node.getAsObject())
          for (const auto &entry : *object) {
            path.push_back(entry.first.str());
            collect(entry.second, path);
            path.pop_back();
          }
        if (const json::Array *array = node.getAsArray())
          for (size_t i = 0; i < array->size(); ++i) {
            path.push_back(std::to_string(i));
            collect((*array)[i], path);
            path.pop_back();
          }
      };
  std::vector<std::string> root;
  collect(original, root);
  ASSERT_GT(paths.size(), 300u);
  const json::Value wrongValues[] = {
      nullptr, true, -1, 0, 1e30, 0.5, "x", json::Array{}, json::Array{1}, json::Object{}};
  size_t rejected = 0;
  for (const std::vector<std::string> &path : paths) {
    for (const json::Value &wrong : wrongValues) {
      json::Value copy = original;
      *at(copy, path) = wrong;
      llvm::Expected<RankPlan> read = rankPlanFromJSON(copy);
      if (!read) {
        ++rejected;
        EXPECT_EQ(llvm::toString(read.takeError()).rfind("rank plan: ", 0), 0u);
      }
    }
    if (path.empty() || !at(original, {path.begin(), path.end() - 1})->getAsObject())
      continue;
    json::Value copy = original;
    at(copy, {path.begin(), path.end() - 1})->getAsObject()->erase(path.back());
    EXPECT_FALSE(static_cast<bool>(rankPlanFromJSON(copy))) << "every field is required";
  }
  EXPECT_GT(rejected, paths.size() * 8);
}

} // namespace

TEST(PlanTraffic, SignatureRoundTripsAndNamesWhatDoesNotPair) {
  RankPlan plan = parc::plan::testing::stageZeroPlan();
  TrafficSignature sig = trafficOf(plan);
  // tp {0, 1}, pp {0, 2}, model {0..3}, embedding {0, 2}: dp and cp have one member.
  EXPECT_EQ(sig.groups.size(), 4u);
  ASSERT_EQ(sig.sends.count(2), 1u);
  EXPECT_EQ(sig.sends[2].events, 2);
  EXPECT_EQ(sig.receives[2].events, 2);
  std::optional<TrafficSignature> back = TrafficSignature::decode(sig.encode());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->encode(), sig.encode());
  EXPECT_FALSE(TrafficSignature::decode("g1,0,x,1").has_value());
  EXPECT_FALSE(TrafficSignature::decode("q2,1,1").has_value());

  // Rank 2 as the plan's pipeline partner: it receives both activations and sends both
  // gradients; a second member of each group mirrors rank 0.
  std::vector<TrafficSignature> ranks(4);
  ranks[0] = sig;
  ranks[1] = sig;
  ranks[1].sends.clear(), ranks[1].receives.clear();
  ranks[2].groups = sig.groups;
  ranks[2].receives[0] = sig.sends[2];
  ranks[2].sends[0] = sig.receives[2];
  ranks[3].groups = sig.groups;
  EXPECT_EQ(checkTraffic(ranks), "");

  std::vector<TrafficSignature> lost = ranks;
  lost[2].receives[0].events = 1;
  EXPECT_EQ(checkTraffic(lost), "rank 0's plan sends 2 messages to rank 2, and rank 2's plan "
                                "receives 1 message from rank 0; a receive without its send "
                                "waits forever");
  std::vector<TrafficSignature> other = ranks;
  other[3].groups[Group::Model].collectives.hash ^= 1;
  EXPECT_EQ(checkTraffic(other),
            "rank 3's plan runs 1 collectives on its model group (led by rank 0), rank 0's plan "
            "1, but not the same ones in the same order; every member must run the same "
            "collectives or they wait for each other");
}
