//===- ExecutorTest.cpp - The executor's parts, without the compiler ------===//
//
// Memory accounting, the data rule, ZeRO partitions and their collectives, tensor liveness and
// the collectives of op lists along any dim, on hand-written plans. The whole executor on
// compiled plans is tested by test/lit/runtime.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Buffer.h"
#include "parc/Runtime/Data.h"
#include "parc/Runtime/OpFusion.h"
#include "parc/Runtime/OpInterpreter.h"
#include "parc/Runtime/Optimizer.h"
#include "parc/Runtime/ParamStore.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/raw_ostream.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <numeric>
#include <set>

using namespace parc;
using namespace parc::runtime;

namespace {

TEST(MemoryTracker, PeaksPerCategoryAndTotal) {
  MemoryTracker memory;
  {
    Buffer<double> weights(memory, MemoryCategory::Weights, 10);
    {
      Buffer<float> activations(memory, MemoryCategory::Activations, 4);
      EXPECT_EQ(memory.current(MemoryCategory::Activations), 16);
    }
    Buffer<float> more(memory, MemoryCategory::Activations, 2);
    EXPECT_EQ(memory.current(MemoryCategory::Activations), 8);
    Buffer<float> moved = std::move(more);
    EXPECT_EQ(memory.current(MemoryCategory::Activations), 8);
    EXPECT_FALSE(more.allocated());
  }
  EXPECT_EQ(memory.current(MemoryCategory::Weights), 0);
  EXPECT_EQ(memory.peak(MemoryCategory::Weights), 80);
  EXPECT_EQ(memory.peak(MemoryCategory::Activations), 16);
  EXPECT_EQ(memory.peakTotal(), 96);
}

TEST(TokenStream, EveryMappingReadsTheSameSamplesPerStep) {
  TokenStream data = TokenStream::synthetic(100);
  int64_t seq = 8;
  auto samplesOfStep = [&](int64_t dp, int64_t microBatch, int64_t step) {
    plan::ParallelSummary parallel;
    parallel.dp = dp;
    parallel.microBatch = microBatch;
    parallel.globalBatch = 8;
    parallel.microbatches = 8 / (dp * microBatch);
    std::multiset<std::vector<int64_t>> samples;
    std::vector<int64_t> tokens(size_t(microBatch * seq)), labels(tokens.size());
    for (int64_t d = 0; d < dp; ++d)
      for (int64_t mb = 0; mb < parallel.microbatches; ++mb) {
        data.microbatch(7, step, parallel, d, mb, seq, tokens.data(), labels.data());
        for (int64_t j = 0; j < microBatch; ++j) {
          std::vector<int64_t> sample(tokens.begin() + j * seq, tokens.begin() + (j + 1) * seq);
          sample.push_back(labels[size_t((j + 1) * seq - 1)]);
          // Labels are the tokens shifted by one.
          for (int64_t t = 0; t + 1 < seq; ++t)
            EXPECT_EQ(labels[size_t(j * seq + t)], tokens[size_t(j * seq + t + 1)]);
          samples.insert(sample);
        }
      }
    return samples;
  };
  EXPECT_EQ(samplesOfStep(1, 1, 3), samplesOfStep(2, 2, 3));
  EXPECT_EQ(samplesOfStep(1, 2, 0), samplesOfStep(4, 1, 0));
  EXPECT_NE(samplesOfStep(1, 1, 0), samplesOfStep(1, 1, 1));
}

TEST(TokenStream, TextSamplesAreSpansOfTheFile) {
  llvm::SmallString<128> path;
  ASSERT_FALSE(llvm::sys::fs::createTemporaryFile("parrun-data", "txt", path));
  std::string text;
  for (int i = 0; i < 50; ++i)
    text += char('a' + i % 26);
  {
    std::error_code error;
    llvm::raw_fd_ostream file(path, error);
    file << text;
  }
  llvm::Expected<TokenStream> data = TokenStream::fromFile(path, 256, 9);
  ASSERT_TRUE(bool(data)) << llvm::toString(data.takeError());
  std::vector<int64_t> sample(10);
  for (uint64_t i = 0; i < 20; ++i) {
    data->sample(1, i, 10, sample.data());
    std::string span(sample.begin(), sample.end());
    EXPECT_NE(text.find(span), std::string::npos) << span;
  }

  llvm::Expected<TokenStream> smallVocab = TokenStream::fromFile(path, 128, 9);
  ASSERT_FALSE(bool(smallVocab));
  EXPECT_NE(llvm::toString(smallVocab.takeError()).find("vocab 128"), std::string::npos);
  llvm::Expected<TokenStream> tooShort = TokenStream::fromFile(path, 256, 50);
  ASSERT_FALSE(bool(tooShort));
  EXPECT_NE(llvm::toString(tooShort.takeError()).find("fewer than one sample"), std::string::npos);
  llvm::sys::fs::remove(path);
  llvm::Expected<TokenStream> missing = TokenStream::fromFile(path, 256, 9);
  ASSERT_FALSE(bool(missing));
  EXPECT_NE(llvm::toString(missing.takeError()).find("cannot read data file"), std::string::npos);
}

/// A rank plan with three parameters of 5, 3 and 3 elements on a dp group of two.
plan::RankPlan partitionedPlan(int64_t rank) {
  plan::RankPlan plan;
  plan.world = 2;
  plan.rank = rank;
  plan.coords.dp = rank;
  plan.groups.dp = {0, 1};
  plan.groups.tp = {rank};
  plan.groups.pp = {rank};
  plan.groups.model = {rank};
  for (auto [name, size] : {std::pair<const char *, int64_t>{"a", 5}, {"b", 3}, {"c", 3}}) {
    plan::ParamShard shard;
    shard.name = name;
    shard.shape = {size};
    shard.slice = {{0, size}};
    shard.init = {plan::InitKind::Normal, 1.0};
    plan.params.push_back(shard);
  }
  std::vector<std::string> names = {"a", "b", "c"};
  plan.schedule = {
      plan::Instr::allGatherParams(plan::Group::DP, names),
      plan::Instr::releaseParams(names),
      plan::Instr::gradCollective(plan::InstrKind::ReduceScatterGrads, plan::Group::DP, true,
                                  names),
      plan::Instr::optimizerStep({plan::Group::Model, plan::Group::DP}),
  };
  plan.train.optimizer = plan::Optimizer::SGD;
  plan.train.lr = 0.5;
  plan.train.gradClip = 0;
  return plan;
}

TEST(ParamStore, PartitionsFlattenPadAndSplitByPosition) {
  plan::RankPlan first = partitionedPlan(0), second = partitionedPlan(1);
  CpuDevice<double> device;
  ParamStore<CpuDevice<double>> a(first, device), b(second, device);
  ASSERT_FALSE(bool(a.buildPartitions()));
  ASSERT_FALSE(bool(b.buildPartitions()));
  ASSERT_EQ(a.partitions().size(), 1u);
  EXPECT_EQ(a.partitions()[0].elements, 11);
  EXPECT_EQ(a.partitions()[0].perMember, 6);
  // Rank 0 owns flat [0, 6): all of a and b's first element; rank 1 [6, 12): the rest.
  using Range = std::pair<int64_t, int64_t>;
  auto owned = [](ParamStore<CpuDevice<double>> &store, const char *name) {
    auto *param = store.find(name);
    return Range(param->ownedBegin, param->ownedEnd);
  };
  EXPECT_EQ(owned(a, "a"), Range(0, 5));
  EXPECT_EQ(owned(a, "b"), Range(0, 1));
  EXPECT_EQ(owned(a, "c").second - owned(a, "c").first, 0);
  EXPECT_EQ(owned(b, "a").second - owned(b, "a").first, 0);
  EXPECT_EQ(owned(b, "b"), Range(1, 3));
  EXPECT_EQ(owned(b, "c"), Range(0, 3));
}

TEST(ParamStore, ZeroCollectivesMatchAnUnpartitionedUpdate) {
  // Both ranks hold gradients g_r; the partitioned step must leave every rank with
  // w - lr * (g_0 + g_1) / 2, exactly as an all-reduce would.
  LocalWorld world(2);
  std::vector<std::vector<double>> finals(2);
  std::vector<std::string> errors = world.run([&](Communicator &comm) {
    plan::RankPlan plan = partitionedPlan(comm.rank());
    CpuDevice<double> device;
    ParamStore<CpuDevice<double>> store(plan, device);
    if (llvm::Error error = store.buildPartitions())
      throw std::runtime_error(llvm::toString(std::move(error)));
    store.initialize(42);
    // ZeRO-3 starts released: only the owned range is held.
    EXPECT_TRUE(store.find("a")->released());
    store.allGatherParams(comm, plan.schedule[0]);
    // A partition's whole gradient exists from its first write to its reduce-scatter.
    EXPECT_EQ(store.find("a")->grad, nullptr);
    for (auto &param : store.all()) {
      double *grad = store.writableGrad(param);
      for (int64_t k = 0; k < param.numel; ++k)
        grad[size_t(k)] = double(comm.rank() + 1) * double(k + 1);
    }
    store.releaseParams(plan.schedule[1]);
    store.reduceScatterGrads(comm, plan.schedule[2]);
    EXPECT_EQ(store.find("a")->grad, nullptr);
    EXPECT_EQ(device.memory().current(MemoryCategory::Grads),
              int64_t(store.partitions()[0].perMember * sizeof(double)));
    StepStats stats = optimizerStep(store, comm, plan, plan.schedule[3], 0);
    EXPECT_TRUE(stats.updated);
    // Global norm over the averaged gradient 1.5 * (k + 1) of every element, counted once.
    double expected = 0;
    for (int64_t size : {5, 3, 3})
      for (int64_t k = 0; k < size; ++k)
        expected += 2.25 * double((k + 1) * (k + 1));
    EXPECT_NEAR(stats.gradNorm, std::sqrt(expected), 1e-12);
    store.gatherAll(comm);
    for (auto &param : store.all())
      finals[size_t(comm.rank())].insert(finals[size_t(comm.rank())].end(), param.value,
                                         param.value + param.numel);
  });
  for (const std::string &error : errors)
    ASSERT_EQ(error, "");
  ASSERT_EQ(finals[0], finals[1]);
  // The reference: initial weights minus lr times the averaged gradient.
  plan::RankPlan plan = partitionedPlan(0);
  CpuDevice<double> device;
  ParamStore<CpuDevice<double>> reference(plan, device);
  plan.schedule.clear();
  reference.initialize(42);
  std::vector<double> expected;
  for (auto &param : reference.all())
    for (int64_t k = 0; k < param.numel; ++k)
      expected.push_back(param.value[size_t(k)] - 0.5 * 1.5 * double(k + 1));
  ASSERT_EQ(expected.size(), finals[0].size());
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(finals[0][i], expected[i], 1e-14) << i;
}

TEST(ParamStore, RejectsTwoDifferentPartitionsOfOneParameter) {
  plan::RankPlan plan = partitionedPlan(0);
  plan.schedule.push_back(plan::Instr::allGatherParams(plan::Group::DP, {"a", "b"}));
  CpuDevice<double> device;
  ParamStore<CpuDevice<double>> store(plan, device);
  llvm::Error error = store.buildPartitions();
  ASSERT_TRUE(bool(error));
  EXPECT_NE(llvm::toString(std::move(error)).find("with another params list"), std::string::npos);
}

plan::Op makeOp(plan::OpKind kind, std::vector<std::string> inputs,
                std::vector<std::string> outputs,
                std::map<std::string, plan::AttrValue> attrs = {}) {
  return plan::Op{kind, std::move(inputs), std::move(outputs), std::move(attrs)};
}

TEST(ChunkLiveness, FreesWhatNoLaterPassReads) {
  plan::Chunk chunk;
  chunk.input = "x";
  chunk.output = "y";
  chunk.tensors = {{"x", {{4}}},      {"a", {{4}}},      {"b", {{4}}},     {"y", {{4}}},
                   {"x.grad", {{4}}}, {"y.grad", {{4}}}, {"a.grad", {{4}}}};
  chunk.forward = {makeOp(plan::OpKind::GELU, {"x"}, {"a"}),
                   makeOp(plan::OpKind::GELU, {"a"}, {"b"}),
                   makeOp(plan::OpKind::ResidualAdd, {"b", "x"}, {"y"})};
  chunk.backward = {makeOp(plan::OpKind::GELUBwd, {"a", "y.grad"}, {"a.grad"}),
                    makeOp(plan::OpKind::GELUBwd, {"x", "a.grad"}, {"x.grad"})};
  ChunkLiveness liveness = ChunkLiveness::analyze(chunk);
  // b dies with the forward's last op; a and x wait for the backward, y for its send.
  EXPECT_EQ(liveness.afterForward[0], std::vector<std::string>{});
  EXPECT_EQ(liveness.afterForward[2], std::vector<std::string>{"b"});
  EXPECT_EQ(liveness.readByBackward, (std::vector<std::string>{"a", "a.grad", "x", "y.grad"}));
  // The backward frees as it goes, except the input gradient, which is sent afterwards.
  EXPECT_EQ(liveness.afterBackward[0], (std::vector<std::string>{"a", "y.grad"}));
  EXPECT_EQ(liveness.afterBackward[1], (std::vector<std::string>{"a.grad", "x"}));
}

/// A two-rank tp group whose chunk gathers, scatters, splits and concatenates along dim 1.
plan::RankPlan collectivePlan(int64_t rank) {
  plan::RankPlan plan;
  plan.world = 2;
  plan.rank = rank;
  plan.coords.tp = rank;
  plan.groups.tp = {0, 1};
  plan::Chunk chunk;
  chunk.tensors = {{"x", {{2, 3, 2}}},  {"y", {{2, 6, 2}}},  {"z", {{2, 3, 2}}},
                   {"p0", {{2, 2, 2}}}, {"p1", {{2, 4, 2}}}, {"w", {{2, 6, 2}}}};
  std::map<std::string, plan::AttrValue> tpDim1 = {{"group", std::string("tp")},
                                                   {"dim", int64_t(1)}};
  chunk.forward = {makeOp(plan::OpKind::AllGather, {"x"}, {"y"}, tpDim1),
                   makeOp(plan::OpKind::ReduceScatter, {"y"}, {"z"}, tpDim1),
                   makeOp(plan::OpKind::Split, {"y"}, {"p0", "p1"}, {{"dim", int64_t(1)}}),
                   makeOp(plan::OpKind::SplitBwd, {"p0", "p1"}, {"w"}, {{"dim", int64_t(1)}})};
  plan.chunks.push_back(chunk);
  return plan;
}

/// The MLP of one block as the lowering writes it: up projection, bias, gelu, down projection.
plan::Chunk mlpChunk() {
  using plan::OpKind;
  plan::Chunk chunk;
  chunk.input = "h";
  chunk.output = "o";
  for (const char *name : {"h", "u", "ub", "g", "o"})
    chunk.tensors[name] = plan::TensorType{{4}};
  chunk.forward = {makeOp(OpKind::MatMul, {"h", "up.weight"}, {"u"}),
                   makeOp(OpKind::BiasAdd, {"u", "up.bias"}, {"ub"}),
                   makeOp(OpKind::GELU, {"ub"}, {"g"}),
                   makeOp(OpKind::MatMul, {"g", "down.weight"}, {"o"})};
  chunk.backward = {
      makeOp(OpKind::MatMulBwd, {"g", "down.weight", "o.grad"}, {"g.grad", "down.weight.grad"}),
      makeOp(OpKind::GELUBwd, {"ub", "g.grad"}, {"ub.grad"}),
      makeOp(OpKind::BiasAddBwd, {"ub.grad"}, {"u.grad", "up.bias.grad"}),
      makeOp(OpKind::MatMulBwd, {"h", "up.weight", "u.grad"}, {"h.grad", "up.weight.grad"})};
  return chunk;
}

TEST(OpFusion, BiasAddAndGeluBecomeOneOpEachWay) {
  using plan::OpKind;
  plan::Chunk chunk = mlpChunk();
  EXPECT_EQ(fuseBiasGELU(chunk), 1);
  ASSERT_EQ(chunk.forward.size(), 3u);
  EXPECT_EQ(chunk.forward[1].kind, OpKind::GELU);
  EXPECT_EQ(chunk.forward[1].inputs, (std::vector<std::string>{"u", "up.bias"}));
  EXPECT_EQ(chunk.forward[1].outputs, std::vector<std::string>{"g"});
  ASSERT_EQ(chunk.backward.size(), 3u);
  EXPECT_EQ(chunk.backward[1].kind, OpKind::GELUBwd);
  EXPECT_EQ(chunk.backward[1].inputs, (std::vector<std::string>{"u", "up.bias", "g.grad"}));
  EXPECT_EQ(chunk.backward[1].outputs, (std::vector<std::string>{"u.grad", "up.bias.grad"}));
  // The backward now keeps the bias_add's input instead of its output.
  ChunkLiveness liveness = ChunkLiveness::analyze(chunk);
  EXPECT_TRUE(llvm::is_contained(liveness.readByBackward, "u"));
  EXPECT_FALSE(llvm::is_contained(liveness.readByBackward, "ub"));
}

TEST(OpFusion, LeavesPairsWhoseSumIsReadElsewhere) {
  using plan::OpKind;
  plan::Chunk chunk = mlpChunk();
  chunk.forward.push_back(makeOp(OpKind::ResidualAdd, {"ub", "o"}, {"r"}));
  EXPECT_EQ(fuseBiasGELU(chunk), 0);
  plan::Chunk recomputed = mlpChunk();
  // Full recompute writes the sum again in the backward: fusing would drop that write.
  recomputed.backward.insert(recomputed.backward.begin(),
                             makeOp(OpKind::BiasAdd, {"u", "up.bias"}, {"ub"}));
  EXPECT_EQ(fuseBiasGELU(recomputed), 0);
  EXPECT_EQ(recomputed.backward.size(), 5u);
}

TEST(OpFusion, ResidualAddFoldsIntoTheNormThatReadsItNext) {
  using plan::OpKind;
  plan::Chunk chunk;
  chunk.forward = {makeOp(OpKind::ResidualAdd, {"h", "attn"}, {"res"}),
                   makeOp(OpKind::RMSNorm, {"res", "ln.weight"}, {"ln"}),
                   makeOp(OpKind::MatMul, {"ln", "w"}, {"mlp"}),
                   makeOp(OpKind::ResidualAdd, {"res", "mlp"}, {"out"}),
                   makeOp(OpKind::MatMul, {"out", "w2"}, {"logits"})};
  EXPECT_EQ(fuseResidualNorm(chunk), 1);
  ASSERT_EQ(chunk.forward.size(), 4u);
  EXPECT_EQ(chunk.forward[0].kind, OpKind::RMSNorm);
  EXPECT_EQ(chunk.forward[0].inputs, (std::vector<std::string>{"h", "attn", "ln.weight"}));
  EXPECT_EQ(chunk.forward[0].outputs, (std::vector<std::string>{"res", "ln"}));
  // The second sum is read next by a matmul: it stays a residual_add.
  EXPECT_EQ(chunk.forward[2].kind, OpKind::ResidualAdd);
}

TEST(OpInterpreter, CollectivesAndSplitsAlongAnInnerDim) {
  LocalWorld world(2);
  std::vector<std::string> errors = world.run([&](Communicator &comm) {
    int64_t rank = comm.rank();
    plan::RankPlan plan = collectivePlan(rank);
    CpuDevice<double> device;
    MemoryTracker &memory = device.memory();
    ParamStore<CpuDevice<double>> params(plan, device);
    OpInterpreter<CpuDevice<double>> interpreter(plan, params, comm);
    const plan::Chunk &chunk = plan.chunks[0];
    ChunkNames names(chunk);
    ChunkEnv<double> env(names);
    Tensor<double> &x = env.setValue("x");
    x = Tensor<double>(memory, MemoryCategory::Activations, {2, 3, 2});
    auto xValue = [](int64_t r, int64_t i, int64_t j, int64_t k) {
      return double(100 * r + 10 * i + 2 * j + k);
    };
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 3; ++j)
        for (int64_t k = 0; k < 2; ++k)
          x.data()[(i * 3 + j) * 2 + k] = xValue(rank, i, j, k);
    interpreter.run(chunk, false, chunk.forward,
                    std::vector<ChunkNames::Freed>(chunk.forward.size()), env);
    const double *y = env.value("y")->data(), *z = env.value("z")->data();
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 6; ++j)
        for (int64_t k = 0; k < 2; ++k)
          EXPECT_EQ(y[(i * 6 + j) * 2 + k], xValue(j / 3, i, j % 3, k));
    // Both ranks gathered the same y, so member r's part of the sum is twice x_r.
    for (int64_t i = 0; i < 12; ++i)
      EXPECT_EQ(z[i], 2 * x.data()[i]);
    EXPECT_EQ(env.value("p0")->data()[2], y[2]); // (0, 1, 0)
    EXPECT_EQ(env.value("p1")->data()[0], y[4]); // (0, 2, 0)
    for (int64_t i = 0; i < 24; ++i)
      EXPECT_EQ(env.value("w")->data()[i], y[i]);
  });
  for (const std::string &error : errors)
    EXPECT_EQ(error, "");
}

TEST(OpInterpreter, ParameterGradientsAccumulateAndOutputsAreWrittenOnce) {
  LocalWorld world(1);
  std::vector<std::string> errors = world.run([&](Communicator &comm) {
    plan::RankPlan plan;
    plan::ParamShard shard;
    shard.name = "w";
    shard.shape = {3};
    shard.slice = {{0, 3}};
    shard.init = {plan::InitKind::Ones, 0};
    plan.params.push_back(shard);
    plan::Chunk chunk;
    chunk.tensors = {{"a", {{3}}}, {"b", {{3}}}, {"c", {{3}}}};
    chunk.backward = {makeOp(plan::OpKind::ResidualAdd, {"a", "w"}, {"w.grad"}),
                      makeOp(plan::OpKind::BiasAddBwd, {"a"}, {"c", "w.grad"})};
    CpuDevice<double> device;
    MemoryTracker &memory = device.memory();
    ParamStore<CpuDevice<double>> params(plan, device);
    ASSERT_FALSE(bool(params.buildPartitions()));
    params.initialize(1);
    OpInterpreter<CpuDevice<double>> interpreter(plan, params, comm);
    ChunkNames names(chunk);
    EXPECT_EQ(names.paramAt(names.slot("w")), ChunkNames::unbound);
    for (int pass = 0; pass < 2; ++pass) {
      // The first pass finds the parameter and its gradient by name, the second by slot.
      if (pass == 1) {
        names.bindParams(params);
        EXPECT_EQ(names.paramAt(names.slot("w")), 0);
        EXPECT_EQ(names.gradOwnerAt(names.slot("w.grad")), 0);
        EXPECT_EQ(names.paramAt(names.slot("a")), -1);
        EXPECT_EQ(names.gradOwnerAt(names.slot("w")), -1);
      }
      ChunkEnv<double> env(names);
      Tensor<double> &a = env.setValue("a");
      a = Tensor<double>(memory, MemoryCategory::Activations, {3});
      std::iota(a.data(), a.data() + 3, 1.0);
      interpreter.run(chunk, true, chunk.backward, {{}, {}}, env);
    }
    // Per pass: (a + w) from the residual_add plus a from bias_add_bwd's dbias.
    const double *grad = params.find("w")->grad;
    for (int64_t i = 0; i < 3; ++i)
      EXPECT_EQ(grad[i], 2 * ((i + 1.0 + 1.0) + (i + 1.0)));

    ChunkEnv<double> env(names);
    env.setValue("a") = Tensor<double>(memory, MemoryCategory::Activations, {3});
    std::vector<plan::Op> twice = {makeOp(plan::OpKind::GELU, {"a"}, {"b"}),
                                   makeOp(plan::OpKind::GELU, {"a"}, {"b"})};
    try {
      interpreter.run(chunk, false, twice, {{}, {}}, env);
      ADD_FAILURE() << "a second write of 'b' was accepted";
    } catch (const std::runtime_error &error) {
      EXPECT_STREQ(error.what(),
                   "forward[1] (gelu -> b): output 'b' is written a second time in this pass");
    }
  });
  for (const std::string &error : errors)
    EXPECT_EQ(error, "");
}

} // namespace
