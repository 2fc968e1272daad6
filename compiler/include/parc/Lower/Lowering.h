//===- Lowering.h - Program + Mapping -> one execution plan per rank ------===//
//
// Runs after the feasibility checks (it relies on every divisibility rule holding) and never
// reports user errors: a plan that fails verification is an internal error.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_LOWER_LOWERING_H
#define PARC_LOWER_LOWERING_H

#include "parc/Check/Mapping.h"
#include "parc/Plan/Plan.h"
#include "parc/Sema/Program.h"

#include "llvm/Support/Error.h"

namespace parc {

/// The plan id of a job. Every rank plan is a pure function of the job description (model,
/// cluster, mapping, training settings, format version) and its rank, so hashing that
/// description identifies the whole set of rank plans; it is what lets `--rank=R` print one
/// rank's plan, id included, without lowering the other ranks.
std::string computeJobPlanId(const Program &program, const Mapping &mapping);

/// The manifest (job summary and rank file list) for `planId`.
plan::Manifest buildManifest(const Program &program, const Mapping &mapping,
                             llvm::StringRef planId);

/// One rank's plan, without lowering any other rank.
plan::RankPlan lowerRank(const Program &program, const Mapping &mapping, int64_t rank,
                         llvm::StringRef planId);

/// Every rank's plan, verified together: each plan passes plan::verifyRankPlan, and the
/// schedules of all ranks, simulated with blocking send/recv, match every send with exactly one
/// receive and never deadlock. A failure is an internal compiler error.
llvm::Expected<std::vector<plan::RankPlan>> lowerAllRanks(const Program &program,
                                                          const Mapping &mapping);

} // namespace parc

#endif
