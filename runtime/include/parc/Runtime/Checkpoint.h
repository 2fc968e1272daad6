//===- Checkpoint.h - parrun --save and --resume --------------------------===//
//
// A checkpoint is a directory of one file per rank and a manifest, taken between steps:
//
//   DIR/manifest.json      {"format": "parrun-checkpoint/2", "plan_id": "...", "world": 8,
//                           "precision": "bf16", "step": 1000, "updates": 998,
//                           "loss_scale": {...}, "losses": [...], "grad_norms": [...],
//                           "files": [{"name": "rank-00000.ckpt", "bytes": N,
//                                      "xxh64": "..."}, ...], "xxh64": "..."}
//   DIR/rank-00003.ckpt    one line of JSON naming the sections, then their bytes
//
// A rank's file holds, byte for byte, what its next step reads: each shard's values (or, for
// a ZeRO-3 partition released between steps, the owned range), and the master weights and
// optimizer moments where they exist. Gradients are cleared between steps and the batches
// are a function of the step, so that is all: a resumed run trains bitwise as the run that
// saved would have gone on. It resumes only the plans it was saved from (the plan id, world
// size and precision must match), as a Megatron-LM checkpoint needs the same tp and pp.
//
// Every file's size and xxHash64 are in the manifest, and the manifest's own checksum (of its
// JSON without "xxh64"); resuming checks them before believing a byte. Saving writes and
// fsyncs DIR.partial first; once every rank's file and the manifest are complete, the
// previous checkpoint moves to DIR.old, DIR.partial becomes DIR (the parent fsync'd) and
// DIR.old goes. A failed save removes DIR.partial; one interrupted between the renames leaves
// the previous checkpoint at DIR.old, which --resume DIR names.
// Only folders that hold a checkpoint (or nothing) are ever replaced or removed. Every
// rank must call both functions (they communicate); a failure on any rank throws AgreedError
// on all of them. DIR must be visible to every rank (one file system, as for Megatron's).
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_CHECKPOINT_H
#define PARC_RUNTIME_CHECKPOINT_H

#include "parc/Plan/Plan.h"
#include "parc/Runtime/Communicator.h"
#include "parc/Runtime/LossScaler.h"
#include "parc/Runtime/ParamStore.h"

#include <vector>

namespace parc::runtime {

/// What besides the plans a resumed run must share with the run that saved: the element type,
/// the data and the loss-scale settings.
struct CheckpointRun {
  std::string precision; // "fp32", "bf16", ...
  std::string data;      // TokenStream::describe()
  LossScaleOptions lossScale;
};

/// What a checkpoint keeps besides the ranks' buffers.
struct CheckpointState {
  int64_t step = 0;    // steps completed
  int64_t updates = 0; // of them, those that updated (LossScaler.h skips the others)
  LossScaler::State lossScale;
  std::vector<double> losses, gradNorms; // per completed step, for the summary
};

/// Empty when a checkpoint can be saved to `dir` (the nearest folder on its path that exists is
/// writable; the rest is created); otherwise why not, for a usage error before any step runs.
std::string checkSaveLocation(llvm::StringRef dir);

template <typename D>
void saveCheckpoint(Communicator &comm, ParamStore<D> &params, const plan::RankPlan &plan,
                    const CheckpointRun &run, const CheckpointState &state, llvm::StringRef dir);

/// Fills `params` (initialised for `plan`) from DIR and returns the rest of the state.
template <typename D>
CheckpointState loadCheckpoint(Communicator &comm, ParamStore<D> &params,
                               const plan::RankPlan &plan, const CheckpointRun &run,
                               llvm::StringRef dir);

} // namespace parc::runtime

#endif
