//===- SignalCleanup.cpp - Remove a temporary file or directory on SIGINT/SIGTERM ===//
//
// Everything the handler calls is async-signal-safe (POSIX.1-2008, signal-safety(7)): open,
// close, unlinkat, rmdir, sigaction, raise, and getdents64 through syscall(2) instead of
// opendir/readdir, which allocate.
//
//===----------------------------------------------------------------------===//

#include "parc/Support/SignalCleanup.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace parc {

namespace {

constexpr int Signals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr size_t MaxPath = 4096;

char registered[MaxPath];
/// Whether `registered` holds a path to remove, and whether a signal arrived.
std::atomic<bool> pathArmed{false}, signalSeen{false};
// While a temporary is being created and registered (HoldCleanupSignals), a signal is only
// noted: any thread may take a process-directed signal, so blocking it in one is not enough.
std::atomic<bool> holding{false};
std::atomic<int> heldSignal{0};

struct LinuxDirent64 {
  ino64_t d_ino;
  off64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[1];
};

/// Removes the entries of directory `dirFd`, descending at most `depth` levels. Returns
/// whether it saw any entry.
bool removeEntries(int dirFd, int depth) {
  alignas(LinuxDirent64) char buffer[4096];
  bool any = false;
  for (;;) {
    long bytes = syscall(SYS_getdents64, dirFd, buffer, sizeof(buffer));
    if (bytes <= 0)
      return any;
    for (long offset = 0; offset < bytes;) {
      auto *entry = reinterpret_cast<LinuxDirent64 *>(buffer + offset);
      offset += entry->d_reclen;
      const char *name = entry->d_name;
      if (!std::strcmp(name, ".") || !std::strcmp(name, ".."))
        continue;
      any = true;
      if (unlinkat(dirFd, name, 0) == 0 || errno != EISDIR || depth == 0)
        continue;
      int child = openat(dirFd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (child >= 0) {
        while (removeEntries(child, depth - 1))
          lseek(child, 0, SEEK_SET);
        close(child);
      }
      unlinkat(dirFd, name, AT_REMOVEDIR);
    }
  }
}

void removeRegistered() {
  if (unlink(registered) == 0 || errno == ENOENT)
    return;
  // A directory: rescan until it can be removed, since writer threads may still be finishing
  // a file; bounded, so that a stuck writer cannot keep the process alive.
  for (int attempt = 0; attempt < 1000; ++attempt) {
    int dir = open(registered, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir < 0)
      return;
    removeEntries(dir, 16);
    close(dir);
    if (rmdir(registered) == 0 || errno == ENOENT)
      return;
  }
}

void onSignal(int signal) {
  signalSeen = true;
  if (holding) {
    heldSignal = signal;
    return;
  }
  if (pathArmed.exchange(false))
    removeRegistered();
  // End the process as the signal would have: the default action, raised again.
  struct sigaction fallback;
  std::memset(&fallback, 0, sizeof(fallback));
  fallback.sa_handler = SIG_DFL;
  sigaction(signal, &fallback, nullptr);
  raise(signal);
}

void installHandlers() {
  static bool installed = false;
  if (installed)
    return;
  installed = true;
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = onSignal;
  action.sa_flags = SA_RESTART; // a held signal returns: the interrupted call goes on
  sigemptyset(&action.sa_mask);
  for (int signal : Signals)
    sigaddset(&action.sa_mask, signal); // one cleanup at a time
  for (int signal : Signals)
    sigaction(signal, &action, nullptr);
}

} // namespace

RemoveOnSignal::RemoveOnSignal(llvm::StringRef path) {
  if (path.size() >= MaxPath)
    return; // too long to register: at worst a temporary is left behind
  installHandlers();
  pathArmed = false; // a handler never sees a half-written path
  std::memcpy(registered, path.data(), path.size());
  registered[path.size()] = '\0';
  pathArmed = true;
  armed = true;
}

void RemoveOnSignal::release() {
  if (armed)
    pathArmed = false;
  armed = false;
}

HoldCleanupSignals::HoldCleanupSignals() {
  installHandlers();
  holding = true;
}

HoldCleanupSignals::~HoldCleanupSignals() {
  holding = false;
  if (int signal = heldSignal.exchange(0))
    onSignal(signal); // removes what is registered by now, then ends the process
}

bool interruptedBySignal() { return signalSeen; }

} // namespace parc
