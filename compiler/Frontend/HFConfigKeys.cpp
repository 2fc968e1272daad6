//===- HFConfigKeys.cpp - Reading a config.json key by key ----------------===//
#include "HFConfigInternal.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace parc::hf {

namespace {
/// Where each key of the top-level object starts in the text: llvm::json keeps no locations.
llvm::StringMap<const char *> locateTopLevelKeys(llvm::StringRef text) {
  llvm::StringMap<const char *> keys;
  int depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == '"') {
      size_t start = i;
      for (++i; i < text.size() && text[i] != '"'; ++i)
        if (text[i] == '\\')
          ++i;
      size_t next = text.find_first_not_of(" \t\r\n", i + 1);
      if (depth == 1 && next != llvm::StringRef::npos && text[next] == ':')
        keys.try_emplace(text.slice(start + 1, std::min(i, text.size())), text.data() + start);
    }
  }
  return keys;
}

} // namespace

std::string formatNumber(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    return std::to_string(int64_t(v));
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.15g", v);
  std::string s = buffer;
  s.erase(std::remove(s.begin(), s.end(), '+'), s.end());
  return s;
}

Config::Config(const llvm::json::Object &object, llvm::StringRef text, DiagnosticEngine &diags)
    : object(object), text(text), keys(locateTopLevelKeys(text)), diags(diags) {}

llvm::SMLoc Config::at(llvm::StringRef key) const {
  auto it = keys.find(key);
  return llvm::SMLoc::getFromPointer(it == keys.end() ? text.data() : it->second);
}

void Config::error(llvm::StringRef key, const llvm::Twine &message) {
  diags.error(at(key), message);
  failed = true;
}

void Config::warning(llvm::StringRef key, const llvm::Twine &message) {
  diags.warning(at(key), message);
}

const llvm::json::Value *Config::get(llvm::StringRef key) {
  read.insert(key);
  const llvm::json::Value *v = object.get(key);
  return v && v->kind() != llvm::json::Value::Null ? v : nullptr;
}

void Config::accept(std::initializer_list<llvm::StringRef> names) {
  for (llvm::StringRef name : names)
    read.insert(name);
}

std::optional<int64_t> Config::count(llvm::StringRef key) {
  const llvm::json::Value *v = get(key);
  if (!v)
    return std::nullopt;
  auto n = v->getAsInteger();
  if (!n || *n < 1) {
    error(key, "'" + key + "' must be a positive integer");
    return std::nullopt;
  }
  return *n;
}

int64_t Config::required(llvm::StringRef key) {
  if (!object.get(key) && !failed)
    error(key, "the config has no '" + key + "'; parc needs it to build the model");
  return count(key).value_or(0);
}

std::optional<double> Config::number(llvm::StringRef key) {
  const llvm::json::Value *v = get(key);
  if (!v)
    return std::nullopt;
  auto n = v->getAsNumber();
  if (!n || *n < 0) {
    error(key, "'" + key + "' must be a non-negative number");
    return std::nullopt;
  }
  return *n;
}

std::optional<bool> Config::flag(llvm::StringRef key) {
  const llvm::json::Value *v = get(key);
  if (!v)
    return std::nullopt;
  auto b = v->getAsBoolean();
  if (!b) {
    error(key, "'" + key + "' must be true or false");
    return std::nullopt;
  }
  return *b;
}

std::optional<std::string> Config::word(llvm::StringRef key) {
  const llvm::json::Value *v = get(key);
  if (!v)
    return std::nullopt;
  auto s = v->getAsString();
  if (!s) {
    error(key, "'" + key + "' must be a string");
    return std::nullopt;
  }
  return s->str();
}

const llvm::json::Object *Config::objectAt(llvm::StringRef key) {
  const llvm::json::Value *v = get(key);
  const llvm::json::Object *o = v ? v->getAsObject() : nullptr;
  if (v && !o)
    error(key, "'" + key + "' must be an object");
  return o;
}

void Config::warnUnread(llvm::StringRef architecture) {
  std::vector<llvm::StringRef> unread;
  for (const auto &entry : object)
    if (!read.count(llvm::StringRef(entry.first)))
      unread.push_back(entry.first);
  std::sort(unread.begin(), unread.end(),
            [&](llvm::StringRef a, llvm::StringRef b) { return at(a).getPointer() < at(b).getPointer(); });
  for (llvm::StringRef key : unread)
    warning(key, "'" + key + "' is not a key parc's importer knows for " + architecture +
                     "; it is ignored, and the model differs if it changes the parameters or "
                     "the math");
}

} // namespace parc::hf

namespace parc {
namespace {
using hf::formatNumber;
/// `text` as comment lines of at most 96 columns, broken at spaces.
void printComment(llvm::raw_ostream &os, llvm::StringRef text) {
  while (!text.empty()) {
    size_t cut = text.size() <= 94 ? text.size() : text.rfind(' ', 94);
    if (cut == llvm::StringRef::npos || cut == 0)
      cut = std::min<size_t>(text.size(), 94);
    os << "# " << text.take_front(cut).rtrim() << "\n";
    text = text.drop_front(cut).ltrim();
  }
}
} // namespace

std::string printModelBlock(const ImportedModel &model, llvm::ArrayRef<std::string> header) {
  std::string out;
  llvm::raw_string_ostream os(out);
  os << "# Imported by parc --import-hf from " << model.source << " (" << model.architecture
     << ").\n";
  for (const std::string &line : header)
    os << "# " << line << "\n";
  for (const std::string &note : model.notes)
    printComment(os, "Note: " + note);
  os << "model " << model.name << " {\n";
  size_t width = 0;
  for (const ImportedField &f : model.fields)
    width = std::max(width, f.name.size());
  for (const ImportedField &f : model.fields) {
    std::string line = "  " + f.name + std::string(width - f.name.size(), ' ') + " = " + f.value;
    os << line;
    if (!f.from.empty())
      os << std::string(std::max<size_t>(34, line.size() + 1) - line.size(), ' ') << "# "
         << f.from;
    os << "\n";
  }
  os << "\n  layer embed : embedding\n";
  os << "  layer block : transformer x " << model.layers << "    # " << model.layersFrom << "\n";
  os << "  layer head  : lm_head" << (model.tied ? " tied(embed)" : "") << "    # "
     << model.tiedFrom << "\n";
  os << "}\n";
  return os.str();
}


} // namespace parc
