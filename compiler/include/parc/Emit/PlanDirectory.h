//===- PlanDirectory.h - Write a plan directory atomically ----------------===//
//
// `parc FILE.par -o DIR` must never leave a half-written DIR: a runtime that starts while the
// compiler writes, or after the compiler failed, would read rank plans from two jobs. So the
// files go to a temporary sibling, DIR.parc-tmp-XXXXXX, which is renamed into place once all of
// them are written; a previous plan directory is renamed away first and deleted afterwards.
// Only a plan directory (one whose manifest.json reads as a plan manifest) or an empty
// directory is ever replaced: anything else at DIR is refused, since deleting it could lose
// someone's files. Atomic for readers, not durable across a power cut: nothing is fsync'ed,
// which would cost seconds for the hundreds of MiB of a large job. SIGINT, SIGTERM and SIGHUP
// remove the temporary (SignalCleanup.h); one left by a killed parc (its name carries the
// owner's pid and host) is removed by the next write next to it.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_EMIT_PLANDIRECTORY_H
#define PARC_EMIT_PLANDIRECTORY_H

#include "parc/Plan/Plan.h"

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

namespace parc {

/// Succeeds when a plan directory may be written to `dir`: nothing is there, or an empty
/// directory, or a plan directory. Otherwise the error says what is there and how to proceed.
/// Lets the driver refuse before it spends time lowering.
llvm::Error checkPlanDirectoryTarget(llvm::StringRef dir);

/// Writes manifest.json and the rank files the manifest names (plans[i] to
/// manifest.ranks[i].file) and moves them to `dir` as described above. On any error, `dir`
/// is as it was and no temporary directory is left. Rank files are written by `threads`
/// threads; 0 means one per hardware thread.
llvm::Error writePlanDirectory(llvm::StringRef dir, const plan::Manifest &manifest,
                               llvm::ArrayRef<plan::RankPlan> plans, unsigned threads = 0);

/// Writes one output file (a trace, a diagram) the same way: to a temporary sibling renamed
/// over `path`, so that a failure leaves the previous file as it was. A `path` that is a
/// device or a FIFO is written in place.
llvm::Error writeFileAtomically(llvm::StringRef path,
                                llvm::function_ref<void(llvm::raw_ostream &)> write);

} // namespace parc

#endif
