//===- WithinPlacement.h - Where the ZeRO instructions inside a compute run ---===//
//
// An all_gather_params, release_params or reduce_scatter_grads marked `within` runs inside the
// compute next to it (docs/plan-format.md): the k-th gather of a list just before the first op
// of the k-th run of ops reading its parameters (plan::readRuns: a run ends where an op reads
// another list gathered over the same group), the k-th release just after that run, the last
// gather and release of a list spanning the runs left (one gather spans them all), a
// reduce-scatter just after the last op that writes one of their gradients. Their positions
// follow from the op lists the runner executes (after OpFusion.h, which keeps every operand and
// moves no weight's read past another list's, so the runs are those the plan verifier counted),
// so they are found once per plan; an instruction whose compute never touches its parameters
// runs at the compute's start (a gather) or end.
//
// Every rank of a pipeline stage runs the same op lists, so all members of a data-parallel
// group reach each collective at the same point.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_WITHINPLACEMENT_H
#define PARC_RUNTIME_WITHINPLACEMENT_H

#include "parc/Plan/Plan.h"

#include <cstddef>
#include <vector>

namespace parc::runtime {

class WithinPlacement {
public:
  struct Hook {
    size_t op = 0;       // the op of the compute's list
    bool before = false; // before it runs, or after
    size_t instr = 0;    // the schedule index of the instruction to run there
  };

  explicit WithinPlacement(const plan::RankPlan &plan);

  /// Whether schedule[instr] runs inside a compute rather than at its own place.
  bool runsWithin(size_t instr) const { return within[instr]; }
  /// The instructions that run inside the compute at schedule[compute], in schedule order.
  const std::vector<Hook> &hooksOf(size_t compute) const { return hooks[compute]; }

private:
  std::vector<std::vector<Hook>> hooks; // per schedule index; empty but for computes
  std::vector<char> within;
};

} // namespace parc::runtime

#endif
