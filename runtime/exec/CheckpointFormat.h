//===- CheckpointFormat.h - What Checkpoint.cpp writes and CheckpointLoad.cpp reads ===//
//
// Internal to runtime/exec: the checkpoint's formats and file names, the sections of a rank's
// file and the checksums (Checkpoint.h describes the layout).
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_EXEC_CHECKPOINTFORMAT_H
#define PARC_RUNTIME_EXEC_CHECKPOINTFORMAT_H

#include "parc/Runtime/Checkpoint.h"
#include "parc/Runtime/Executor.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Support/xxhash.h"

#include <string>
#include <vector>

namespace parc::runtime::checkpoint {

// Version 2 added the checksums ("files", "xxh64").
inline constexpr llvm::StringLiteral ManifestFormat = "parrun-checkpoint/2";
inline constexpr llvm::StringLiteral RankFormat = "parrun-checkpoint-rank/1";

inline std::string rankFileName(int64_t rank) {
  std::string name;
  llvm::raw_string_ostream(name) << llvm::format("rank-%05lld.ckpt", (long long)rank);
  return name;
}

inline std::string join(llvm::StringRef dir, llvm::StringRef name) {
  llvm::SmallString<256> path(dir);
  llvm::sys::path::append(path, name);
  return std::string(path);
}

/// Every rank learns the first rank's failure (in rank order), or nothing.
inline void agreeOnFailure(Communicator &comm, const std::string &mine, llvm::StringRef what) {
  for (const std::string &failure : comm.agree(mine))
    if (!failure.empty())
      throw AgreedError(what.str() + ": " + failure);
}

/// What the manifest records of each file: its size and 64-bit xxHash (llvm::xxHash64).
struct FileDigest {
  int64_t bytes = 0;
  std::string xxh64; // 16 lower-case hex digits

  static FileDigest of(llvm::StringRef content) {
    return {int64_t(content.size()), llvm::utohexstr(llvm::xxHash64(content), /*LowerCase=*/true,
                                                     /*Width=*/16)};
  }
  std::string encode() const { return std::to_string(bytes) + " " + xxh64; }
};

/// The manifest's own checksum: of its JSON without the "xxh64" key, compact and with sorted
/// keys, so that it covers every value but not the layout of the text.
inline std::string manifestChecksum(llvm::json::Object manifest) {
  manifest.erase("xxh64");
  std::string text;
  llvm::raw_string_ostream(text) << llvm::json::Value(std::move(manifest));
  return FileDigest::of(text).xxh64;
}

/// One buffer of a rank's file: whose, what, and where it lives on the device.
struct Section {
  std::string owner; // a shard's name, or "partition N"
  std::string kind;  // value, master, moment1, moment2, owned
  void *data = nullptr;
  size_t bytes = 0;
};

/// The buffers a rank's file holds: each shard's values unless released, its optimizer state
/// (where allocated, or with `unallocatedState` also where not yet, at a null address), and
/// the owned range of each released partition.
template <typename D>
std::vector<Section> sectionsOf(ParamStore<D> &params, bool unallocatedState = false) {
  using T = typename D::Value;
  using OptState = typename D::OptState;
  std::vector<Section> sections;
  for (auto &param : params.all()) {
    const std::string &name = param.shard->name;
    if (param.value)
      sections.push_back({name, "value", param.value, size_t(param.numel) * sizeof(T)});
    size_t stateBytes = size_t(param.ownedCount()) * sizeof(OptState);
    for (auto [kind, buffer] : {std::pair{"master", &param.master},
                                {"moment1", &param.moment1},
                                {"moment2", &param.moment2}})
      if (buffer->allocated() || unallocatedState)
        sections.push_back(
            {name, kind, buffer->allocated() ? buffer->data() : nullptr, stateBytes});
  }
  auto &parts = params.partitions();
  for (size_t p = 0; p < parts.size(); ++p)
    if (!parts[p].weights.allocated())
      sections.push_back({"partition " + std::to_string(p), "owned", parts[p].owned.data(),
                          size_t(parts[p].perMember) * sizeof(T)});
  return sections;
}

} // namespace parc::runtime::checkpoint

#endif
