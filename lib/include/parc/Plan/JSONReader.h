//===- JSONReader.h - Field-by-field JSON reading with located errors -----===//
//
// The plan readers (and parrun's checkpoint reader) walk a json::Value and need, at every
// step, a clear message naming the field when the value is not what the format says. ReadContext keeps the
// first failure only: after it every read is a no-op that returns false, so reading code can
// keep going without testing each step and the message still names the first bad field.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_PLAN_JSONREADER_H
#define PARC_PLAN_JSONREADER_H

#include "parc/Plan/Plan.h"
#include "parc/Support/NameSuggest.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <string>
#include <vector>

namespace parc::plan::detail {

class ReadContext {
public:
  /// `document` starts every message: "rank plan", "plan manifest".
  explicit ReadContext(llvm::StringRef document) : document(document.str()) {}

  bool failed() const { return !message.empty(); }
  /// Records `problem` about the field at `path` ("" for the document itself) unless an
  /// earlier failure was recorded. Always returns false.
  bool fail(llvm::StringRef path, const llvm::Twine &problem);
  llvm::Error takeError() const;

private:
  std::string document, message;
};

std::string fieldPath(llvm::StringRef parent, llvm::StringRef key);
std::string indexPath(llvm::StringRef parent, size_t index);
/// For map entries whose names contain dots: tensors["block.0.out"].
std::string entryPath(llvm::StringRef parent, llvm::StringRef name);

/// A number as a message shows it: shortest round-trip-ish form, "1e-05", "0.95".
std::string numberText(double value);

/// "an integer", "a string", "null", ... for "expected X, got Y".
const char *describe(const llvm::json::Value &value);

bool readInt(ReadContext &ctx, const llvm::json::Value &value, llvm::StringRef path, int64_t &out);
bool readNumber(ReadContext &ctx, const llvm::json::Value &value, llvm::StringRef path,
                double &out);
bool readBool(ReadContext &ctx, const llvm::json::Value &value, llvm::StringRef path, bool &out);
bool readString(ReadContext &ctx, const llvm::json::Value &value, llvm::StringRef path,
                std::string &out);
const llvm::json::Array *readArray(ReadContext &ctx, const llvm::json::Value &value,
                                   llvm::StringRef path);

/// Reads a spelling of E; `what` names the kind in the message ("unknown op 'fwdd'").
template <typename E>
bool readEnum(ReadContext &ctx, const llvm::json::Value &value, llvm::StringRef path,
              llvm::StringRef what, E &out) {
  std::string text;
  if (!readString(ctx, value, path, text))
    return false;
  if (std::optional<E> parsed = parseSpelling<E>(text)) {
    out = *parsed;
    return true;
  }
  llvm::SmallVector<llvm::StringRef, 32> names(spellings(E{}).begin(), spellings(E{}).end());
  std::string hint = didYouMean(text, names);
  if (hint.empty() && names.size() <= 8)
    hint = "; expected one of " + llvm::join(names, ", ");
  return ctx.fail(path, "unknown " + what + " '" + text + "'" + hint);
}

/// One JSON object at a path. Every key asked for is remembered, so that finish() can reject
/// any other key as unknown (with a suggestion) instead of silently ignoring a typo.
class ObjectReader {
public:
  ObjectReader(ReadContext &ctx, const llvm::json::Value &value, std::string path);

  bool valid() const { return object != nullptr; }
  const std::string &path() const { return objectPath; }
  std::string pathOf(llvm::StringRef key) const { return fieldPath(objectPath, key); }
  ReadContext &context() { return ctx; }

  /// The value of a required key; null (and a recorded failure) when it is missing.
  const llvm::json::Value *get(llvm::StringRef key);

  bool read(llvm::StringRef key, int64_t &out);
  bool read(llvm::StringRef key, double &out);
  bool read(llvm::StringRef key, bool &out);
  bool read(llvm::StringRef key, std::string &out);
  bool read(llvm::StringRef key, std::vector<int64_t> &out);
  bool read(llvm::StringRef key, std::vector<std::string> &out);
  template <typename E> bool readEnum(llvm::StringRef key, llvm::StringRef what, E &out) {
    const llvm::json::Value *value = get(key);
    return value && detail::readEnum(ctx, *value, pathOf(key), what, out);
  }
  template <typename E>
  bool readEnumList(llvm::StringRef key, llvm::StringRef what, std::vector<E> &out) {
    const llvm::json::Value *value = get(key);
    const llvm::json::Array *array = value ? readArray(ctx, *value, pathOf(key)) : nullptr;
    if (!array)
      return false;
    out.assign(array->size(), E{});
    for (size_t i = 0; i < array->size(); ++i)
      if (!detail::readEnum(ctx, (*array)[i], indexPath(pathOf(key), i), what, out[i]))
        return false;
    return true;
  }

  /// Fails on the first key (in sorted order) that was never asked for.
  bool finish();

private:
  ReadContext &ctx;
  const llvm::json::Object *object = nullptr;
  std::string objectPath;
  std::vector<std::string> known;
};

} // namespace parc::plan::detail

#endif
