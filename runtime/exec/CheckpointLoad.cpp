//===- CheckpointLoad.cpp - parrun --resume: read and verify a checkpoint -===//
//
// Every byte is checked before it is believed: the manifest against its own checksum, then
// this rank's file against the size and checksum the manifest records, then the sections of
// its header against what this rank holds.
//
//===----------------------------------------------------------------------===//

#include "CheckpointFormat.h"
#include "Devices.h"
#include "parc/Plan/JSONReader.h"
#include "parc/Support/FileInput.h"
#include "parc/Support/Limits.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cmath>
#include <algorithm>
#include <map>
#include <stdexcept>

namespace parc::runtime {

using namespace checkpoint;

namespace {

using plan::detail::ObjectReader;

/// One JSON document of a checkpoint, read field by field with the plan readers' ObjectReader:
/// a field that is missing or of the wrong type is thrown at once, named by its path.
class DocumentReader {
public:
  DocumentReader(std::string file, llvm::StringRef document)
      : file(std::move(file)), ctx(document) {}

  [[noreturn]] void fail(const llvm::Twine &message) const {
    throw std::runtime_error(file + ": " + message.str());
  }
  void check() const {
    if (ctx.failed())
      fail(llvm::toString(ctx.takeError()));
  }
  ObjectReader object(const llvm::json::Value &value, std::string path = "") {
    ObjectReader reader(ctx, value, std::move(path));
    check();
    return reader;
  }
  ObjectReader object(ObjectReader &parent, llvm::StringRef key) {
    const llvm::json::Value *value = parent.get(key);
    check();
    return object(*value, parent.pathOf(key));
  }
  template <typename V> V get(ObjectReader &reader, llvm::StringRef key) {
    V value{};
    reader.read(key, value);
    check();
    return value;
  }
  const llvm::json::Array &array(ObjectReader &reader, llvm::StringRef key) {
    const llvm::json::Value *value = reader.get(key);
    const llvm::json::Array *array =
        value ? plan::detail::readArray(ctx, *value, reader.pathOf(key)) : nullptr;
    check();
    return *array;
  }
  /// Numbers, nan for null: the norms of skipped steps.
  std::vector<double> numbersOrNull(ObjectReader &reader, llvm::StringRef key) {
    const llvm::json::Array &values = array(reader, key);
    std::vector<double> numbers(values.size(), std::nan(""));
    for (size_t i = 0; i < values.size(); ++i)
      if (values[i].kind() != llvm::json::Value::Null)
        plan::detail::readNumber(ctx, values[i], plan::detail::indexPath(reader.pathOf(key), i),
                                 numbers[i]);
    check();
    return numbers;
  }
  /// Rejects the keys of `reader` that were never read.
  void finish(ObjectReader &reader) {
    reader.finish();
    check();
  }
  /// The JSON value of `text`, or a thrown complaint.
  llvm::json::Value parse(llvm::StringRef text) const {
    if (jsonTooDeepAt(text, unsigned(limits::MaxJSONDepth)) != llvm::StringRef::npos)
      fail("not JSON: nested deeper than " + std::to_string(limits::MaxJSONDepth) + " levels");
    llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(text);
    if (!parsed)
      fail("not JSON: " + llvm::toString(parsed.takeError()));
    return std::move(*parsed);
  }

private:
  std::string file;
  plan::detail::ReadContext ctx;
};

/// `path`, refused beyond `maxBytes`: the manifest is as small as a plan, a rank file as
/// large as the manifest records.
std::unique_ptr<llvm::MemoryBuffer> readFile(const std::string &path, int64_t maxBytes) {
  llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>> file =
      readRegularFile(path, maxBytes, /*RequiresNullTerminator=*/false);
  if (!file)
    throw std::runtime_error("cannot read " + path + ": " + llvm::toString(file.takeError()));
  return std::move(*file);
}

/// The manifest's state, after its checksum; `mine` receives what it records of this rank's
/// file.
CheckpointState readManifest(const plan::RankPlan &plan, const CheckpointRun &run,
                             llvm::StringRef dir, FileDigest &mine) {
  std::string path = join(dir, "manifest.json");
  std::string old = dir.str() + ".old";
  if (!llvm::sys::fs::exists(path) && llvm::sys::fs::exists(join(old, "manifest.json")))
    throw std::runtime_error(path + " is missing, and " + old +
                             " holds the checkpoint before an interrupted save: resume from " +
                             old);
  std::unique_ptr<llvm::MemoryBuffer> file = readFile(path, limits::MaxPlanFileBytes);
  DocumentReader doc(path, "checkpoint manifest");
  llvm::json::Value parsed = doc.parse(file->getBuffer());
  ObjectReader manifest = doc.object(parsed);
  std::string format = doc.get<std::string>(manifest, "format");
  if (format != ManifestFormat)
    doc.fail("not a parrun checkpoint (format '" + format + "', not '" + ManifestFormat + "')");
  // Before any other field is believed.
  std::string recorded = doc.get<std::string>(manifest, "xxh64");
  std::string actual = manifestChecksum(*parsed.getAsObject());
  if (recorded != actual)
    doc.fail("does not match its checksum (xxh64 " + actual + ", recorded " + recorded +
             "): it is damaged or was edited; resume from another checkpoint");
  const llvm::json::Array &files = doc.array(manifest, "files");
  if (int64_t(files.size()) != plan.world)
    doc.fail("lists " + llvm::Twine(files.size()) + " rank files, not " + llvm::Twine(plan.world));
  ObjectReader entry = doc.object(files[size_t(plan.rank)],
                                  plan::detail::indexPath(manifest.pathOf("files"), plan.rank));
  if (doc.get<std::string>(entry, "name") != rankFileName(plan.rank))
    doc.fail("names another file than " + rankFileName(plan.rank) + " for rank " +
             llvm::Twine(plan.rank));
  mine.bytes = doc.get<int64_t>(entry, "bytes");
  mine.xxh64 = doc.get<std::string>(entry, "xxh64");
  doc.finish(entry);
  std::string planId = doc.get<std::string>(manifest, "plan_id");
  if (planId != plan.planId)
    doc.fail("saved from plan " + planId + ", but these plans are " + plan.planId +
             "; a checkpoint resumes only the plans it was saved from");
  int64_t world = doc.get<int64_t>(manifest, "world");
  if (world != plan.world)
    doc.fail("saved by " + llvm::Twine(world) + " ranks, not " + llvm::Twine(plan.world));
  std::string precision = doc.get<std::string>(manifest, "precision");
  if (precision != run.precision)
    doc.fail("saved in " + precision + "; resume with --precision=" + precision);
  std::string data = doc.get<std::string>(manifest, "data");
  if (data != run.data)
    doc.fail("saved training on " + data + ", not " + run.data + "; resume with the same --data");
  ObjectReader scale = doc.object(manifest, "loss_scale");
  std::string options = doc.get<std::string>(scale, "options");
  if (options != run.lossScale.flags())
    doc.fail("saved with " + options + "; resume with the same");
  CheckpointState state;
  state.step = doc.get<int64_t>(manifest, "step");
  state.updates = doc.get<int64_t>(manifest, "updates");
  state.lossScale = {doc.get<double>(scale, "scale"), doc.get<int64_t>(scale, "finite_in_a_row"),
                     doc.get<int64_t>(scale, "overflows_left")};
  doc.finish(scale);
  const LossScaler::State &s = state.lossScale;
  if (!(s.scale > 0 && std::isfinite(s.scale)) || s.finiteInARow < 0 || s.overflowsLeft < 0 ||
      (run.lossScale.mode == LossScaleOptions::Mode::Dynamic &&
       (s.scale < run.lossScale.min || s.finiteInARow >= run.lossScale.window ||
        s.overflowsLeft > run.lossScale.hysteresis)))
    doc.fail("holds a loss scaler state that these settings cannot reach (scale " +
             formatLossScale(s.scale) + ")");
  state.losses = doc.numbersOrNull(manifest, "losses");
  state.gradNorms = doc.numbersOrNull(manifest, "grad_norms");
  doc.finish(manifest);
  if (state.step < 0 || state.updates < 0 || state.updates > state.step ||
      int64_t(state.losses.size()) != state.step || int64_t(state.gradNorms.size()) != state.step)
    doc.fail("inconsistent: step " + llvm::Twine(state.step) + ", updates " +
             llvm::Twine(state.updates) + ", " + llvm::Twine(state.losses.size()) + " losses");
  return state;
}

template <typename D>
void readRankFile(ParamStore<D> &params, const plan::RankPlan &plan, const std::string &path,
                  const FileDigest &recorded) {
  using T = typename D::Value;
  using OptState = typename D::OptState;
  std::unique_ptr<llvm::MemoryBuffer> file = readFile(path, std::max<int64_t>(recorded.bytes, 0));
  llvm::StringRef bytes = file->getBuffer();
  // Before any byte is believed: a flipped byte in a section would load silently.
  if (int64_t(bytes.size()) != recorded.bytes)
    throw std::runtime_error(path + ": is " + std::to_string(bytes.size()) +
                             " bytes, but manifest.json records " +
                             std::to_string(recorded.bytes) +
                             ": the file is truncated or damaged; resume from another checkpoint");
  FileDigest actual = FileDigest::of(bytes);
  if (actual.xxh64 != recorded.xxh64)
    throw std::runtime_error(path + ": does not match its checksum in manifest.json (xxh64 " +
                             actual.xxh64 + ", recorded " + recorded.xxh64 +
                             "): the file is damaged; resume from another checkpoint");
  size_t newline = bytes.find('\n');
  if (newline == llvm::StringRef::npos)
    throw std::runtime_error(path + ": no header line");
  DocumentReader doc(path, "checkpoint rank file header");
  llvm::json::Value parsed = doc.parse(bytes.take_front(newline));
  ObjectReader header = doc.object(parsed);
  if (doc.get<std::string>(header, "format") != RankFormat)
    doc.fail("not a parrun checkpoint rank file");
  int64_t rank = doc.get<int64_t>(header, "rank");
  std::string planId = doc.get<std::string>(header, "plan_id");
  if (rank != plan.rank || planId != plan.planId)
    doc.fail("belongs to rank " + llvm::Twine(rank) + " of plan " + planId + ", not rank " +
             llvm::Twine(plan.rank) + " of " + plan.planId);
  int64_t valueBytes = doc.get<int64_t>(header, "value_bytes");
  if (valueBytes != int64_t(sizeof(T)) ||
      doc.get<int64_t>(header, "state_bytes") != int64_t(sizeof(OptState)))
    doc.fail("holds values of " + llvm::Twine(valueBytes) + " bytes, not " +
             llvm::Twine(sizeof(T)));

  // Where each section may go, and how large it must be.
  std::map<std::pair<std::string, std::string>, Section> expected;
  for (Section &section : sectionsOf(params, /*unallocatedState=*/true))
    expected[{section.owner, section.kind}] = section;

  D &dev = params.device();
  size_t offset = newline + 1;
  std::map<std::pair<std::string, std::string>, bool> loaded;
  const llvm::json::Array &sections = doc.array(header, "sections");
  doc.finish(header);
  for (size_t i = 0; i < sections.size(); ++i) {
    ObjectReader section =
        doc.object(sections[i], plan::detail::indexPath(header.pathOf("sections"), i));
    std::pair<std::string, std::string> key{doc.get<std::string>(section, "owner"),
                                            doc.get<std::string>(section, "kind")};
    int64_t size = doc.get<int64_t>(section, "bytes");
    doc.finish(section);
    auto slot = expected.find(key);
    if (slot == expected.end())
      doc.fail("has " + key.second + " of '" + key.first + "', which this rank does not hold");
    if (size != int64_t(slot->second.bytes))
      doc.fail(key.second + " of '" + key.first + "' is " + llvm::Twine(size) + " bytes, not " +
               llvm::Twine(slot->second.bytes));
    if (loaded[key])
      doc.fail("has " + key.second + " of '" + key.first + "' twice");
    if (offset + size_t(size) > bytes.size())
      doc.fail("is truncated: " + llvm::Twine(bytes.size()) + " bytes, " + key.second + " of '" +
               key.first + "' ends at " + llvm::Twine(offset + size_t(size)));
    void *target = slot->second.data;
    if (!target) {
      // Optimizer state exists from the first update on; a checkpoint taken after it has it.
      auto *param = params.find(key.first);
      auto &buffer = key.second == "master"    ? param->master
                     : key.second == "moment1" ? param->moment1
                                               : param->moment2;
      if (!buffer.allocated())
        buffer = params.optimizerBuffer(size_t(param->ownedCount()));
      target = buffer.data();
    }
    dev.loadBytes(target, bytes.data() + offset, size_t(size));
    offset += size_t(size);
    loaded[key] = true;
  }
  if (offset != bytes.size())
    doc.fail("has " + llvm::Twine(bytes.size() - offset) + " bytes after its last section");
  for (const auto &[key, section] : expected)
    if ((key.second == "value" || key.second == "owned") && !loaded[key])
      doc.fail("has no " + key.second + " of '" + key.first + "'");
}

} // namespace

template <typename D>
CheckpointState loadCheckpoint(Communicator &comm, ParamStore<D> &params,
                               const plan::RankPlan &plan, const CheckpointRun &run,
                               llvm::StringRef dir) {
  CheckpointState state;
  std::string failure;
  try {
    FileDigest recorded;
    state = readManifest(plan, run, dir, recorded);
    readRankFile(params, plan, join(dir, rankFileName(plan.rank)), recorded);
  } catch (const std::runtime_error &error) {
    failure = error.what();
  }
  agreeOnFailure(comm, failure, "--resume " + dir.str());
  return state;
}

#define INSTANTIATE(D)                                                                             \
  template CheckpointState loadCheckpoint(Communicator &, ParamStore<D> &, const plan::RankPlan &, \
                                          const CheckpointRun &, llvm::StringRef);
PARC_FOR_EACH_DEVICE(INSTANTIATE)
#undef INSTANTIATE

} // namespace parc::runtime
