//===- PlanLoader.cpp - One rank's plan, and the start-up handshake -------===//

#include "parc/Runtime/PlanLoader.h"

#include "parc/Plan/PlanJSON.h"
#include "parc/Plan/PlanTraffic.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <set>

namespace parc::runtime {

namespace {
llvm::Error loadError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

std::string joinPath(llvm::StringRef dir, llvm::StringRef file) {
  llvm::SmallString<256> path(dir);
  llvm::sys::path::append(path, file);
  return std::string(path);
}

/// What one rank contributes to the handshake: 'E' and its error, or 'K' and the tab-separated
/// facts the others check.
struct Status {
  bool ok = false;
  std::string error;
  int64_t world = 0;
  std::string planId, manifestId;
  plan::TrafficSignature traffic;

  std::string encode() const {
    if (!ok)
      return "E" + error;
    return "K" + std::to_string(world) + "\t" + planId + "\t" + manifestId + "\t" +
           traffic.encode();
  }
  static Status decode(llvm::StringRef text) {
    Status status;
    if (text.consume_front("E")) {
      status.error = text.str();
      return status;
    }
    text.consume_front("K");
    llvm::SmallVector<llvm::StringRef, 4> fields;
    text.split(fields, '\t');
    std::optional<plan::TrafficSignature> traffic;
    if (fields.size() == 4)
      traffic = plan::TrafficSignature::decode(fields[3]);
    status.ok = traffic && !fields[0].getAsInteger(10, status.world);
    if (!status.ok) {
      status.error = "sent a malformed handshake";
      return status;
    }
    status.planId = fields[1].str();
    status.manifestId = fields[2].str();
    status.traffic = std::move(*traffic);
    return status;
  }
};

std::string rankList(llvm::ArrayRef<int64_t> ranks) {
  std::vector<std::string> names;
  for (int64_t rank : ranks)
    names.push_back(std::to_string(rank));
  return llvm::join(names, ", ");
}

/// The one message every rank raises, computed from everyone's status alike.
std::string checkStatuses(llvm::ArrayRef<Status> statuses, int64_t world, llvm::StringRef planDir) {
  std::vector<int64_t> failed;
  std::set<std::string> distinct;
  for (size_t r = 0; r < statuses.size(); ++r)
    if (!statuses[r].ok) {
      failed.push_back(int64_t(r));
      distinct.insert(statuses[r].error);
    }
  if (!failed.empty()) {
    const Status &first = statuses[size_t(failed.front())];
    if (distinct.size() == 1 && failed.size() == statuses.size())
      return first.error;
    std::string message = "rank " + std::to_string(failed.front()) + ": " + first.error;
    if (failed.size() > 1)
      message += " (ranks " + rankList(llvm::ArrayRef<int64_t>(failed).drop_front()) +
                 " failed to load too)";
    return message;
  }
  const Status &reference = statuses.front();
  if (reference.world != world)
    return "the plans in '" + planDir.str() + "' are for " + std::to_string(reference.world) +
           " ranks but this job has " + std::to_string(world) + "; launch it as `mpirun -np " +
           std::to_string(reference.world) + " parrun " + planDir.str() + "`";
  for (size_t r = 0; r < statuses.size(); ++r) {
    const Status &status = statuses[r];
    if (status.planId != reference.planId)
      return "rank " + std::to_string(r) + " loaded plan id " + status.planId +
             " but rank 0 loaded plan id " + reference.planId + ": '" + planDir.str() +
             "' mixes the plans of different compilations; regenerate it with `parc FILE.par -o " +
             planDir.str() + "`";
    if (status.manifestId != status.planId)
      return "rank " + std::to_string(r) + " loaded plan id " + status.planId +
             " but the manifest says " + status.manifestId + ": '" + planDir.str() +
             "' mixes the plans of different compilations; regenerate it with `parc FILE.par -o " +
             planDir.str() + "`";
    if (status.world != reference.world)
      return "rank " + std::to_string(r) + " loaded a plan for " + std::to_string(status.world) +
             " ranks but rank 0 one for " + std::to_string(reference.world) +
             "; regenerate the plans";
  }
  std::vector<plan::TrafficSignature> traffic;
  for (const Status &status : statuses)
    traffic.push_back(status.traffic);
  std::string disagreement = plan::checkTraffic(traffic);
  if (!disagreement.empty())
    return disagreement + "; the plans in '" + planDir.str() +
           "' were edited or come from different compilations: regenerate them with `parc "
           "FILE.par -o " + planDir.str() + "`";
  return "";
}
} // namespace

llvm::Expected<plan::Manifest> loadManifest(llvm::StringRef planDir) {
  if (!llvm::sys::fs::is_directory(planDir)) {
    std::string reason =
        llvm::sys::fs::exists(planDir) ? "it is not a directory" : "no such directory";
    return loadError("cannot read plan directory '" + planDir + "': " + reason +
                     "; write one with `parc FILE.par -o " + planDir + "`");
  }
  std::string path = joinPath(planDir, plan::ManifestFileName);
  llvm::Expected<plan::Manifest> manifest = plan::readManifest(path);
  if (!manifest)
    return manifest.takeError();
  if (llvm::Error error = plan::verifyManifestPlanId(*manifest))
    return loadError(path + ": " + llvm::toString(std::move(error)));
  return manifest;
}

llvm::Expected<plan::RankPlan> loadRankPlan(llvm::StringRef planDir, const plan::Manifest &manifest,
                                            int64_t rank) {
  if (rank >= int64_t(manifest.ranks.size()))
    return loadError("the manifest in '" + planDir + "' lists " +
                     llvm::Twine(manifest.ranks.size()) + " ranks, so rank " + llvm::Twine(rank) +
                     " has no plan; launch as many ranks as the plan has");
  std::string path = joinPath(planDir, manifest.ranks[size_t(rank)].file);
  // The summaries of every rank are the manifest's, so the ranks agree on the job; they are
  // compared before the checks that read them.
  llvm::Expected<plan::RankPlan> plan = plan::readRankPlan(path, &manifest);
  if (!plan)
    return plan.takeError();
  if (plan->rank != rank)
    return loadError(path + " holds the plan of rank " + llvm::Twine(plan->rank) +
                     ", not of rank " + llvm::Twine(rank) + "; regenerate the plan directory");
  return plan;
}

LoadedJob loadAndAgree(Communicator &comm, const RunOptions &options) {
  Status mine;
  std::optional<plan::RankPlan> plan;
  std::optional<TokenStream> data;
  llvm::Expected<plan::Manifest> manifest = loadManifest(options.planDir);
  if (!manifest) {
    mine.error = llvm::toString(manifest.takeError());
  } else if (llvm::Expected<plan::RankPlan> loaded =
                 loadRankPlan(options.planDir, *manifest, comm.rank())) {
    plan = std::move(*loaded);
    mine.ok = true;
    mine.world = plan->world;
    mine.planId = plan->planId;
    mine.manifestId = manifest->planId;
    mine.traffic = plan::trafficOf(*plan);
  } else {
    mine.error = llvm::toString(loaded.takeError());
  }
  if (mine.ok && !options.dataPath.empty()) {
    llvm::Expected<TokenStream> text =
        TokenStream::fromFile(options.dataPath, plan->model.vocab, plan->model.seq);
    if (text) {
      data = std::move(*text);
    } else {
      mine.ok = false;
      mine.error = llvm::toString(text.takeError());
    }
  }

  std::vector<Status> statuses;
  for (const std::string &text : comm.agree(mine.encode()))
    statuses.push_back(Status::decode(text));
  std::string problem = checkStatuses(statuses, comm.world(), options.planDir);
  if (!problem.empty())
    throw AgreedError(problem);
  if (!data)
    data = TokenStream::synthetic(plan->model.vocab);
  return LoadedJob{std::move(*plan), std::move(*data)};
}

} // namespace parc::runtime
