//===- PlanTraffic.cpp - What a rank plan sends, receives and reduces ------===//

#include "parc/Plan/PlanTraffic.h"
#include "PlanVerifierInternal.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/xxhash.h"

#include <cstring>

namespace parc::plan {

namespace {

/// The fields that identify one collective or message, hashed as raw bytes.
struct Event {
  int64_t fields[4] = {0, 0, 0, 0};
};

uint64_t hashOf(const Event &event, uint64_t previous) {
  uint8_t bytes[sizeof(uint64_t) + sizeof(event.fields)];
  std::memcpy(bytes, &previous, sizeof(previous));
  std::memcpy(bytes + sizeof(previous), event.fields, sizeof(event.fields));
  return llvm::xxHash64(llvm::ArrayRef<uint8_t>(bytes, sizeof(bytes)));
}

/// Collectives on a group pair in order: each event folds into the previous hash.
void appendOrdered(TrafficChannel &channel, const Event &event) {
  ++channel.events;
  channel.hash = hashOf(event, channel.hash);
}

/// Messages pair by tag, in any order: a sum of the events' hashes.
void addUnordered(TrafficChannel &channel, const Event &event) {
  ++channel.events;
  channel.hash += hashOf(event, 0);
}

/// Elements of a verified shape (the verifier refuses one whose count overflows).
int64_t elementsOf(llvm::ArrayRef<int64_t> shape) { return detail::elementCount(shape).value_or(-1); }

int64_t tensorElements(const Chunk &chunk, const std::string &name) {
  auto it = chunk.tensors.find(name);
  return it == chunk.tensors.end() ? -1 : elementsOf(it->second.shape);
}

int64_t paramElements(const RankPlan &plan, const std::vector<std::string> &names) {
  int64_t n = 0;
  for (const std::string &name : names)
    if (const ParamShard *shard = plan.findParam(name))
      n += elementsOf(shard->localShape());
  return n;
}

class TrafficBuilder {
public:
  explicit TrafficBuilder(const RankPlan &plan) : plan(plan) {}

  TrafficSignature build() {
    for (size_t g = 0; g < spellings(Group{}).size(); ++g) {
      const Group group = Group(g);
      const std::vector<int64_t> &members = plan.groups.get(group);
      if (members.size() > 1)
        sig.groups[group].leader = members.front();
    }
    for (const Instr &instr : plan.schedule)
      addInstr(instr);
    return std::move(sig);
  }

private:
  const RankPlan &plan;
  TrafficSignature sig;

  void collective(Group group, const Event &event) {
    auto it = sig.groups.find(group);
    if (it != sig.groups.end())
      appendOrdered(it->second.collectives, event);
  }

  // Pipeline transfers carry ScheduleRunner's tag: the boundary (the sending virtual stage
  // of an activation), the microbatch and the direction.
  void transfer(const Instr &instr) {
    if (instr.chunk < 0 || instr.chunk >= int64_t(plan.chunks.size()))
      return;
    const Chunk &chunk = plan.chunks[size_t(instr.chunk)];
    bool send = instr.op == InstrKind::SendAct || instr.op == InstrKind::SendGrad;
    bool gradient = instr.op == InstrKind::SendGrad || instr.op == InstrKind::RecvGrad;
    bool towardsNext = instr.op == InstrKind::SendAct || instr.op == InstrKind::RecvGrad;
    const std::string &boundaryTensor = towardsNext ? chunk.output : chunk.input;
    int64_t boundary = towardsNext ? chunk.virtualStage : chunk.virtualStage - 1;
    Event event{{0, boundary * 2 + (gradient ? 1 : 0), instr.microbatch,
                 tensorElements(chunk, boundaryTensor)}};
    addUnordered(send ? sig.sends[instr.peer] : sig.receives[instr.peer], event);
  }

  void ops(const Chunk &chunk, const std::vector<Op> &list) {
    // Ring attention's sends in one run of sends and receives are tagged by their count per
    // peer within the run (OpInterpreter::exchangeRun).
    std::map<std::pair<bool, int64_t>, int64_t> inRun;
    for (const Op &op : list) {
      bool pointToPoint = op.kind == OpKind::Send || op.kind == OpKind::Recv;
      if (!pointToPoint) {
        inRun.clear();
        // An all-to-all's members send whole rows of the same width in blocks of the
        // same (member, expert) grid, whatever the counts at run time.
        int64_t counts = op.kind == OpKind::AllToAll ? tensorElements(chunk, op.inputs[1]) : 0;
        if (op.attrs.count("group") && !op.inputs.empty())
          collective(op.groupAttr("group"),
                     {{1, int64_t(op.kind), tensorElements(chunk, op.inputs.front()), counts}});
        continue;
      }
      const std::vector<int64_t> &members = plan.groups.get(op.groupAttr("group"));
      int64_t member = op.intAttr("peer");
      if (member < 0 || member >= int64_t(members.size()))
        continue; // the interpreter refuses it before anything is sent
      int64_t peer = members[size_t(member)];
      bool send = op.kind == OpKind::Send;
      const std::string &tensor = send ? op.inputs.front() : op.outputs.front();
      Event event{{1, inRun[{send, peer}]++, tensorElements(chunk, tensor), 0}};
      addUnordered(send ? sig.sends[peer] : sig.receives[peer], event);
    }
  }

  void addInstr(const Instr &instr) {
    switch (instr.op) {
    case InstrKind::SendAct:
    case InstrKind::RecvAct:
    case InstrKind::SendGrad:
    case InstrKind::RecvGrad:
      return transfer(instr);
    case InstrKind::Forward:
    case InstrKind::Backward:
      if (instr.chunk >= 0 && instr.chunk < int64_t(plan.chunks.size())) {
        const Chunk &chunk = plan.chunks[size_t(instr.chunk)];
        ops(chunk, instr.op == InstrKind::Forward ? chunk.forward : chunk.backward);
      }
      return;
    case InstrKind::AllReduceGrads:
    case InstrKind::ReduceScatterGrads:
    case InstrKind::AllGatherParams:
      return collective(instr.group, {{2, int64_t(instr.op), instr.average ? 1 : 0,
                                       paramElements(plan, instr.params)}});
    case InstrKind::OptimizerStep:
      for (Group group : instr.normGroups)
        collective(group, {{3, 0, 0, 0}});
      return;
    case InstrKind::LoadBatch:
    case InstrKind::ReleaseParams:
      return;
    }
  }
};

std::string channelText(const TrafficChannel &channel) {
  return std::to_string(channel.events) + "," + llvm::utohexstr(channel.hash);
}

bool parseChannel(llvm::StringRef events, llvm::StringRef hash, TrafficChannel &channel) {
  return !events.getAsInteger(10, channel.events) && !hash.getAsInteger(16, channel.hash);
}

std::string describeGroup(Group group, int64_t leader) {
  return "its " + spelling(group).str() + " group (led by rank " + std::to_string(leader) + ")";
}

std::string messages(int64_t n) {
  return std::to_string(n) + (n == 1 ? " message" : " messages");
}

} // namespace

TrafficSignature trafficOf(const RankPlan &plan) { return TrafficBuilder(plan).build(); }

std::string TrafficSignature::encode() const {
  std::string out;
  for (const auto &[group, traffic] : groups)
    out += "g" + std::to_string(int(group)) + "," + std::to_string(traffic.leader) + "," +
           channelText(traffic.collectives) + " ";
  for (const auto &[peer, channel] : sends)
    out += "s" + std::to_string(peer) + "," + channelText(channel) + " ";
  for (const auto &[peer, channel] : receives)
    out += "r" + std::to_string(peer) + "," + channelText(channel) + " ";
  return out;
}

std::optional<TrafficSignature> TrafficSignature::decode(llvm::StringRef text) {
  TrafficSignature sig;
  llvm::SmallVector<llvm::StringRef, 16> entries;
  text.split(entries, ' ', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef entry : entries) {
    char kind = entry.front();
    llvm::SmallVector<llvm::StringRef, 4> fields;
    entry.drop_front().split(fields, ',');
    int64_t key = 0;
    if (fields.empty() || fields[0].getAsInteger(10, key))
      return std::nullopt;
    TrafficChannel channel;
    if (kind == 'g' && fields.size() == 4 && key >= 0 && key < int64_t(spellings(Group{}).size())) {
      GroupTraffic &traffic = sig.groups[Group(key)];
      if (fields[1].getAsInteger(10, traffic.leader) ||
          !parseChannel(fields[2], fields[3], traffic.collectives))
        return std::nullopt;
    } else if ((kind == 's' || kind == 'r') && fields.size() == 3 &&
               parseChannel(fields[1], fields[2], channel)) {
      (kind == 's' ? sig.sends : sig.receives)[key] = channel;
    } else {
      return std::nullopt;
    }
  }
  return sig;
}

std::string checkTraffic(llvm::ArrayRef<TrafficSignature> ranks) {
  const int64_t world = int64_t(ranks.size());
  auto known = [&](int64_t rank) { return rank >= 0 && rank < world; };
  for (int64_t r = 0; r < world; ++r) {
    for (const auto &[group, traffic] : ranks[size_t(r)].groups) {
      const std::string rank = "rank " + std::to_string(r);
      if (!known(traffic.leader))
        return rank + "'s plan names rank " + std::to_string(traffic.leader) + " in " +
               describeGroup(group, traffic.leader) + ", which the job does not have";
      const TrafficSignature &leader = ranks[size_t(traffic.leader)];
      auto theirs = leader.groups.find(group);
      if (theirs == leader.groups.end() || theirs->second.leader != traffic.leader)
        return rank + "'s plan puts it in " + describeGroup(group, traffic.leader) +
               ", but rank " + std::to_string(traffic.leader) + "'s plan does not lead that group";
      const TrafficChannel &mine = traffic.collectives, &lead = theirs->second.collectives;
      if (mine != lead)
        return rank + "'s plan runs " + std::to_string(mine.events) + " collectives on " +
               describeGroup(group, traffic.leader) + ", rank " +
               std::to_string(traffic.leader) + "'s plan " + std::to_string(lead.events) +
               (mine.events == lead.events ? ", but not the same ones in the same order" : "") +
               "; every member must run the same collectives or they wait for each other";
    }
  }
  for (int64_t r = 0; r < world; ++r) {
    const TrafficSignature &sig = ranks[size_t(r)];
    for (bool sending : {true, false}) {
      for (const auto &[peer, mine] : sending ? sig.sends : sig.receives) {
        std::string from = "rank " + std::to_string(sending ? r : peer);
        std::string to = "rank " + std::to_string(sending ? peer : r);
        if (!known(peer) || peer == r)
          return "rank " + std::to_string(r) + "'s plan " + (sending ? "sends to" : "receives from") +
                 " rank " + std::to_string(peer) + ", which is " +
                 (peer == r ? "itself" : "not a rank of the job");
        const TrafficSignature &other = ranks[size_t(peer)];
        const auto &pairs = sending ? other.receives : other.sends;
        auto it = pairs.find(r);
        TrafficChannel theirs = it == pairs.end() ? TrafficChannel{} : it->second;
        if (mine == theirs)
          continue;
        const TrafficChannel &sent = sending ? mine : theirs;
        const TrafficChannel &received = sending ? theirs : mine;
        return from + "'s plan sends " + messages(sent.events) + " to " + to + ", and " + to +
               "'s plan receives " + messages(received.events) + " from " + from +
               (sent.events == received.events ? ", but not the same ones (tags or sizes differ)"
                                               : "") +
               "; a receive without its send waits forever";
      }
    }
  }
  return "";
}

} // namespace parc::plan
