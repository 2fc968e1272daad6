//===- Data.h - The token stream parrun trains on -------------------------===//
//
// A sample is seq + 1 tokens: `tokens` are its first seq, `labels` its last seq. Sample i of a
// run is a pure function of (seed, i), so every mapping of a job trains on the same samples
// in the same steps and its losses match a single-rank run. Which samples a microbatch holds
// is the plan format's rule (Megatron's sampler): microbatch mb of data-parallel rank d in
// step t holds the micro_batch samples from t*G + mb*micro_batch*dp + d*micro_batch on.
//
// With a text file the bytes are the tokens (vocabulary 256) and sample i starts at an offset
// drawn from Philox4x32 keyed by the seed; without one, sample i is an arithmetic progression
// modulo the vocabulary, with start and stride drawn the same way: synthetic, but learnable.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_DATA_H
#define PARC_RUNTIME_DATA_H

#include "parc/Plan/Plan.h"

#include "llvm/Support/Error.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace parc::runtime {

class TokenStream {
public:
  /// Byte-level tokens from a file. Fails when the file cannot be read, when `vocab` (the
  /// plan's) has fewer than 256 ids, or when the file is shorter than one sample.
  static llvm::Expected<TokenStream> fromFile(llvm::StringRef path, int64_t vocab, int64_t seq);
  static TokenStream synthetic(int64_t vocab);

  /// Writes the `length` tokens of sample `index`.
  void sample(uint64_t seed, uint64_t index, int64_t length, int64_t *out) const;

  /// Fills tokens and labels, both [micro_batch, seq], for microbatch `microbatch` of
  /// data-parallel rank `dpRank` in step `step`.
  void microbatch(uint64_t seed, int64_t step, const plan::ParallelSummary &parallel,
                  int64_t dpRank, int64_t microbatch, int64_t seq, int64_t *tokens,
                  int64_t *labels) const;

  /// "data.txt (12345 bytes)" or "synthetic".
  std::string describe() const;

private:
  TokenStream(int64_t vocab, std::shared_ptr<const std::vector<uint8_t>> text, std::string path)
      : vocab(vocab), text(std::move(text)), path(std::move(path)) {}

  int64_t vocab;
  std::shared_ptr<const std::vector<uint8_t>> text; // null: synthetic
  std::string path;
};

} // namespace parc::runtime

#endif
