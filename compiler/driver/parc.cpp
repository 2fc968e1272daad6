//===- parc.cpp - The parc compiler driver --------------------------------===//
//
// parse -> analyze -> (check -> lower -> emit). Thin on purpose: each stage lives in its
// library; this file only wires options to them and turns the outcome into an exit code.
//
//===----------------------------------------------------------------------===//
#include "parc/Check/LayoutPrinter.h"
#include "parc/Check/Mapping.h"
#include "parc/Cost/MemoryModel.h"
#include "parc/Cost/Report.h"
#include "parc/Emit/ParWriter.h"
#include "parc/Emit/PipelineSVG.h"
#include "parc/Emit/PlanDirectory.h"
#include "parc/Plan/PlanStream.h"
#include "parc/Cost/StepTimeline.h"
#include "parc/Emit/Trace.h"
#include "parc/Frontend/Parser.h"
#include "parc/Interop/Export.h"
#include "parc/Interop/HFImport.h"
#include "parc/Lower/Lowering.h"
#include "parc/Lower/PlanText.h"
#include "parc/Plan/PlanJSON.h"
#include "parc/Search/SearchReport.h"
#include "parc/Sema/Sema.h"
#include "parc/Support/FileOutput.h"
#include "parc/Support/Limits.h"
#include "parc/Support/Units.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/WithColor.h"

#include <chrono>
#include <csignal>

using namespace parc;
namespace cl = llvm::cl;

namespace {

cl::OptionCategory parcCategory("parc options");

cl::opt<std::string> inputFile(cl::Positional, cl::desc("<file.par>"), cl::cat(parcCategory));
cl::opt<std::string> importHF(
    "import-hf",
    cl::desc("Write the model of a Hugging Face config.json as a .par model block (to -o FILE, "
             "or stdout) instead of planning a .par file"),
    cl::value_desc("config.json"), cl::cat(parcCategory));
cl::opt<std::string> outputPath(
    "o",
    cl::desc("Write every rank's plan and manifest.json to this directory, replacing a previous "
             "plan directory atomically; with --emit=trace, svg, megatron or deepspeed, or "
             "--import-hf, the file to write"),
    cl::value_desc("path"), cl::cat(parcCategory));

enum class EmitKind { Summary, AST, Layout, Trace, SVG, PlanText, Par, Megatron, DeepSpeed };
cl::opt<EmitKind> emitKind(
    "emit", cl::desc("What to produce"), cl::init(EmitKind::Summary),
    cl::values(clEnumValN(EmitKind::Summary, "summary", "a short summary (default)"),
               clEnumValN(EmitKind::AST, "ast", "the resolved semantic model as text"),
               clEnumValN(EmitKind::Layout, "layout",
                          "every rank's node, coordinates and process groups"),
               clEnumValN(EmitKind::Trace, "trace",
                          "the simulated pipeline step as a Chrome trace / Perfetto JSON "
                          "(to -o FILE.json, or stdout)"),
               clEnumValN(EmitKind::SVG, "svg",
                          "the pipeline diagram of the simulated step (to -o FILE.svg, or "
                          "stdout)"),
               clEnumValN(EmitKind::PlanText, "plan-text",
                          "with --rank=R: a readable listing of that rank's plan"),
               clEnumValN(EmitKind::Par, "par",
                          "with --search: the program with the best mapping written out"),
               clEnumValN(EmitKind::Megatron, "megatron",
                          "a bash script that launches Megatron-LM's pretrain_gpt.py with "
                          "torchrun for this job (to -o FILE, or stdout)"),
               clEnumValN(EmitKind::DeepSpeed, "deepspeed",
                          "the DeepSpeed config JSON for this job, with the Megatron-DeepSpeed "
                          "arguments in its comment (to -o FILE, or stdout)")),
    cl::cat(parcCategory));
cl::opt<int64_t> rankToPrint("rank",
                             cl::desc("Print the JSON plan of rank R to stdout, lowering only "
                                      "that rank"),
                             cl::value_desc("R"), cl::init(-1), cl::cat(parcCategory));
cl::opt<bool> checkOnly("check", cl::desc("Only diagnose; print nothing on success"),
                        cl::cat(parcCategory));
cl::opt<bool> warningsAsErrors("Werror", cl::desc("Treat warnings as errors"),
                               cl::cat(parcCategory));
enum class ReportKind { None, Text, JSON };
cl::opt<ReportKind> reportKind(
    "report", cl::desc("After the diagnostics, print memory, FLOPs and traffic estimates"),
    cl::init(ReportKind::None), cl::ValueOptional,
    cl::values(clEnumValN(ReportKind::Text, "", "as text tables (--report)"),
               clEnumValN(ReportKind::Text, "text", "as text tables"),
               clEnumValN(ReportKind::JSON, "json", "as one JSON object")),
    cl::cat(parcCategory));

cl::opt<bool> searchMode("search",
                         cl::desc("Rank the mappings the parallel block's auto fields allow"),
                         cl::cat(parcCategory));
cl::opt<unsigned> topCount("top", cl::desc("With --search: how many mappings to list"),
                           cl::init(10), cl::value_desc("K"), cl::cat(parcCategory));
cl::opt<std::string> mappingName(
    "mapping", cl::desc("The parallel block to use when the file names several"),
    cl::value_desc("NAME"), cl::cat(parcCategory));

void printVersion(llvm::raw_ostream &os) { os << "parc 0.1.0 (plan format parc-plan/1)\n"; }

void printSummary(const Program &p, const Mapping &mapping, llvm::raw_ostream &os) {
  const ModelSpec &m = p.model;
  const ClusterSpec &c = p.cluster;
  const ParallelSpec &par = p.parallel;
  os << "model    " << m.name << ": " << m.numBlocks() << " transformer blocks, hidden "
     << m.hidden << ", heads " << m.heads << " (kv " << m.kvHeads << "), ffn " << m.ffn
     << ", vocab " << m.vocab << ", seq " << m.seq << ", " << toString(m.dtype) << "\n";
  os << "cluster  " << c.name << ": " << c.nodes << " x " << c.gpusPerNode << " GPUs ("
     << c.world() << "), " << formatBytes(double(c.gpuMemory)) << " and "
     << formatQuantity(c.gpuFlops, Dimension::flopRate()) << " each\n";
  os << "mapping  tp " << par.tp << ", pp " << par.pp << ", dp " << mapping.dp
     << (par.dpAuto ? " (auto)" : "") << (par.cp > 1 ? ", cp " + std::to_string(par.cp) : "")
     << ", order " << par.orderText() << ", schedule " << par.scheduleText();
  os << ", zero " << par.zero << ", recompute " << toString(par.recompute)
     << (par.sequenceParallel ? ", sequence parallel" : "") << "\n";
  os << "batch    global " << mapping.globalBatch << " = " << mapping.microbatches
     << " microbatches (M) x micro_batch " << mapping.microBatch << " x dp " << mapping.dp
     << ", pipeline bubble "
     << llvm::format("%.1f%%", 100 * bubbleFraction(mapping, par.schedule)) << "\n";
}

/// `-o DIR`: every rank's plan and the manifest, written atomically. A refused DIR fails
/// before the lowering spends any time. Returns the plan id, or nothing after an error.
std::optional<std::string> writePlans(const Program &program, const Mapping &mapping,
                                      DiagnosticEngine &diags) {
  if (llvm::Error error = checkPlanDirectoryTarget(outputPath)) {
    diags.ioError(llvm::SMLoc(), llvm::toString(std::move(error)));
    return std::nullopt;
  }
  llvm::Expected<std::vector<plan::RankPlan>> plans = lowerAllRanks(program, mapping);
  if (!plans) {
    diags.error(llvm::SMLoc(), llvm::toString(plans.takeError()));
    return std::nullopt;
  }
  plan::Manifest manifest = buildManifest(program, mapping, plans->front().planId);
  if (llvm::Error error = writePlanDirectory(outputPath, manifest, *plans)) {
    diags.ioError(llvm::SMLoc(), llvm::toString(std::move(error)));
    return std::nullopt;
  }
  return manifest.planId;
}

/// `--rank=R`, as JSON or (`--emit=plan-text`) as a listing. The plan id names the job, so
/// one rank's plan carries the id of the whole set without lowering the other ranks.
int printRankPlan(const Program &program, const Mapping &mapping) {
  int64_t world = mapping.layout.world();
  if (!rankToPrint.getNumOccurrences() || rankToPrint < 0 || rankToPrint >= world) {
    llvm::WithColor::error(llvm::errs(), "parc")
        << (!rankToPrint.getNumOccurrences()
                ? "--emit=plan-text lists one rank's plan; choose it with --rank=R"
                : "--rank=" + std::to_string(rankToPrint) +
                      " is not a rank of this job; use 0 to " + std::to_string(world - 1))
        << "\n";
    return ExitUsageOrIO;
  }
  plan::RankPlan plan =
      lowerRank(program, mapping, rankToPrint, computeJobPlanId(program, mapping));
  if (llvm::Error error = plan::verifyRankPlan(plan)) {
    llvm::WithColor::error(llvm::errs(), "parc")
        << "internal error: the plan of rank " << rankToPrint
        << " fails verification: " << llvm::toString(std::move(error)) << "\n";
    return ExitInputError;
  }
  if (emitKind == EmitKind::PlanText)
    printPlanText(plan, llvm::outs());
  else
    streamRankPlan(llvm::outs(), plan, JSONLayout::Pretty);
  return ExitSuccess;
}

/// Text to -o FILE (atomically) or stdout.
int writeOutput(const std::string &text, DiagnosticEngine &diags) {
  if (outputPath.empty() || outputPath == "-") {
    llvm::outs() << text;
    return diags.exitCode();
  }
  if (llvm::Error error =
          writeFileAtomically(outputPath, [&](llvm::raw_ostream &os) { os << text; }))
    diags.ioError(llvm::SMLoc(), llvm::toString(std::move(error)));
  return diags.exitCode();
}

/// `--import-hf=config.json`: the model block, to -o FILE or stdout; the usage error when
/// there is neither a config nor a .par file, or both.
int importModel(DiagnosticEngine &diags) {
  if (importHF.getNumOccurrences() == inputFile.getNumOccurrences()) {
    llvm::WithColor::error(llvm::errs(), "parc")
        << (inputFile.empty() ? "no input: give a .par file, or --import-hf=config.json"
                              : "give either a .par file or --import-hf=config.json, not both")
        << "\n";
    return ExitUsageOrIO;
  }
  std::optional<std::string> block = importHFModel(importHF, diags);
  return block ? writeOutput(*block, diags) : diags.exitCode();
}

/// `--emit=megatron` and `--emit=deepspeed`: the launch file, to -o FILE or stdout.
int exportJob(const Program &program, const Mapping &mapping, DiagnosticEngine &diags) {
  bool toStdout = outputPath.empty() || outputPath == "-";
  std::optional<std::string> text =
      emitKind == EmitKind::Megatron
          ? exportMegatron(program, mapping, llvm::sys::path::filename(inputFile), diags)
          : exportDeepSpeed(program, mapping, toStdout ? "ds_config.json" : outputPath.getValue(),
                            diags);
  return text ? writeOutput(*text, diags) : diags.exitCode();
}

/// `--emit=trace` and `--emit=svg`: the simulated step, to -o FILE or stdout.
int emitStep(const Program &program, const Mapping &mapping, DiagnosticEngine &diags) {
  // Each factor is bounded by the limits the checks enforced, so the product fits 64 bits.
  int64_t passes = 2 * mapping.pp * mapping.chunks * mapping.microbatches;
  if (passes > limits::MaxTimelinePasses) {
    diags.error(program.rangeOf("parallel.global_batch", program.parallel.headerRange),
                "--emit=" + std::string(emitKind == EmitKind::Trace ? "trace" : "svg") +
                    " draws every forward and backward pass of the step, here 2 x pp x chunks x "
                    "M = " +
                    llvm::Twine(passes) + ", more than the limit of " +
                    llvm::Twine(limits::MaxTimelinePasses));
    return diags.exitCode();
  }
  llvm::Expected<StepTimeline> timeline = simulateStep(program, mapping);
  if (!timeline) {
    diags.error(llvm::SMLoc(), llvm::toString(timeline.takeError()));
    return diags.exitCode();
  }
  auto write = [&](llvm::raw_ostream &os) {
    if (emitKind == EmitKind::Trace)
      writeTrace(*timeline, program, mapping, os);
    else
      writePipelineSVG(*timeline, program, mapping, os);
  };
  if (outputPath.empty() || outputPath == "-") {
    write(llvm::outs());
    return diags.exitCode();
  }
  if (llvm::Error error = writeFileAtomically(outputPath, write))
    diags.ioError(llvm::SMLoc(), llvm::toString(std::move(error)));
  return diags.exitCode();
}

/// Runs the search, with a progress line on a terminal once it has run for a second; a space
/// beyond the search's work limit is an error on the parallel block.
std::optional<SearchResult> runSearch(const Program &program, DiagnosticEngine &diags) {
  SearchOptions options;
  options.top = std::max(1u, unsigned(topCount));
  auto start = std::chrono::steady_clock::now();
  bool shown = false;
  if (llvm::errs().is_displayed())
    options.progress = [&](double done) {
      if (std::chrono::steady_clock::now() - start < std::chrono::seconds(1))
        return;
      llvm::errs() << llvm::format("\rparc: searching %3.0f%%", 100 * done);
      llvm::errs().flush();
      shown = true;
    };
  SearchResult result = searchMappings(program, options);
  if (shown)
    llvm::errs() << "\r                      \r";
  if (result.overBudget) {
    diags.error(program.parallel.headerRange,
                "the auto fields (" + llvm::join(program.parallel.space.openFields(), ", ") +
                    ") leave more to search than the limit of " +
                    std::to_string(options.maxWork) +
                    " units of work (one per transformer block, here " +
                    std::to_string(program.model.numBlocks()) +
                    ", of each candidate's memory estimate and step bound, and one per pass of "
                    "each simulated step); fix some of them or list fewer values in auto(...)");
    return std::nullopt;
  }
  return result;
}

/// `--search`: the ranked table, its JSON, or (--emit=par) the best mapping as a program.
int printSearchResult(const SearchResult &result, const Program &program,
                      const ResolvedModule &resolved) {
  if (emitKind == EmitKind::Par) {
    if (result.top.empty()) {
      printSearch(result, program, llvm::errs());
      return ExitInputError;
    }
    writeParSource(resolved, withMapping(program, result.top.front().parallel), llvm::outs());
  } else if (reportKind == ReportKind::JSON) {
    llvm::outs() << llvm::formatv("{0:2}", searchToJSON(result, program)) << "\n";
  } else {
    printSearch(result, program, llvm::outs());
  }
  return result.top.empty() ? ExitInputError : ExitSuccess;
}

/// The program the command works on: the one mapping, or the one --mapping names.
std::optional<Program> selectProgram(std::vector<Program> &programs, DiagnosticEngine &diags) {
  std::string names;
  for (const Program &p : programs)
    names += (names.empty() ? "" : ", ") + p.parallel.name;
  if (!mappingName.empty()) {
    for (Program &p : programs)
      if (p.parallel.name == mappingName)
        return std::move(p);
    diags.error(llvm::SMLoc(), "no mapping named '" + mappingName + "'; the file has " +
                                   (names.empty() ? std::string("one unnamed") : names));
    return std::nullopt;
  }
  if (programs.size() == 1)
    return std::move(programs.front());
  diags.error(programs.back().parallel.headerRange,
              "this file has " + std::to_string(programs.size()) + " mappings (" + names +
                  "); choose one with --mapping=NAME (--report compares them all)");
  return std::nullopt;
}

/// `--report` over a file of several mappings: each estimated, side by side.
int compareMappings(std::vector<Program> &programs, DiagnosticEngine &diags) {
  std::vector<std::pair<Program, Mapping>> jobs;
  for (Program &p : programs) {
    if (p.parallel.space.searches()) {
      std::optional<SearchResult> r = runSearch(p, diags);
      if (!r || r->top.empty())
        continue;
      p = withMapping(p, r->top.front().parallel);
    }
    if (auto m = checkMapping(p, diags))
      jobs.push_back({p, *m});
  }
  if (diags.hasErrors())
    return diags.exitCode();
  if (reportKind == ReportKind::JSON)
    llvm::outs() << llvm::formatv("{0:2}", comparisonToJSON(jobs)) << "\n";
  else
    printComparison(jobs, llvm::outs());
  return diags.exitCode();
}

int compile(int argc, char **argv) {
  cl::HideUnrelatedOptions(parcCategory);
  cl::SetVersionPrinter(printVersion);
  if (!cl::ParseCommandLineOptions(argc, argv, "parc: plan 3D-parallel transformer training\n",
                                   &llvm::errs()))
    return ExitUsageOrIO;

  llvm::SourceMgr sourceMgr;
  DiagnosticEngine diags(sourceMgr, llvm::errs());
  diags.setWarningsAsErrors(warningsAsErrors);
  if (importHF.getNumOccurrences() || inputFile.empty())
    return importModel(diags);

  auto module = parseFile(inputFile, diags);
  if (!module)
    return diags.exitCode();
  ResolvedModule resolved;
  auto programs = analyzeAll(*module, diags, &resolved);
  if (emitKind == EmitKind::AST && !diags.hasErrors()) {
    printResolved(resolved, sourceMgr, llvm::outs());
    return diags.exitCode();
  }
  if (!programs || programs->empty() || diags.hasErrors())
    return diags.exitCode() ? diags.exitCode() : ExitInputError;
  if (programs->size() > 1 && mappingName.empty() && reportKind != ReportKind::None &&
      !searchMode)
    return compareMappings(*programs, diags);
  auto program = selectProgram(*programs, diags);
  if (!program)
    return diags.exitCode();
  if (emitKind == EmitKind::Par && !searchMode) {
    llvm::WithColor::error(llvm::errs(), "parc") << "--emit=par writes the best mapping of a "
                                                    "search; add --search\n";
    return ExitUsageOrIO;
  }
  if (searchMode) {
    std::optional<SearchResult> result = runSearch(*program, diags);
    return result ? printSearchResult(*result, *program, resolved) : diags.exitCode();
  }
  if (program->parallel.space.searches()) {
    // Every other command works on one mapping: the fastest the auto fields allow.
    std::optional<SearchResult> result = runSearch(*program, diags);
    if (!result)
      return diags.exitCode();
    if (result->top.empty()) {
      printSearch(*result, *program, llvm::errs());
      return ExitInputError;
    }
    const ParallelSpec &best = result->top.front().parallel;
    llvm::errs() << "parc: auto fields chose " << mappingText(best) << " (of "
                 << result->feasible << " feasible mappings; parc --search ranks them)\n";
    program = withMapping(*program, best);
  }
  auto mapping = checkMapping(*program, diags);
  if (!mapping)
    return ExitInputError;
  checkMemory(*program, *mapping, diags);
  // The report also follows an out-of-memory error: its table shows where the bytes go.
  if (reportKind == ReportKind::Text) {
    printReport(*program, *mapping, llvm::outs());
    return diags.exitCode();
  }
  if (reportKind == ReportKind::JSON) {
    writeReportJSON(*program, *mapping, llvm::outs());
    return diags.exitCode();
  }
  if (diags.hasErrors())
    return diags.exitCode();
  if (emitKind == EmitKind::Trace || emitKind == EmitKind::SVG)
    return emitStep(*program, *mapping, diags);
  if (emitKind == EmitKind::Megatron || emitKind == EmitKind::DeepSpeed)
    return exportJob(*program, *mapping, diags);
  bool lowers = rankToPrint.getNumOccurrences() || emitKind == EmitKind::PlanText ||
                (emitKind == EmitKind::Summary && !outputPath.empty());
  if (lowers && !checkLowerable(*program, *mapping, diags))
    return diags.exitCode();
  if (rankToPrint.getNumOccurrences() || emitKind == EmitKind::PlanText)
    return printRankPlan(*program, *mapping);
  std::optional<std::string> planId;
  if (emitKind == EmitKind::Summary && !outputPath.empty())
    if (!(planId = writePlans(*program, *mapping, diags)))
      return diags.exitCode();
  if (emitKind == EmitKind::Layout)
    printLayout(*mapping, *program, llvm::outs());
  else if (!checkOnly)
    printSummary(*program, *mapping, llvm::outs());
  if (planId && !checkOnly)
    llvm::outs() << "plans    " << mapping->layout.world() << " rank plans and manifest.json in "
                 << outputPath << " (plan id " << *planId << ")\n";
  return diags.exitCode();
}

} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  // A file-size limit (ulimit -f) makes a write fail with EFBIG, reported like a full disk,
  // instead of ending the process by SIGXFSZ with its outputs half-written.
  std::signal(SIGXFSZ, SIG_IGN);
  int status = compile(argc, argv);
  // An output that did not reach standard output is an I/O error, whatever else happened.
  return finishStandardOutput("parc") ? status : ExitUsageOrIO;
}
