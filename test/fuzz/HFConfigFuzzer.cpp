//===- HFConfigFuzzer.cpp - libFuzzer target: --import-hf of any bytes ----===//
//
// Any byte string is a config.json: read it as parc --import-hf does (the JSON, each family's
// keys, the block read back and checked, its parameter count). Whatever the input, this must
// end without a crash, a sanitizer report, a leak or a hang. The bytes go through a file, as
// the import reads a path. scripts/fuzz.sh runs it.
//
//===----------------------------------------------------------------------===//
#include "parc/Interop/HFImport.h"

#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

namespace {
const std::string &inputPath() {
  static const std::string path = [] {
    const char *dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/parc-fuzz-hf-" +
           std::to_string(getpid()) + ".json";
  }();
  return path;
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string &path = inputPath();
  FILE *file = std::fopen(path.c_str(), "wb");
  if (!file)
    std::abort();
  bool written = std::fwrite(data, 1, size, file) == size;
  if (std::fclose(file) != 0 || !written)
    std::abort();
  llvm::SourceMgr sourceMgr;
  parc::DiagnosticEngine diags(sourceMgr, llvm::nulls());
  parc::importHFModel(path, diags);
  return 0;
}
