//===- Limits.h - The largest inputs parc and parrun accept -------------===//
//
// A .par file is typed by hand and a plan directory is copied and edited, so neither may make
// parc or parrun run without bound or overflow a size. Each limit is far above any real job
// (GPT-3 175B has 96 blocks, 50k vocab, seq 2048; the largest trainings use ~16k-100k GPUs)
// and low enough that every product the memory and cost models form of them stays well inside
// 64 bits: parameters per block <= 4 h^2 + 3 h f < 2^40 (2^46 with an imported head_dim,
// whose attention may be heads x head_dim = 2^24 wide), times MaxBlocks < 2^58; the vocab
// table MaxVocab x MaxHidden = 2^40; a microbatch's logits MaxMicrobatchTokens x MaxVocab =
// 2^46 elements. docs/language.md (Limits) lists them; the compiler reports each as a located
// error, the plan verifier refuses plans beyond them.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_SUPPORT_LIMITS_H
#define PARC_SUPPORT_LIMITS_H

#include <cstdint>

namespace parc::limits {

/// Bytes of one .par file, the main one or an included one.
inline constexpr int64_t MaxInputFileBytes = int64_t(16) << 20;
/// Files on a chain of nested includes, the main file counted.
inline constexpr int64_t MaxIncludeDepth = 32;
/// Distinct files one compilation reads, the main file counted.
inline constexpr int64_t MaxInputFiles = 256;

/// Model sizes.
inline constexpr int64_t MaxVocab = int64_t(1) << 22;  // 4,194,304 tokens
inline constexpr int64_t MaxSeq = int64_t(1) << 20;    // 1,048,576 positions
inline constexpr int64_t MaxHidden = int64_t(1) << 18; // 262,144
inline constexpr int64_t MaxFFN = int64_t(1) << 20;    // 1,048,576
inline constexpr int64_t MaxHeads = int64_t(1) << 14;  // 16,384 (kv_heads too)
inline constexpr int64_t MaxHeadDim = int64_t(1) << 10; // 1,024 (an imported head_dim)
/// Experts of a mixture-of-experts layer (and its top_k), and its shared experts: with them a
/// block holds at most (1024 + 64) x 3 x hidden x moe_ffn < 2^50 parameters.
inline constexpr int64_t MaxExperts = int64_t(1) << 10;
inline constexpr int64_t MaxSharedExperts = 64;
/// Transformer blocks of the whole model (the sum of the layer counts).
inline constexpr int64_t MaxBlocks = 4096;

/// Cluster and mapping.
inline constexpr int64_t MaxNodes = int64_t(1) << 17;       // 131,072
inline constexpr int64_t MaxGpusPerNode = int64_t(1) << 12; // 4,096, and network adapters
inline constexpr int64_t MaxGpuSMs = int64_t(1) << 12;      // 4,096 streaming multiprocessors
/// Ranks of a job, tp x pp x dp.
inline constexpr int64_t MaxWorld = int64_t(1) << 17; // 131,072
/// Sequences per microbatch, and their tokens (micro_batch x seq).
inline constexpr int64_t MaxMicroBatch = int64_t(1) << 16;
inline constexpr int64_t MaxMicrobatchTokens = int64_t(1) << 24;
/// Microbatches M per step and data-parallel replica.
inline constexpr int64_t MaxMicrobatches = 8192;
/// Sequences per step.
inline constexpr int64_t MaxGlobalBatch = int64_t(1) << 30;
/// Parameters per ZeRO bucket: more than any model within these limits holds, so one bucket
/// may take a whole stage.
inline constexpr int64_t MaxBucketSize = int64_t(1) << 60;

/// Ops of the op lists plus instructions of the schedule in one rank plan.
inline constexpr int64_t MaxPlanEntries = int64_t(1) << 20;
/// Forward and backward passes of all stages (2 x pp x chunks x M) that --emit=trace and
/// --emit=svg simulate and draw.
inline constexpr int64_t MaxTimelinePasses = int64_t(1) << 20;
/// The same passes for the step time every estimate simulates (the report, -o's summary, the
/// search's candidates): about half a second and a few hundred MB at the limit, four times
/// an interleaved pp 128 x 8 chunks x M 1024, far beyond any published run.
inline constexpr int64_t MaxStepPasses = int64_t(1) << 22;
/// Work of one `auto` search: each memory estimate and each step bound of a candidate costs
/// one unit per transformer block, each simulated step one per forward and backward pass, about
/// what they take. 2^26 units took 4 s of one core on the 2-core machine; the spaces of
/// bench/search.sh take a sixth of it, every field auto at the size limits (4096 blocks, 2^17
/// ranks) five times it.
inline constexpr int64_t MaxSearchWork = int64_t(1) << 26;
/// Arrays and objects nested in a JSON file parc or parrun reads (a plan, a manifest, a
/// Hugging Face config): deeper than any of them is written.
inline constexpr int64_t MaxJSONDepth = 64;
/// Bytes of one rank plan or manifest file parrun reads.
inline constexpr int64_t MaxPlanFileBytes = int64_t(1) << 30;

} // namespace parc::limits

#endif
