//===- Report.h - The plan at a glance: layout, memory, FLOPs, traffic ----===//
//
// `parc --report` prints, after the diagnostics, what a person checks before launching: the
// process groups and their links, the memory of every pipeline stage, the bubble, the FLOPs
// of a step, the bytes each group moves and a first step-time and MFU estimate.
// `--report=json` prints the same numbers for tools; its keys are documented in
// docs/memory-and-cost.md and kept stable.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_COST_REPORT_H
#define PARC_COST_REPORT_H

#include "parc/Check/Mapping.h"
#include "parc/Cost/CostModel.h"
#include "parc/Sema/Program.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <utility>
#include <vector>

namespace parc {

/// The report as aligned text tables.
void printReport(const Program &program, const Mapping &mapping, llvm::raw_ostream &os);

/// The report as one JSON object.
llvm::json::Value reportToJSON(const Program &program, const Mapping &mapping);
/// The same object written to `os` as `--report=json` prints it (indented by 2, a newline
/// after), its O(world) process groups streamed rather than built.
void writeReportJSON(const Program &program, const Mapping &mapping, llvm::raw_ostream &os);

/// `step_time_breakdown`: every part of the step in seconds, as `--report=json` writes it.
llvm::json::Object breakdownToJSON(const StepBreakdown &breakdown);

/// Several mappings of one file side by side: their layout, memory, step time and breakdown.
void printComparison(const std::vector<std::pair<Program, Mapping>> &jobs,
                     llvm::raw_ostream &os);
/// `{"mappings": [...]}`, one report per mapping with its name.
llvm::json::Value comparisonToJSON(const std::vector<std::pair<Program, Mapping>> &jobs);

} // namespace parc

#endif
