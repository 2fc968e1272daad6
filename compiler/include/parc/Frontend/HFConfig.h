//===- HFConfig.h - A Hugging Face config.json as a .par model block -----===//
//
// `parc --import-hf=config.json` reads a transformers model config and writes the same model
// in the .par language. Every key that changes the parameters or the math is mapped to a field
// or refused at its place in the JSON; a key the importer does not know is a warning that
// names it. The mapping, field by field, is in docs/interop.md.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_FRONTEND_HFCONFIG_H
#define PARC_FRONTEND_HFCONFIG_H

#include "parc/Support/Diagnostics.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <optional>
#include <string>
#include <vector>

namespace parc {

/// One field of the model block: `name = value`, and the config keys it comes from.
struct ImportedField {
  std::string name, value, from;
};

struct ImportedModel {
  std::string name;         // the model block's name, from the file's
  std::string architecture; // "LlamaForCausalLM"
  std::string source;       // the config file as given
  std::vector<ImportedField> fields;
  int64_t layers = 0;
  bool tied = false;
  std::string layersFrom, tiedFrom;
  /// Comment lines above the block: what the import assumed or could not say.
  std::vector<std::string> notes;
};

/// Reads `path`; reports through `diags` at the offending key. Nothing after an error.
std::optional<ImportedModel> readHFConfig(llvm::StringRef path, DiagnosticEngine &diags);

/// The model block, `header` lines first as comments.
std::string printModelBlock(const ImportedModel &model, llvm::ArrayRef<std::string> header);

/// The architectures readHFConfig knows, for messages and docs.
llvm::ArrayRef<llvm::StringRef> importableArchitectures();

} // namespace parc

#endif
