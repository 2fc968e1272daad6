//===- Parser.cpp - Files, includes and the guards in front of ANTLR ------===//
//
// ANTLR's generated parser recurses once per nesting level and its left-recursive expression
// rule once per operator, so hostile input (100 000 '(' or a megabyte of `1+1+...`) would
// overflow the stack. The token stream is checked for both before the parser sees it.
//
//===----------------------------------------------------------------------===//
#include "parc/Frontend/Parser.h"
#include "FrontendInternal.h"
#include "parc/Support/FileInput.h"
#include "parc/Support/Limits.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/ConvertUTF.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

namespace parc {
namespace {

using grammar::ParLexer;
using grammar::ParParser;

constexpr unsigned kMaxNesting = 256;
constexpr unsigned kMaxStatementTokens = 4096;

class ModuleReader {
public:
  explicit ModuleReader(DiagnosticEngine &diags) : diags(diags) {}

  /// Parses buffer `bufferId` of the SourceMgr (already added) and its includes into `out`.
  void parseBufferId(unsigned bufferId, ast::Module &out);
  void include(llvm::StringRef path, llvm::SMRange where, unsigned fromBuffer, ast::Module &out);

  llvm::StringSet<> includedFiles; // real paths, for cycles and include-once
  std::vector<std::string> includeStack;

private:
  bool validUTF8(llvm::StringRef text);
  bool withinLimits(antlr4::CommonTokenStream &tokens, const frontend::SourceText &source);

  DiagnosticEngine &diags;
};

bool ModuleReader::validUTF8(llvm::StringRef text) {
  const llvm::UTF8 *begin = reinterpret_cast<const llvm::UTF8 *>(text.begin());
  const llvm::UTF8 *bad = begin;
  if (llvm::isLegalUTF8String(&bad, reinterpret_cast<const llvm::UTF8 *>(text.end())))
    return true;
  size_t offset = bad - begin;
  diags.error(llvm::SMLoc::getFromPointer(text.data() + offset),
              "invalid UTF-8 (byte 0x" +
                  llvm::utohexstr((unsigned char)text[offset], false, 2) +
                  "); .par files must be UTF-8 text");
  return false;
}

bool ModuleReader::withinLimits(antlr4::CommonTokenStream &tokens,
                                const frontend::SourceText &source) {
  unsigned statementTokens = 0;
  // Open brackets, and for each bracket level the signs (`- - 1`) still waiting for their
  // operand: the parser recurses once for each.
  std::vector<unsigned> signsAtLevel(1, 0);
  unsigned openSigns = 0;
  bool afterOperand = false;
  for (antlr4::Token *t : tokens.getTokens()) {
    std::string text = t->getText();
    size_t type = t->getType();
    if (type == ParLexer::NEWLINE || text == ";" || text == "{" || text == "}")
      statementTokens = 0;
    else if (++statementTokens > kMaxStatementTokens) {
      diags.error(source.rangeOf(t), "statement is too long (more than " +
                                         llvm::Twine(kMaxStatementTokens) + " tokens)");
      return false;
    }
    bool open = text == "(" || text == "[" || text == "{";
    bool close = text == ")" || text == "]" || text == "}";
    // Names include the soft keywords (`x`, `1f1b`), which are tokens of their own.
    bool operand = type == ParLexer::NUMBER || type == ParLexer::STRING || close ||
                   (type != ParLexer::NEWLINE && !text.empty() && llvm::isAlnum(text[0]));
    if ((text == "-" || text == "+") && !afterOperand) {
      ++signsAtLevel.back();
      ++openSigns;
    } else if (open) {
      signsAtLevel.push_back(0);
    } else if (close && signsAtLevel.size() > 1) {
      openSigns -= signsAtLevel.back();
      signsAtLevel.pop_back();
    }
    if (operand) {
      openSigns -= signsAtLevel.back();
      signsAtLevel.back() = 0;
    }
    afterOperand = operand || type == ParLexer::RATE_UNIT;
    if (signsAtLevel.size() - 1 + openSigns > kMaxNesting) {
      diags.error(source.rangeOf(t), "nesting is too deep (more than " + llvm::Twine(kMaxNesting) +
                                         " levels of brackets, braces and signs)");
      return false;
    }
  }
  return true;
}

void ModuleReader::parseBufferId(unsigned bufferId, ast::Module &out) {
  const llvm::MemoryBuffer *buffer = diags.getSourceMgr().getMemoryBuffer(bufferId);
  llvm::StringRef text = buffer->getBuffer();
  if (!validUTF8(text))
    return;

  frontend::SourceText source(text);
  frontend::SyntaxErrorLog log;
  antlr4::ANTLRInputStream input(text.str());
  frontend::ReportingLexer lexer(&input, source, diags, log);
  lexer.removeErrorListeners();
  antlr4::CommonTokenStream tokens(&lexer);
  tokens.fill();
  if (!withinLimits(tokens, source))
    return;

  ParParser parser(&tokens);
  parser.removeErrorListeners();
  parser.setErrorHandler(std::make_shared<frontend::HumanErrorStrategy>(source, diags, log));
  ParParser::FileContext *tree = nullptr;
  // The lexer or the parser reached the error limit: the file is read no further, its
  // includes not at all (the parser owns the contexts it made).
  if (!diags.reachedErrorLimit()) {
    try {
      tree = parser.file();
    } catch (const antlr4::ParseCancellationException &) {
    }
  }
  if (!tree) {
    diags.announceErrorLimit();
    return;
  }

  frontend::IncludeHandler onInclude = [&](llvm::StringRef path, llvm::SMRange where,
                                           ast::Module &into) {
    include(path, where, bufferId, into);
  };
  frontend::buildAST(tree, source, diags, log, onInclude, out);
}

void ModuleReader::include(llvm::StringRef path, llvm::SMRange where, unsigned fromBuffer,
                           ast::Module &out) {
  if (diags.reachedErrorLimit())
    return;
  llvm::SourceMgr &sm = diags.getSourceMgr();
  llvm::SmallString<256> resolved(path);
  if (!llvm::sys::path::is_absolute(resolved)) {
    llvm::StringRef including = sm.getMemoryBuffer(fromBuffer)->getBufferIdentifier();
    resolved = llvm::sys::path::parent_path(including);
    llvm::sys::path::append(resolved, path);
  }
  if (path.empty()) {
    diags.error(where, "'include' needs a file name");
    return;
  }
  if (llvm::sys::fs::is_directory(resolved)) {
    diags.ioError(where.Start, "cannot include '" + path + "': it is a directory");
    return;
  }
  auto file = readRegularFile(resolved, limits::MaxInputFileBytes);
  if (!file) {
    diags.ioError(where.Start, "cannot open included file '" + path +
                                   "': " + llvm::toString(file.takeError()));
    return;
  }
  llvm::SmallString<256> real;
  if (llvm::sys::fs::real_path(resolved, real))
    real = resolved;
  if (llvm::is_contained(includeStack, std::string(real))) {
    diags.error(where, "include cycle: '" + path + "' is already being read");
    return;
  }
  if (int64_t(includeStack.size()) >= limits::MaxIncludeDepth) {
    diags.error(where, "includes are nested too deeply (more than " +
                           llvm::Twine(limits::MaxIncludeDepth) + " files)");
    return;
  }
  // Include-once: a cluster shared by two included files is defined a single time.
  if (includedFiles.count(real))
    return;
  if (int64_t(includedFiles.size()) >= limits::MaxInputFiles) {
    diags.error(where, "this compilation reads more than " + llvm::Twine(limits::MaxInputFiles) +
                           " files");
    return;
  }
  includedFiles.insert(real);
  unsigned id = sm.AddNewSourceBuffer(std::move(*file), where.Start);
  includeStack.push_back(std::string(real));
  parseBufferId(id, out);
  includeStack.pop_back();
}

ast::Module readModule(unsigned mainBuffer, DiagnosticEngine &diags) {
  ModuleReader reader(diags);
  llvm::StringRef name = diags.getSourceMgr().getMemoryBuffer(mainBuffer)->getBufferIdentifier();
  llvm::SmallString<256> real;
  if (!llvm::sys::fs::real_path(name, real)) {
    reader.includedFiles.insert(real);
    reader.includeStack.push_back(std::string(real));
  }
  ast::Module module;
  reader.parseBufferId(mainBuffer, module);
  llvm::StringRef text = diags.getSourceMgr().getMemoryBuffer(mainBuffer)->getBuffer();
  module.endLoc = llvm::SMLoc::getFromPointer(text.end());
  return module;
}

} // namespace

const char *ast::blockKindName(Block::Kind kind) {
  switch (kind) {
  case Block::Model:
    return "model";
  case Block::Cluster:
    return "cluster";
  case Block::Parallel:
    return "parallel";
  case Block::Train:
    return "train";
  case Block::Nested:
    return "block";
  }
  return "block";
}

std::optional<ast::Module> parseFile(llvm::StringRef path, DiagnosticEngine &diags) {
  auto file = readRegularFile(path, limits::MaxInputFileBytes);
  if (!file) {
    diags.ioError(llvm::SMLoc(), "cannot open '" + path + "': " + llvm::toString(file.takeError()));
    return std::nullopt;
  }
  unsigned id = diags.getSourceMgr().AddNewSourceBuffer(std::move(*file), llvm::SMLoc());
  return readModule(id, diags);
}

ast::Module parseBuffer(llvm::StringRef text, llvm::StringRef name, DiagnosticEngine &diags) {
  unsigned id = diags.getSourceMgr().AddNewSourceBuffer(
      llvm::MemoryBuffer::getMemBufferCopy(text, name), llvm::SMLoc());
  return readModule(id, diags);
}

} // namespace parc
