//===- HFImport.h - parc --import-hf: a config.json to a checked model block -===//
//
// The block readHFConfig writes is parsed back by the front end and analysed like any .par
// model, and its parameter count comes from the memory model, the one place parc counts
// parameters: the number in the block's header is what parc will plan with.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_INTEROP_HFIMPORT_H
#define PARC_INTEROP_HFIMPORT_H

#include "parc/Support/Diagnostics.h"

#include "llvm/ADT/StringRef.h"

#include <optional>
#include <string>

namespace parc {

/// The model block for the Hugging Face config at `path`, or nothing after an error.
std::optional<std::string> importHFModel(llvm::StringRef path, DiagnosticEngine &diags);

} // namespace parc

#endif
