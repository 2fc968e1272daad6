//===- SearchSpace.h - The mapping search's space and its enumeration ----===//
//
// Internal to Search/: the values of each field (Domains), the candidates that pass the rules
// and fit (Scored), and the threads' enumeration of the space (Enumerator, under a shared
// Budget). Search.cpp ranks what the enumeration found.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_SEARCH_SEARCHSPACE_H
#define PARC_SEARCH_SEARCHSPACE_H

#include "parc/Search/Search.h"

#include <array>
#include <atomic>
#include <optional>
#include <vector>

namespace parc::search {

struct ScheduleChoice {
  ScheduleKind kind;
  int64_t chunks;
};

/// Every field's values, each independent of the others so that the space is their product.
struct Domains {
  std::vector<int64_t> tp, pp, cp, ep, mb, sp, recompute, zero, order;
  std::vector<ScheduleChoice> schedules;

  explicit Domains(const Program &program);
};

/// A feasible candidate, small enough to keep by the hundred thousand.
struct Scored {
  int64_t tp, pp, dp, cp, ep, mb, chunks;
  uint8_t kind, zero, recompute, sp, order;
  double bound, bytes;
  int64_t crossing; // ranks of the groups that span nodes, for ties
};

/// The mapping `s` stands for, the rest of `base` kept.
ParallelSpec specOf(const ParallelSpec &base, const Scored &s);

/// What the enumeration of one slice of the space found.
struct Tally {
  int64_t candidates = 0;
  std::array<int64_t, kRejections> rejected{};
  std::vector<Scored> feasible;
  std::vector<Scored> overflowing; // the least over gpu.memory, when nothing fits
  /// Per pure family: candidates seen, and the smallest memory of those that did not fit.
  std::array<int64_t, kPureFamilies> familySeen{}, familyFit{};
  std::array<double, kPureFamilies> familyLeastBytes{};

  void reject(Rejection r, int64_t count) {
    rejected[size_t(r)] += count;
    candidates += count;
  }
};

/// The one-axis family of a mapping, if it is one.
std::optional<PureFamily> familyOf(int64_t tp, int64_t pp, int64_t dp, int64_t cp);

/// The work the threads share (SearchOptions::maxWork): its total does not depend on how
/// they split the space, so whether a search is over the budget does not either.
class Budget {
public:
  explicit Budget(int64_t limit) : limit(limit) {}
  /// False once the search has spent more than the limit: it stops.
  bool spend(int64_t units) { return used.fetch_add(units) + units <= limit; }
  bool exhausted() const { return used.load() > limit; }
  int64_t spent() const { return used.load(); }

private:
  std::atomic<int64_t> used{0};
  const int64_t limit;
};

class Enumerator {
public:
  Enumerator(const Program &program, const Domains &d, Budget &budget)
      : program(program), d(d), budget(budget) {}

  /// Enumerates every candidate with this tp, cp and pp into `t`.
  void run(int64_t tp, int64_t cp, int64_t pp, Tally &t);

private:
  size_t below(size_t level) const {
    size_t sizes[] = {d.ep.size(), d.mb.size(), d.sp.size(), d.schedules.size(), d.recompute.size(),
                      d.zero.size(), d.order.size()};
    size_t n = 1;
    for (size_t i = level; i < std::size(sizes); ++i)
      n *= sizes[i];
    return n;
  }
  /// Every candidate with this tp, cp, pp and ep.
  void runWithExperts(int64_t tp, int64_t cp, int64_t pp, int64_t ep, int64_t padded, Tally &t);
  void scoreOrders(Program &p, Mapping &m, Scored s, Tally &t);

  const Program &program;
  const Domains &d;
  Budget &budget;
};

} // namespace parc::search

#endif
