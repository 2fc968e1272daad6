//===- PlanFuzzer.cpp - libFuzzer target: read and verify a plan file -----===//
//
// Any byte string is a rank plan or a manifest: the readers and the verifier must answer
// every input with a plan or an error, never a crash, a sanitizer report, a leak or a hang
// (docs/plan-format.md, Errors). A plan that passes is checked against the manifest built from
// its own summaries, as parrun does. scripts/fuzz.sh runs it.
//
//===----------------------------------------------------------------------===//
#include "parc/Plan/PlanJSON.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  llvm::StringRef text(reinterpret_cast<const char *>(data), size);
  // A manifest lists "ranks"; one reader per input keeps the fuzzer fast.
  if (text.contains("\"ranks\"")) {
    llvm::Expected<parc::plan::Manifest> manifest = parc::plan::parseManifest(text);
    if (!manifest)
      llvm::consumeError(manifest.takeError());
    return 0;
  }
  llvm::Expected<parc::plan::RankPlan> plan = parc::plan::parseRankPlan(text);
  if (plan) {
    parc::plan::Manifest manifest;
    manifest.world = plan->world;
    manifest.model = plan->model;
    manifest.cluster = plan->cluster;
    manifest.parallel = plan->parallel;
    manifest.train = plan->train;
    manifest.planId = plan->planId;
    // Only this rank's entry is read: the verified rank is inside the world (at most 2^17).
    manifest.ranks.resize(size_t(plan->rank) + 1);
    manifest.ranks.back() = {plan->rank, plan->node, plan->localRank, plan->coords,
                             parc::plan::rankFileName(plan->rank)};
    llvm::consumeError(parc::plan::verifyManifestPlanId(manifest));
    llvm::consumeError(parc::plan::verifyPlanMatchesManifest(manifest, *plan));
  } else {
    llvm::consumeError(plan.takeError());
  }
  return 0;
}
