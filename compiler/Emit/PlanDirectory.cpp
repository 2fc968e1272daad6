//===- PlanDirectory.cpp - Write a plan directory atomically --------------===//
//
// Renaming a directory is atomic on POSIX file systems only within one file system, which a
// sibling of DIR shares. The swap of an existing plan directory is two renames, so a reader can
// find DIR missing for an instant, but never a mix of two plans.
//
//===----------------------------------------------------------------------===//
#include "parc/Emit/PlanDirectory.h"
#include "parc/Plan/PlanStream.h"
#include "parc/Plan/PlanJSON.h"
#include "parc/Support/FileOutput.h"
#include "parc/Support/SignalCleanup.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/ThreadPool.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <mutex>
#include <optional>
#include <unistd.h>

namespace fs = llvm::sys::fs;
namespace path = llvm::sys::path;
using llvm::StringRef;

namespace parc {

namespace {

llvm::Error failure(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

const char *const ChooseAnother = "; remove it or choose another output directory with -o";

enum class Target { Missing, EmptyDirectory, PlanDirectory };

/// What is at `dir` now, or why nothing may be written there; messages call it `shown`.
llvm::Expected<Target> classifyTarget(StringRef dir, StringRef shown) {
  fs::file_status status;
  if (std::error_code ec = fs::status(dir, status, /*Follow=*/false)) {
    if (ec == std::errc::no_such_file_or_directory)
      return Target::Missing;
    return failure("cannot write plans to '" + shown + "': " + ec.message());
  }
  if (status.type() == fs::file_type::symlink_file)
    return failure("cannot write plans to '" + shown +
                   "': it is a symbolic link, which parc would replace rather than follow; give "
                   "the directory it points to with -o");
  if (status.type() != fs::file_type::directory_file)
    return failure("cannot write plans to '" + shown +
                   "': it exists and is not a directory, and parc replaces only plan "
                   "directories" +
                   ChooseAnother);
  llvm::SmallString<256> manifestPath(dir);
  path::append(manifestPath, plan::ManifestFileName);
  if (fs::exists(manifestPath)) {
    llvm::Expected<plan::Manifest> manifest = plan::readManifest(manifestPath);
    if (manifest)
      return Target::PlanDirectory;
    // The reader's message starts with the path, which this one already names.
    std::string why = llvm::toString(manifest.takeError());
    StringRef reason = StringRef(why).startswith(manifestPath.str().str() + ": ")
                           ? StringRef(why).drop_front(manifestPath.size() + 2)
                           : StringRef(why);
    return failure("cannot write plans to '" + shown +
                   "': its manifest.json is not a parc plan manifest (" + reason +
                   "), and parc replaces only plan directories" + ChooseAnother);
  }
  std::error_code ec;
  fs::directory_iterator entries(dir, ec);
  if (ec)
    return failure("cannot write plans to '" + shown + "': cannot list it: " + ec.message());
  if (entries == fs::directory_iterator())
    return Target::EmptyDirectory;
  return failure("cannot write plans to '" + shown +
                 "': it is a directory with files but no manifest.json, not a parc plan "
                 "directory, and parc replaces only plan directories" +
                 ChooseAnother);
}

/// Removes a file or a directory tree when it goes out of scope, unless released.
class RemoveOnExit {
public:
  explicit RemoveOnExit(std::string path) : path(std::move(path)) {}
  ~RemoveOnExit() {
    if (path.empty())
      return;
    if (fs::is_directory(path))
      fs::remove_directories(path, /*IgnoreErrors=*/true);
    else
      fs::remove(path);
  }
  void release() { path.clear(); }

private:
  std::string path;
};

/// The absolute, dot-free spelling of `dir`, so that "out/", "./out" and "." name their
/// directory and its parent is well defined.
std::string normalise(StringRef dir) {
  llvm::SmallString<256> absolute(dir);
  fs::make_absolute(absolute);
  path::remove_dots(absolute, /*remove_dot_dot=*/true);
  StringRef text = absolute;
  while (text.size() > 1 && path::is_separator(text.back()))
    text = text.drop_back();
  return text.str();
}

llvm::Error checkManifestMatchesPlans(const plan::Manifest &manifest,
                                      llvm::ArrayRef<plan::RankPlan> plans) {
  // The manifest's own checks keep every rank file inside the directory.
  if (llvm::Error error = plan::verifyManifest(manifest))
    return failure("internal error: " + llvm::toString(std::move(error)));
  if (manifest.ranks.size() != plans.size())
    return failure("internal error: the manifest lists " + llvm::Twine(manifest.ranks.size()) +
                   " ranks but " + llvm::Twine(plans.size()) + " rank plans were lowered");
  for (const plan::RankEntry &entry : manifest.ranks)
    if (path::remove_leading_dotslash(entry.file) == plan::ManifestFileName)
      return failure("internal error: rank " + llvm::Twine(entry.rank) +
                     "'s plan would overwrite the manifest");
  return llvm::Error::success();
}

/// Rank files may sit in subdirectories of the plan directory; those exist before the
/// threads write into them.
llvm::Error createRankFileDirectories(StringRef dir, const plan::Manifest &manifest) {
  llvm::StringSet<> created;
  for (const plan::RankEntry &entry : manifest.ranks) {
    StringRef parent = path::parent_path(entry.file);
    if (parent.empty() || !created.insert(parent).second)
      continue;
    llvm::SmallString<256> subdirectory(dir);
    path::append(subdirectory, parent);
    if (std::error_code ec = fs::create_directories(subdirectory))
      return failure("cannot create '" + subdirectory + "': " + ec.message());
  }
  return llvm::Error::success();
}

llvm::Error writeRankFiles(StringRef dir, const plan::Manifest &manifest,
                           llvm::ArrayRef<plan::RankPlan> plans, unsigned threads) {
  llvm::ThreadPoolStrategy strategy = llvm::hardware_concurrency(threads);
  unsigned workers =
      std::max(1u, std::min<unsigned>(strategy.compute_thread_count(), unsigned(plans.size())));
  std::mutex errorMutex;
  std::string firstError;
  std::atomic<bool> failed{false};
  auto writeRange = [&](size_t begin, size_t end) {
    for (size_t rank = begin; rank < end && !failed && !interruptedBySignal(); ++rank) {
      llvm::SmallString<256> file(dir);
      path::append(file, manifest.ranks[rank].file);
      if (llvm::Error error = streamRankPlanToFile(file, plans[rank], JSONLayout::Compact)) {
        std::lock_guard<std::mutex> lock(errorMutex);
        if (!failed.exchange(true))
          firstError = llvm::toString(std::move(error));
        else
          llvm::consumeError(std::move(error));
      }
    }
  };
  if (workers == 1) {
    writeRange(0, plans.size());
  } else {
    // Contiguous ranges, several per worker, so that a slow file does not idle the others.
    llvm::ThreadPool pool(llvm::hardware_concurrency(workers));
    size_t tasks = size_t(workers) * 8;
    size_t perTask = (plans.size() + tasks - 1) / tasks;
    for (size_t begin = 0; begin < plans.size(); begin += perTask)
      pool.async(writeRange, begin, std::min(plans.size(), begin + perTask));
    pool.wait();
  }
  if (failed)
    return failure(firstError);
  return llvm::Error::success();
}

/// Puts the finished `staged` directory at `dir`, replacing what classifyTarget allows.
llvm::Error moveIntoPlace(StringRef staged, StringRef dir, StringRef shownDir) {
  // Checked again: something may have appeared at DIR while the plans were written.
  llvm::Expected<Target> target = classifyTarget(dir, shownDir);
  if (!target)
    return target.takeError();
  auto renameFailed = [&](std::error_code ec) {
    return failure("cannot move the new plans into '" + shownDir + "': " + ec.message());
  };
  if (*target == Target::EmptyDirectory)
    if (std::error_code ec = fs::remove(dir))
      return renameFailed(ec);
  if (*target != Target::PlanDirectory) {
    if (std::error_code ec = fs::rename(staged, dir))
      return renameFailed(ec);
    return llvm::Error::success();
  }
  llvm::SmallString<256> old;
  fs::createUniquePath(dir + ".parc-old-%%%%%%", old, /*MakeAbsolute=*/false);
  if (std::error_code ec = fs::rename(dir, old))
    return failure("cannot move the previous plans at '" + shownDir + "' aside: " + ec.message());
  if (std::error_code ec = fs::rename(staged, dir)) {
    fs::rename(old, dir);
    return renameFailed(ec);
  }
  // The new plans are in place; a previous plan left behind would only cost disk space.
  fs::remove_directories(old, /*IgnoreErrors=*/true);
  return llvm::Error::success();
}

} // namespace

/// "DIR.parc-tmp-PID-HOST": the prefix of this process's temporary directories, which names
/// their owner so that a later run can tell whether it is gone.
std::string temporaryPrefix(StringRef dir) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0)
    host[0] = '\0';
  std::string name = host;
  for (char &c : name)
    if (!llvm::isAlnum(c) && c != '.')
      c = '_';
  return (dir + ".parc-tmp-" + llvm::Twine(getpid()) + "-" + name).str();
}

/// Removes the temporary directories next to `dir` that a parc on this host left when it was
/// killed (SIGKILL, a crash): their owner process no longer exists.
void removeStaleTemporaries(StringRef dir) {
  StringRef parent = path::parent_path(dir);
  std::string prefix = (path::filename(dir) + ".parc-tmp-").str();
  std::string ourHost = path::filename(temporaryPrefix(dir)).rsplit('-').second.str();
  std::error_code ec;
  for (fs::directory_iterator entry(parent.empty() ? "." : parent, ec), end; entry != end && !ec;
       entry.increment(ec)) {
    StringRef name = path::filename(entry->path());
    if (!name.consume_front(prefix))
      continue;
    auto [pidText, rest] = name.split('-');
    StringRef host = rest.rsplit('-').first;
    int pid = 0;
    if (pidText.getAsInteger(10, pid) || pid <= 0 || host != ourHost)
      continue;
    if (kill(pid, 0) != 0 && errno == ESRCH)
      fs::remove_directories(entry->path(), /*IgnoreErrors=*/true);
  }
}

llvm::Error checkPlanDirectoryTarget(StringRef dir) {
  llvm::Expected<Target> target = classifyTarget(normalise(dir), dir);
  return target ? llvm::Error::success() : target.takeError();
}

llvm::Error writePlanDirectory(StringRef shownDir, const plan::Manifest &manifest,
                               llvm::ArrayRef<plan::RankPlan> plans, unsigned threads) {
  if (llvm::Error error = checkManifestMatchesPlans(manifest, plans))
    return error;
  std::string dir = normalise(shownDir);
  if (llvm::Error error = checkPlanDirectoryTarget(shownDir))
    return error;

  removeStaleTemporaries(dir);
  llvm::SmallString<256> staged;
  std::optional<HoldCleanupSignals> held(std::in_place);
  if (std::error_code ec = fs::createUniqueDirectory(temporaryPrefix(dir), staged)) {
    StringRef parent = path::parent_path(dir);
    if (ec == std::errc::no_such_file_or_directory)
      return failure("cannot write plans to '" + shownDir + "': its parent directory '" + parent +
                     "' does not exist; create it first");
    return failure("cannot write plans to '" + shownDir + "': cannot create a directory in '" +
                   parent + "': " + ec.message());
  }
  RemoveOnExit cleanup(staged.str().str());
  RemoveOnSignal interrupted(staged);
  held.reset(); // a signal that came meanwhile arrives now, with the directory registered
  // createUniqueDirectory makes it private to the owner; a plan directory is as readable as
  // one made by mkdir.
  fs::setPermissions(staged, static_cast<fs::perms>(fs::all_all & ~fs::getUmask()));

  if (llvm::Error error = createRankFileDirectories(staged, manifest))
    return error;
  if (llvm::Error error = writeRankFiles(staged, manifest, plans, threads))
    return error;
  llvm::SmallString<256> manifestPath(staged);
  path::append(manifestPath, plan::ManifestFileName);
  if (llvm::Error error = plan::writeManifest(manifestPath, manifest))
    return error;
  if (llvm::Error error = moveIntoPlace(staged, dir, shownDir))
    return error;
  interrupted.release();
  cleanup.release();
  return llvm::Error::success();
}

llvm::Error writeFileAtomically(StringRef path,
                                llvm::function_ref<void(llvm::raw_ostream &)> write) {
  if (fs::is_directory(path))
    return failure("cannot write '" + path + "': it is a directory; give a file name with -o");
  // A device or a FIFO (/dev/stdout, /dev/full) is written in place: renaming a file over it
  // would replace the device.
  fs::file_status status;
  if (!fs::status(path, status) && status.type() != fs::file_type::regular_file) {
    if (llvm::Error error = writeFile(path, write))
      return failure("cannot write '" + path + "': " +
                     llvm::errorToErrorCode(std::move(error)).message());
    return llvm::Error::success();
  }
  int fd = -1;
  llvm::SmallString<256> temporary;
  std::optional<HoldCleanupSignals> held(std::in_place);
  if (std::error_code ec = fs::createUniqueFile(path + ".parc-tmp-%%%%%%", fd, temporary)) {
    if (ec == std::errc::no_such_file_or_directory)
      return failure("cannot write '" + path + "': its directory '" + path::parent_path(path) +
                     "' does not exist; create it first");
    return failure("cannot write '" + path + "': " + ec.message());
  }
  RemoveOnExit cleanup(temporary.str().str());
  RemoveOnSignal interrupted(temporary);
  held.reset();
  // createUniqueFile makes it private to the owner; an output is as readable as any new file.
  fs::setPermissions(fd, static_cast<fs::perms>((fs::all_read | fs::all_write) & ~fs::getUmask()));
  llvm::raw_fd_ostream os(fd, /*shouldClose=*/true);
  write(os);
  os.close();
  if (os.has_error()) {
    std::error_code ec = os.error();
    os.clear_error();
    return failure("cannot write '" + path + "': " + ec.message());
  }
  if (std::error_code ec = fs::rename(temporary, path))
    return failure("cannot write '" + path + "': " + ec.message());
  interrupted.release();
  cleanup.release();
  return llvm::Error::success();
}

} // namespace parc
