//===- SignalCleanup.h - Remove a temporary file or directory on SIGINT/SIGTERM ===//
//
// parc builds its outputs in a temporary sibling of the target and renames it into place; an
// interrupt in between must not leave DIR.parc-tmp-... behind. LLVM's RemoveFileOnSignal
// removes files only, so this handler removes one registered path, a file or a directory tree,
// with async-signal-safe system calls only, then lets the signal end the process as it would
// have. Files that other threads create while it runs are removed by rescanning until the
// directory is gone.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_SUPPORT_SIGNALCLEANUP_H
#define PARC_SUPPORT_SIGNALCLEANUP_H

#include "llvm/ADT/StringRef.h"

namespace parc {

/// Removes `path` (a file, or a directory and everything below it) if SIGINT, SIGTERM or
/// SIGHUP arrives before the returned guard is released or destroyed. One path at a time;
/// the path must be absolute or stay valid relative to the working directory.
class RemoveOnSignal {
public:
  explicit RemoveOnSignal(llvm::StringRef path);
  ~RemoveOnSignal() { release(); }
  RemoveOnSignal(const RemoveOnSignal &) = delete;
  RemoveOnSignal &operator=(const RemoveOnSignal &) = delete;

  /// The path is in its final place, or removed by its owner: a signal leaves it alone.
  void release();

private:
  bool armed = false;
};

/// Holds SIGINT, SIGTERM and SIGHUP back, in every thread, while it lives; one that arrives
/// meanwhile takes effect when it ends. Around creating a temporary and registering it with
/// RemoveOnSignal, so that no signal falls between the two and leaves it behind.
class HoldCleanupSignals {
public:
  HoldCleanupSignals();
  ~HoldCleanupSignals();
  HoldCleanupSignals(const HoldCleanupSignals &) = delete;
  HoldCleanupSignals &operator=(const HoldCleanupSignals &) = delete;
};

/// Whether a signal is removing the registered path: writers stop starting new files.
bool interruptedBySignal();

} // namespace parc

#endif
