//===- ZeroPolicy.cpp - Buckets and the schedule of ZeRO's collectives ----===//

#include "parc/Cost/ZeroPolicy.h"

#include <algorithm>
#include <map>

namespace parc {

ZeroPolicy zeroPolicy(const ParallelSpec &parallel, int64_t dp) {
  ZeroPolicy policy;
  policy.zero = parallel.zero;
  policy.dp = dp;
  policy.bucketElements = parallel.bucketSize;
  return policy;
}

GradReduction ZeroPolicy::gradReduction() const {
  if (dp == 1)
    return GradReduction::None;
  if (!partitioned())
    return GradReduction::AllReducePerStep;
  return zero == 1 ? GradReduction::ReduceScatterPerStep
                   : GradReduction::ReduceScatterPerMicrobatch;
}

std::vector<ZeroBucket> ZeroPolicy::buckets(llvm::ArrayRef<ParamUnit> units) const {
  std::vector<ZeroBucket> out;
  if (!partitioned())
    return out;
  auto alone = [](const ParamUnit &unit) {
    return unit.kind == ParamUnitKind::WordEmbedding || unit.kind == ParamUnitKind::Head;
  };
  auto close = [&](ZeroBucket &bucket, size_t end) {
    if (end == bucket.first)
      return;
    bucket.end = end;
    bucket.perMember = (bucket.elements + dp - 1) / dp;
    out.push_back(bucket);
    bucket = ZeroBucket{end, end, 0, 0};
  };
  ZeroBucket open;
  for (size_t i = 0; i < units.size(); ++i) {
    if (alone(units[i]))
      close(open, i);
    open.elements += units[i].elements;
    if (alone(units[i]) || open.elements >= bucketElements)
      close(open, i + 1);
  }
  close(open, units.size());
  return out;
}

namespace {
/// One read of a unit in a pass: its family (0 dense, 1 experts) and place in that list.
struct UnitRead {
  int family;
  size_t unit;
};

/// The passes' reads of one chunk's units, in the order the lowering's ops make them.
class ReadOrder {
public:
  ReadOrder(const ModelSpec &model, const ChunkUnits &chunk) : model(model), chunk(chunk) {
    for (size_t u = 0; u < chunk.expertUnits.size(); ++u)
      expertsOf[chunk.expertUnits[u].block] = u;
  }

  /// The forward's reads, into `reads` (cleared first).
  void forward(bool tiedHead, std::vector<UnitRead> &reads) const {
    reads.clear();
    for (size_t u = chunk.units.size(); u-- > 0;)
      readForward(u, reads);
    if (tiedHead)
      appendWords(reads);
  }

  /// The backward's reads, into `reads` (cleared first).
  void backward(bool fullRecompute, bool tiedHead, std::vector<UnitRead> &reads) const {
    reads.clear();
    if (tiedHead)
      appendWords(reads);
    llvm::ArrayRef<ParamUnit> units = chunk.units;
    for (size_t u = 0; u < units.size();) {
      ParamUnitKind kind = units[u].kind;
      if (kind != ParamUnitKind::Attention && kind != ParamUnitKind::MLP) {
        if (kind == ParamUnitKind::Head || kind == ParamUnitKind::FinalNorm)
          reads.push_back({0, u});
        ++u;
        continue;
      }
      size_t end = u;
      while (end < units.size() && units[end].block == units[u].block &&
             (units[end].kind == ParamUnitKind::Attention || units[end].kind == ParamUnitKind::MLP))
        ++end;
      for (size_t i = end; fullRecompute && i-- > u;)
        readForward(i, reads);
      auto experts = expertsOf.find(units[u].block);
      if (experts != expertsOf.end())
        reads.push_back({1, experts->second});
      for (size_t i = u; i < end; ++i)
        reads.push_back({0, i});
      u = end;
    }
  }

private:
  /// A dense unit's forward reads: a MoE block's MLP reads the router, then the experts run,
  /// then the shared experts.
  void readForward(size_t u, std::vector<UnitRead> &reads) const {
    reads.push_back({0, u});
    const ParamUnit &unit = chunk.units[u];
    auto experts = expertsOf.find(unit.block);
    if (unit.kind != ParamUnitKind::MLP || experts == expertsOf.end())
      return;
    reads.push_back({1, experts->second});
    if (model.blockGroup(unit.block).moe.sharedExperts > 0)
      reads.push_back({0, u});
  }

  void appendWords(std::vector<UnitRead> &reads) const {
    for (size_t u = 0; u < chunk.units.size(); ++u)
      if (chunk.units[u].kind == ParamUnitKind::WordEmbedding)
        reads.push_back({0, u});
  }

  const ModelSpec &model;
  const ChunkUnits &chunk;
  std::map<int64_t, size_t> expertsOf; // block -> its experts' unit
};
} // namespace

ChunkGathers gathersAroundUse(const ModelSpec &model, const ChunkUnits &chunk,
                              bool fullRecompute, bool tiedHead) {
  ChunkGathers result;
  const ZeroPolicy *policies[2] = {&chunk.policy, &chunk.expertPolicy};
  llvm::ArrayRef<ParamUnit> lists[2] = {chunk.units, chunk.expertUnits};
  std::vector<ZeroBucket> buckets[2];
  std::vector<size_t> bucketOf[2];
  for (int f = 0; f < 2; ++f) {
    if (!policies[f]->gathersWeightsAroundUse())
      continue;
    buckets[f] = policies[f]->buckets(lists[f]);
    bucketOf[f].resize(lists[f].size());
    for (size_t b = 0; b < buckets[f].size(); ++b)
      for (size_t u = buckets[f][b].first; u < buckets[f][b].end; ++u)
        bucketOf[f][u] = b;
  }
  ZeroGathers *families[2] = {&result.dense, &result.experts};
  // A run is one bucket's consecutive reads among those of its group; it is whole from its
  // first read to its last.
  auto countRuns = [&](const std::vector<UnitRead> &reads, bool backward) {
    struct Run {
      int family;
      size_t bucket, first, last;
    };
    thread_local std::vector<Run> runs;
    runs.clear();
    int64_t open[2] = {-1, -1};
    for (size_t i = 0; i < reads.size(); ++i) {
      const UnitRead &read = reads[i];
      if (buckets[read.family].empty())
        continue;
      int key = chunk.oneGroup ? 0 : read.family;
      size_t bucket = bucketOf[read.family][read.unit];
      if (open[key] >= 0 && runs[size_t(open[key])].family == read.family &&
          runs[size_t(open[key])].bucket == bucket) {
        runs[size_t(open[key])].last = i;
        continue;
      }
      open[key] = int64_t(runs.size());
      runs.push_back({read.family, bucket, i, i});
      double whole = double(buckets[read.family][bucket].padded(policies[read.family]->dp));
      PassGathers &pass = backward ? families[read.family]->backward : families[read.family]->forward;
      pass.elements += whole;
      ++pass.collectives;
      result.peak = std::max(result.peak, whole);
    }
    // One group: its runs never overlap, so the largest is the peak.
    if (chunk.oneGroup || buckets[1].empty() || buckets[0].empty())
      return;
    thread_local std::vector<double> change;
    change.assign(reads.size() + 1, 0);
    for (const Run &run : runs) {
      double whole = double(buckets[run.family][run.bucket].padded(policies[run.family]->dp));
      change[run.first] += whole;
      change[run.last + 1] -= whole;
    }
    double held = 0;
    for (double delta : change)
      result.peak = std::max(result.peak, held += delta);
  };
  if (buckets[0].empty() && buckets[1].empty())
    return result;
  // The search asks this of every ZeRO-3 candidate: the reads reuse one buffer per thread.
  thread_local std::vector<UnitRead> reads;
  reads.reserve(3 * (chunk.units.size() + chunk.expertUnits.size()) + 2);
  ReadOrder order(model, chunk);
  order.forward(tiedHead, reads);
  countRuns(reads, false);
  order.backward(fullRecompute, tiedHead, reads);
  countRuns(reads, true);
  return result;
}

} // namespace parc
