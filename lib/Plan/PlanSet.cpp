//===- PlanSet.cpp - The plan id and the agreement of plans with their manifest ===//
//
// A rank plan is checked on its own by verifyRankPlan; what it shares with the other ranks
// (the job's summaries, the plan id, its placement) is checked against the manifest, which
// every rank reads. Summaries are compared as the JSON they are written as, so "equal" is
// "equal bit for bit" and a difference is named by its JSON path.
//
//===----------------------------------------------------------------------===//

#include "PlanVerifierInternal.h"
#include "parc/Plan/PlanJSON.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/raw_ostream.h"

#include <set>

using llvm::StringRef;
using llvm::Twine;
namespace json = llvm::json;

namespace parc::plan {

namespace {

std::string compactText(const json::Value &value) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << value;
  return os.str();
}

/// The path of the first place where `actual` differs from `expected`, keys in sorted order;
/// nothing when they are equal.
std::optional<std::string> firstDifference(const json::Value &actual, const json::Value &expected,
                                           const std::string &path) {
  if (actual.kind() != expected.kind())
    return path;
  if (const json::Object *object = actual.getAsObject()) {
    const json::Object &other = *expected.getAsObject();
    std::set<std::string> keys;
    for (const auto &entry : *object)
      keys.insert(entry.first.str());
    for (const auto &entry : other)
      keys.insert(entry.first.str());
    for (const std::string &key : keys) {
      const json::Value *a = object->get(key), *b = other.get(key);
      std::string keyPath = detail::fieldPath(path, key);
      if (!a || !b)
        return keyPath;
      if (std::optional<std::string> found = firstDifference(*a, *b, keyPath))
        return found;
    }
    return std::nullopt;
  }
  if (const json::Array *array = actual.getAsArray()) {
    const json::Array &other = *expected.getAsArray();
    if (array->size() != other.size())
      return path;
    for (size_t i = 0; i < array->size(); ++i)
      if (std::optional<std::string> found =
              firstDifference((*array)[i], other[i], detail::indexPath(path, i)))
        return found;
    return std::nullopt;
  }
  // Integers and doubles compare by their written form: 1 and 1.0 are different plans.
  if (compactText(actual) != compactText(expected))
    return path;
  return std::nullopt;
}

const json::Value *lookup(const json::Value &root, StringRef path) {
  const json::Value *value = &root;
  llvm::SmallVector<StringRef, 4> keys;
  path.split(keys, '.');
  for (StringRef key : keys) {
    if (key.contains('[')) // an array element: the whole array is shown
      key = key.take_until([](char c) { return c == '['; });
    const json::Object *object = value->getAsObject();
    value = object ? object->get(key) : nullptr;
    if (!value)
      return nullptr;
  }
  return value;
}

/// What a rank plan shares with its manifest (the job and the rank's placement), as the JSON
/// of a plan that holds nothing else.
json::Value sharedFields(int64_t world, const RankEntry &placement, const ModelSummary &model,
                         const ClusterSummary &cluster, const ParallelSummary &parallel,
                         const TrainSettings &train) {
  RankPlan plan;
  plan.world = world;
  plan.node = placement.node;
  plan.localRank = placement.localRank;
  plan.coords = placement.coords;
  plan.model = model;
  plan.cluster = cluster;
  plan.parallel = parallel;
  plan.train = train;
  return toJSON(plan);
}

} // namespace

std::string canonicalText(const Manifest &manifest) {
  json::Value value = toJSON(manifest);
  value.getAsObject()->erase("plan_id");
  return compactText(value);
}

std::string computeJobPlanId(const Manifest &manifest) {
  // The placement of ranks follows from the summaries (and verifyPlanSet checks it against the
  // plans), so the id hashes the job description alone.
  json::Value value = toJSON(manifest);
  value.getAsObject()->erase("plan_id");
  value.getAsObject()->erase("ranks");
  return computePlanId({CompilerVersion.str(), compactText(value)});
}

namespace {
bool checkManifestPlanId(detail::ReadContext &ctx, const Manifest &manifest) {
  std::string id = computeJobPlanId(manifest);
  if (id == manifest.planId)
    return true;
  return ctx.fail("plan_id", "the manifest's job hashes to " + id + ", not " + manifest.planId +
                                 "; the manifest was changed after compilation or comes from a " +
                                 "release other than " + CompilerVersion);
}
} // namespace

llvm::Error verifyManifestPlanId(const Manifest &manifest) {
  detail::ReadContext ctx("plan manifest");
  checkManifestPlanId(ctx, manifest);
  return ctx.takeError();
}

llvm::Error verifyPlanMatchesManifest(const Manifest &manifest, const RankPlan &plan) {
  detail::ReadContext ctx("rank plan");
  if (plan.rank < 0 || plan.rank >= int64_t(manifest.ranks.size())) {
    ctx.fail("rank", "rank " + Twine(plan.rank) + " is not one of the manifest's " +
                         Twine(manifest.ranks.size()) + " ranks");
    return ctx.takeError();
  }
  if (plan.planId != manifest.planId) {
    ctx.fail("plan_id", "\"" + plan.planId + "\" differs from the manifest's \"" +
                            manifest.planId + "\"; the files come from different compilations");
    return ctx.takeError();
  }
  const RankEntry &entry = manifest.ranks[size_t(plan.rank)];
  // Only these fields are compared, so only they are converted to JSON.
  json::Value expectedJSON =
      sharedFields(manifest.world, {plan.rank, entry.node, entry.localRank, entry.coords, ""},
                   manifest.model, manifest.cluster, manifest.parallel, manifest.train);
  json::Value actualJSON =
      sharedFields(plan.world, {plan.rank, plan.node, plan.localRank, plan.coords, ""},
                   plan.model, plan.cluster, plan.parallel, plan.train);
  for (StringRef key : {"world", "node", "local_rank", "coords", "model", "cluster", "parallel",
                        "train"}) {
    const json::Value &a = *actualJSON.getAsObject()->get(key);
    const json::Value &b = *expectedJSON.getAsObject()->get(key);
    if (std::optional<std::string> path = firstDifference(a, b, key.str())) {
      const json::Value *shown = lookup(actualJSON, *path), *want = lookup(expectedJSON, *path);
      ctx.fail(*path, (shown ? compactText(*shown) : std::string("nothing")) +
                          " differs from the manifest's " +
                          (want ? compactText(*want) : std::string("nothing")) +
                          "; every rank plan carries the manifest's job: regenerate the plan "
                          "directory");
      break;
    }
  }
  return ctx.takeError();
}

llvm::Error verifyPlanSet(const Manifest &manifest, llvm::ArrayRef<RankPlan> plans) {
  detail::ReadContext ctx("plan set");
  if (int64_t(plans.size()) != manifest.world) {
    ctx.fail("", "the manifest describes " + Twine(manifest.world) + " ranks but " +
                     Twine(plans.size()) + " rank plans were given");
    return ctx.takeError();
  }
  if (!checkManifestPlanId(ctx, manifest))
    return ctx.takeError();
  for (size_t r = 0; r < plans.size() && !ctx.failed(); ++r) {
    std::string where = "rank plan " + manifest.ranks[r].file;
    if (plans[r].rank != int64_t(r)) {
      ctx.fail("", where + " holds the plan of rank " + Twine(plans[r].rank) + ", not of rank " +
                       Twine(r));
    } else if (llvm::Error error = verifyPlanMatchesManifest(manifest, plans[r])) {
      // "rank plan: field ..." becomes "rank plan FILE: field ...".
      std::string message = llvm::toString(std::move(error));
      ctx.fail("", where + StringRef(message).drop_front(StringRef("rank plan").size()));
    }
  }
  return ctx.takeError();
}

} // namespace parc::plan
