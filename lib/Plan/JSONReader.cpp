//===- JSONReader.cpp - Field-by-field JSON reading with located errors ---===//

#include "parc/Plan/JSONReader.h"

#include "llvm/ADT/STLExtras.h"

#include <cmath>
#include <cstdio>

namespace json = llvm::json;
using llvm::StringRef;

namespace parc::plan::detail {

bool ReadContext::fail(StringRef path, const llvm::Twine &problem) {
  if (failed())
    return false;
  message = document + ": ";
  if (!path.empty())
    message += "field \"" + path.str() + "\": ";
  message += problem.str();
  return false;
}

llvm::Error ReadContext::takeError() const {
  if (!failed())
    return llvm::Error::success();
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

std::string fieldPath(StringRef parent, StringRef key) {
  return parent.empty() ? key.str() : (parent + "." + key).str();
}

std::string indexPath(StringRef parent, size_t index) {
  return (parent + "[" + llvm::Twine(index) + "]").str();
}

std::string entryPath(StringRef parent, StringRef name) {
  return (parent + "[\"" + name + "\"]").str();
}

namespace {
// getAsInteger converts a double near 2^63 without a range check of its own, so values that
// far out never reach it; no plan field comes close.
bool inIntegerRange(double number) { return std::fabs(number) < 9.0e18; }
} // namespace

std::string numberText(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", value);
  return buffer;
}

const char *describe(const json::Value &value) {
  switch (value.kind()) {
  case json::Value::Null:
    return "null";
  case json::Value::Boolean:
    return "a boolean";
  case json::Value::Number:
    return inIntegerRange(*value.getAsNumber()) && value.getAsInteger() ? "an integer" : "a number";
  case json::Value::String:
    return "a string";
  case json::Value::Array:
    return "an array";
  case json::Value::Object:
    return "an object";
  }
  return "a value";
}

bool readInt(ReadContext &ctx, const json::Value &value, StringRef path, int64_t &out) {
  std::optional<double> number;
  if (auto n = value.getAsNumber())
    number = *n;
  if (!number)
    return ctx.fail(path, llvm::Twine("expected an integer, got ") + describe(value));
  if (!inIntegerRange(*number))
    return ctx.fail(path, "integer out of range");
  auto integer = value.getAsInteger();
  if (!integer)
    return ctx.fail(path, "expected an integer, got a fractional number");
  out = *integer;
  return true;
}

bool readNumber(ReadContext &ctx, const json::Value &value, StringRef path, double &out) {
  auto number = value.getAsNumber();
  if (!number)
    return ctx.fail(path, llvm::Twine("expected a number, got ") + describe(value));
  out = *number;
  return true;
}

bool readBool(ReadContext &ctx, const json::Value &value, StringRef path, bool &out) {
  auto boolean = value.getAsBoolean();
  if (!boolean)
    return ctx.fail(path, llvm::Twine("expected a boolean, got ") + describe(value));
  out = *boolean;
  return true;
}

bool readString(ReadContext &ctx, const json::Value &value, StringRef path, std::string &out) {
  auto string = value.getAsString();
  if (!string)
    return ctx.fail(path, llvm::Twine("expected a string, got ") + describe(value));
  out = string->str();
  return true;
}

const json::Array *readArray(ReadContext &ctx, const json::Value &value, StringRef path) {
  const json::Array *array = value.getAsArray();
  if (!array)
    ctx.fail(path, llvm::Twine("expected an array, got ") + describe(value));
  return array;
}

ObjectReader::ObjectReader(ReadContext &ctx, const json::Value &value, std::string path)
    : ctx(ctx), objectPath(std::move(path)) {
  if (ctx.failed())
    return;
  object = value.getAsObject();
  if (!object)
    ctx.fail(objectPath, llvm::Twine("expected an object, got ") + describe(value));
}

const json::Value *ObjectReader::get(StringRef key) {
  known.push_back(key.str());
  if (!object || ctx.failed())
    return nullptr;
  const json::Value *value = object->get(key);
  if (!value)
    ctx.fail(pathOf(key), "missing required field");
  return value;
}

bool ObjectReader::read(StringRef key, int64_t &out) {
  const json::Value *value = get(key);
  return value && readInt(ctx, *value, pathOf(key), out);
}

bool ObjectReader::read(StringRef key, double &out) {
  const json::Value *value = get(key);
  return value && readNumber(ctx, *value, pathOf(key), out);
}

bool ObjectReader::read(StringRef key, bool &out) {
  const json::Value *value = get(key);
  return value && readBool(ctx, *value, pathOf(key), out);
}

bool ObjectReader::read(StringRef key, std::string &out) {
  const json::Value *value = get(key);
  return value && readString(ctx, *value, pathOf(key), out);
}

bool ObjectReader::read(StringRef key, std::vector<int64_t> &out) {
  const json::Value *value = get(key);
  const json::Array *array = value ? readArray(ctx, *value, pathOf(key)) : nullptr;
  if (!array)
    return false;
  out.assign(array->size(), 0);
  for (size_t i = 0; i < array->size(); ++i)
    if (!readInt(ctx, (*array)[i], indexPath(pathOf(key), i), out[i]))
      return false;
  return true;
}

bool ObjectReader::read(StringRef key, std::vector<std::string> &out) {
  const json::Value *value = get(key);
  const json::Array *array = value ? readArray(ctx, *value, pathOf(key)) : nullptr;
  if (!array)
    return false;
  out.assign(array->size(), std::string());
  for (size_t i = 0; i < array->size(); ++i)
    if (!readString(ctx, (*array)[i], indexPath(pathOf(key), i), out[i]))
      return false;
  return true;
}

bool ObjectReader::finish() {
  if (!object || ctx.failed())
    return false;
  std::vector<StringRef> unknown;
  for (const auto &entry : *object)
    if (!llvm::is_contained(known, entry.first.str()))
      unknown.push_back(entry.first);
  if (unknown.empty())
    return true;
  // The object's own order is a hash order; sorting makes the reported key reproducible.
  llvm::sort(unknown);
  std::vector<StringRef> candidates(known.begin(), known.end());
  return ctx.fail(pathOf(unknown.front()),
                  "unknown field" + didYouMean(unknown.front(), candidates));
}

} // namespace parc::plan::detail
