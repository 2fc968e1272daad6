//===- FrontendFuzzer.cpp - libFuzzer target: parse and check a .par file -===//
//
// Any byte string is a .par file: parse, analyze and run the feasibility and memory checks.
// Whatever the input, this must end without a crash, a sanitizer report, a leak or a hang;
// diagnostics are the expected outcome and go nowhere. scripts/fuzz.sh runs it.
//
//===----------------------------------------------------------------------===//
#include "parc/Check/Mapping.h"
#include "parc/Cost/MemoryModel.h"
#include "parc/Frontend/Parser.h"
#include "parc/Sema/Sema.h"

#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  llvm::SourceMgr sourceMgr;
  parc::DiagnosticEngine diags(sourceMgr, llvm::nulls());
  llvm::StringRef text(reinterpret_cast<const char *>(data), size);
  parc::ast::Module module = parc::parseBuffer(text, "fuzz.par", diags);
  std::optional<parc::Program> program = parc::analyze(module, diags);
  if (!program || diags.hasErrors())
    return 0;
  if (std::optional<parc::Mapping> mapping = parc::checkMapping(*program, diags))
    parc::checkMemory(*program, *mapping, diags);
  return 0;
}
