//===- Search.cpp - parc chooses the mapping ------------------------------===//
#include "parc/Search/Search.h"
#include "parc/Check/Feasibility.h"
#include "parc/Cost/MemoryModel.h"
#include "parc/Cost/StageWork.h"
#include "parc/Cost/StepTimeline.h"
#include "parc/Support/Limits.h"
#include "parc/Support/Units.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

namespace parc {

const char *toString(Rejection reason) {
  switch (reason) {
  case Rejection::DoesNotDivide:
    return "does not divide";
  case Rejection::ContextParallel:
    return "context parallel rule";
  case Rejection::SequenceParallel:
    return "sequence parallel rule";
  case Rejection::ScheduleRule:
    return "schedule rule";
  case Rejection::ZeroWithoutDP:
    return "zero without dp";
  case Rejection::StepLimit:
    return "step limit";
  case Rejection::OutOfMemory:
    return "out of memory";
  }
  return "?";
}

const char *toString(PureFamily family) {
  switch (family) {
  case PureFamily::DataParallel:
    return "data parallel";
  case PureFamily::TensorParallel:
    return "tensor parallel";
  case PureFamily::PipelineParallel:
    return "pipeline parallel";
  }
  return "?";
}

Program withMapping(const Program &program, const ParallelSpec &chosen) {
  Program p = program;
  SearchSpace none;
  p.parallel = chosen;
  p.parallel.space = none;
  p.parallel.dpAuto = false;
  return p;
}

namespace {

/// The divisors of n in increasing order, in O(sqrt n).
std::vector<int64_t> divisorsOf(int64_t n) {
  std::vector<int64_t> low, high;
  for (int64_t d = 1; d <= n / d; ++d)
    if (n % d == 0) {
      low.push_back(d);
      if (d != n / d)
        high.push_back(n / d);
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

/// A field's values: the fixed one, or the legal ones `auto(...)` allows.
std::vector<int64_t> valuesOf(const Choices &c, const std::vector<int64_t> &legal, int64_t fixed) {
  if (!c.open)
    return {fixed};
  std::vector<int64_t> out;
  for (int64_t v : legal)
    if (c.allows(v))
      out.push_back(v);
  return out;
}

std::vector<int64_t> range(int64_t first, int64_t last) {
  std::vector<int64_t> out;
  for (int64_t v = first; v <= last; ++v)
    out.push_back(v);
  return out;
}

struct ScheduleChoice {
  ScheduleKind kind;
  int64_t chunks;
};

/// Every field's values, each independent of the others so that the space is their product.
struct Domains {
  std::vector<int64_t> tp, pp, cp, ep, mb, sp, recompute, zero, order;
  std::vector<ScheduleChoice> schedules;

  Domains(const Program &program) {
    const ParallelSpec &par = program.parallel;
    const SearchSpace &space = par.space;
    const int64_t world = program.cluster.world(), blocks = program.model.numBlocks();
    std::vector<int64_t> worldDivisors = divisorsOf(world);
    tp = valuesOf(space.tp, worldDivisors, par.tp);
    pp = valuesOf(space.pp, worldDivisors, par.pp);
    cp = valuesOf(space.cp, worldDivisors, par.cp);
    // Without experts ep is 1 whatever `auto` allows.
    ep = program.model.hasExperts() ? valuesOf(space.ep, worldDivisors, par.ep)
                                    : std::vector<int64_t>{1};
    mb = valuesOf(space.microBatch, divisorsOf(par.globalBatch), par.microBatch);
    sp = valuesOf(space.sequenceParallel, {0, 1}, par.sequenceParallel);
    recompute = valuesOf(space.recompute, {0, 1, 2}, int64_t(par.recompute));
    zero = valuesOf(space.zero, range(0, 3), par.zero);
    // `order = auto` tries the 24 orders of tp, cp, dp and pp when cp may exceed 1, else the
    // 6 without cp (allOrders() lists those last); listed orders as written.
    bool context = std::any_of(cp.begin(), cp.end(), [](int64_t v) { return v > 1; });
    int64_t all = int64_t(allOrders().size()), withCp = 24;
    order = space.order.values.empty() && context  ? valuesOf(space.order, range(0, withCp - 1), 0)
            : space.order.values.empty()           ? valuesOf(space.order, range(withCp, all - 1), 0)
                                                   : valuesOf(space.order, range(0, all - 1), 0);
    if (!space.order.open)
      order = {orderCode(par.order)};
    if (!space.schedule.open) {
      schedules.push_back({par.schedule, par.chunks});
      return;
    }
    std::vector<int64_t> chunkValues = valuesOf(space.chunks, divisorsOf(blocks), par.chunks);
    for (ScheduleKind kind :
         {ScheduleKind::OneFOneB, ScheduleKind::GPipe, ScheduleKind::Interleaved}) {
      if (!space.schedule.allows(int64_t(kind)))
        continue;
      if (kind != ScheduleKind::Interleaved) {
        schedules.push_back({kind, 1});
        continue;
      }
      for (int64_t v : chunkValues)
        if (v >= 2)
          schedules.push_back({kind, v});
    }
  }
};

/// A feasible candidate, small enough to keep by the hundred thousand.
struct Scored {
  int64_t tp, pp, dp, cp, ep, mb, chunks;
  uint8_t kind, zero, recompute, sp, order;
  double bound, bytes;
  int64_t crossing; // ranks of the groups that span nodes, for ties
};

ParallelSpec specOf(const ParallelSpec &base, const Scored &s) {
  ParallelSpec p = base;
  p.tp = s.tp;
  p.pp = s.pp;
  p.dp = s.dp;
  p.cp = s.cp;
  p.ep = s.ep;
  p.dpAuto = false;
  p.microBatch = s.mb;
  p.schedule = ScheduleKind(s.kind);
  p.chunks = s.chunks;
  p.zero = s.zero;
  p.recompute = Recompute(s.recompute);
  p.sequenceParallel = s.sp;
  p.order = allOrders()[s.order];
  p.space = SearchSpace();
  return p;
}

int64_t crossingRanks(const RankLayout &layout) {
  int64_t n = 0;
  for (Axis a : {Axis::TP, Axis::CP, Axis::PP, Axis::DP})
    if (layout.anyGroupCrossesNodes(a))
      n += layout.sizeOf(a);
  return n;
}

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

std::optional<PureFamily> familyOf(int64_t tp, int64_t pp, int64_t dp, int64_t cp) {
  if (cp > 1)
    return std::nullopt;
  if (tp == 1 && pp == 1)
    return PureFamily::DataParallel;
  if (pp == 1 && dp == 1)
    return PureFamily::TensorParallel;
  if (tp == 1 && dp == 1)
    return PureFamily::PipelineParallel;
  return std::nullopt;
}

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

void Enumerator::run(int64_t tp, int64_t cp, int64_t pp, Tally &t) {
  const int64_t world = program.cluster.world(), blocks = program.model.numBlocks();
  const ParallelSpec &base = program.parallel;
  if (world % tp != 0 || !tensorParallelSplits(program.model, tp) || world / tp % cp != 0 ||
      world / (tp * cp) % pp != 0 || pp > blocks) {
    t.reject(Rejection::DoesNotDivide, int64_t(below(0)));
    return;
  }
  if (!contextParallelSplits(program.model, cp)) {
    t.reject(Rejection::ContextParallel, int64_t(below(0)));
    return;
  }
  const int64_t dp = world / (tp * cp * pp);
  bool dpFits = base.dpAuto ? base.space.dp.allows(dp) : dp == base.dp;
  std::optional<int64_t> padded = paddedVocab(program.model.vocab, tp);
  if (!dpFits || !padded) {
    t.reject(Rejection::DoesNotDivide, int64_t(below(0)));
    return;
  }
  for (int64_t ep : d.ep) {
    if (!expertParallelSplits(program.model, ep, dp * cp))
      t.reject(Rejection::DoesNotDivide, int64_t(below(1)));
    else
      runWithExperts(tp, cp, pp, ep, *padded, t);
  }
  // Only the few closest misses are ever shown.
  auto byBytes = [](const Scored &a, const Scored &b) { return a.bytes < b.bytes; };
  std::sort(t.overflowing.begin(), t.overflowing.end(), byBytes);
  if (t.overflowing.size() > 8)
    t.overflowing.resize(8);
}

void Enumerator::runWithExperts(int64_t tp, int64_t cp, int64_t pp, int64_t ep, int64_t padded,
                                Tally &t) {
  const int64_t world = program.cluster.world(), blocks = program.model.numBlocks();
  const ParallelSpec &base = program.parallel;
  const int64_t dp = world / (tp * cp * pp);
  Program p = program;
  p.parallel.cp = cp;
  p.parallel.ep = ep;
  std::optional<PureFamily> family = familyOf(tp, pp, dp, cp);
  for (int64_t mb : d.mb) {
    if (base.globalBatch % (mb * dp) != 0) {
      t.reject(Rejection::DoesNotDivide, int64_t(below(2)));
      continue;
    }
    const int64_t microbatches = base.globalBatch / (mb * dp);
    if (microbatches > limits::MaxMicrobatches) { // the mapping check refuses it
      t.reject(Rejection::StepLimit, int64_t(below(2)));
      continue;
    }
    for (int64_t sp : d.sp) {
      if (sp && !sequenceParallelSplits(program.model, tp, cp)) {
        t.reject(Rejection::SequenceParallel, int64_t(below(3)));
        continue;
      }
      for (const ScheduleChoice &sched : d.schedules) {
        bool interleaved = sched.kind == ScheduleKind::Interleaved;
        bool pipelineRule = pp == 1 ? sched.kind != ScheduleKind::OneFOneB
                                    : interleaved && (sched.chunks < 2 || microbatches % pp);
        std::optional<StagePartition> partition =
            pipelineRule ? std::nullopt
                         : partitionBlocks(blocks, pp, interleaved ? sched.chunks : 1,
                                           base.stageLayers);
        if (!partition) {
          t.reject(pipelineRule || interleaved ? Rejection::ScheduleRule
                                               : Rejection::DoesNotDivide,
                   int64_t(below(4)));
          continue;
        }
        if (stepPasses(pp, partition->chunks, microbatches) > limits::MaxStepPasses) {
          t.reject(Rejection::StepLimit, int64_t(below(4)));
          continue;
        }
        for (int64_t rc : d.recompute)
          for (int64_t zero : d.zero) {
            if (zero > 0 && dp * cp == 1) {
              t.reject(Rejection::ZeroWithoutDP, int64_t(d.order.size()));
              continue;
            }
            ParallelSpec &par = p.parallel;
            par.tp = tp;
            par.pp = pp;
            par.dp = dp;
            par.microBatch = mb;
            par.schedule = sched.kind;
            par.chunks = interleaved ? sched.chunks : 1;
            par.zero = int(zero);
            par.recompute = Recompute(rc);
            par.sequenceParallel = sp;
            if (!budget.spend(blocks))
              return;
            Mapping m = makeMapping(p, dp, *partition, padded);
            double bytes = estimateMemory(p, m).maxRankBytes();
            Scored s{tp, pp, dp, cp, ep, mb, par.chunks, uint8_t(sched.kind), uint8_t(zero),
                     uint8_t(rc), uint8_t(sp), 0, 0, bytes, 0};
            if (family)
              ++t.familySeen[size_t(*family)];
            if (bytes > double(program.cluster.gpuMemory)) {
              t.reject(Rejection::OutOfMemory, int64_t(d.order.size()));
              if (family && (t.familyLeastBytes[size_t(*family)] == 0 ||
                             bytes < t.familyLeastBytes[size_t(*family)]))
                t.familyLeastBytes[size_t(*family)] = bytes;
              t.overflowing.push_back(s);
              continue;
            }
            if (family)
              ++t.familyFit[size_t(*family)];
            scoreOrders(p, m, s, t);
          }
      }
    }
  }
}

void Enumerator::scoreOrders(Program &p, Mapping &m, Scored s, Tally &t) {
  for (int64_t order : d.order) {
    p.parallel.order = allOrders()[size_t(order)];
    if (!orderNamesAxes(p.parallel.order, axisSizes(s.tp, s.cp, 1, s.dp, s.pp))) {
      t.reject(Rejection::ContextParallel, 1);
      continue;
    }
    m.layout = RankLayout(s.tp, s.pp, s.dp, p.parallel.order, program.cluster.gpusPerNode, s.cp,
                          s.ep);
    if (program.model.hasExperts() && !m.layout.expertGridAligned()) {
      t.reject(Rejection::ContextParallel, 1);
      continue;
    }
    if (!budget.spend(program.model.numBlocks()))
      return;
    s.order = uint8_t(order);
    s.bound = stepLowerBound(p, m, buildWorkTable(p, m));
    s.crossing = crossingRanks(m.layout);
    t.feasible.push_back(s);
    ++t.candidates;
  }
}

/// Why the space holds no candidate of a one-axis family that passes the rules.
std::string familyProblem(const Program &program, PureFamily family) {
  const int64_t world = program.cluster.world(), blocks = program.model.numBlocks();
  const ParallelSpec &par = program.parallel;
  int64_t tp = family == PureFamily::TensorParallel ? world : 1;
  int64_t pp = family == PureFamily::PipelineParallel ? world : 1;
  int64_t dp = family == PureFamily::DataParallel ? world : 1;
  auto s = [](int64_t v) { return std::to_string(v); };
  auto excluded = [&](const char *name, const Choices &c, int64_t fixed, int64_t want) {
    if (c.open ? c.allows(want) : fixed == want)
      return std::string();
    return c.open ? std::string("auto(...) does not allow ") + name + " = " + s(want)
                  : std::string("the parallel block fixes ") + name + " = " + s(fixed);
  };
  for (std::string why : {excluded("tp", par.space.tp, par.tp, tp),
                          excluded("pp", par.space.pp, par.pp, pp),
                          excluded("cp", par.space.cp, par.cp, 1)})
    if (!why.empty())
      return why;
  if (!par.dpAuto && par.dp != dp)
    return "the parallel block fixes dp = " + s(par.dp);
  if (!tensorParallelSplits(program.model, tp))
    return "tp = " + s(tp) + " does not split the model's " + s(program.model.heads) +
           " heads, its key/value heads or its ffn";
  if (pp > blocks || blocks % pp != 0)
    return "pp = " + s(pp) + " does not split the " + s(blocks) + " transformer blocks";
  if (par.globalBatch % dp != 0)
    return "global_batch = " + s(par.globalBatch) + " is not a multiple of dp = " + s(dp);
  return "no micro_batch, schedule or sequence parallel setting of the space passes the rules";
}

/// The rank order with the axes of size 1 left out: orders that differ only in where such an
/// axis goes lay the ranks out identically.
std::array<int, kAxes> canonicalOrder(const Scored &s) {
  std::array<int, kAxes> out;
  out.fill(-1);
  size_t n = 0;
  AxisSizes sizes = axisSizes(s.tp, s.cp, 1, s.dp, s.pp);
  for (Axis a : allOrders()[s.order].axes())
    if (sizes[indexOf(a)] > 1)
      out[n++] = int(a);
  return out;
}

/// Everything that tells two candidates apart, for a total order of ties and to drop
/// orders that are the same layout.
auto identity(const Scored &s) {
  return std::make_tuple(s.tp, s.pp, s.dp, s.cp, s.ep, s.mb, s.kind, s.chunks, s.zero,
                         s.recompute, s.sp, canonicalOrder(s), s.order);
}

bool before(const Scored &a, const Scored &b) {
  if (a.bound != b.bound)
    return a.bound < b.bound;
  if (a.bytes != b.bytes)
    return a.bytes < b.bytes;
  if (a.crossing != b.crossing)
    return a.crossing < b.crossing;
  return identity(a) < identity(b);
}

bool sameLayout(const Scored &a, const Scored &b) {
  auto ia = identity(a), ib = identity(b);
  std::get<12>(ia) = std::get<12>(ib) = 0; // the order, as written
  return ia == ib;
}

/// Simulates `s` for its exact step time.
Candidate simulate(const Program &program, const Scored &s) {
  Candidate c;
  c.parallel = specOf(program.parallel, s);
  Program p = withMapping(program, c.parallel);
  const int64_t blocks = program.model.numBlocks();
  std::optional<StagePartition> partition =
      partitionBlocks(blocks, s.pp, s.chunks, program.parallel.stageLayers);
  c.mapping = makeMapping(p, s.dp, *partition, *paddedVocab(program.model.vocab, s.tp));
  c.maxRankBytes = s.bytes;
  c.lowerBound = s.bound;
  c.cost = estimateCost(p, c.mapping);
  c.simulated = c.cost.stepSeconds > 0;
  return c;
}

bool faster(const Candidate &a, const Candidate &b, const Scored &sa, const Scored &sb) {
  if (a.step() != b.step())
    return a.step() < b.step();
  if (sa.bytes != sb.bytes)
    return sa.bytes < sb.bytes;
  if (sa.crossing != sb.crossing)
    return sa.crossing < sb.crossing;
  return identity(sa) < identity(sb);
}

/// The `k` fastest of `pool` by simulated step: simulates in the order of the bounds until
/// the next bound cannot beat the k-th simulated step. A simulation costs the budget one unit
/// per forward and backward pass, 2 x pp x chunks x M.
std::vector<Candidate> fastest(const Program &program, std::vector<const Scored *> pool,
                               size_t k, Budget &budget) {
  std::sort(pool.begin(), pool.end(), [](const Scored *a, const Scored *b) { return before(*a, *b); });
  std::vector<std::pair<Candidate, const Scored *>> done;
  for (const Scored *s : pool) {
    if (done.size() >= k && s->bound > done[k - 1].first.step())
      break;
    // An order that differs only in where a size-1 axis goes is the same mapping.
    if (std::any_of(done.begin(), done.end(),
                    [&](const auto &d) { return sameLayout(*d.second, *s); }))
      continue;
    int64_t microbatches = program.parallel.globalBatch / (s->mb * s->dp);
    if (!budget.spend(stepPasses(s->pp, s->chunks, microbatches)))
      return {};
    done.push_back({simulate(program, *s), s});
    std::sort(done.begin(), done.end(), [](const auto &a, const auto &b) {
      return faster(a.first, b.first, *a.second, *b.second);
    });
  }
  std::vector<Candidate> out;
  for (size_t i = 0; i < done.size() && i < k; ++i)
    out.push_back(std::move(done[i].first));
  return out;
}

/// The three candidates that miss gpu.memory by the least, with the stage that misses.
std::vector<Candidate> closestMisses(const Program &program, std::vector<Scored> overflowing) {
  std::sort(overflowing.begin(), overflowing.end(),
            [](const Scored &a, const Scored &b) { return a.bytes < b.bytes; });
  std::vector<Candidate> out;
  for (size_t i = 0; i < overflowing.size() && i < 3; ++i) {
    const Scored &s = overflowing[i];
    Candidate c;
    c.parallel = specOf(program.parallel, s);
    Program p = withMapping(program, c.parallel);
    c.mapping = makeMapping(p, s.dp,
                            *partitionBlocks(program.model.numBlocks(), s.pp, s.chunks,
                                             program.parallel.stageLayers),
                            *paddedVocab(program.model.vocab, s.tp));
    c.maxRankBytes = s.bytes;
    c.worstStage = estimateMemory(p, c.mapping).worst();
    out.push_back(c);
  }
  return out;
}

} // namespace

SearchResult searchMappings(const Program &program, const SearchOptions &options) {
  auto start = std::chrono::steady_clock::now();
  Domains d(program);
  std::vector<std::array<int64_t, 3>> pairs;
  for (int64_t tp : d.tp)
    for (int64_t cp : d.cp)
      for (int64_t pp : d.pp)
        pairs.push_back({tp, cp, pp});

  unsigned threads = std::max(1u, std::min<unsigned>(options.threads, unsigned(pairs.size())));
  std::vector<Tally> tallies(threads);
  std::atomic<size_t> next{0}, finished{0};
  Budget budget(options.maxWork);
  auto work = [&](unsigned id) {
    Enumerator e(program, d, budget);
    for (size_t i; !budget.exhausted() && (i = next.fetch_add(1)) < pairs.size(); ++finished)
      e.run(pairs[i][0], pairs[i][1], pairs[i][2], tallies[id]);
  };
  std::vector<std::thread> pool;
  for (unsigned id = 1; id < threads; ++id)
    pool.emplace_back(work, id);
  if (options.progress) {
    std::thread reporter([&] {
      while (finished.load() < pairs.size() && !budget.exhausted()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        options.progress(double(finished.load()) / double(std::max<size_t>(pairs.size(), 1)));
      }
    });
    work(0);
    reporter.join();
  } else {
    work(0);
  }
  for (std::thread &t : pool)
    t.join();

  SearchResult result;
  result.work = budget.spent();
  if (budget.exhausted()) {
    result.overBudget = true;
    return result;
  }
  std::vector<Scored> feasible, overflowing;
  std::array<int64_t, kPureFamilies> seen{}, fit{};
  std::array<double, kPureFamilies> least{};
  for (Tally &t : tallies) {
    result.candidates += t.candidates;
    for (size_t r = 0; r < kRejections; ++r)
      result.rejected[r] += t.rejected[r];
    feasible.insert(feasible.end(), t.feasible.begin(), t.feasible.end());
    overflowing.insert(overflowing.end(), t.overflowing.begin(), t.overflowing.end());
    for (size_t f = 0; f < kPureFamilies; ++f) {
      seen[f] += t.familySeen[f];
      fit[f] += t.familyFit[f];
      if (t.familyLeastBytes[f] > 0 && (least[f] == 0 || t.familyLeastBytes[f] < least[f]))
        least[f] = t.familyLeastBytes[f];
    }
  }
  result.feasible = int64_t(feasible.size());

  std::vector<const Scored *> all;
  for (const Scored &s : feasible)
    all.push_back(&s);
  result.top = fastest(program, all, std::max<size_t>(options.top, 1), budget);
  for (size_t f = 0; f < kPureFamilies; ++f) {
    std::vector<const Scored *> members;
    for (const Scored &s : feasible)
      if (familyOf(s.tp, s.pp, s.dp, s.cp) == PureFamily(f))
        members.push_back(&s);
    if (!members.empty()) {
      std::vector<Candidate> best = fastest(program, members, 1, budget);
      if (!best.empty())
        result.pure[f] = best.front();
      continue;
    }
    if (seen[f] == 0)
      result.pureProblem[f] = familyProblem(program, PureFamily(f));
    else
      result.pureProblem[f] = "none fits: the smallest needs " + formatBytes(least[f]) +
                              " per GPU";
  }
  if (feasible.empty())
    result.closest = closestMisses(program, std::move(overflowing));
  result.work = budget.spent();
  if (budget.exhausted()) {
    SearchResult over;
    over.work = result.work;
    over.overBudget = true;
    return over;
  }
  result.elapsedSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

} // namespace parc
