//===- RankScheduleCheck.cpp - The schedules of all ranks fit together ----===//
//
// Three checks that together prove every rank runs its step to the end:
//  1. Pipeline transfers. Transfers never leave a pp group, so each pp group's ranks run
//     ScheduleVerifier's rendezvous simulation (batched transfers, each send met by exactly
//     one receive) over their own instruction lists, read back from the plans with each peer
//     mapped to its stage.
//  2. Ranks of one stage differ only in their peers: the same instructions in the same order
//     and the same collectives inside their op lists. tp and dp groups hold ranks of one stage
//     only, so their collectives (tensor parallelism's inside the computes, ZeRO-3's gathers
//     between them) sit at the same point of identical programs: running all pp groups in
//     lock step is an execution in which none of these collectives waits.
//  3. The schedules' group collectives (gradient reductions, parameter gathers, the norm
//     reduction of optimizer_step) run as rendezvous over their groups: all members must
//     reach the same collective with the same operands, and every collective must complete.
//     Those over groups that span stages (embedding, model) must follow the rank's last
//     transfer, so that they never hold up a pipeline.
//  4. Ring attention's sends and receives inside the op lists (cp > 1): cp groups hold ranks
//     of one stage too, so their members post their k-th batch of point-to-point ops together;
//     every such batch must pair each send with the peer's receive of the same size.
//
//===----------------------------------------------------------------------===//
#include "LowerInternal.h"

#include "parc/Lower/ScheduleVerifier.h"

#include "llvm/Support/Parallel.h"

#include <algorithm>
#include <deque>
#include <map>
#include <optional>

namespace parc::lower {

namespace {

using plan::Instr;
using plan::InstrKind;
using plan::RankPlan;

llvm::Error failure(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

std::string rankList(const std::vector<int64_t> &ranks) {
  std::string text = "[";
  for (size_t i = 0; i < ranks.size(); ++i)
    text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text + "]";
}

std::optional<PipeOpKind> pipeKind(InstrKind op) {
  switch (op) {
  case InstrKind::Forward:
    return PipeOpKind::Forward;
  case InstrKind::Backward:
    return PipeOpKind::Backward;
  case InstrKind::SendAct:
    return PipeOpKind::SendActivation;
  case InstrKind::RecvAct:
    return PipeOpKind::RecvActivation;
  case InstrKind::SendGrad:
    return PipeOpKind::SendGradient;
  case InstrKind::RecvGrad:
    return PipeOpKind::RecvGradient;
  default:
    return std::nullopt;
  }
}

/// The pipeline transfers of the pp group `group` in ScheduleVerifier's simulation.
std::string checkPipeline(const Job &job, llvm::ArrayRef<RankPlan> plans,
                          const std::vector<int64_t> &group) {
  std::vector<StageProgram> programs(group.size());
  for (size_t stage = 0; stage < group.size(); ++stage) {
    const RankPlan &plan = plans[group[stage]];
    programs[stage].reserve(plan.schedule.size());
    for (const Instr &instr : plan.schedule) {
      std::optional<PipeOpKind> kind = pipeKind(instr.op);
      if (!kind)
        continue;
      int64_t peerStage = -1;
      if (plan::isTransfer(instr.op)) {
        bool inGroup = instr.peer >= 0 && instr.peer < int64_t(plans.size()) &&
                       group[plans[instr.peer].coords.pp] == instr.peer;
        if (!inGroup)
          return "rank " + std::to_string(plan.rank) + " has a transfer with rank " +
                 std::to_string(instr.peer) + ", outside its pipeline " + rankList(group);
        peerStage = plans[instr.peer].coords.pp;
      }
      programs[stage].push_back({*kind, int16_t(instr.chunk), int16_t(instr.microbatch),
                                 int16_t(peerStage)});
    }
  }
  ScheduleVerdict verdict = verifySchedule(job.pipeline, programs);
  if (verdict.ok())
    return "";
  return "the pipeline of ranks " + rankList(group) +
         " (stage i is the i-th) fails the rendezvous simulation: " + verdict.error;
}

llvm::Error checkPipelines(const Job &job, llvm::ArrayRef<RankPlan> plans) {
  std::vector<const std::vector<int64_t> *> groups;
  for (const RankPlan &plan : plans)
    if (plan.coords.pp == 0)
      groups.push_back(&plan.groups.pp);
  return firstFailure(groups.size(),
                      [&](size_t i) { return checkPipeline(job, plans, *groups[i]); });
}

bool isPointToPoint(plan::OpKind kind) {
  return kind == plan::OpKind::Send || kind == plan::OpKind::Recv;
}

/// How far ahead along its group's list the peer of a send or recv op of `plan` is.
int64_t peerDistance(const RankPlan &plan, const plan::Op &op) {
  const std::vector<int64_t> &members = plan.groups.get(op.groupAttr("group"));
  int64_t size = int64_t(members.size());
  int64_t self = std::find(members.begin(), members.end(), plan.rank) - members.begin();
  return ((op.intAttr("peer") - self) % size + size) % size;
}

/// The collectives inside a chunk's op lists, in order: kind, group and dimension, or for a
/// point-to-point op the distance to its peer (ring attention's next and previous rank).
std::vector<std::tuple<plan::OpKind, std::string, int64_t>>
collectivesOf(const RankPlan &plan, const plan::Chunk &chunk) {
  std::vector<std::tuple<plan::OpKind, std::string, int64_t>> sequence;
  for (const std::vector<plan::Op> *ops : {&chunk.forward, &chunk.backward})
    for (const plan::Op &op : *ops) {
      auto group = op.attrs.find("group");
      if (group == op.attrs.end())
        continue;
      auto dim = op.attrs.find("dim");
      int64_t extra = isPointToPoint(op.kind)   ? peerDistance(plan, op)
                      : dim == op.attrs.end() ? -1
                                              : std::get<int64_t>(dim->second);
      sequence.emplace_back(op.kind, std::get<std::string>(group->second), extra);
    }
  return sequence;
}

/// Equal but for the peer, which must be on the same stage.
bool sameInstruction(const Instr &a, const Instr &b, llvm::ArrayRef<RankPlan> plans) {
  if (a.op != b.op || a.chunk != b.chunk || a.microbatch != b.microbatch || a.group != b.group ||
      a.average != b.average || a.params != b.params || a.normGroups != b.normGroups ||
      (a.peer < 0) != (b.peer < 0))
    return false;
  return a.peer < 0 || plans[a.peer].coords.pp == plans[b.peer].coords.pp;
}

/// Rank `plan` against the rank with tp and dp coordinate 0 of its stage.
std::string checkStageAlike(const Job &job, llvm::ArrayRef<RankPlan> plans, const RankPlan &plan) {
  int64_t modelRank = job.mapping.layout.rankOf(Coords{0, plan.coords.pp, 0});
  if (modelRank == plan.rank)
    return "";
  const RankPlan &model = plans[modelRank];
  std::string both = "ranks " + std::to_string(modelRank) + " and " + std::to_string(plan.rank) +
                     " of stage " + std::to_string(plan.coords.pp);
  if (plan.schedule.size() != model.schedule.size())
    return both + " have schedules of different lengths";
  for (size_t i = 0; i < plan.schedule.size(); ++i)
    if (!sameInstruction(plan.schedule[i], model.schedule[i], plans))
      return both + " differ at schedule[" + std::to_string(i) + "]";
  for (size_t c = 0; c < plan.chunks.size(); ++c)
    if (collectivesOf(plan, plan.chunks[c]) != collectivesOf(model, model.chunks[c]))
      return both + " run different collectives in chunk " + std::to_string(c);
  return "";
}

llvm::Error checkStagesAlike(const Job &job, llvm::ArrayRef<RankPlan> plans) {
  return firstFailure(plans.size(),
                      [&](size_t i) { return checkStageAlike(job, plans, plans[i]); });
}

/// One op-level send or receive: its peer (a global rank) and the elements it moves.
struct PointToPoint {
  bool send;
  int64_t peer, elements;
};

/// The maximal runs of consecutive send and recv ops of one op list: each is posted together.
std::vector<std::vector<PointToPoint>> pointToPointRuns(const RankPlan &plan,
                                                        const plan::Chunk &chunk,
                                                        const std::vector<plan::Op> &ops) {
  std::vector<std::vector<PointToPoint>> runs;
  bool inRun = false;
  for (const plan::Op &op : ops) {
    if (!isPointToPoint(op.kind)) {
      inRun = false;
      continue;
    }
    if (!inRun)
      runs.emplace_back();
    inRun = true;
    bool send = op.kind == plan::OpKind::Send;
    const std::vector<int64_t> &shape =
        chunk.tensors.at(send ? op.inputs.front() : op.outputs.front()).shape;
    int64_t elements = 1;
    for (int64_t d : shape)
      elements *= d;
    runs.back().push_back(
        {send, plan.groups.get(op.groupAttr("group"))[size_t(op.intAttr("peer"))], elements});
  }
  return runs;
}

/// The n-th message from `from` among `run`'s sends (or receives): its elements, or -1.
int64_t nthMessage(const std::vector<PointToPoint> &run, bool send, int64_t other, size_t n) {
  for (const PointToPoint &m : run)
    if (m.send == send && m.peer == other && n-- == 0)
      return m.elements;
  return -1;
}

/// Ring attention's exchanges inside the op lists: every member of a cp group posts its k-th
/// run of a chunk's list when all do (the ranks of a stage run alike), so the runs pair up iff
/// the k-th run of every member sends each peer exactly what that peer's k-th run receives
/// from it, message by message.
std::string checkRing(llvm::ArrayRef<RankPlan> plans, const std::vector<int64_t> &group) {
  const RankPlan &first = plans[group.front()];
  for (size_t c = 0; c < first.chunks.size(); ++c)
    for (bool backward : {false, true}) {
      std::map<int64_t, std::vector<std::vector<PointToPoint>>> runs;
      for (int64_t member : group) {
        const plan::Chunk &chunk = plans[member].chunks[c];
        runs[member] = pointToPointRuns(plans[member], chunk,
                                        backward ? chunk.backward : chunk.forward);
      }
      std::string where = std::string(backward ? "backward" : "forward") + " of chunk " +
                          std::to_string(c) + " in cp group " + rankList(group);
      for (int64_t member : group) {
        if (runs[member].size() != runs[group.front()].size())
          return "ranks " + std::to_string(group.front()) + " and " + std::to_string(member) +
                 " post different numbers of point-to-point runs in the " + where;
        for (size_t k = 0; k < runs[member].size(); ++k) {
          std::map<std::pair<bool, int64_t>, size_t> seen;
          for (const PointToPoint &m : runs[member][k]) {
            size_t n = seen[{m.send, m.peer}]++;
            if (nthMessage(runs[m.peer][k], !m.send, member, n) != m.elements)
              return "rank " + std::to_string(member) + "'s " + (m.send ? "send to" : "recv from") +
                     " rank " + std::to_string(m.peer) + " in point-to-point run " +
                     std::to_string(k) + " of the " + where + " has no matching " +
                     (m.send ? "recv" : "send") + " of " + std::to_string(m.elements) +
                     " elements";
          }
        }
      }
    }
  return "";
}

llvm::Error checkRings(llvm::ArrayRef<RankPlan> plans) {
  std::vector<const std::vector<int64_t> *> groups;
  for (const RankPlan &plan : plans)
    if (plan.coords.cp == 0 && plan.groups.cp.size() > 1)
      groups.push_back(&plan.groups.cp);
  return firstFailure(groups.size(), [&](size_t i) { return checkRing(plans, *groups[i]); });
}

/// One rendezvous of a rank's schedule: a gradient or parameter collective, or one group of
/// optimizer_step's norm reduction.
struct Collective {
  plan::Group group;
  const Instr *instr;
  size_t index; // in the schedule
};

bool spansStages(plan::Group group) {
  return group == plan::Group::Embedding || group == plan::Group::Model || group == plan::Group::PP;
}

std::string describe(const Collective &call) {
  return "'" + plan::spelling(call.instr->op).str() + "' over " + plan::spelling(call.group).str() +
         " (schedule[" + std::to_string(call.index) + "])";
}

llvm::Error checkCollectives(llvm::ArrayRef<RankPlan> plans) {
  std::vector<std::vector<Collective>> calls(plans.size());
  for (const RankPlan &plan : plans) {
    size_t lastTransfer = 0;
    bool anyTransfer = false;
    for (size_t i = 0; i < plan.schedule.size(); ++i) {
      const Instr &instr = plan.schedule[i];
      if (plan::isTransfer(instr.op)) {
        lastTransfer = i;
        anyTransfer = true;
      } else if (instr.op == InstrKind::OptimizerStep) {
        for (plan::Group group : instr.normGroups)
          calls[plan.rank].push_back({group, &instr, i});
      } else if (instr.op != InstrKind::ReleaseParams && plan::usesParams(instr.op)) {
        calls[plan.rank].push_back({instr.group, &instr, i});
      }
    }
    for (const Collective &call : calls[plan.rank])
      if (anyTransfer && spansStages(call.group) && call.index < lastTransfer)
        return failure("rank " + llvm::Twine(plan.rank) + " runs " + describe(call) +
                       " before its last transfer; a collective across stages there could "
                       "stall the pipeline");
  }

  std::vector<size_t> next(plans.size(), 0);
  std::map<std::pair<plan::Group, int64_t>, std::vector<int64_t>> arrived;
  std::deque<int64_t> ready;
  for (const RankPlan &plan : plans)
    ready.push_back(plan.rank);
  while (!ready.empty()) {
    int64_t rank = ready.front();
    ready.pop_front();
    if (next[rank] == calls[rank].size())
      continue;
    const Collective &call = calls[rank][next[rank]];
    const std::vector<int64_t> &members = plans[rank].groups.get(call.group);
    std::vector<int64_t> &waiting = arrived[{call.group, members.front()}];
    waiting.push_back(rank);
    if (waiting.size() < members.size())
      continue;
    for (int64_t other : waiting) {
      const Collective &theirs = calls[other][next[other]];
      if (theirs.group != call.group || theirs.instr->op != call.instr->op ||
          theirs.instr->average != call.instr->average ||
          theirs.instr->params != call.instr->params ||
          plans[other].groups.get(call.group) != members)
        return failure("rank " + llvm::Twine(rank) + "'s " + describe(call) + " meets rank " +
                       llvm::Twine(other) + "'s " + describe(theirs) +
                       "; the members of a group must run the same collectives in order");
    }
    for (int64_t other : waiting) {
      ++next[other];
      ready.push_back(other);
    }
    waiting.clear();
  }
  for (const RankPlan &plan : plans)
    if (next[plan.rank] < calls[plan.rank].size()) {
      const Collective &call = calls[plan.rank][next[plan.rank]];
      return failure("deadlock: rank " + llvm::Twine(plan.rank) + " waits forever in " +
                     describe(call) + " of group " + rankList(plan.groups.get(call.group)));
    }
  return llvm::Error::success();
}

} // namespace

llvm::Error firstFailure(size_t count, llvm::function_ref<std::string(size_t)> check) {
  std::vector<std::string> problems(count);
  llvm::parallelForEachN(0, count, [&](size_t i) { problems[i] = check(i); });
  for (const std::string &problem : problems)
    if (!problem.empty())
      return failure(problem);
  return llvm::Error::success();
}

llvm::Error checkRankSchedules(const Job &job, llvm::ArrayRef<RankPlan> plans) {
  if (llvm::Error error = checkPipelines(job, plans))
    return error;
  if (llvm::Error error = checkStagesAlike(job, plans))
    return error;
  if (llvm::Error error = checkRings(plans))
    return error;
  return checkCollectives(plans);
}

} // namespace parc::lower
