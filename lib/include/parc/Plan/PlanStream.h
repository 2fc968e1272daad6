//===- PlanStream.h - Stream a rank plan as JSON without a tree -----------===//
//
// Writes the rank plan JSON of plan::writeRankPlan straight from the plan's structs, keys
// sorted, with a trailing newline. plan::toJSON first builds an llvm::json::Value tree, whose
// allocations and copies cost about 30 ms per gpt3-175b rank plan: half a minute for the 1024
// ranks of one job. EmitTest checks that both agree byte for byte on lowered plans, so that
// the format keeps its one definition in lib/Plan/PlanWriter.cpp.
//
// Plan directories hold compact rank files: pretty-printed, a gpt3-175b rank plan is 350 KB
// and the job 360 MB, half of it indentation, and writing it is bound by the file system.
// `parc --emit=plan-text` is the view for people.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_PLAN_PLANSTREAM_H
#define PARC_PLAN_PLANSTREAM_H

#include "parc/Plan/Plan.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

namespace parc {

enum class JSONLayout {
  Pretty, // indent 2, what plan::writeRankPlan writes
  Compact // no whitespace, what `os << plan::toJSON(plan)` writes
};

void streamRankPlan(llvm::raw_ostream &os, const plan::RankPlan &plan, JSONLayout layout);

/// streamRankPlan to `path`. Errors name the path, as plan::writeRankPlan's do.
llvm::Error streamRankPlanToFile(llvm::StringRef path, const plan::RankPlan &plan,
                                 JSONLayout layout);

} // namespace parc

#endif
