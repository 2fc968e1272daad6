//===- CommModel.cpp - alpha-beta times of collectives and sends ----------===//
#include "parc/Cost/CommModel.h"

namespace parc {

namespace {
/// One ring phase: n - 1 steps, each moving bytes / n over the link.
double ringPhaseTime(double bytes, int64_t ranks, const LinkSpec &link) {
  if (ranks <= 1)
    return 0;
  double steps = double(ranks - 1);
  return steps * link.latency + steps / double(ranks) * bytes / link.bandwidth;
}
} // namespace

double allReduceTime(double bytes, int64_t ranks, const LinkSpec &link) {
  return 2 * ringPhaseTime(bytes, ranks, link);
}

double allGatherTime(double bytes, int64_t ranks, const LinkSpec &link) {
  return ringPhaseTime(bytes, ranks, link);
}

double reduceScatterTime(double bytes, int64_t ranks, const LinkSpec &link) {
  return ringPhaseTime(bytes, ranks, link);
}

double sendTime(double bytes, const LinkSpec &link) {
  return link.latency + bytes / link.bandwidth;
}

} // namespace parc
