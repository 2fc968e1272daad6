//===- WeightDump.cpp - Gather every shard to rank 0 and write whole tensors ===//

#include "parc/Runtime/WeightDump.h"

#include "Devices.h"
#include "parc/Support/FileOutput.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

namespace parc::runtime {

namespace {
// The largest tag every MPI accepts. The pipeline's traffic is over when weights are dumped,
// so sharing a tag with it could not mismatch anyway.
constexpr int64_t DumpTag = 32767;

struct ShardInfo {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<plan::Slice> slice;
  int64_t rows = 0; // init.rows: the rows that are vocabulary, 0 when all are
  int64_t numel() const {
    int64_t n = 1;
    for (const plan::Slice &s : slice)
      n *= s.size;
    return n;
  }
};

std::string joinInts(llvm::ArrayRef<int64_t> values) {
  std::vector<std::string> parts;
  for (int64_t value : values)
    parts.push_back(std::to_string(value));
  return llvm::join(parts, ",");
}

std::vector<int64_t> splitInts(llvm::StringRef text) {
  std::vector<int64_t> values;
  llvm::SmallVector<llvm::StringRef, 4> parts;
  text.split(parts, ',', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef part : parts) {
    int64_t value = 0;
    if (part.getAsInteger(10, value))
      throw std::runtime_error("--dump-weights: malformed shard description '" + text.str() + "'");
    values.push_back(value);
  }
  return values;
}

/// One line per shard: name, shape, slice offsets, slice sizes, vocabulary rows, tab-separated.
std::string describeShards(const plan::RankPlan &plan) {
  std::string text;
  for (const plan::ParamShard &shard : plan.params) {
    std::vector<int64_t> offsets, sizes;
    for (const plan::Slice &s : shard.slice) {
      offsets.push_back(s.offset);
      sizes.push_back(s.size);
    }
    int64_t rows = shard.init.kind == plan::InitKind::Normal ? shard.init.rows : 0;
    text += shard.name + "\t" + joinInts(shard.shape) + "\t" + joinInts(offsets) + "\t" +
            joinInts(sizes) + "\t" + std::to_string(rows) + "\n";
  }
  return text;
}

std::vector<ShardInfo> parseShards(llvm::StringRef text) {
  std::vector<ShardInfo> shards;
  llvm::SmallVector<llvm::StringRef, 16> lines;
  text.split(lines, '\n', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef line : lines) {
    llvm::SmallVector<llvm::StringRef, 4> fields;
    line.split(fields, '\t');
    if (fields.size() != 5)
      throw std::runtime_error("--dump-weights: malformed shard description '" + line.str() + "'");
    ShardInfo info;
    info.name = fields[0].str();
    info.shape = splitInts(fields[1]);
    std::vector<int64_t> offsets = splitInts(fields[2]), sizes = splitInts(fields[3]);
    for (size_t d = 0; d < offsets.size() && d < sizes.size(); ++d)
      info.slice.push_back({offsets[d], sizes[d]});
    std::vector<int64_t> rows = splitInts(fields[4]);
    info.rows = rows.empty() ? 0 : rows.front();
    shards.push_back(std::move(info));
  }
  return shards;
}

struct WholeTensor {
  std::vector<int64_t> shape;
  int64_t rows = 0; // the rows written: those that are vocabulary (0: all)
  std::vector<double> values;
  /// The leading elements written: all but the vocabulary's padding rows.
  size_t keptElements() const {
    if (rows <= 0 || shape.empty())
      return values.size();
    return values.size() / size_t(shape[0]) * size_t(rows);
  }
  std::vector<bool> covered;
  /// Copies of an element on several ranks (replicas, the tied embedding) must be equal; the
  /// largest difference seen is written out so that tests can insist on zero.
  double maxReplicaDifference = 0;
};

/// Copies a shard (row-major over its slice sizes) into its place in the whole tensor.
void place(WholeTensor &whole, const ShardInfo &shard, const double *values) {
  size_t rank = shard.shape.size();
  std::vector<int64_t> strides(rank, 1), local(rank, 0);
  for (size_t d = rank; d-- > 1;)
    strides[d - 1] = strides[d] * shard.shape[d];
  for (int64_t i = 0, n = shard.numel(); i < n; ++i) {
    int64_t global = 0;
    for (size_t d = 0; d < rank; ++d)
      global += (shard.slice[d].offset + local[d]) * strides[d];
    if (whole.covered[size_t(global)])
      whole.maxReplicaDifference = std::max(
          whole.maxReplicaDifference, std::abs(whole.values[size_t(global)] - double(values[i])));
    whole.values[size_t(global)] = double(values[i]);
    whole.covered[size_t(global)] = true;
    for (size_t d = rank; d-- > 0;) {
      if (++local[d] < shard.slice[d].size)
        break;
      local[d] = 0;
    }
  }
}
} // namespace

template <typename D>
void dumpWeights(Communicator &comm, ParamStore<D> &params, const plan::RankPlan &plan,
                 const RankSummary &summary, llvm::StringRef precision, llvm::StringRef path) {
  using T = typename D::Value;
  D &dev = params.device();
  MemoryTracker &memory = dev.memory();
  params.gatherAll(comm);
  // Staged on the device: the communicator moves device buffers where the ranks run on GPUs.
  int64_t total = 0;
  for (typename ParamStore<D>::Param &param : params.all())
    total += param.numel;
  Buffer<T> mine(memory, MemoryCategory::Activations, size_t(total));
  int64_t offset = 0;
  for (typename ParamStore<D>::Param &param : params.all()) {
    dev.copy(mine.data() + offset, param.value, param.numel);
    offset += param.numel;
  }
  std::vector<std::string> descriptions = comm.agree(describeShards(plan));
  if (comm.rank() != 0) {
    if (total)
      comm.send(0, DumpTag, mine.data(), mine.size());
    dev.synchronize();
    return;
  }

  std::vector<std::vector<ShardInfo>> shards;
  std::vector<Buffer<T>> values(descriptions.size());
  std::vector<Transfer> receives;
  values[0] = std::move(mine);
  for (size_t r = 0; r < descriptions.size(); ++r) {
    shards.push_back(parseShards(descriptions[r]));
    if (r == 0)
      continue;
    int64_t count = 0;
    for (const ShardInfo &shard : shards.back())
      count += shard.numel();
    values[r] = Buffer<T>(memory, MemoryCategory::Activations, size_t(count));
    if (count)
      receives.push_back(Transfer::recv(int64_t(r), DumpTag, values[r].data(), size_t(count)));
  }
  comm.exchange(receives);

  std::map<std::string, WholeTensor> tensors;
  for (size_t r = 0; r < shards.size(); ++r) {
    std::vector<double> host = dev.download(values[r].data(), int64_t(values[r].size()));
    const double *next = host.data();
    for (const ShardInfo &shard : shards[r]) {
      WholeTensor &whole = tensors[shard.name];
      if (whole.shape.empty()) {
        whole.shape = shard.shape;
        whole.rows = shard.rows;
        int64_t n = 1;
        for (int64_t dim : shard.shape)
          n *= dim;
        whole.values.assign(size_t(n), 0.0);
        whole.covered.assign(size_t(n), false);
      } else if (whole.shape != shard.shape) {
        throw std::runtime_error("--dump-weights: ranks disagree on the shape of '" + shard.name +
                                 "'");
      }
      place(whole, shard, next);
      next += shard.numel();
    }
  }

  for (const auto &[name, whole] : tensors)
    for (size_t i = 0; i < whole.covered.size(); ++i)
      if (!whole.covered[i])
        throw std::runtime_error("--dump-weights: element " + std::to_string(i) + " of '" + name +
                                 "' is in no rank's shard");

  llvm::Error written = writeFile(path, [&](llvm::raw_ostream &file) {
    llvm::json::OStream json(file);
    json.object([&] {
      json.attribute("format", "parrun-weights/1");
      json.attribute("plan_id", plan.planId);
      json.attribute("precision", precision);
      json.attribute("steps", int64_t(summary.losses.size()));
      json.attributeArray("losses", [&] {
        for (double loss : summary.losses)
          json.value(loss);
      });
      // JSON has no nan or inf: a skipped step's norm (LossScaler.h) is null.
      json.attributeArray("grad_norms", [&] {
        for (double norm : summary.gradNorms)
          if (std::isfinite(norm))
            json.value(norm);
          else
            json.value(nullptr);
      });
      double replicaDifference = 0;
      for (const auto &entry : tensors)
        replicaDifference = std::max(replicaDifference, entry.second.maxReplicaDifference);
      json.attribute("max_replica_difference", replicaDifference);
      // The vocabulary's padding is left out, so that every tp writes the same tensors; what
      // it holds (zero, as it started) is summed up here.
      double padding = 0;
      for (const auto &entry : tensors) {
        const WholeTensor &whole = entry.second;
        for (size_t i = whole.keptElements(); i < whole.values.size(); ++i)
          padding = std::max(padding, std::abs(whole.values[i]));
      }
      json.attribute("max_padding_value", padding);
      json.attributeObject("params", [&] {
        for (const auto &[name, whole] : tensors) {
          size_t kept = whole.keptElements();
          std::vector<int64_t> shape = whole.shape;
          if (whole.rows > 0 && !shape.empty())
            shape[0] = whole.rows;
          // A lambda captures a structured binding only from C++20 on; this is C++17.
          json.attributeObject(name, [&, &whole = whole] {
            json.attributeArray("shape", [&] {
              for (int64_t dim : shape)
                json.value(dim);
            });
            json.attributeArray("data", [&] {
              for (size_t i = 0; i < kept; ++i)
                json.value(whole.values[i]);
            });
          });
        }
      });
    });
    file << "\n";
  });
  if (written)
    throw WriteError("cannot write --dump-weights file '" + path.str() +
                             "': " + llvm::errorToErrorCode(std::move(written)).message());
}

#define PARC_INSTANTIATE(D)                                                                        \
  template void dumpWeights(Communicator &, ParamStore<D> &, const plan::RankPlan &,               \
                            const RankSummary &, llvm::StringRef, llvm::StringRef);
PARC_FOR_EACH_DEVICE(PARC_INSTANTIATE)
#undef PARC_INSTANTIATE

} // namespace parc::runtime
