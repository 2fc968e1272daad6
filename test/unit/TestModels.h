//===- TestModels.h - Small jobs the unit tests share ---------------------===//
#ifndef PARC_TEST_UNIT_TESTMODELS_H
#define PARC_TEST_UNIT_TESTMODELS_H

#include "parc/Check/Mapping.h"
#include "parc/Lower/Schedule.h"
#include "parc/Sema/Program.h"

#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"
#include <gtest/gtest.h>

#include <string>

namespace parc::test {

/// The mapping of a job the test expects to pass every rule; a failure shows the diagnostics.
inline Mapping mapped(const Program &p) {
  llvm::SourceMgr sourceMgr;
  std::string text;
  llvm::raw_string_ostream os(text);
  DiagnosticEngine diags(sourceMgr, os);
  std::optional<Mapping> mapping = checkMapping(p, diags);
  EXPECT_TRUE(mapping.has_value()) << os.str();
  return mapping ? *mapping : Mapping();
}

/// A GPT of 8 blocks (hidden 128, 4 heads, ffn 512, vocab 1000, seq 64) with a tied head:
/// every tp <= 4 and pp dividing 8 satisfy its divisibility rules.
inline ModelSpec eightBlockGPT() {
  ModelSpec m;
  m.vocab = 1000;
  m.seq = 64;
  m.hidden = 128;
  m.heads = m.kvHeads = 4;
  m.ffn = 512;
  LayerGroup embed, blocks, head;
  embed.kind = LayerGroup::Embedding;
  embed.name = "embed";
  blocks.name = "block";
  blocks.count = 8;
  blocks.heads = blocks.kvHeads = 4;
  blocks.ffn = 512;
  head.kind = LayerGroup::LMHead;
  head.tiedTo = "embed";
  m.layers = {embed, blocks, head};
  return m;
}

inline PipelineConfig makeConfig(ScheduleKind kind, int64_t stages, int64_t microbatches,
                                 int64_t chunks = 1) {
  PipelineConfig config;
  config.kind = kind;
  config.stages = stages;
  config.microbatches = microbatches;
  config.chunks = chunks;
  return config;
}

} // namespace parc::test

#endif
