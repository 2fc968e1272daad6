//===- PlanJSON.h - Reading, writing and verifying plan files -------------===//
//
// A plan on disk is a directory: manifest.json plus one rank-NNNNN.json per rank, all in the
// format of docs/plan-format.md. The reader accepts exactly what the writer produces: every
// field required, no unknown field, every value checked, so that a runtime can execute a plan
// that was read without re-checking it. Errors name the field: `rank plan: field
// "schedule[12].op": unknown op 'fwdd'; did you mean 'fwd'?`.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_PLAN_PLANJSON_H
#define PARC_PLAN_PLANJSON_H

#include "parc/Plan/Plan.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

namespace parc::plan {

inline constexpr llvm::StringLiteral ManifestFileName = "manifest.json";

llvm::json::Value toJSON(const RankPlan &plan);
llvm::json::Value toJSON(const Manifest &manifest);

/// Parse and check one plan. Never crashes on any input; the error message starts with
/// "rank plan: " (or "plan manifest: ") and names the offending field. With a `manifest`, the
/// plan's summaries are compared with it (verifyPlanMatchesManifest) before the semantic
/// checks, which read them: an edited summary is reported as such.
llvm::Expected<RankPlan> rankPlanFromJSON(const llvm::json::Value &value,
                                          const Manifest *manifest = nullptr);
llvm::Expected<Manifest> manifestFromJSON(const llvm::json::Value &value);
/// The same from JSON text; also rejects malformed or truncated text.
llvm::Expected<RankPlan> parseRankPlan(llvm::StringRef text, const Manifest *manifest = nullptr);
llvm::Expected<Manifest> parseManifest(llvm::StringRef text);

/// The semantic checks the readers apply after the structure (ranges, groups, slices, op data
/// flow, schedule completeness). The compiler runs them on what it built before writing.
llvm::Error verifyRankPlan(const RankPlan &plan);
llvm::Error verifyManifest(const Manifest &manifest);
/// Checks that `plans` (indexed by rank) belong together and to `manifest`: the manifest's
/// plan_id is computeJobPlanId of its job, and every plan carries that id, the same summaries
/// and the placement of its manifest entry.
llvm::Error verifyPlanSet(const Manifest &manifest, llvm::ArrayRef<RankPlan> plans);
/// The two halves of verifyPlanSet, for a runtime that reads one plan per process: the
/// manifest's plan_id is that of its job; `plan` carries the manifest's plan_id, world,
/// summaries and the placement of its entry, bit for bit ("rank plan: field "train.seed":
/// 99 differs from the manifest's 1234; ...").
llvm::Error verifyManifestPlanId(const Manifest &manifest);
llvm::Error verifyPlanMatchesManifest(const Manifest &manifest, const RankPlan &plan);

/// Pretty-printed JSON (indent 2, keys sorted) with a trailing newline. Errors name the path.
llvm::Error writeRankPlan(llvm::StringRef path, const RankPlan &plan);
llvm::Error writeManifest(llvm::StringRef path, const Manifest &manifest);
/// Errors start with the path: "out/rank-00003.json: rank plan: field ...".
llvm::Expected<RankPlan> readRankPlan(llvm::StringRef path, const Manifest *manifest = nullptr);
llvm::Expected<Manifest> readManifest(llvm::StringRef path);

/// The plan as compact JSON with sorted keys and without "plan_id", so that it is a function
/// of the plan's content alone and can be hashed into the plan_id.
std::string canonicalText(const RankPlan &plan);
/// A stable 64-bit xxHash of the canonical texts of all ranks in rank order, as 16 lower-case
/// hex digits.
std::string computePlanId(llvm::ArrayRef<std::string> canonicalTexts);

/// The compiler release the plan id covers: the same job lowered by another release may give
/// other plans. Kept here, not in the compiler, so that verifyPlanSet can recompute the id.
inline constexpr llvm::StringLiteral CompilerVersion = "parc 0.1.0";
/// The manifest as compact JSON with sorted keys and without "plan_id": the job description
/// (format, world, summaries, rank placement) every rank plan is a function of.
std::string canonicalText(const Manifest &manifest);
/// The plan id of a job: computePlanId over {CompilerVersion, the canonical text of the
/// manifest's job description (its summaries and world; not plan_id, not the rank list)}.
/// A plan id names one job, so a single rank can be lowered, id included, on its own.
std::string computeJobPlanId(const Manifest &manifest);

} // namespace parc::plan

#endif
