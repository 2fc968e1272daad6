//===- Data.cpp - Samples as pure functions of (seed, index) --------------===//

#include "parc/Runtime/Data.h"

#include "parc/Runtime/Init.h"
#include "parc/Support/FileInput.h"

#include "llvm/Support/MemoryBuffer.h"

#include <limits>

namespace parc::runtime {

namespace {
// Philox key words ("data", "parr"): a stream of its own, unrelated to any weight's.
constexpr std::array<uint32_t, 2> DataKey = {0x64617461, 0x70617272};

std::array<uint32_t, 4> sampleBits(uint64_t seed, uint64_t index) {
  return philox4x32({uint32_t(index), uint32_t(index >> 32), uint32_t(seed), uint32_t(seed >> 32)},
                    DataKey);
}
} // namespace

llvm::Expected<TokenStream> TokenStream::fromFile(llvm::StringRef path, int64_t vocab,
                                                  int64_t seq) {
  auto fail = [&](const llvm::Twine &message) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
  };
  if (vocab < 256)
    return fail("--data reads bytes as tokens, which needs a vocabulary of at least 256 ids, "
                "but the plan's model has vocab " +
                llvm::Twine(vocab) + "; raise the model's vocab to 256 or drop --data");
  // Only a regular file: --data /dev/zero would never end.
  llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>> file =
      readRegularFile(path, std::numeric_limits<int64_t>::max(), /*RequiresNullTerminator=*/false);
  if (!file)
    return fail("cannot read data file '" + path + "': " + llvm::toString(file.takeError()));
  llvm::StringRef bytes = (*file)->getBuffer();
  if (int64_t(bytes.size()) < seq + 1)
    return fail("data file '" + path + "' holds " + llvm::Twine(bytes.size()) +
                " bytes, fewer than one sample of seq + 1 = " + llvm::Twine(seq + 1) +
                " tokens; use a longer text");
  auto text = std::make_shared<std::vector<uint8_t>>(bytes.begin(), bytes.end());
  return TokenStream(vocab, std::move(text), path.str());
}

TokenStream TokenStream::synthetic(int64_t vocab) { return TokenStream(vocab, nullptr, ""); }

void TokenStream::sample(uint64_t seed, uint64_t index, int64_t length, int64_t *out) const {
  std::array<uint32_t, 4> bits = sampleBits(seed, index);
  uint64_t draw = (uint64_t(bits[0]) << 32) | bits[1];
  if (text) {
    uint64_t starts = text->size() - uint64_t(length) + 1;
    uint64_t start = draw % starts;
    for (int64_t i = 0; i < length; ++i)
      out[i] = (*text)[start + uint64_t(i)];
    return;
  }
  // Strides up to 16 (never 0): the continuation is predictable from two tokens.
  uint64_t first = draw % uint64_t(vocab);
  uint64_t stride = 1 + bits[2] % uint32_t(std::min<int64_t>(16, std::max<int64_t>(1, vocab - 1)));
  for (int64_t i = 0; i < length; ++i)
    out[i] = int64_t((first + stride * uint64_t(i)) % uint64_t(vocab));
}

void TokenStream::microbatch(uint64_t seed, int64_t step, const plan::ParallelSummary &parallel,
                             int64_t dpRank, int64_t microbatch, int64_t seq, int64_t *tokens,
                             int64_t *labels) const {
  int64_t b = parallel.microBatch;
  int64_t first = step * parallel.globalBatch + microbatch * b * parallel.dp + dpRank * b;
  std::vector<int64_t> sampleTokens(size_t(seq + 1));
  for (int64_t j = 0; j < b; ++j) {
    sample(seed, uint64_t(first + j), seq + 1, sampleTokens.data());
    for (int64_t t = 0; t < seq; ++t) {
      tokens[j * seq + t] = sampleTokens[size_t(t)];
      labels[j * seq + t] = sampleTokens[size_t(t + 1)];
    }
  }
}

std::string TokenStream::describe() const {
  if (!text)
    return "synthetic";
  return path + " (" + std::to_string(text->size()) + " bytes)";
}

} // namespace parc::runtime
