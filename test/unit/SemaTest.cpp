//===- SemaTest.cpp - Quantities and checked evaluation through the API ---===//
//
// Each test parses a small .par text with parc::parseBuffer and analyses it with parc::analyze,
// then looks at the typed Program (values in base units) or at the diagnostics printed.
//
//===----------------------------------------------------------------------===//
#include "parc/Sema/Sema.h"
#include "parc/Frontend/Parser.h"
#include <gtest/gtest.h>

using namespace parc;

namespace {

/// One analysis run: the program (if any), the resolved blocks and everything printed.
struct Analysis {
  std::optional<Program> program;
  ResolvedModule resolved;
  std::string diagnostics;
  unsigned errors = 0;
  unsigned warnings = 0;
};

Analysis analyzeText(llvm::StringRef text) {
  Analysis result;
  llvm::SourceMgr sourceMgr;
  llvm::raw_string_ostream os(result.diagnostics);
  DiagnosticEngine diags(sourceMgr, os);
  ast::Module module = parseBuffer(text, "test.par", diags);
  result.program = analyze(module, diags, &result.resolved);
  os.flush();
  result.errors = diags.errorCount();
  result.warnings = diags.warningCount();
  return result;
}

/// A complete, valid file; each argument replaces one part of it.
std::string makeFile(llvm::StringRef modelFields = "", llvm::StringRef gpu = "",
                     llvm::StringRef interNode = "", llvm::StringRef extraBlocks = "") {
  std::string text = "model m {\n"
                     "  dtype = bf16\n"
                     "  vocab = 1024\n"
                     "  seq = 128\n"
                     "  hidden = 256\n"
                     "  heads = 8\n";
  text += modelFields.empty() ? "  ffn = 1024\n" : modelFields.str() + "\n";
  text += "  layer embed : embedding\n"
          "  layer body : transformer x 2\n"
          "  layer head : lm_head\n"
          "}\n"
          "cluster c {\n"
          "  nodes = 2\n"
          "  gpus_per_node = 8\n";
  text += gpu.empty() ? "  gpu { memory = 80 GiB; flops = 312 TFLOPS }\n"
                      : "  gpu { " + gpu.str() + " }\n";
  text += "  intra_node { bandwidth = 300 GB/s; latency = 1 us }\n";
  text += interNode.empty() ? "  inter_node { bandwidth = 200 Gb/s; latency = 5 us }\n"
                            : "  inter_node { " + interNode.str() + " }\n";
  text += "}\n";
  text += extraBlocks.str();
  text += "parallel for m on c {\n  global_batch = 16\n}\n";
  return text;
}

const ResolvedField *findField(const Analysis &a, llvm::StringRef block, llvm::StringRef field) {
  for (const ResolvedBlock &b : a.resolved.blocks)
    if (b.name == block)
      return b.field(field);
  return nullptr;
}

} // namespace

TEST(Sema, ValidFileBuildsAProgram) {
  Analysis a = analyzeText(makeFile());
  ASSERT_TRUE(a.program) << a.diagnostics;
  EXPECT_EQ(a.errors, 0u);
  EXPECT_EQ(a.program->model.hidden, 256);
  EXPECT_EQ(a.program->model.numBlocks(), 2);
  EXPECT_EQ(a.program->cluster.world(), 16);
}

TEST(Sema, FieldReferenceToAnEarlierField) {
  Analysis a = analyzeText(makeFile("  ffn = 4 * hidden"));
  ASSERT_TRUE(a.program) << a.diagnostics;
  EXPECT_EQ(a.program->model.ffn, 1024);
}

TEST(Sema, DefaultNamingAnotherField) {
  Analysis a = analyzeText(makeFile());
  ASSERT_TRUE(a.program) << a.diagnostics;
  EXPECT_EQ(a.program->model.kvHeads, a.program->model.heads);
  const ResolvedField *kv = findField(a, "m", "kv_heads");
  ASSERT_NE(kv, nullptr);
  EXPECT_TRUE(kv->defaulted);
}

TEST(Sema, ArithmeticPrecedenceAndParentheses) {
  Analysis a = analyzeText(makeFile("  ffn = (2 + 2) * 64 * 4 - 2 * 3 + 6 / 3 * 3"));
  ASSERT_TRUE(a.program) << a.diagnostics;
  EXPECT_EQ(a.program->model.ffn, 1024);
}

TEST(Sema, ExponentLiterals) {
  Analysis a =
      analyzeText(makeFile("", "memory = 80 GiB; flops = 1.5e12 FLOPS",
                           "bandwidth = 25e9 B/s; latency = 1e-3 ms", "train {\n  lr = 1e-3\n}\n"));
  ASSERT_TRUE(a.program) << a.diagnostics;
  EXPECT_DOUBLE_EQ(a.program->cluster.gpuFlops, 1.5e12);
  EXPECT_DOUBLE_EQ(a.program->cluster.interNode.bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(a.program->cluster.interNode.latency, 1e-6);
  EXPECT_DOUBLE_EQ(a.program->train.lr, 1e-3);
}

TEST(Sema, BitRateIsAnEighthOfTheByteRate) {
  Analysis a = analyzeText(makeFile());
  ASSERT_TRUE(a.program) << a.diagnostics;
  // 200 Gb/s in the file: 25 GB/s once normalised.
  EXPECT_DOUBLE_EQ(a.program->cluster.interNode.bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(a.program->cluster.intraNode.bandwidth, 300e9);
}

TEST(Sema, BinaryAndDecimalSizes) {
  Analysis binary = analyzeText(makeFile("", "memory = 80 GiB; flops = 312 TFLOPS"));
  Analysis decimal = analyzeText(makeFile("", "memory = 80 GB; flops = 312 TFLOPS"));
  ASSERT_TRUE(binary.program) << binary.diagnostics;
  ASSERT_TRUE(decimal.program) << decimal.diagnostics;
  EXPECT_EQ(binary.program->cluster.gpuMemory, 85899345920);
  EXPECT_EQ(decimal.program->cluster.gpuMemory, 80000000000);
  EXPECT_EQ(binary.program->cluster.gpuReserve, 1073741824); // default 1 GiB
}

TEST(Sema, QuantityArithmeticDerivesTheDimension) {
  // bytes / time is a bandwidth; a size times a plain number stays a size.
  Analysis a = analyzeText(makeFile("", "memory = 40 GiB * 2; flops = 312 TFLOPS",
                                    "bandwidth = 100 GB / 4 s; latency = 5 us"));
  ASSERT_TRUE(a.program) << a.diagnostics;
  EXPECT_EQ(a.program->cluster.gpuMemory, 85899345920);
  EXPECT_DOUBLE_EQ(a.program->cluster.interNode.bandwidth, 25e9);
}

TEST(Sema, CrossBlockReference) {
  Analysis a =
      analyzeText("model base {\n  dtype = bf16; vocab = 1024; seq = 128; hidden = 512; heads = 8\n"
                  "  ffn = 4 * hidden\n  layer e : embedding\n  layer b : transformer x 1\n"
                  "  layer h : lm_head\n}\n" +
                  makeFile("  ffn = base.ffn / 2"));
  ASSERT_TRUE(a.program) << a.diagnostics;
  EXPECT_EQ(a.program->model.ffn, 1024);
}

TEST(Sema, OverflowIsReported) {
  Analysis a = analyzeText(makeFile("  ffn = 9223372036854775807 + 1"));
  EXPECT_FALSE(a.program);
  EXPECT_EQ(a.errors, 1u);
  EXPECT_NE(a.diagnostics.find("test.par:7:9: error: integer overflow"), std::string::npos)
      << a.diagnostics;
}

TEST(Sema, MultiplicationOverflowIsReported) {
  Analysis a = analyzeText(makeFile("  ffn = 4294967296 * 4294967296"));
  EXPECT_FALSE(a.program);
  EXPECT_NE(a.diagnostics.find("integer overflow"), std::string::npos) << a.diagnostics;
}

TEST(Sema, UnitScalingOverflowIsReported) {
  Analysis a = analyzeText(makeFile("", "memory = 10000000 TB; flops = 312 TFLOPS"));
  EXPECT_FALSE(a.program);
  EXPECT_NE(a.diagnostics.find("'10000000 TB' does not fit a 64-bit integer"), std::string::npos)
      << a.diagnostics;
}

TEST(Sema, HugeLiteralIsReported) {
  Analysis a = analyzeText(makeFile("  ffn = 1000000000000000000000000000000"));
  EXPECT_FALSE(a.program);
  EXPECT_NE(a.diagnostics.find("is too large"), std::string::npos) << a.diagnostics;
}

TEST(Sema, DivisionByZeroIsReported) {
  Analysis a = analyzeText(makeFile("  ffn = hidden / (2 - 2)"));
  EXPECT_FALSE(a.program);
  EXPECT_EQ(a.errors, 1u);
  EXPECT_NE(a.diagnostics.find("test.par:7:18: error: division by zero"), std::string::npos)
      << a.diagnostics;
}

TEST(Sema, InexactDivisionWhereAnIntegerIsRequired) {
  Analysis a = analyzeText(makeFile("  ffn = 1024\n  kv_heads = 96 / 5"));
  EXPECT_FALSE(a.program);
  EXPECT_NE(a.diagnostics.find("expected an integer for 'kv_heads', got 19.2"), std::string::npos)
      << a.diagnostics;
}

TEST(Sema, ExactDivisionStaysAnInteger) {
  Analysis a = analyzeText(makeFile("  ffn = 4096 / 4"));
  ASSERT_TRUE(a.program) << a.diagnostics;
  EXPECT_EQ(a.program->model.ffn, 1024);
}

TEST(Sema, WrongDimensionIsReported) {
  Analysis a = analyzeText(makeFile("", "memory = 80 GB/s; flops = 312 TFLOPS"));
  EXPECT_FALSE(a.program);
  EXPECT_NE(a.diagnostics.find("expected a size in bytes, got a bandwidth"), std::string::npos)
      << a.diagnostics;
}

TEST(Sema, AddingDifferentDimensionsIsReported) {
  Analysis a = analyzeText(makeFile("", "memory = 80 GiB + 1 s; flops = 312 TFLOPS"));
  EXPECT_FALSE(a.program);
  EXPECT_NE(a.diagnostics.find("cannot add a time to a size in bytes"), std::string::npos)
      << a.diagnostics;
}

TEST(Sema, FractionalBytesWarn) {
  Analysis a = analyzeText(makeFile("", "memory = 0.1 TiB; flops = 312 TFLOPS"));
  ASSERT_TRUE(a.program) << a.diagnostics;
  EXPECT_EQ(a.warnings, 1u);
  EXPECT_EQ(a.program->cluster.gpuMemory, 109951162778);
}

TEST(Sema, EveryErrorOfAFileIsReported) {
  Analysis a = analyzeText(makeFile("  ffn = 1 / 0\n  kv_heads = 3 / 2\n  hiden = 4",
                                    "memory = 80 GB/s; flops = 312 TFLOPS"));
  EXPECT_FALSE(a.program);
  EXPECT_EQ(a.errors, 4u) << a.diagnostics;
  EXPECT_NE(a.diagnostics.find("did you mean 'hidden'?"), std::string::npos) << a.diagnostics;
}

TEST(Sema, SyntaxErrorsComeThroughParseBuffer) {
  Analysis a = analyzeText("model m {\n  hidden 12\n}\n");
  EXPECT_FALSE(a.program);
  EXPECT_EQ(a.errors, 1u) << a.diagnostics;
  EXPECT_NE(a.diagnostics.find(
                "test.par:2:10: error: expected '=' after field name 'hidden', found number '12'"),
            std::string::npos)
      << a.diagnostics;
}
