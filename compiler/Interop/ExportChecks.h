//===- ExportChecks.h - What both exporters refuse, and how they say it ----===//
//
// Internal to compiler/Interop. An export is refused at the field that asks for what the
// launcher cannot run; every refusal of one export is reported, then nothing is written.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_INTEROP_EXPORTCHECKS_H
#define PARC_INTEROP_EXPORTCHECKS_H

#include "parc/Sema/Program.h"
#include "parc/Support/Diagnostics.h"

#include <string>

namespace parc::interop {

class ExportChecker {
public:
  ExportChecker(const Program &program, llvm::StringRef launcher, DiagnosticEngine &diags)
      : program(program), launcher(launcher.str()), diags(diags) {}

  /// `field` ("parallel.order") asks for what the launcher cannot express: `why`.
  void refuse(llvm::StringRef field, const llvm::Twine &why);
  /// The same at a layer declaration.
  void refuse(const LayerGroup &layer, const llvm::Twine &why);
  bool failed() const { return refused; }

  /// Refusals both launchers share: the rank order (Megatron's two, DeepSpeed's one), the
  /// pipeline schedules neither has, and gradient precisions without a switch.
  void checkOrder(bool tpPpDpAllowed);
  void checkSchedule(bool interleavedAllowed);
  void checkGradDtype();
  /// Mixture-of-experts blocks are not exported yet: a launch file without them would train
  /// a dense model.
  void checkExperts();

private:
  const Program &program;
  std::string launcher;
  DiagnosticEngine &diags;
  bool refused = false;
};

/// True when the order places pipeline before data parallelism (tp-pp-dp).
bool ppBeforeDp(const ParallelSpec &par);
/// A real number as a command line or JSON takes it: 0.0003, 1e-08, 10000.
std::string cliNumber(double v);
/// The learning-rate warm-up parc runs: update k (from 0) uses lr * min(1, (k + 1) / W).
double firstWarmupRate(const TrainSpec &train);

} // namespace parc::interop

#endif
