//===- Search.cpp - parc chooses the mapping ------------------------------===//
#include "parc/Search/Search.h"
#include "SearchSpace.h"
#include "parc/Check/Feasibility.h"
#include "parc/Cost/MemoryModel.h"
#include "parc/Support/Limits.h"
#include "parc/Support/Units.h"

#include <algorithm>
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

using namespace search;

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
