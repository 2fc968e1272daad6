//===- Checkpoint.cpp - Save and restore a rank's training state ----------===//

#include "parc/Runtime/Checkpoint.h"

#include "Devices.h"
#include "parc/Plan/JSONReader.h"
#include "parc/Runtime/Executor.h"
#include "parc/Support/FileInput.h"
#include "parc/Support/FileOutput.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

namespace parc::runtime {

namespace {

constexpr llvm::StringLiteral ManifestFormat = "parrun-checkpoint/1";
constexpr llvm::StringLiteral RankFormat = "parrun-checkpoint-rank/1";

std::string rankFileName(int64_t rank) {
  std::string name;
  llvm::raw_string_ostream(name) << llvm::format("rank-%05lld.ckpt", (long long)rank);
  return name;
}

std::string join(llvm::StringRef dir, llvm::StringRef name) {
  llvm::SmallString<256> path(dir);
  llvm::sys::path::append(path, name);
  return std::string(path);
}

/// Every rank learns the first rank's failure (in rank order), or nothing.
void agreeOnFailure(Communicator &comm, const std::string &mine, llvm::StringRef what) {
  for (const std::string &failure : comm.agree(mine))
    if (!failure.empty())
      throw AgreedError(what.str() + ": " + failure);
}

/// writeFile's error as text, empty when there is none (agreeOnFailure's currency).
std::string writeFileOrFailure(llvm::StringRef path,
                               llvm::function_ref<void(llvm::raw_ostream &)> write) {
  if (llvm::Error error = writeFile(path, write))
    return llvm::toString(std::move(error));
  return "";
}

/// One buffer of a rank's file: whose, what, and where it lives on the device.
struct Section {
  std::string owner; // a shard's name, or "partition N"
  std::string kind;  // value, master, moment1, moment2, owned
  void *data = nullptr;
  size_t bytes = 0;
};

/// The buffers a rank's file holds: each shard's values unless released, its optimizer state
/// (where allocated, or with `unallocatedState` also where not yet, at a null address), and
/// the owned range of each released partition.
template <typename D>
std::vector<Section> sectionsOf(ParamStore<D> &params, bool unallocatedState = false) {
  using T = typename D::Value;
  using OptState = typename D::OptState;
  std::vector<Section> sections;
  for (auto &param : params.all()) {
    const std::string &name = param.shard->name;
    if (param.value)
      sections.push_back({name, "value", param.value, size_t(param.numel) * sizeof(T)});
    size_t stateBytes = size_t(param.ownedCount()) * sizeof(OptState);
    for (auto [kind, buffer] : {std::pair{"master", &param.master},
                                {"moment1", &param.moment1},
                                {"moment2", &param.moment2}})
      if (buffer->allocated() || unallocatedState)
        sections.push_back(
            {name, kind, buffer->allocated() ? buffer->data() : nullptr, stateBytes});
  }
  auto &parts = params.partitions();
  for (size_t p = 0; p < parts.size(); ++p)
    if (!parts[p].weights.allocated())
      sections.push_back({"partition " + std::to_string(p), "owned", parts[p].owned.data(),
                          size_t(parts[p].perMember) * sizeof(T)});
  return sections;
}

template <typename D>
std::string writeRankFile(ParamStore<D> &params, const plan::RankPlan &plan, llvm::StringRef path) {
  std::vector<Section> sections = sectionsOf(params);
  llvm::json::Array described;
  for (const Section &section : sections)
    described.push_back(llvm::json::Object{
        {"owner", section.owner}, {"kind", section.kind}, {"bytes", int64_t(section.bytes)}});
  llvm::json::Object header{{"format", RankFormat},
                            {"rank", plan.rank},
                            {"plan_id", plan.planId},
                            {"value_bytes", int64_t(sizeof(typename D::Value))},
                            {"state_bytes", int64_t(sizeof(typename D::OptState))},
                            {"sections", std::move(described)}};
  D &dev = params.device();
  return writeFileOrFailure(path, [&](llvm::raw_ostream &os) {
    os << llvm::json::Value(std::move(header)) << "\n";
    std::vector<char> host;
    for (const Section &section : sections) {
      host.resize(section.bytes);
      dev.saveBytes(host.data(), section.data, section.bytes);
      os.write(host.data(), host.size());
    }
  });
}

llvm::json::Value finiteOrNull(double value) {
  return std::isfinite(value) ? llvm::json::Value(value) : llvm::json::Value(nullptr);
}

std::string manifestText(const plan::RankPlan &plan, const CheckpointRun &run,
                         const CheckpointState &state) {
  llvm::json::Array losses, norms;
  for (double loss : state.losses)
    losses.push_back(finiteOrNull(loss));
  for (double norm : state.gradNorms)
    norms.push_back(finiteOrNull(norm));
  llvm::json::Object manifest{
      {"format", ManifestFormat},
      {"plan_id", plan.planId},
      {"world", plan.world},
      {"precision", run.precision},
      {"data", run.data},
      {"step", state.step},
      {"updates", state.updates},
      {"loss_scale", llvm::json::Object{{"options", run.lossScale.flags()},
                                        {"scale", state.lossScale.scale},
                                        {"finite_in_a_row", state.lossScale.finiteInARow},
                                        {"overflows_left", state.lossScale.overflowsLeft}}},
      {"losses", std::move(losses)},
      {"grad_norms", std::move(norms)}};
  std::string text;
  llvm::raw_string_ostream(text) << llvm::formatv("{0:2}", llvm::json::Value(std::move(manifest)))
                                 << "\n";
  return text;
}

/// Replaces `dir` by the complete `partial`. The previous checkpoint waits at DIR.old until
/// the new one is in place; a DIR.old left by an interrupted save (and no DIR) is kept until
/// then too.
std::string publish(llvm::StringRef partial, llvm::StringRef dir) {
  std::string old = dir.str() + ".old";
  if (llvm::sys::fs::exists(dir)) {
    llvm::sys::fs::remove_directories(old);
    if (std::error_code error = llvm::sys::fs::rename(dir, old))
      return "cannot move the previous checkpoint " + dir.str() + " aside: " + error.message();
  }
  if (std::error_code error = llvm::sys::fs::rename(partial, dir))
    return "cannot rename " + partial.str() + " to " + dir.str() + ": " + error.message();
  llvm::sys::fs::remove_directories(old);
  return "";
}

/// Whether `path` is a folder parrun may replace or remove: missing, empty, or holding only a
/// checkpoint's files.
bool replaceable(llvm::StringRef path) {
  if (!llvm::sys::fs::exists(path))
    return true;
  if (!llvm::sys::fs::is_directory(path))
    return false;
  std::error_code error;
  for (llvm::sys::fs::directory_iterator entry(path, error), end; entry != end && !error;
       entry.increment(error)) {
    llvm::StringRef name = llvm::sys::path::filename(entry->path());
    if (name != "manifest.json" && !(name.startswith("rank-") && name.endswith(".ckpt")))
      return false;
  }
  return !error;
}

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
    llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(text);
    if (!parsed)
      fail("not JSON: " + llvm::toString(parsed.takeError()));
    return std::move(*parsed);
  }

private:
  std::string file;
  plan::detail::ReadContext ctx;
};

std::unique_ptr<llvm::MemoryBuffer> readFile(const std::string &path) {
  llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>> file = readRegularFile(
      path, std::numeric_limits<int64_t>::max(), /*RequiresNullTerminator=*/false);
  if (!file)
    throw std::runtime_error("cannot read " + path + ": " + llvm::toString(file.takeError()));
  return std::move(*file);
}

CheckpointState readManifest(const plan::RankPlan &plan, const CheckpointRun &run,
                             llvm::StringRef dir) {
  std::string path = join(dir, "manifest.json");
  std::string old = dir.str() + ".old";
  if (!llvm::sys::fs::exists(path) && llvm::sys::fs::exists(join(old, "manifest.json")))
    throw std::runtime_error(path + " is missing, and " + old +
                             " holds the checkpoint before an interrupted save: resume from " +
                             old);
  std::unique_ptr<llvm::MemoryBuffer> file = readFile(path);
  DocumentReader doc(path, "checkpoint manifest");
  llvm::json::Value parsed = doc.parse(file->getBuffer());
  ObjectReader manifest = doc.object(parsed);
  std::string format = doc.get<std::string>(manifest, "format");
  if (format != ManifestFormat)
    doc.fail("not a parrun checkpoint (format '" + format + "', not '" + ManifestFormat + "')");
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
void readRankFile(ParamStore<D> &params, const plan::RankPlan &plan, const std::string &path) {
  using T = typename D::Value;
  using OptState = typename D::OptState;
  std::unique_ptr<llvm::MemoryBuffer> file = readFile(path);
  llvm::StringRef bytes = file->getBuffer();
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

std::string checkSaveLocation(llvm::StringRef dir) {
  llvm::SmallString<256> absolute(dir);
  llvm::sys::fs::make_absolute(absolute);
  llvm::sys::path::remove_dots(absolute, /*remove_dot_dot=*/true);
  if (llvm::sys::fs::exists(absolute) && !llvm::sys::fs::is_directory(absolute))
    return "--save " + dir.str() + ": it exists and is not a folder";
  // The folders missing on the way are created by the save.
  llvm::StringRef existing = llvm::sys::path::parent_path(absolute);
  while (!existing.empty() && !llvm::sys::fs::exists(existing))
    existing = llvm::sys::path::parent_path(existing);
  if (!llvm::sys::fs::is_directory(existing))
    return "--save " + dir.str() + ": " + existing.str() + " is not a folder";
  if (llvm::sys::fs::access(existing, llvm::sys::fs::AccessMode::Write))
    return "--save " + dir.str() + ": the folder " + existing.str() + " is not writable";
  // A save replaces these; anything there that is not a checkpoint is the user's.
  for (std::string path :
       {std::string(absolute), absolute.str().str() + ".partial", absolute.str().str() + ".old"})
    if (!replaceable(path))
      return "--save " + dir.str() + ": " + path +
             " holds files that are not a parrun checkpoint, which saving would remove; choose "
             "another folder";
  return "";
}

template <typename D>
void saveCheckpoint(Communicator &comm, ParamStore<D> &params, const plan::RankPlan &plan,
                    const CheckpointRun &run, const CheckpointState &state, llvm::StringRef dir) {
  std::string what = "--save " + dir.str();
  std::string partial = dir.str() + ".partial";
  std::string failure;
  if (plan.rank == 0) {
    llvm::sys::fs::remove_directories(partial);
    if (std::error_code error = llvm::sys::fs::create_directories(partial))
      failure = "cannot create " + partial + ": " + error.message();
  }
  agreeOnFailure(comm, failure, what);
  failure = writeRankFile(params, plan, join(partial, rankFileName(plan.rank)));
  agreeOnFailure(comm, failure, what);
  if (plan.rank == 0) {
    std::string text = manifestText(plan, run, state);
    failure = writeFileOrFailure(join(partial, "manifest.json"),
                                 [&](llvm::raw_ostream &os) { os << text; });
    if (failure.empty())
      failure = publish(partial, dir);
  }
  agreeOnFailure(comm, failure, what);
}

template <typename D>
CheckpointState loadCheckpoint(Communicator &comm, ParamStore<D> &params,
                               const plan::RankPlan &plan, const CheckpointRun &run,
                               llvm::StringRef dir) {
  CheckpointState state;
  std::string failure;
  try {
    state = readManifest(plan, run, dir);
    readRankFile(params, plan, join(dir, rankFileName(plan.rank)));
  } catch (const std::runtime_error &error) {
    failure = error.what();
  }
  agreeOnFailure(comm, failure, "--resume " + dir.str());
  return state;
}

#define INSTANTIATE(D)                                                                             \
  template void saveCheckpoint(Communicator &, ParamStore<D> &, const plan::RankPlan &,            \
                               const CheckpointRun &, const CheckpointState &, llvm::StringRef);   \
  template CheckpointState loadCheckpoint(Communicator &, ParamStore<D> &, const plan::RankPlan &, \
                                          const CheckpointRun &, llvm::StringRef);
PARC_FOR_EACH_DEVICE(INSTANTIATE)
#undef INSTANTIATE

} // namespace parc::runtime
