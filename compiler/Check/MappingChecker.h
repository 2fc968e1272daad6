//===- MappingChecker.h - The rule checker that Rules.cpp and AxisRules.cpp share --===//
//
// Private to compiler/Check. One MappingChecker runs every feasibility rule on a program
// (Feasibility.h's checkMapping); the rules of the tp x pp x dp grid, the batch and the flags
// are in Rules.cpp, those of context and expert parallelism and of where groups sit (across
// nodes, the pipeline bubble) in AxisRules.cpp.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_CHECK_MAPPINGCHECKER_H
#define PARC_CHECK_MAPPINGCHECKER_H

#include "parc/Check/Feasibility.h"
#include "parc/Check/Mapping.h"

#include <optional>
#include <string>

namespace parc::rules {

inline std::string str(int64_t v) { return std::to_string(v); }
/// "1, 2, 4 or 8": the divisors of `n` up to `limit`, for "use tp = ..." hints.
std::string divisorsUpTo(int64_t n, int64_t limit);

class MappingChecker {
public:
  MappingChecker(const Program &program, DiagnosticEngine &diags)
      : program(program), model(program.model), cluster(program.cluster), par(program.parallel),
        diags(diags) {}

  std::optional<Mapping> run();

private:
  llvm::SMRange at(llvm::StringRef field) const {
    llvm::SMRange fallback = field.startswith("model.")     ? model.nameRange
                             : field.startswith("cluster.") ? cluster.nameRange
                                                            : par.headerRange;
    return program.rangeOf(field, fallback);
  }
  bool written(llvm::StringRef field) const { return program.fieldRanges.count(field); }
  void error(llvm::StringRef field, const llvm::Twine &message) {
    diags.error(at(field), message);
    failed = true;
  }
  /// Points at `field` where it was written; a defaulted one is named as such on its block.
  void noteField(llvm::StringRef field, int64_t value) {
    llvm::StringRef name = field.substr(field.find('.') + 1);
    if (written(field))
      diags.note(at(field), "'" + name + "' is " + str(value) + " here");
    else
      diags.note(at(field), "'" + name + "' defaults to " + str(value));
  }

  void checkWorld();
  void checkModelShape();
  void checkTensorSplit(const LayerGroup *layer);
  void checkVocab();
  void checkStages();
  void checkBatch();
  void checkPlanSize();
  void checkSchedule();
  void checkFlags();
  void checkContext();
  void checkExperts();
  void checkExpertLayer(const LayerGroup &layer);
  void checkExpertGrid();
  void warnTensorAcrossNodes();
  void warnContextAcrossNodes();
  void warnBubble();
  const LayerGroup &firstTransformer() const;

  const Program &program;
  const ModelSpec &model;
  const ClusterSpec &cluster;
  const ParallelSpec &par;
  DiagnosticEngine &diags;
  bool failed = false;
  Mapping mapping;
  bool dpKnown = false, batchKnown = false;
};

} // namespace parc::rules

#endif
