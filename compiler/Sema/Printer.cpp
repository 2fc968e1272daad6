//===- Printer.cpp - --emit=ast: the resolved model as stable text --------===//
#include "parc/Sema/Sema.h"

#include "llvm/Support/Path.h"

namespace parc {
namespace {

std::string where(llvm::SMRange range, llvm::SourceMgr &sm) {
  if (!range.Start.isValid())
    return "(default)";
  unsigned id = sm.FindBufferContainingLoc(range.Start);
  auto [line, col] = sm.getLineAndColumn(range.Start, id);
  llvm::StringRef file = llvm::sys::path::filename(sm.getMemoryBuffer(id)->getBufferIdentifier());
  return "@" + file.str() + ":" + std::to_string(line) + ":" + std::to_string(col);
}

void printFields(const ResolvedBlock &block, const std::string &prefix, llvm::SourceMgr &sm,
                 llvm::raw_ostream &os) {
  for (const ResolvedField &f : block.fields)
    os << "  " << prefix << f.name << " = " << f.value.str() << "  " << where(f.range, sm)
       << "\n";
  for (const ResolvedBlock &inner : block.nested)
    printFields(inner, prefix + inner.name + ".", sm, os);
}

} // namespace

void printResolved(const ResolvedModule &module, llvm::SourceMgr &sm, llvm::raw_ostream &os) {
  for (const ResolvedBlock &b : module.blocks) {
    switch (b.kind) {
    case ast::Block::Parallel:
      os << "parallel " << (b.name.empty() ? "" : b.name + " ") << "for " << b.modelRef << " on "
         << b.clusterRef;
      break;
    case ast::Block::Train:
      os << "train";
      break;
    default:
      os << ast::blockKindName(b.kind) << " " << b.name;
    }
    os << "  " << (b.declared ? where(b.headerRange, sm) : "(default)") << "\n";
    printFields(b, "", sm, os);
    for (const LayerGroup &g : b.layers) {
      os << "  layer " << g.name << " : ";
      if (g.kind == LayerGroup::Embedding)
        os << "embedding";
      else if (g.kind == LayerGroup::LMHead)
        os << "lm_head" << (g.tiedTo.empty() ? "" : " tied(" + g.tiedTo + ")");
      else
        os << "transformer x " << g.count << " (heads = " << g.heads
           << ", kv_heads = " << g.kvHeads << ", ffn = " << g.ffn
           << ", mlp = " << toString(g.mlp) << g.moe.fieldsText() << ")";
      os << "  " << where(g.range, sm) << "\n";
    }
  }
}

} // namespace parc
