//===- cost-bench.cpp - In-process cost of the step-time model and the search ===//
//
// Times, for each .par file given, what the search and the report spend on one mapping:
// building its work table and bound (what the search does for every feasible candidate), and
// the whole estimate with the simulated schedule (what --report does once). Prints a table.
// Run by bench/search.sh; not a test. `--calls=N` makes exactly N calls of each instead of
// 200 ms' worth, for counting instructions under `valgrind --tool=callgrind` on a busy machine.
//
//===----------------------------------------------------------------------===//
#include "parc/Check/Mapping.h"
#include "parc/Cost/CostModel.h"
#include "parc/Cost/StageWork.h"
#include "parc/Cost/StepTimeline.h"
#include "parc/Frontend/Parser.h"
#include "parc/Sema/Sema.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

using namespace parc;

namespace {

int64_t fixedCalls = 0; // --calls=N

template <typename F> double microsecondsPerCall(F f) {
  // Enough calls for 200 ms, at least 5, unless --calls fixed their number.
  using clock = std::chrono::steady_clock;
  int64_t calls = 0;
  auto start = clock::now();
  double elapsed = 0;
  do {
    f();
    ++calls;
    elapsed = std::chrono::duration<double>(clock::now() - start).count();
  } while (fixedCalls > 0 ? calls < fixedCalls : elapsed < 0.2 || calls < 5);
  return 1e6 * elapsed / double(calls);
}

} // namespace

int main(int argc, char **argv) {
  llvm::outs() << llvm::format("%-44s %8s %8s %14s %14s\n", (const char *)"file",
                               (const char *)"ranks", (const char *)"M",
                               (const char *)"work+bound us", (const char *)"estimate us");
  int first = 1;
  if (argc > 1 && std::strncmp(argv[1], "--calls=", 8) == 0) {
    fixedCalls = std::atoll(argv[1] + 8);
    if (fixedCalls <= 0) {
      llvm::errs() << "cost-bench: --calls wants a positive count\n";
      return 2;
    }
    first = 2;
  }
  for (int i = first; i < argc; ++i) {
    llvm::SourceMgr sourceMgr;
    std::string sink;
    llvm::raw_string_ostream quiet(sink);
    DiagnosticEngine diags(sourceMgr, quiet);
    auto module = parseFile(argv[i], diags);
    auto program = module ? analyze(*module, diags) : std::nullopt;
    auto mapping = program ? checkMapping(*program, diags) : std::nullopt;
    if (!mapping) {
      llvm::errs() << argv[i] << ": does not check:\n" << quiet.str();
      return 1;
    }
    double bound = microsecondsPerCall([&] {
      WorkTable work = buildWorkTable(*program, *mapping);
      volatile double b = stepLowerBound(*program, *mapping, work);
      (void)b;
    });
    double estimate = microsecondsPerCall([&] {
      volatile double s = estimateCost(*program, *mapping).stepSeconds;
      (void)s;
    });
    llvm::outs() << llvm::format("%-44s %8lld %8lld %14.1f %14.1f\n", argv[i],
                                 (long long)mapping->layout.world(),
                                 (long long)mapping->microbatches, bound, estimate);
  }
  return 0;
}
