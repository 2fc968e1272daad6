//===- PlanTraffic.h - What a rank plan sends, receives and reduces --------===//
//
// Each rank plan is verified alone, so a plan with one transfer or collective edited away
// passes and then waits for a message that never comes. The traffic signature summarises,
// per rank, what its plan will make the communicators do:
//
// - per group it belongs to (of more than one rank), the ordered sequence of collectives it
//   runs on that group: ops with a `group` attribute inside its computes, ZeRO and gradient
//   instructions, the optimizer's norm. Every member must run the same sequence, or the
//   collectives pair wrongly or wait forever;
// - per peer, the messages it sends to and receives from that peer (pipeline transfers and
//   ring attention's sends), each named by its tag and element count. Messages are matched
//   by tag, so these are compared as sets: every send has its receive and no receive waits.
//
// Each signature is a few hashes, small enough for the runtime's start-up handshake, so that
// every rank compares everyone's before the first step and all raise the same error.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_PLAN_PLANTRAFFIC_H
#define PARC_PLAN_PLANTRAFFIC_H

#include "parc/Plan/Plan.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace parc::plan {

struct TrafficChannel {
  int64_t events = 0;
  uint64_t hash = 0;

  bool operator==(const TrafficChannel &other) const {
    return events == other.events && hash == other.hash;
  }
  bool operator!=(const TrafficChannel &other) const { return !(*this == other); }
};

struct TrafficSignature {
  struct GroupTraffic {
    int64_t leader = 0; // the group's first member: the rank every member compares with
    TrafficChannel collectives;
  };
  std::map<Group, GroupTraffic> groups;
  std::map<int64_t, TrafficChannel> sends, receives; // by peer rank

  /// A line without newlines or tabs, for the handshake; decode(encode()) == *this.
  std::string encode() const;
  static std::optional<TrafficSignature> decode(llvm::StringRef text);
};

/// The signature of a plan that passed the reader and verifier.
TrafficSignature trafficOf(const RankPlan &plan);

/// The first disagreement between the ranks' signatures (indexed by rank), naming both ranks
/// and what differs; "" when every collective and message pairs.
std::string checkTraffic(llvm::ArrayRef<TrafficSignature> ranks);

} // namespace parc::plan

#endif
