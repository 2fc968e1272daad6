//===- Parser.cpp - Files, includes and the guards in front of ANTLR ------===//
//
// ANTLR's generated parser recurses once per nesting level and its left-recursive expression
// rule once per operator, so hostile input (100 000 '(' or a megabyte of `1+1+...`) would
// overflow the stack. The token stream is checked for both before the parser sees it.
//
//===----------------------------------------------------------------------===//
#include "parc/Frontend/Parser.h"
#include "FrontendInternal.h"

#include "llvm/ADT/SmallString.h"
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
constexpr unsigned kMaxIncludeDepth = 32;

class ModuleReader {
public:
  explicit ModuleReader(DiagnosticEngine &diags) : diags(diags) {}

  /// Parses buffer `bufferId` of the SourceMgr (already added) and its includes.
  std::vector<std::unique_ptr<ast::Block>> parseBufferId(unsigned bufferId);
  std::vector<std::unique_ptr<ast::Block>> include(llvm::StringRef path, llvm::SMRange where,
                                                   unsigned fromBuffer);

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
  unsigned depth = 0, statementTokens = 0;
  for (antlr4::Token *t : tokens.getTokens()) {
    std::string text = t->getText();
    if (t->getType() == ParLexer::NEWLINE || text == ";" || text == "{" || text == "}")
      statementTokens = 0;
    else if (++statementTokens > kMaxStatementTokens) {
      diags.error(source.rangeOf(t), "statement is too long (more than " +
                                         llvm::Twine(kMaxStatementTokens) + " tokens)");
      return false;
    }
    if (text == "(" || text == "[" || text == "{") {
      if (++depth > kMaxNesting) {
        diags.error(source.rangeOf(t), "nesting is too deep (more than " +
                                           llvm::Twine(kMaxNesting) +
                                           " levels of brackets and braces)");
        return false;
      }
    } else if ((text == ")" || text == "]" || text == "}") && depth > 0) {
      --depth;
    }
  }
  return true;
}

std::vector<std::unique_ptr<ast::Block>> ModuleReader::parseBufferId(unsigned bufferId) {
  const llvm::MemoryBuffer *buffer = diags.getSourceMgr().getMemoryBuffer(bufferId);
  llvm::StringRef text = buffer->getBuffer();
  if (!validUTF8(text))
    return {};

  frontend::SourceText source(text);
  antlr4::ANTLRInputStream input(text.str());
  frontend::ReportingLexer lexer(&input, source, diags);
  lexer.removeErrorListeners();
  antlr4::CommonTokenStream tokens(&lexer);
  tokens.fill();
  if (!withinLimits(tokens, source))
    return {};

  ParParser parser(&tokens);
  parser.removeErrorListeners();
  parser.setErrorHandler(std::make_shared<frontend::HumanErrorStrategy>(source, diags));
  ParParser::FileContext *tree = parser.file();

  frontend::IncludeHandler onInclude = [&](llvm::StringRef path, llvm::SMRange where) {
    return include(path, where, bufferId);
  };
  return frontend::buildAST(tree, source, diags, onInclude);
}

std::vector<std::unique_ptr<ast::Block>>
ModuleReader::include(llvm::StringRef path, llvm::SMRange where, unsigned fromBuffer) {
  llvm::SourceMgr &sm = diags.getSourceMgr();
  llvm::SmallString<256> resolved(path);
  if (!llvm::sys::path::is_absolute(resolved)) {
    llvm::StringRef including = sm.getMemoryBuffer(fromBuffer)->getBufferIdentifier();
    resolved = llvm::sys::path::parent_path(including);
    llvm::sys::path::append(resolved, path);
  }
  auto file = llvm::MemoryBuffer::getFile(resolved, /*IsText=*/true);
  if (!file) {
    diags.ioError(where.Start, "cannot open included file '" + path +
                                   "': " + file.getError().message());
    return {};
  }
  llvm::SmallString<256> real;
  if (llvm::sys::fs::real_path(resolved, real))
    real = resolved;
  if (llvm::is_contained(includeStack, std::string(real))) {
    diags.error(where, "include cycle: '" + path + "' is already being read");
    return {};
  }
  if (includeStack.size() >= kMaxIncludeDepth) {
    diags.error(where, "includes are nested too deeply (more than " +
                           llvm::Twine(kMaxIncludeDepth) + " files)");
    return {};
  }
  // Include-once: a cluster shared by two included files is defined a single time.
  if (!includedFiles.insert(real).second)
    return {};
  unsigned id = sm.AddNewSourceBuffer(std::move(*file), where.Start);
  includeStack.push_back(std::string(real));
  auto blocks = parseBufferId(id);
  includeStack.pop_back();
  return blocks;
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
  module.blocks = reader.parseBufferId(mainBuffer);
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
  auto file = llvm::MemoryBuffer::getFile(path, /*IsText=*/true);
  if (!file) {
    diags.ioError(llvm::SMLoc(), "cannot open '" + path + "': " + file.getError().message());
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
