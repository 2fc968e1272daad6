//===- ZeroPolicy.cpp - Buckets and the schedule of ZeRO's collectives ----===//

#include "parc/Cost/ZeroPolicy.h"

#include <algorithm>

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

ZeroTraffic zeroTraffic(const ZeroPolicy &policy,
                        llvm::ArrayRef<std::vector<ParamUnit>> stageUnits, int64_t microbatches) {
  ZeroTraffic t;
  GradReduction reduction = policy.gradReduction();
  if (reduction == GradReduction::None)
    return t;
  for (const std::vector<ParamUnit> &units : stageUnits) {
    if (reduction == GradReduction::AllReducePerStep) {
      for (const ParamUnit &unit : units)
        t.gradElements += unit.elements;
      continue;
    }
    for (const ZeroBucket &bucket : policy.buckets(units)) {
      int64_t padded = bucket.padded(policy.dp);
      t.gradElements += padded;
      ++t.buckets;
      t.largestBucket = std::max(t.largestBucket, padded);
    }
  }
  t.gradEvents = reduction == GradReduction::ReduceScatterPerMicrobatch ? microbatches : 1;
  if (policy.partitioned()) {
    t.weightElements = t.gradElements;
    t.weightEvents = policy.gathersWeightsAroundUse() ? 2 * microbatches : 1;
  }
  return t;
}

} // namespace parc
