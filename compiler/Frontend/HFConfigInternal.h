//===- HFConfigInternal.h - Reading a config.json key by key --------------===//
//
// Internal to compiler/Frontend: the reader every architecture's mapping uses (HFConfig.cpp),
// with the keys' locations for diagnostics, and the block it fills.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_FRONTEND_HFCONFIGINTERNAL_H
#define PARC_FRONTEND_HFCONFIGINTERNAL_H

#include "parc/Frontend/HFConfig.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/JSON.h"

#include <initializer_list>
#include <optional>
#include <string>

namespace parc::hf {

/// A number as the .par language writes it: integers without a point, no '+' in exponents.
std::string formatNumber(double v);

/// The config's top-level object, read key by key. Every key read is remembered, so that the
/// ones no reader asked for can be named (warnUnread). Type errors are reported at the key.
class Config {
public:
  Config(const llvm::json::Object &object, llvm::StringRef text, DiagnosticEngine &diags);

  llvm::SMLoc at(llvm::StringRef key) const;
  void error(llvm::StringRef key, const llvm::Twine &message);
  void warning(llvm::StringRef key, const llvm::Twine &message);
  bool hasFailed() const { return failed; }

  /// The value of `key`; null when it is absent or JSON null. The key counts as read.
  const llvm::json::Value *get(llvm::StringRef key);
  /// Keys that name tokens, caching and the like: read, with no effect on the model.
  void accept(std::initializer_list<llvm::StringRef> names);

  std::optional<int64_t> count(llvm::StringRef key);  // a positive integer
  int64_t required(llvm::StringRef key);              // a count that must be there
  std::optional<double> number(llvm::StringRef key);  // a non-negative number
  std::optional<bool> flag(llvm::StringRef key);
  std::optional<std::string> word(llvm::StringRef key);
  const llvm::json::Object *objectAt(llvm::StringRef key);

  /// A key nobody read may change the model: say so, by name.
  void warnUnread(llvm::StringRef architecture);

private:
  const llvm::json::Object &object;
  llvm::StringRef text;
  llvm::StringMap<const char *> keys;
  DiagnosticEngine &diags;
  llvm::StringSet<> read;
  bool failed = false;
};

class ModelBuilder {
public:
  ModelBuilder(Config &config, ImportedModel &model) : config(config), model(model) {}

  void set(llvm::StringRef name, llvm::StringRef value, llvm::StringRef from = "") {
    for (ImportedField &f : model.fields)
      if (f.name == name) {
        f.value = value.str();
        f.from = from.str();
        return;
      }
    model.fields.push_back({name.str(), value.str(), from.str()});
  }
  void set(llvm::StringRef name, int64_t value, llvm::StringRef from) {
    set(name, std::to_string(value), from);
  }
  std::string value(llvm::StringRef name) const {
    for (const ImportedField &f : model.fields)
      if (f.name == name)
        return f.value;
    return "";
  }
  /// A field set from an integer key; 0 when it is not set (readSizes has reported why).
  int64_t integer(llvm::StringRef name) const {
    int64_t n = 0;
    return llvm::StringRef(value(name)).getAsInteger(10, n) ? 0 : n;
  }
  void note(const std::string &line) { model.notes.push_back(line); }

  Config &config;
  ImportedModel &model;
};

} // namespace parc::hf

#endif
