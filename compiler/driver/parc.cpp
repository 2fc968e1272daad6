//===- parc.cpp - The parc compiler driver --------------------------------===//
//
// parse -> analyze -> (check -> lower -> emit). Thin on purpose: each stage lives in its
// library; this file only wires options to them and turns the outcome into an exit code.
//
//===----------------------------------------------------------------------===//
#include "parc/Frontend/Parser.h"
#include "parc/Sema/Sema.h"
#include "parc/Support/Units.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/WithColor.h"

using namespace parc;
namespace cl = llvm::cl;

namespace {

cl::OptionCategory parcCategory("parc options");

cl::opt<std::string> inputFile(cl::Positional, cl::desc("<file.par>"), cl::Required,
                               cl::cat(parcCategory));
cl::opt<std::string> outputPath("o", cl::desc("Output directory (plans) or file"),
                                cl::value_desc("path"), cl::cat(parcCategory));

enum class EmitKind { Summary, AST };
cl::opt<EmitKind> emitKind(
    "emit", cl::desc("What to produce"), cl::init(EmitKind::Summary),
    cl::values(clEnumValN(EmitKind::Summary, "summary", "a short summary (default)"),
               clEnumValN(EmitKind::AST, "ast", "the resolved semantic model as text")),
    cl::cat(parcCategory));
cl::opt<bool> checkOnly("check", cl::desc("Only diagnose; print nothing on success"),
                        cl::cat(parcCategory));
cl::opt<bool> warningsAsErrors("Werror", cl::desc("Treat warnings as errors"),
                               cl::cat(parcCategory));

void printVersion(llvm::raw_ostream &os) { os << "parc 0.1.0 (plan format parc-plan/1)\n"; }

void printSummary(const Program &p, llvm::raw_ostream &os) {
  const ModelSpec &m = p.model;
  const ClusterSpec &c = p.cluster;
  const ParallelSpec &par = p.parallel;
  os << "model    " << m.name << ": " << m.numBlocks() << " transformer blocks, hidden "
     << m.hidden << ", heads " << m.heads << " (kv " << m.kvHeads << "), ffn " << m.ffn
     << ", vocab " << m.vocab << ", seq " << m.seq << ", " << toString(m.dtype) << "\n";
  os << "cluster  " << c.name << ": " << c.nodes << " x " << c.gpusPerNode << " GPUs ("
     << c.world() << "), " << formatBytes(double(c.gpuMemory)) << " and "
     << formatQuantity(c.gpuFlops, Dimension::flopRate()) << " each\n";
  os << "mapping  tp " << par.tp << ", pp " << par.pp << ", dp "
     << (par.dpAuto ? std::string("auto") : std::to_string(par.dp)) << ", order "
     << toString(par.order[0]) << "-" << toString(par.order[1]) << "-" << toString(par.order[2])
     << ", schedule " << toString(par.schedule);
  if (par.schedule == ScheduleKind::Interleaved)
    os << "(chunks = " << par.chunks << ")";
  os << ", zero " << par.zero << ", recompute " << toString(par.recompute)
     << (par.sequenceParallel ? ", sequence parallel" : "") << "\n";
}

} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  cl::HideUnrelatedOptions(parcCategory);
  cl::SetVersionPrinter(printVersion);
  if (!cl::ParseCommandLineOptions(argc, argv, "parc: plan 3D-parallel transformer training\n",
                                   &llvm::errs()))
    return ExitUsageOrIO;

  llvm::SourceMgr sourceMgr;
  DiagnosticEngine diags(sourceMgr, llvm::errs());
  diags.setWarningsAsErrors(warningsAsErrors);

  auto module = parseFile(inputFile, diags);
  if (!module)
    return diags.exitCode();
  ResolvedModule resolved;
  auto program = analyze(*module, diags, &resolved);
  if (emitKind == EmitKind::AST && !diags.hasErrors()) {
    printResolved(resolved, sourceMgr, llvm::outs());
    return diags.exitCode();
  }
  if (!program || diags.hasErrors())
    return diags.exitCode() ? diags.exitCode() : ExitInputError;
  if (!checkOnly)
    printSummary(*program, llvm::outs());
  return diags.exitCode();
}
