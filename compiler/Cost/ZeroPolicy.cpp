//===- ZeroPolicy.cpp - Buckets and the schedule of ZeRO's collectives ----===//

#include "parc/Cost/ZeroPolicy.h"

#include <algorithm>
#include <cstdint>
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
  void forward(std::vector<UnitRead> &reads) const {
    reads.clear();
    for (size_t u = chunk.units.size(); u-- > 0;)
      readForward(u, reads);
    if (chunk.tiedHead)
      appendWords(reads);
  }

  /// The backward's reads, into `reads` (cleared first).
  void backward(bool fullRecompute, std::vector<UnitRead> &reads) const {
    reads.clear();
    if (chunk.tiedHead)
      appendWords(reads);
    llvm::ArrayRef<ParamUnit> units = chunk.units;
    for (size_t u = 0; u < units.size();) {
      ParamUnitKind kind = units[u].kind;
      if (!isSubLayer(kind)) {
        if (kind == ParamUnitKind::Head || kind == ParamUnitKind::FinalNorm)
          reads.push_back({0, u});
        ++u;
        continue;
      }
      size_t end = u;
      while (end < units.size() && units[end].block == units[u].block &&
             isSubLayer(units[end].kind))
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

  /// The backward's gradient writes, into `writes` (cleared first): the head's (a tied head's
  /// into the word embedding), the final norm's, each block's experts, MLP and attention, the
  /// positions' and the word embedding's.
  void writes(std::vector<UnitRead> &writes) const {
    writes.clear();
    if (chunk.tiedHead)
      appendWords(writes);
    llvm::ArrayRef<ParamUnit> units = chunk.units;
    for (size_t u = 0; u < units.size(); ++u) {
      bool blockStart =
          isSubLayer(units[u].kind) && (u == 0 || units[u - 1].block != units[u].block);
      auto experts = expertsOf.find(units[u].block);
      if (blockStart && experts != expertsOf.end())
        writes.push_back({1, experts->second});
      writes.push_back({0, u});
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

/// Both families' buckets and the bucket of each unit, for the families whose policy says
/// `kept` (empty for the others).
struct FamilyBuckets {
  const ZeroPolicy *policies[2];
  std::vector<ZeroBucket> buckets[2];
  std::vector<size_t> bucketOf[2];

  FamilyBuckets(const ChunkUnits &chunk, bool (ZeroPolicy::*kept)() const)
      : policies{&chunk.policy, &chunk.expertPolicy} {
    llvm::ArrayRef<ParamUnit> lists[2] = {chunk.units, chunk.expertUnits};
    for (int f = 0; f < 2; ++f) {
      if (!(policies[f]->*kept)())
        continue;
      buckets[f] = policies[f]->buckets(lists[f]);
      bucketOf[f].resize(lists[f].size());
      for (size_t b = 0; b < buckets[f].size(); ++b)
        for (size_t u = buckets[f][b].first; u < buckets[f][b].end; ++u)
          bucketOf[f][u] = b;
    }
  }
  bool empty() const { return buckets[0].empty() && buckets[1].empty(); }
  double whole(int family, size_t bucket) const {
    return double(buckets[family][bucket].padded(policies[family]->dp));
  }
};

/// The most of `sizes` held at once when entry i is held over positions [spans[i].first,
/// spans[i].second] of `positions` positions (none when first > second).
double overlapPeak(llvm::ArrayRef<std::pair<size_t, size_t>> spans, llvm::ArrayRef<double> sizes,
                   size_t positions) {
  thread_local std::vector<double> change;
  change.assign(positions + 1, 0);
  for (size_t i = 0; i < spans.size(); ++i)
    if (spans[i].first <= spans[i].second) { // held at all
      change[spans[i].first] += sizes[i];
      change[spans[i].second + 1] -= sizes[i];
    }
  double held = 0, peak = 0;
  for (double delta : change)
    peak = std::max(peak, held += delta);
  return peak;
}
} // namespace

ChunkGathers gathersAroundUse(const ModelSpec &model, const ChunkUnits &chunk,
                              bool fullRecompute) {
  ChunkGathers result;
  const FamilyBuckets families(chunk, &ZeroPolicy::gathersWeightsAroundUse);
  const auto &buckets = families.buckets;
  const auto &bucketOf = families.bucketOf;
  ZeroGathers *gathers[2] = {&result.dense, &result.experts};
  // A run is one bucket's consecutive reads among those of its group; it is whole from its
  // first read to its last.
  auto countRuns = [&](const std::vector<UnitRead> &reads, bool backward) {
    thread_local std::vector<std::pair<size_t, size_t>> spans; // of each run
    thread_local std::vector<double> sizes;
    thread_local std::vector<std::pair<int, size_t>> runBucket;
    spans.clear();
    sizes.clear();
    runBucket.clear();
    int64_t open[2] = {-1, -1};
    for (size_t i = 0; i < reads.size(); ++i) {
      const UnitRead &read = reads[i];
      if (buckets[read.family].empty())
        continue;
      int key = chunk.oneGroup ? 0 : read.family;
      std::pair<int, size_t> bucket{read.family, bucketOf[read.family][read.unit]};
      if (open[key] >= 0 && runBucket[size_t(open[key])] == bucket) {
        spans[size_t(open[key])].second = i;
        continue;
      }
      open[key] = int64_t(spans.size());
      double whole = families.whole(bucket.first, bucket.second);
      spans.push_back({i, i});
      sizes.push_back(whole);
      runBucket.push_back(bucket);
      PassGathers &pass = backward ? gathers[read.family]->backward : gathers[read.family]->forward;
      pass.elements += whole;
      ++pass.collectives;
      result.peak = std::max(result.peak, whole);
    }
    // One group: its runs never overlap, so the largest is the peak.
    if (!chunk.oneGroup && !buckets[0].empty() && !buckets[1].empty())
      result.peak = std::max(result.peak, overlapPeak(spans, sizes, reads.size()));
  };
  if (families.empty())
    return result;
  // The search asks this of every ZeRO-3 candidate: the reads reuse one buffer per thread.
  thread_local std::vector<UnitRead> reads;
  reads.reserve(3 * (chunk.units.size() + chunk.expertUnits.size()) + 2);
  ReadOrder order(model, chunk);
  order.forward(reads);
  countRuns(reads, false);
  order.backward(fullRecompute, reads);
  countRuns(reads, true);
  return result;
}

double gradientPeak(const ModelSpec &model, const ChunkUnits &chunk) {
  const FamilyBuckets families(chunk, &ZeroPolicy::shardsGrads);
  if (families.empty())
    return 0;
  thread_local std::vector<UnitRead> writes;
  ReadOrder(model, chunk).writes(writes);
  // Each bucket's gradient is whole from its first write to its last (its reduce-scatter).
  thread_local std::vector<std::pair<size_t, size_t>> spans;
  thread_local std::vector<double> sizes;
  spans.clear();
  sizes.clear();
  size_t offset[2] = {0, families.buckets[0].size()};
  for (int f = 0; f < 2; ++f)
    for (size_t b = 0; b < families.buckets[f].size(); ++b) {
      spans.push_back({SIZE_MAX, 0});
      sizes.push_back(families.whole(f, b));
    }
  for (size_t i = 0; i < writes.size(); ++i) {
    const UnitRead &write = writes[i];
    if (families.buckets[write.family].empty())
      continue;
    auto &span = spans[offset[write.family] + families.bucketOf[write.family][write.unit]];
    span.first = std::min(span.first, i);
    span.second = i;
  }
  return overlapPeak(spans, sizes, writes.size());
}

} // namespace parc
