//===- PlanText.h - A readable listing of one rank plan -------------------===//
//
// What `parc FILE --rank=R --emit=plan-text` prints: the rank's placement, groups, parameter
// shards, each chunk's tensors and op lists, and the step schedule, one item a line in plan
// order, so that tests can check it line by line.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_LOWER_PLANTEXT_H
#define PARC_LOWER_PLANTEXT_H

#include "parc/Plan/Plan.h"

#include "llvm/Support/raw_ostream.h"

namespace parc {

void printPlanText(const plan::RankPlan &plan, llvm::raw_ostream &os);

} // namespace parc

#endif
