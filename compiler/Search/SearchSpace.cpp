//===- SearchSpace.cpp - The mapping search's space and its enumeration --===//
#include "SearchSpace.h"
#include "parc/Check/Feasibility.h"
#include "parc/Cost/MemoryModel.h"
#include "parc/Cost/StageWork.h"
#include "parc/Cost/StepTimeline.h"
#include "parc/Support/Limits.h"

#include <algorithm>

namespace parc::search {

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

int64_t crossingRanks(const RankLayout &layout) {
  int64_t n = 0;
  for (Axis a : {Axis::TP, Axis::CP, Axis::PP, Axis::DP})
    if (layout.anyGroupCrossesNodes(a))
      n += layout.sizeOf(a);
  return n;
}

} // namespace

Domains::Domains(const Program &program) {
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

} // namespace parc::search
