//===- PlanLoader.h - Loading a rank's plan and agreeing on the job -------===//
//
// Each rank reads the manifest and its own rank file, never another rank's: under MPI that is
// all a process can rely on. Before any compute all ranks exchange what they loaded (or why
// they could not) and check together that the world size is the plan's and that every rank
// loaded the same plan id; a problem anywhere fails every rank with the same message.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_PLANLOADER_H
#define PARC_RUNTIME_PLANLOADER_H

#include "parc/Plan/Plan.h"
#include "parc/Runtime/Communicator.h"
#include "parc/Runtime/Data.h"
#include "parc/Runtime/Executor.h"

#include "llvm/Support/Error.h"

namespace parc::runtime {

/// The manifest of `planDir`, with messages that say how to produce one.
llvm::Expected<plan::Manifest> loadManifest(llvm::StringRef planDir);

/// The plan of `rank`, from the file the manifest names; checks that it is that rank's.
llvm::Expected<plan::RankPlan> loadRankPlan(llvm::StringRef planDir, const plan::Manifest &manifest,
                                            int64_t rank);

struct LoadedJob {
  plan::RankPlan plan;
  TokenStream data;
};

/// Loads this rank's plan and data, exchanges the outcome with every rank and checks the job
/// is consistent. Throws AgreedError (identical on every rank) on any problem.
LoadedJob loadAndAgree(Communicator &comm, const RunOptions &options);

} // namespace parc::runtime

#endif
