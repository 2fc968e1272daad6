//===- HFImport.cpp - parc --import-hf: a config.json to a checked model block -===//
#include "parc/Interop/HFImport.h"

#include "parc/Cost/MemoryModel.h"
#include "parc/Frontend/HFConfig.h"
#include "parc/Frontend/Parser.h"
#include "parc/Sema/Sema.h"

namespace parc {

namespace {
/// 8030261248 as 8,030,261,248.
std::string withThousands(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return out;
}
} // namespace

std::optional<std::string> importHFModel(llvm::StringRef path, DiagnosticEngine &diags) {
  std::optional<ImportedModel> model = readHFConfig(path, diags);
  if (!model)
    return std::nullopt;
  // The block as written, read back as any .par file is, so that the language's checks and
  // limits (docs/language.md, Limits) apply to an import too: an error is reported on the
  // block's line, whose comment names the config key it came from.
  std::string draft = printModelBlock(*model, {});
  ast::Module module = parseBuffer(draft, model->name + ".par (imported)", diags);
  std::optional<ModelSpec> spec = analyzeModel(module, diags);
  if (!spec || diags.hasErrors()) {
    diags.error(llvm::SMLoc(), "the model of '" + path + "' is not one parc accepts: the " +
                                   "block imported from it has the errors above");
    return std::nullopt;
  }
  int64_t params = totalParams(*spec, spec->vocab);
  return printModelBlock(
      *model, {withThousands(params) + " parameters, as transformers counts them (the vocabulary "
                                       "before padding)."});
}

} // namespace parc
