//===- Checkpoint.cpp - parrun --save: write a rank's training state ------===//
//
// Reading it back is CheckpointLoad.cpp; what both agree on is CheckpointFormat.h.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/Checkpoint.h"

#include "CheckpointFormat.h"
#include "Devices.h"
#include "parc/Support/FileInput.h"
#include "parc/Support/FileOutput.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cmath>
#include <limits>

namespace parc::runtime {

using namespace checkpoint;

namespace {

/// The same for a save: a failed write is exit 2, and the incomplete DIR.partial goes. Every
/// rank removes it, since every rank has stopped writing into it once they agree, and the
/// first rank to throw ends the others' waits (so rank 0 alone might never get here).
void agreeOnSaveFailure(Communicator &comm, const std::string &mine, llvm::StringRef what,
                        llvm::StringRef partial) {
  for (const std::string &failure : comm.agree(mine))
    if (!failure.empty()) {
      llvm::sys::fs::remove_directories(partial, /*IgnoreErrors=*/true);
      throw AgreedError(what.str() + ": " + failure, ExitWriteFailed);
    }
}

/// writeFile's error as text, empty when there is none (agreeOnFailure's currency).
std::string writeFileOrFailure(llvm::StringRef path,
                               llvm::function_ref<void(llvm::raw_ostream &)> write) {
  if (llvm::Error error = writeFile(path, write))
    return llvm::toString(std::move(error));
  return "";
}

template <typename D>
std::string writeRankFile(ParamStore<D> &params, const plan::RankPlan &plan, llvm::StringRef path) {
  std::vector<Section> sections = sectionsOf(params);
  llvm::json::Array described;
  for (const Section &section : sections)
    described.push_back(llvm::json::Object{
        {"owner", section.owner}, {"kind", section.kind}, {"bytes", int64_t(section.bytes)}});
  llvm::json::Object header{{"format", RankFormat},
                            {"rank", plan.rank},
                            {"plan_id", plan.planId},
                            {"value_bytes", int64_t(sizeof(typename D::Value))},
                            {"state_bytes", int64_t(sizeof(typename D::OptState))},
                            {"sections", std::move(described)}};
  D &dev = params.device();
  return writeFileOrFailure(path, [&](llvm::raw_ostream &os) {
    os << llvm::json::Value(std::move(header)) << "\n";
    std::vector<char> host;
    for (const Section &section : sections) {
      host.resize(section.bytes);
      dev.saveBytes(host.data(), section.data, section.bytes);
      os.write(host.data(), host.size());
    }
  });
}

llvm::json::Value finiteOrNull(double value) {
  return std::isfinite(value) ? llvm::json::Value(value) : llvm::json::Value(nullptr);
}

std::string manifestText(const plan::RankPlan &plan, const CheckpointRun &run,
                         const CheckpointState &state, llvm::ArrayRef<FileDigest> files) {
  llvm::json::Array losses, norms;
  for (double loss : state.losses)
    losses.push_back(finiteOrNull(loss));
  for (double norm : state.gradNorms)
    norms.push_back(finiteOrNull(norm));
  llvm::json::Object manifest{
      {"format", ManifestFormat},
      {"plan_id", plan.planId},
      {"world", plan.world},
      {"precision", run.precision},
      {"data", run.data},
      {"step", state.step},
      {"updates", state.updates},
      {"loss_scale", llvm::json::Object{{"options", run.lossScale.flags()},
                                        {"scale", state.lossScale.scale},
                                        {"finite_in_a_row", state.lossScale.finiteInARow},
                                        {"overflows_left", state.lossScale.overflowsLeft}}},
      {"losses", std::move(losses)},
      {"grad_norms", std::move(norms)}};
  llvm::json::Array described;
  for (size_t rank = 0; rank < files.size(); ++rank)
    described.push_back(llvm::json::Object{{"name", rankFileName(int64_t(rank))},
                                           {"bytes", files[rank].bytes},
                                           {"xxh64", files[rank].xxh64}});
  manifest["files"] = std::move(described);
  manifest["xxh64"] = manifestChecksum(manifest);
  std::string text;
  llvm::raw_string_ostream(text) << llvm::formatv("{0:2}", llvm::json::Value(std::move(manifest)))
                                 << "\n";
  return text;
}

/// Replaces `dir` by the complete `partial`. The previous checkpoint waits at DIR.old until
/// the new one is in place; a DIR.old left by an interrupted save (and no DIR) is kept until
/// then too.
std::string publish(llvm::StringRef partial, llvm::StringRef dir) {
  std::string old = dir.str() + ".old";
  if (llvm::sys::fs::exists(dir)) {
    llvm::sys::fs::remove_directories(old);
    if (std::error_code error = llvm::sys::fs::rename(dir, old))
      return "cannot move the previous checkpoint " + dir.str() + " aside: " + error.message();
  }
  if (std::error_code error = llvm::sys::fs::rename(partial, dir))
    return "cannot rename " + partial.str() + " to " + dir.str() + ": " + error.message();
  llvm::sys::fs::remove_directories(old);
  return "";
}

/// Whether `path` is a folder parrun may replace or remove: missing, empty, or holding only a
/// checkpoint's files.
bool replaceable(llvm::StringRef path) {
  if (!llvm::sys::fs::exists(path))
    return true;
  if (!llvm::sys::fs::is_directory(path))
    return false;
  std::error_code error;
  for (llvm::sys::fs::directory_iterator entry(path, error), end; entry != end && !error;
       entry.increment(error)) {
    llvm::StringRef name = llvm::sys::path::filename(entry->path());
    if (name != "manifest.json" && !(name.startswith("rank-") && name.endswith(".ckpt")))
      return false;
  }
  return !error;
}

} // namespace

std::string checkSaveLocation(llvm::StringRef dir) {
  llvm::SmallString<256> absolute(dir);
  llvm::sys::fs::make_absolute(absolute);
  llvm::sys::path::remove_dots(absolute, /*remove_dot_dot=*/true);
  if (llvm::sys::fs::exists(absolute) && !llvm::sys::fs::is_directory(absolute))
    return "--save " + dir.str() + ": it exists and is not a folder";
  // The folders missing on the way are created by the save.
  llvm::StringRef existing = llvm::sys::path::parent_path(absolute);
  while (!existing.empty() && !llvm::sys::fs::exists(existing))
    existing = llvm::sys::path::parent_path(existing);
  if (!llvm::sys::fs::is_directory(existing))
    return "--save " + dir.str() + ": " + existing.str() + " is not a folder";
  if (llvm::sys::fs::access(existing, llvm::sys::fs::AccessMode::Write))
    return "--save " + dir.str() + ": the folder " + existing.str() + " is not writable";
  // A save replaces these; anything there that is not a checkpoint is the user's.
  for (std::string path :
       {std::string(absolute), absolute.str().str() + ".partial", absolute.str().str() + ".old"})
    if (!replaceable(path))
      return "--save " + dir.str() + ": " + path +
             " holds files that are not a parrun checkpoint, which saving would remove; choose "
             "another folder";
  return "";
}

namespace {

/// Writes this rank's file into `partial`, makes it durable and returns "D" and "BYTES XXH64"
/// of what is on disk, or "E" and the failure.
template <typename D>
std::string saveRankFile(ParamStore<D> &params, const plan::RankPlan &plan,
                         llvm::StringRef partial) {
  std::string path = join(partial, rankFileName(plan.rank));
  std::string failure = writeRankFile(params, plan, path);
  if (!failure.empty())
    return "E" + failure;
  if (std::error_code error = syncToDisk(path))
    return "E" + path + ": cannot sync to disk: " + error.message();
  // Read back (mapped, from the page cache), so that the checksum is of the written bytes.
  llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>> written = readRegularFile(
      path, std::numeric_limits<int64_t>::max(), /*RequiresNullTerminator=*/false);
  if (!written)
    return "E" + path + ": cannot read back: " + llvm::toString(written.takeError());
  return "D" + FileDigest::of((*written)->getBuffer()).encode();
}

/// Rank 0's part of a save once every rank's file is in place: the manifest with their
/// digests, made durable with the folder, then published and the parent made durable.
std::string saveManifest(const plan::RankPlan &plan, const CheckpointRun &run,
                         const CheckpointState &state, llvm::ArrayRef<FileDigest> files,
                         llvm::StringRef partial, llvm::StringRef dir) {
  std::string path = join(partial, "manifest.json");
  std::string text = manifestText(plan, run, state, files);
  if (std::string failure = writeFileOrFailure(path, [&](llvm::raw_ostream &os) { os << text; });
      !failure.empty())
    return failure;
  for (const std::string &durable : {path, partial.str()})
    if (std::error_code error = syncToDisk(durable))
      return durable + ": cannot sync to disk: " + error.message();
  if (std::string failure = publish(partial, dir); !failure.empty())
    return failure;
  llvm::SmallString<256> parent(dir);
  llvm::sys::fs::make_absolute(parent);
  llvm::sys::path::remove_filename(parent);
  if (std::error_code error = syncToDisk(parent))
    return parent.str().str() + ": cannot sync to disk: " + error.message();
  return "";
}

} // namespace

template <typename D>
void saveCheckpoint(Communicator &comm, ParamStore<D> &params, const plan::RankPlan &plan,
                    const CheckpointRun &run, const CheckpointState &state, llvm::StringRef dir) {
  std::string what = "--save " + dir.str();
  std::string partial = dir.str() + ".partial";
  std::string failure;
  if (plan.rank == 0) {
    llvm::sys::fs::remove_directories(partial);
    if (std::error_code error = llvm::sys::fs::create_directories(partial))
      failure = "cannot create " + partial + ": " + error.message();
  }
  agreeOnSaveFailure(comm, failure, what, partial);
  // Every rank learns every rank's digest, or the first failure.
  std::vector<FileDigest> files;
  for (const std::string &report : comm.agree(saveRankFile(params, plan, partial))) {
    llvm::StringRef text(report);
    FileDigest &digest = files.emplace_back();
    if (text.consume_front("E")) {
      if (failure.empty())
        failure = text.str();
    } else if (text.consume_front("D")) {
      auto [bytes, hash] = text.split(' ');
      if (bytes.getAsInteger(10, digest.bytes) && failure.empty())
        failure = "a rank sent a malformed digest";
      digest.xxh64 = hash.str();
    }
  }
  agreeOnSaveFailure(comm, failure, what, partial);
  if (plan.rank == 0)
    failure = saveManifest(plan, run, state, files, partial, dir);
  agreeOnSaveFailure(comm, failure, what, partial);
}

#define INSTANTIATE(D)                                                                             \
  template void saveCheckpoint(Communicator &, ParamStore<D> &, const plan::RankPlan &,            \
                               const CheckpointRun &, const CheckpointState &, llvm::StringRef);
PARC_FOR_EACH_DEVICE(INSTANTIATE)
#undef INSTANTIATE

} // namespace parc::runtime
