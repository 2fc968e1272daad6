//===- LoweringTest.cpp - Rank plans of whole jobs ------------------------===//
//
// lowerAllRanks on the acceptance examples and on a sweep of small mappings: every plan must
// verify, alone and together. Also: the shards add up to the memory model's parameters, one
// rank lowered alone equals its plan in the full set, and the whole-job check rejects plans
// whose schedules do not fit together.
//
//===----------------------------------------------------------------------===//
#include "parc/Lower/Lowering.h"
#include "parc/Check/Mapping.h"
#include "parc/Cost/MemoryModel.h"
#include "parc/Frontend/Parser.h"
#include "parc/Plan/PlanJSON.h"
#include "parc/Sema/Sema.h"

#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"
#include "gtest/gtest.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <functional>
#include <iostream>

using namespace parc;

namespace {

struct Compiled {
  std::optional<Program> program;
  std::optional<Mapping> mapping;
  std::string diagnostics;
};

Compiled compileText(llvm::StringRef text) {
  Compiled result;
  llvm::SourceMgr sourceMgr;
  llvm::raw_string_ostream os(result.diagnostics);
  DiagnosticEngine diags(sourceMgr, os);
  ast::Module module = parseBuffer(text, "test.par", diags);
  result.program = analyze(module, diags);
  if (result.program && !diags.hasErrors())
    result.mapping = checkMapping(*result.program, diags);
  if (diags.hasErrors())
    result.mapping.reset();
  os.flush();
  return result;
}

Compiled compileExample(llvm::StringRef name) {
  auto buffer = llvm::MemoryBuffer::getFile(std::string(PARC_EXAMPLES_DIR) + "/" + name.str());
  if (!buffer)
    return {};
  return compileText((*buffer)->getBuffer());
}

/// A job with every knob of the sweep; `extraModel` goes into the model block.
struct Knobs {
  int tp = 2, pp = 2, dp = 2;
  std::string schedule = "1f1b";
  int zero = 0;
  std::string recompute = "none";
  bool sequenceParallel = false;
  int blocks = 4, heads = 4, kvHeads = 4;
  bool llama = false; // rmsnorm, swiglu, rope, untied head
  int globalBatch = 16;
  /// Model fields of a mixture of experts on every block but the first ("" for dense).
  std::string moe;
  int64_t bucketSize = 0; // parallel.bucket_size; 0 leaves the default
  int cp = 1, ep = 1;      // ep is carved from dp
};

std::string jobText(const Knobs &k) {
  std::string model = "model m {\n  dtype = fp32; vocab = 300; seq = 16; hidden = 32\n  heads = " +
                      std::to_string(k.heads) + "; kv_heads = " + std::to_string(k.kvHeads) +
                      "; ffn = 64\n";
  if (k.llama)
    model += "  norm = rmsnorm; mlp = swiglu; position = rope\n";
  model += k.moe;
  model += "  layer embed : embedding\n";
  if (!k.moe.empty())
    model += "  layer dense : transformer(experts = 0) x 1\n";
  model += "  layer block : transformer x " + std::to_string(k.blocks - !k.moe.empty()) +
           "\n  layer head : lm_head" + (k.llama ? "" : " tied(embed)") + "\n}\n";
  std::string cluster =
      "cluster c {\n  nodes = 1; gpus_per_node = " + std::to_string(k.tp * k.pp * k.dp * k.cp) +
      "\n  gpu { memory = 80 GiB; flops = 100 TFLOPS }\n"
      "  intra_node { bandwidth = 100 GB/s; latency = 1 us }\n}\n";
  std::string parallel =
      "parallel for m on c {\n  tp = " + std::to_string(k.tp) + "; pp = " + std::to_string(k.pp) +
      "; dp = " + std::to_string(k.dp) + "\n  global_batch = " + std::to_string(k.globalBatch) +
      "\n  schedule = " + k.schedule + "\n  zero = " + std::to_string(k.zero) +
      "\n  recompute = " + k.recompute +
      "\n  sequence_parallel = " + (k.sequenceParallel ? "true" : "false") +
      (k.bucketSize ? "\n  bucket_size = " + std::to_string(k.bucketSize) : "") +
      (k.cp > 1 ? "\n  cp = " + std::to_string(k.cp) : "") +
      (k.ep > 1 ? "\n  ep = " + std::to_string(k.ep) : "") + "\n}\n";
  return model + cluster + parallel;
}

std::string describe(const Knobs &k) {
  return "tp " + std::to_string(k.tp) + " pp " + std::to_string(k.pp) + " dp " +
         std::to_string(k.dp) + " " + k.schedule + " zero " + std::to_string(k.zero) + " " +
         k.recompute + (k.sequenceParallel ? " sp" : "") + (k.llama ? " llama" : " gpt") + " kv " +
         std::to_string(k.kvHeads) + (k.moe.empty() ? "" : " moe") +
         (k.cp > 1 ? " cp " + std::to_string(k.cp) : "") +
         (k.ep > 1 ? " ep " + std::to_string(k.ep) : "");
}

/// Elements of each parameter this rank holds, as the memory model counts them.
int64_t localElements(const plan::RankPlan &plan) {
  int64_t total = 0;
  for (const plan::ParamShard &param : plan.params) {
    int64_t n = 1;
    for (const plan::Slice &s : param.slice)
      n *= s.size;
    total += n;
  }
  return total;
}

/// The elements of every ZeRO partition the rank's schedule defines, in order of appearance.
std::vector<int64_t> partitionSizes(const plan::RankPlan &plan) {
  std::map<std::string, int64_t> numel;
  for (const plan::ParamShard &param : plan.params) {
    int64_t n = 1;
    for (const plan::Slice &s : param.slice)
      n *= s.size;
    numel[param.name] = n;
  }
  std::vector<std::vector<std::string>> seen;
  std::vector<int64_t> sizes;
  for (const plan::Instr &instr : plan.schedule) {
    if (instr.op == plan::InstrKind::AllReduceGrads || !plan::usesParams(instr.op) ||
        std::find(seen.begin(), seen.end(), instr.params) != seen.end())
      continue;
    seen.push_back(instr.params);
    int64_t n = 0;
    for (const std::string &name : instr.params)
      n += numel[name];
    sizes.push_back(n);
  }
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

/// The buckets the ZeRO policy forms from the memory model's units of one stage: the dense
/// units' and, apart, the experts'.
std::vector<int64_t> modelBuckets(const Program &program, const Mapping &mapping,
                                  int64_t stage) {
  ZeroPolicy policy = zeroPolicy(program.parallel, mapping.dp);
  ZeroPolicy expertPolicy = zeroPolicy(program.parallel, mapping.expertDp());
  std::vector<int64_t> sizes;
  for (int64_t chunk = 0; chunk < mapping.chunks; ++chunk) {
    int64_t virtualStage = chunk * mapping.pp + stage;
    for (const ZeroBucket &bucket :
         policy.buckets(virtualStageUnits(program.model, mapping, virtualStage)))
      sizes.push_back(bucket.elements);
    for (const ZeroBucket &bucket :
         expertPolicy.buckets(expertUnits(program.model, mapping, virtualStage)))
      sizes.push_back(bucket.elements);
  }
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

/// The all_gather_params within each compute of microbatch 0, as (chunk, backward) -> padded
/// elements and collectives, beside what ZeroPolicy's gathersAroundUse says of the same chunk.
void expectGathersFollowThePolicy(const Program &program, const Mapping &mapping,
                                  const plan::RankPlan &plan, const std::string &what) {
  std::map<std::string, int64_t> numel;
  for (const plan::ParamShard &param : plan.params) {
    int64_t n = 1;
    for (int64_t dim : param.localShape())
      n *= dim;
    numel[param.name] = n;
  }
  const bool full = program.parallel.recompute == Recompute::Full;
  const bool tied = headReadsWordEmbedding(program.model, mapping);
  const ZeroPolicy dense = zeroPolicy(program.parallel, mapping.gradientRanks());
  const ZeroPolicy experts = zeroPolicy(program.parallel, mapping.expertDp());
  std::vector<double> peaks(plan.chunks.size(), 0), modelPeaks(plan.chunks.size(), 0);
  for (size_t i = 0; i < plan.schedule.size(); ++i) {
    const plan::Instr &compute = plan.schedule[i];
    if (!plan::isCompute(compute.op) || compute.microbatch != 0)
      continue;
    double elements = 0;
    int64_t collectives = 0;
    for (size_t j = i; j-- > 0 && plan.schedule[j].within &&
                       plan.schedule[j].op == plan::InstrKind::AllGatherParams;) {
      int64_t n = 0, members = int64_t(plan.groups.get(plan.schedule[j].group).size());
      for (const std::string &name : plan.schedule[j].params)
        n += numel[name];
      elements += double((n + members - 1) / members * members);
      ++collectives;
    }
    int64_t v = plan.chunks[size_t(compute.chunk)].virtualStage;
    std::vector<ParamUnit> units = virtualStageUnits(program.model, mapping, v);
    std::vector<ParamUnit> expertList = expertUnits(program.model, mapping, v);
    ChunkGathers chunk = gathersAroundUse(
        program.model, {dense, units, experts, expertList, mapping.ep == 1, tied}, full);
    const ZeroGathers &d = chunk.dense, &e = chunk.experts;
    bool backward = compute.op == plan::InstrKind::Backward;
    EXPECT_EQ(collectives, backward ? d.backward.collectives + e.backward.collectives
                                    : d.forward.collectives + e.forward.collectives)
        << what << ", rank " << plan.rank << ", schedule[" << i << "]";
    EXPECT_EQ(elements, backward ? d.backward.elements + e.backward.elements
                                 : d.forward.elements + e.forward.elements)
        << what << ", rank " << plan.rank << ", schedule[" << i << "]";
    // The most elements whole at once, from the runs the plan's gathers span.
    const plan::Chunk &lowered = plan.chunks[size_t(compute.chunk)];
    llvm::ArrayRef<plan::Op> ops = backward ? lowered.backward : lowered.forward;
    plan::WithinGathers within = plan::gatheredWithin(plan.schedule, i);
    std::vector<std::vector<plan::OpRun>> runs = plan::readRuns(ops, within.lists);
    std::vector<double> held(ops.size() + 1, 0);
    for (size_t l = 0; l < within.lists.size(); ++l) {
      int64_t n = 0, members = int64_t(plan.groups.get(within.lists[l].group).size());
      for (const std::string &name : *within.lists[l].params)
        n += numel[name];
      for (const plan::OpRun &run : runs[l])
        for (size_t op = run.first; op <= run.last; ++op)
          held[op] += double((n + members - 1) / members * members);
    }
    double peak = *std::max_element(held.begin(), held.end());
    EXPECT_LE(peak, chunk.peak) << what << ", rank " << plan.rank << ", schedule[" << i << "]";
    peaks[size_t(compute.chunk)] = std::max(peaks[size_t(compute.chunk)], peak);
    modelPeaks[size_t(compute.chunk)] = chunk.peak;
  }
  EXPECT_EQ(peaks, modelPeaks) << what << ", rank " << plan.rank;
}

void expectLowers(const Knobs &knobs) {
  Compiled job = compileText(jobText(knobs));
  ASSERT_TRUE(job.mapping) << describe(knobs) << "\n" << job.diagnostics;
  llvm::Expected<std::vector<plan::RankPlan>> plans = lowerAllRanks(*job.program, *job.mapping);
  ASSERT_TRUE(static_cast<bool>(plans))
      << describe(knobs) << ": " << llvm::toString(plans.takeError());
  ASSERT_EQ(int64_t(plans->size()), int64_t(knobs.tp * knobs.pp * knobs.dp * knobs.cp));
  if (knobs.kvHeads < knobs.tp)
    return; // replicated key/value heads are held more than once
  MemoryEstimate memory = estimateMemory(*job.program, *job.mapping);
  for (const plan::RankPlan &plan : *plans) {
    EXPECT_EQ(localElements(plan), memory.stages[plan.coords.pp].paramsPerRank)
        << describe(knobs) << ", rank " << plan.rank;
    EXPECT_EQ(partitionSizes(plan), modelBuckets(*job.program, *job.mapping, plan.coords.pp))
        << describe(knobs) << ", rank " << plan.rank;
    expectGathersFollowThePolicy(*job.program, *job.mapping, plan, describe(knobs));
  }
}

} // namespace

TEST(Lowering, AcceptanceExamplesLowerAndVerify) {
  for (const char *name : {"tiny.par", "llama2-70b.par", "gpt3-175b.par"}) {
    Compiled job = compileExample(name);
    ASSERT_TRUE(job.mapping) << name << "\n" << job.diagnostics;
    auto start = std::chrono::steady_clock::now();
    llvm::Expected<std::vector<plan::RankPlan>> plans = lowerAllRanks(*job.program, *job.mapping);
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(static_cast<bool>(plans)) << name << ": " << llvm::toString(plans.takeError());
    EXPECT_EQ(int64_t(plans->size()), job.mapping->layout.world());
    // Its speed is bench/lowering.sh's to judge: on a shared machine a timed test fails at
    // random (this one took 10.5 s once, 4 s alone).
    std::cout << "[ lowering ] " << name << ": " << plans->size() << " ranks lowered and "
              << "verified in " << seconds << " s\n";
  }
}

TEST(Lowering, SweepOfSmallMappings) {
  int count = 0;
  for (int tp : {1, 2, 4})
    for (int pp : {1, 2, 4})
      for (const char *schedule : {"gpipe", "1f1b", "interleaved(chunks = 2)"}) {
        if (pp == 1 && std::string(schedule) != "1f1b")
          continue;
        for (int variant = 0; variant < 6; ++variant) {
          Knobs k;
          k.tp = tp;
          k.pp = pp;
          k.dp = variant % 3 == 2 ? 1 : 2;
          k.schedule = schedule;
          k.blocks = 8;
          k.zero = variant % 4;
          k.recompute = variant % 3 == 0 ? "none" : variant % 3 == 1 ? "selective" : "full";
          k.sequenceParallel = tp > 1 && variant % 2 == 1;
          k.llama = variant >= 3;
          k.kvHeads = k.llama ? 2 : 4; // kv_heads < tp when tp = 4
          k.globalBatch = 8 * k.dp;    // M = 8 with micro_batch 1
          SCOPED_TRACE(describe(k));
          expectLowers(k);
          ++count;
        }
      }
  EXPECT_GT(count, 100);
}

TEST(Lowering, MixtureOfExpertsShardsAndBucketsFollowTheMemoryModel) {
  // The experts are ZeRO buckets of their own; with ep = 1 they are sharded over dp too, and
  // over tp as the dense MLP is (expert tensor parallelism = tp).
  for (int zero = 0; zero < 4; ++zero)
    for (int tp : {1, 2})
      for (bool llama : {false, true}) {
        Knobs k;
        k.tp = tp;
        k.pp = 2;
        k.sequenceParallel = tp > 1 && zero % 2;
        k.zero = zero;
        k.llama = llama;
        k.recompute = zero % 2 ? "full" : "selective";
        k.moe = "  experts = 4; top_k = 2; moe_ffn = 16; shared_experts = " +
                std::to_string(zero % 2) + "\n";
        SCOPED_TRACE(describe(k));
        expectLowers(k);
      }
}

TEST(Lowering, ZeroThreeGathersABucketForEachRunOfItsReads) {
  // bucket_size 1 makes each sub-layer a bucket: a full recompute regathers the attention
  // halves in the backward and a tied head the word embedding; 3000 merges sub-layers of
  // neighbouring blocks; the default keeps a stage's blocks in one bucket.
  for (int64_t bucketSize : {int64_t(1), int64_t(3000), int64_t(0)})
    for (const char *recompute : {"none", "selective", "full"})
      for (int pp : {1, 2})
        for (int variant = 0; variant < 5; ++variant) {
          Knobs k;
          k.tp = variant == 1 ? 2 : 1;
          k.pp = pp;
          k.zero = 3;
          k.recompute = recompute;
          k.bucketSize = bucketSize;
          k.llama = variant == 1;
          k.sequenceParallel = k.tp > 1;
          if (variant == 2 || variant == 3)
            k.moe = "  experts = 4; top_k = 2; moe_ffn = 16; shared_experts = " +
                    std::to_string(variant == 2) + "\n";
          if (variant == 3) { // experts over their own group
            k.dp = 4;
            k.ep = 2;
            k.globalBatch = 32;
          }
          k.cp = variant == 4 ? 2 : 1; // ring attention
          SCOPED_TRACE(describe(k) + ", bucket_size " + std::to_string(bucketSize));
          expectLowers(k);
        }
}

TEST(Lowering, OneRankAloneEqualsItsPlanInTheSet) {
  Knobs k;
  k.schedule = "interleaved(chunks = 2)";
  k.zero = 3;
  k.sequenceParallel = true;
  Compiled job = compileText(jobText(k));
  ASSERT_TRUE(job.mapping) << job.diagnostics;
  auto plans = lowerAllRanks(*job.program, *job.mapping);
  ASSERT_TRUE(static_cast<bool>(plans)) << llvm::toString(plans.takeError());
  std::string id = computeJobPlanId(*job.program, *job.mapping);
  for (const plan::RankPlan &expected : *plans) {
    plan::RankPlan alone = lowerRank(*job.program, *job.mapping, expected.rank, id);
    EXPECT_EQ(plan::toJSON(alone), plan::toJSON(expected)) << "rank " << expected.rank;
  }
  EXPECT_EQ(plans->front().planId, id);
  EXPECT_EQ(buildManifest(*job.program, *job.mapping, id).planId, id);
}

TEST(Lowering, PlanIdNamesTheJob) {
  Knobs k;
  Compiled a = compileText(jobText(k));
  k.zero = 1;
  Compiled b = compileText(jobText(k));
  ASSERT_TRUE(a.mapping && b.mapping);
  std::string id = computeJobPlanId(*a.program, *a.mapping);
  EXPECT_EQ(id.size(), 16u);
  EXPECT_EQ(id, computeJobPlanId(*a.program, *a.mapping));
  EXPECT_NE(id, computeJobPlanId(*b.program, *b.mapping));
  plan::Manifest manifest = buildManifest(*a.program, *a.mapping, id);
  EXPECT_EQ(plan::computeJobPlanId(manifest), id);
}

TEST(Lowering, WholeJobCheckRejectsSchedulesThatDoNotFit) {
  Knobs k;
  k.schedule = "gpipe";
  Compiled job = compileText(jobText(k));
  ASSERT_TRUE(job.mapping) << job.diagnostics;
  auto lowered = lowerAllRanks(*job.program, *job.mapping);
  ASSERT_TRUE(static_cast<bool>(lowered)) << llvm::toString(lowered.takeError());
  const std::vector<plan::RankPlan> &plans = *lowered;
  auto rejection = [&](const std::function<void(std::vector<plan::RankPlan> &)> &edit) {
    std::vector<plan::RankPlan> edited = plans;
    edit(edited);
    llvm::Error error = verifyLoweredPlans(*job.program, *job.mapping, edited);
    return error ? llvm::toString(std::move(error)) : std::string("accepted");
  };
  EXPECT_EQ(rejection([](auto &) {}), "accepted");

  // Rank 0 (stage 0) runs microbatch 1 before microbatch 0: each plan is still valid, but
  // its first send waits for a receive that stage 1 posts only after receiving microbatch 0.
  std::string deadlock = rejection([](std::vector<plan::RankPlan> &p) {
    std::vector<plan::Instr> &s = p[0].schedule;
    ASSERT_EQ(plan::spelling(s[3].op), "load_batch");
    std::rotate(s.begin(), s.begin() + 3, s.begin() + 6);
  });
  EXPECT_NE(deadlock.find("internal error: the pipeline of ranks [0, 4]"), std::string::npos)
      << deadlock;
  EXPECT_NE(deadlock.find("deadlock"), std::string::npos) << deadlock;

  std::string collective = rejection([](std::vector<plan::RankPlan> &p) {
    for (plan::Instr &instr : p[1].schedule)
      if (instr.op == plan::InstrKind::AllReduceGrads && instr.group == plan::Group::DP)
        instr.params.pop_back();
  });
  EXPECT_NE(collective.find("internal error: ranks 0 and 1 of stage 0 differ at schedule["),
            std::string::npos)
      << collective;

  // The same change on every rank of the stage leaves the tp and dp groups consistent but
  // breaks the embedding group: stage 1 still sums a gradient stage 0 no longer names.
  std::string embedding = rejection([](std::vector<plan::RankPlan> &p) {
    for (plan::RankPlan &plan : p)
      if (plan.coords.pp == 0)
        for (plan::Instr &instr : plan.schedule)
          if (instr.op == plan::InstrKind::AllReduceGrads && instr.group == plan::Group::Embedding)
            instr.average = true;
  });
  EXPECT_NE(embedding.find("meets rank"), std::string::npos) << embedding;
}

TEST(Lowering, VerifierHoldsMixtureOfExpertsOpsToTheirShapes) {
  Knobs k;
  k.tp = 1;
  k.pp = 1;
  k.dp = 1;
  k.llama = true;
  k.moe = "  experts = 4; top_k = 2; moe_ffn = 16\n";
  Compiled job = compileText(jobText(k));
  ASSERT_TRUE(job.mapping) << job.diagnostics;
  auto plans = lowerAllRanks(*job.program, *job.mapping);
  ASSERT_TRUE(static_cast<bool>(plans)) << llvm::toString(plans.takeError());
  auto verdict = [&](const std::function<void(plan::Chunk &)> &edit) {
    plan::RankPlan edited = plans->front();
    edit(edited.chunks[0]);
    llvm::Error error = plan::verifyRankPlan(edited);
    return error ? llvm::toString(std::move(error)) : std::string("accepted");
  };
  auto opWriting = [](plan::Chunk &chunk, llvm::StringRef output) -> plan::Op & {
    for (std::vector<plan::Op> *ops : {&chunk.forward, &chunk.backward})
      for (plan::Op &op : *ops)
        if (op.outputs.front() == output)
          return op;
    static plan::Op none;
    ADD_FAILURE() << "no op writes " << output.str();
    return none;
  };
  EXPECT_EQ(verdict([](plan::Chunk &) {}), "accepted");
  // 16 tokens x top_k 2 = 32 rows reach the experts.
  std::string rows = verdict([](plan::Chunk &c) { c.tensors["block.1.moe.rows"].shape = {31, 32}; });
  EXPECT_NE(rows.find("'block.1.moe.rows' has shape [31, 32]; expected [32, 32] ([seq x batch x "
                      "top_k, features] of the routed tokens)"),
            std::string::npos)
      << rows;
  std::string topK = verdict([&](plan::Chunk &c) {
    opWriting(c, "block.1.moe.rows").attrs["top_k"] = int64_t(5);
  });
  EXPECT_NE(topK.find("5 choices among the 4 experts of 'block.1.moe.logits'"), std::string::npos)
      << topK;
  std::string weight = verdict([&](plan::Chunk &c) {
    std::swap(opWriting(c, "block.1.moe.gate").inputs[2], opWriting(c, "block.1.moe.down").inputs[2]);
  });
  // The down projection [4, 32, 16] now reads the 32 features of the dispatched rows.
  EXPECT_NE(weight.find("'block.1.moe.experts.down.weight' has shape [4, 32, 16]; expected "
                        "[4, 32, 32] ([experts, out, in] of the logits' experts and the rows' "
                        "features)"),
            std::string::npos)
      << weight;
  std::string aux = verdict([&](plan::Chunk &c) {
    opWriting(c, "block.1.moe.logits.grad.aux").attrs["aux_loss"] = -0.5;
  });
  EXPECT_NE(aux.find("must be finite and not negative, got -0.5"), std::string::npos) << aux;
  std::string role = verdict([&](plan::Chunk &c) {
    plan::Op &op = opWriting(c, "block.1.ln2.grad.experts");
    op.inputs[0] = "block.1.moe.rows";
  });
  EXPECT_NE(role.find("'block.1.moe.rows' is not a gradient, where 'moe_dispatch_bwd' takes one"),
            std::string::npos)
      << role;
}
