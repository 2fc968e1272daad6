//===- FlashAttention.cu - Fused attention on tensor cores, forward and backward -===//
//
// FlashAttention-2 on mma.sync.m16n8k16 (bf16/fp16 operands, fp32 accumulators), both
// operands fed from shared memory by ldmatrix. A block is 4 warps that own 64 rows (queries,
// or keys in the dK/dV pass), 16 a warp, so each row of a score tile lives in one warp and a
// row reduction is two shuffles among the 4 lanes that hold it.
//
// Fragments (PTX ISA, m16n8k16), lane = 4g + t: the fp32 accumulator of a 16 x 8 tile holds
// rows g and g + 8, columns 2t and 2t + 1, as c[0..1] and c[2..3]. The A operand of a 16 x 16
// tile holds the same positions of columns 0-7 (a[0], a[1]) and 8-15 (a[2], a[3]), so two
// neighbouring accumulator tiles of probabilities become one A operand in registers.
//
// Passes; shared tiles are [rows][headDim + 8], the pad keeping ldmatrix conflict-free, and
// the backward streams 32-row tiles at head size 128 (see Tiles):
//  forward    per (batch*head, 64 queries): Q once; K and V tiles of 64 keys double-buffered
//             with cp.async; online softmax; y = O / l.
//  row stats  per (batch*head, 64 queries): Q and dY once, K and V streamed; the base-2
//             logsumexp and D = sum_j P_ij dP_ij (dP = dY V^T), rescaled online like O.
//  dK, dV     per (batch*kvHead, 64 keys): K and V once; Q, dY and their statistics streamed
//             for each query head of the group, then each query tile, in that order; S^T =
//             K Q^T, dP^T = V dY^T, dS^T = P^T (dP^T - D); dV += P^T dY, dK += dS^T Q.
//  dQ         per (batch*head, 64 queries): as row stats, then dQ += dS K.
// The backward thus multiplies 9 tile products per (query, key) tile pair where
// FlashAttention-2 multiplies 5: the price of having no saved statistics and no atomics.
// Every sum runs in a fixed order, so the results are bitwise reproducible.
//
// Causal grids start their longest blocks first. Only tiles that cross the diagonal compare
// keys with queries; a masked score is -inf before the exponential, or its probability 0.
//
//===----------------------------------------------------------------------===//

#include "parc/Runtime/CudaFlashAttention.h"

#include "Common.cuh"
#include "TensorCore.cuh"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>

namespace parc::runtime::cuda {

using namespace detail;
using namespace tensorcore;

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kWarpRows = 16;
/// Query rows of a forward, row-stats or dQ block; key rows of a dK/dV block.
constexpr int kBlockRows = kWarps * kWarpRows;
/// An explicit minimum of resident blocks: without one, ptxas held flashForwardKernel<T, 64>
/// to 128 registers and spilled.
constexpr int kMinBlocks = 1;
/// Pad elements per shared row: rows 16 bytes apart modulo 128 put the 8 rows that one
/// ldmatrix phase reads in 8 different groups of 4 banks.
constexpr int kPad = 8;
constexpr int64_t kMaxGridY = 65535;
constexpr float kLog2e = 1.4426950408889634f;

/// Tile shapes per head size. At 128 the backward streams 32-row tiles: the dK/dV pass holds
/// 128 accumulator floats a thread already, and pass 1 and dQ stay under 99 KiB of shared
/// memory, what sm_86 and sm_89 allow a block.
template <int D> struct Tiles {
  static_assert(D == 64 || D == 128, "head sizes 64 and 128");
  static constexpr int kStride = D + kPad;
  static constexpr int kForwardKeys = 64;
  static constexpr int kBackwardKeys = D == 128 ? 32 : 64;
  static constexpr int kBackwardQueries = D == 128 ? 32 : 64;
};

/// Dynamic shared memory of a block: `Fixed` tiles of kBlockRows rows, loaded once, then two
/// buffers of `Streamed` tiles of `Rows` rows each, then two buffers of `Floats` floats.
template <typename T, int D, int Fixed, int Streamed, int Rows, int Floats = 0>
struct SharedLayout {
  static constexpr int kFixedTile = kBlockRows * Tiles<D>::kStride;
  static constexpr int kStreamedTile = Rows * Tiles<D>::kStride;
  static constexpr int kElements = Fixed * kFixedTile + 2 * Streamed * kStreamedTile;
  static constexpr size_t kBytes = kElements * sizeof(T) + 2 * Floats * sizeof(float);
  static_assert(kElements * sizeof(T) % 16 == 0 && Floats % 4 == 0, "16-byte aligned parts");

  __device__ static T *fixed(unsigned char *base, int tile) {
    return reinterpret_cast<T *>(base) + tile * kFixedTile;
  }
  __device__ static T *streamed(unsigned char *base, int buffer, int tile) {
    return reinterpret_cast<T *>(base) + Fixed * kFixedTile +
           (buffer * Streamed + tile) * kStreamedTile;
  }
  __device__ static float *floats(unsigned char *base, int buffer) {
    return reinterpret_cast<float *>(base + kElements * sizeof(T)) + buffer * Floats;
  }
};

// Forward: Q; K and V streamed.
template <typename T, int D> using ForwardShared = SharedLayout<T, D, 1, 2, Tiles<D>::kForwardKeys>;
// Row stats and dQ: Q and dY; K and V streamed.
template <typename T, int D>
using QueryGradShared = SharedLayout<T, D, 2, 2, Tiles<D>::kBackwardKeys>;
// dK, dV: K and V; Q and dY streamed with the logsumexp and D of their rows.
template <typename T, int D>
using KeyValueGradShared =
    SharedLayout<T, D, 2, 2, Tiles<D>::kBackwardQueries, 2 * Tiles<D>::kBackwardQueries>;

/// Where the heads live and how scores scale. Element (t, b, h, d) of a [seq, batch,
/// heads*headDim] tensor is at t * rowStride + (b * heads + h) * headDim + d.
struct Geometry {
  int64_t seq, batch, heads, kvHeads, group, headDim;
  int64_t qRowStride, kvRowStride;
  float scale;     // 1/sqrt(headDim)
  float scaleLog2; // scale * log2(e): scores in base-2 units for exp2
  bool causal;

  template <typename T> __device__ T *queryHead(T *base, int64_t b, int64_t h) const {
    return base + (b * heads + h) * headDim;
  }
  template <typename T> __device__ T *kvHead(T *base, int64_t b, int64_t kvh) const {
    return base + (b * kvHeads + kvh) * headDim;
  }
  /// Key tiles of `keys` keys that queries [query0, query0 + kBlockRows) attend to.
  __device__ int keyTiles(int64_t query0, int keys) const {
    return int((causal ? query0 + kBlockRows : seq) / keys);
  }
};

/// The 64 queries of a forward, row-stats or dQ block: blockIdx.x is batch * heads + head,
/// blockIdx.y counts query blocks from the last, so causal grids start the longest first.
struct QueryBlock {
  int64_t batch, head, query0;

  __device__ explicit QueryBlock(const Geometry &geo)
      : batch(blockIdx.x / geo.heads), head(blockIdx.x % geo.heads),
        query0(int64_t(gridDim.y - 1 - blockIdx.y) * kBlockRows) {}
  /// Index of the block's first row in the [batch*heads, seq] statistics.
  __device__ int64_t statsRow(const Geometry &geo) const {
    return (batch * geo.heads + head) * geo.seq + query0;
  }
};

/// The same bits in all 4 lanes that hold a row: each adds the same pairs, only swapped.
template <typename Op> __device__ __forceinline__ float quadReduce(float x, Op op) {
  x = op(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return op(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

/// Scales scores to base-2 units; under the causal mask, keys after their query become -inf.
/// query0 is the query of the warp's row 0, key0 the key of column 0.
template <int N>
__device__ __forceinline__ void scaleAndMask(float (&s)[N / 8][4], const Geometry &geo,
                                             int64_t query0, int64_t key0) {
  bool crossesDiagonal = geo.causal && key0 + N - 1 > query0;
  forEachElement<N>([&](int n, int e, int row, int column) {
    s[n][e] = crossesDiagonal && key0 + column > query0 + row ? -INFINITY : s[n][e] * geo.scaleLog2;
  });
}

/// Online softmax statistics of a warp's rows g and g + 8 (index 0 and 1), in base 2.
struct OnlineRows {
  float max[2] = {-INFINITY, -INFINITY};
  float sum[2] = {0.0f, 0.0f}; // this lane's columns only until quadReduce

  /// Turns scores s (base-2 units) into exp2(s - running max), adds them to sum, and sets
  /// rescale to the factor that brings what was summed before to the new max.
  template <int N>
  __device__ __forceinline__ void update(float (&s)[N / 8][4], float (&rescale)[2]) {
    float base[2], tileSum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tileMax = -INFINITY;
#pragma unroll
      for (int n = 0; n < N / 8; ++n)
        tileMax = fmaxf(tileMax, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      float newMax = fmaxf(max[r], quadReduce(tileMax, MaxOp()));
      // A row masked so far has no max yet; exp2(-inf - 0) keeps its terms at 0.
      base[r] = newMax == -INFINITY ? 0.0f : newMax;
      rescale[r] = exp2f(max[r] - base[r]);
      max[r] = newMax;
    }
    forEachElement<N>([&](int n, int e, int, int) {
      s[n][e] = exp2f(s[n][e] - base[e / 2]);
      tileSum[e / 2] += s[n][e];
    });
    for (int r = 0; r < 2; ++r)
      sum[r] = sum[r] * rescale[r] + tileSum[r];
  }
};

//===----------------------------------------------------------------------===//
// Block tiles
//===----------------------------------------------------------------------===//

/// Starts copying Rows rows of D elements, rowStride apart in global memory, to a tile.
template <int Rows, int D, typename T>
__device__ __forceinline__ void loadTile(T *tile, const T *global, int64_t rowStride) {
  constexpr int kChunks = D / 8; // of 16 bytes
  static_assert(Rows * kChunks % kThreads == 0);
#pragma unroll
  for (int j = 0; j < Rows * kChunks / kThreads; ++j) {
    int i = threadIdx.x + j * kThreads, row = i / kChunks, chunk = i % kChunks;
    copyAsync16(tile + row * Tiles<D>::kStride + chunk * 8, global + row * rowStride + chunk * 8);
  }
}

/// Starts copying Count floats.
template <int Count>
__device__ __forceinline__ void loadFloats(float *shared, const float *global) {
  static_assert(Count % 4 == 0 && Count / 4 <= kThreads);
  if (threadIdx.x < Count / 4)
    copyAsync16(shared + 4 * threadIdx.x, global + 4 * threadIdx.x);
}

/// Copies a tile of Rows rows of D elements to global memory, rows rowStride apart.
template <int Rows, int D, typename T>
__device__ __forceinline__ void storeTile(T *global, int64_t rowStride, const T *tile) {
  constexpr int kChunks = D / 8;
  static_assert(Rows * kChunks % kThreads == 0);
#pragma unroll
  for (int j = 0; j < Rows * kChunks / kThreads; ++j) {
    int i = threadIdx.x + j * kThreads, row = i / kChunks, chunk = i % kChunks;
    *reinterpret_cast<uint4 *>(global + row * rowStride + chunk * 8) =
        *reinterpret_cast<const uint4 *>(tile + row * Tiles<D>::kStride + chunk * 8);
  }
}

/// Runs compute(i, buffer) for i in [begin, end) while issue(i + 1, other buffer) copies the
/// next tile; copies committed before the call are complete before the first compute. Ends
/// with a barrier, after which the caller may reuse shared memory.
template <typename Issue, typename Compute>
__device__ __forceinline__ void streamTiles(int begin, int end, Issue issue, Compute compute) {
  if (begin >= end) {
    waitCopies<0>();
    __syncthreads();
    return;
  }
  issue(begin, 0);
  commitCopies();
  for (int i = begin; i < end; ++i) {
    int buffer = (i - begin) % 2;
    if (i + 1 < end) {
      issue(i + 1, 1 - buffer);
      commitCopies();
      waitCopies<1>();
    } else {
      waitCopies<0>();
    }
    __syncthreads();
    compute(i, buffer);
    __syncthreads();
  }
}

/// streamTiles over the key tiles that the query block at query0 sees: K and V of one kv head
/// double-buffered in Shared's streamed tiles 0 and 1, compute(tile, buffer) on each.
template <typename Shared, int Keys, int D, typename T, typename Compute>
__device__ __forceinline__ void streamKeyValueTiles(unsigned char *shared, const Geometry &geo,
                                                    int64_t query0, const T *kHead, const T *vHead,
                                                    Compute compute) {
  streamTiles(
      0, geo.keyTiles(query0, Keys),
      [&](int tile, int buffer) {
        int64_t offset = int64_t(tile) * Keys * geo.kvRowStride;
        loadTile<Keys, D>(Shared::streamed(shared, buffer, 0), kHead + offset, geo.kvRowStride);
        loadTile<Keys, D>(Shared::streamed(shared, buffer, 1), vHead + offset, geo.kvRowStride);
      },
      compute);
}

//===----------------------------------------------------------------------===//
// Kernels
//===----------------------------------------------------------------------===//

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    flashForwardKernel(T *y, const T *q, const T *k, const T *v, Geometry geo) {
  using Shared = ForwardShared<T, D>;
  constexpr int kKeys = Tiles<D>::kForwardKeys, kStride = Tiles<D>::kStride;
  extern __shared__ __align__(16) unsigned char shared[];
  QueryBlock block(geo);
  int warp = threadIdx.x / 32;
  int64_t kvh = block.head / geo.group;
  const T *kHead = geo.kvHead(k, block.batch, kvh), *vHead = geo.kvHead(v, block.batch, kvh);
  T *tileQ = Shared::fixed(shared, 0), *warpQ = tileQ + warp * kWarpRows * kStride;
  loadTile<kBlockRows, D>(tileQ,
                          geo.queryHead(q, block.batch, block.head) + block.query0 * geo.qRowStride,
                          geo.qRowStride);
  commitCopies();

  float out[D / 8][4] = {};
  OnlineRows rows;
  streamKeyValueTiles<Shared, kKeys, D>(
      shared, geo, block.query0, kHead, vHead, [&](int tile, int buffer) {
        float s[kKeys / 8][4] = {};
        warpProductABt<T, kKeys, D>(s, warpQ, Shared::streamed(shared, buffer, 0), kStride);
        scaleAndMask<kKeys>(s, geo, block.query0 + warp * kWarpRows, int64_t(tile) * kKeys);
        float rescale[2];
        rows.update<kKeys>(s, rescale);
        forEachElement<D>([&](int n, int e, int, int) { out[n][e] *= rescale[e / 2]; });
        uint32_t p[kKeys / 16][4];
        toFragments<T, kKeys>(p, s);
        warpProductAB<T, D, kKeys>(out, p, Shared::streamed(shared, buffer, 1), kStride);
      });

  float inverse[2];
  for (int r = 0; r < 2; ++r)
    inverse[r] = 1.0f / quadReduce(rows.sum[r], SumOp());
  storeFragments<T, D>(warpQ, kStride, out, inverse);
  __syncthreads();
  storeTile<kBlockRows, D>(geo.queryHead(y, block.batch, block.head) +
                               block.query0 * geo.qRowStride,
                           geo.qRowStride, tileQ);
}

/// The loop that row stats and dQ share: Q and dY of the block's 64 queries stay, the key
/// tiles of K and V stream, and onTile(s, dp, tileK) gets each tile's scores s (base-2 units,
/// masked) and dP = dY V^T for the warp's 16 rows.
template <typename T, int D, typename OnTile>
__device__ __forceinline__ void streamKeyTiles(unsigned char *shared, const Geometry &geo,
                                               const QueryBlock &block, const T *q, const T *k,
                                               const T *v, const T *dy, OnTile onTile) {
  using Shared = QueryGradShared<T, D>;
  constexpr int kKeys = Tiles<D>::kBackwardKeys, kStride = Tiles<D>::kStride;
  int warp = threadIdx.x / 32;
  int64_t kvh = block.head / geo.group, queryOffset = block.query0 * geo.qRowStride;
  const T *kHead = geo.kvHead(k, block.batch, kvh), *vHead = geo.kvHead(v, block.batch, kvh);
  loadTile<kBlockRows, D>(Shared::fixed(shared, 0),
                          geo.queryHead(q, block.batch, block.head) + queryOffset, geo.qRowStride);
  loadTile<kBlockRows, D>(Shared::fixed(shared, 1),
                          geo.queryHead(dy, block.batch, block.head) + queryOffset, geo.qRowStride);
  commitCopies();
  const T *warpQ = Shared::fixed(shared, 0) + warp * kWarpRows * kStride;
  const T *warpDy = Shared::fixed(shared, 1) + warp * kWarpRows * kStride;
  streamKeyValueTiles<Shared, kKeys, D>(
      shared, geo, block.query0, kHead, vHead, [&](int tile, int buffer) {
        const T *tileK = Shared::streamed(shared, buffer, 0);
        float s[kKeys / 8][4] = {}, dp[kKeys / 8][4] = {};
        warpProductABt<T, kKeys, D>(s, warpQ, tileK, kStride);
        warpProductABt<T, kKeys, D>(dp, warpDy, Shared::streamed(shared, buffer, 1), kStride);
        scaleAndMask<kKeys>(s, geo, block.query0 + warp * kWarpRows, int64_t(tile) * kKeys);
        onTile(s, dp, tileK);
      });
}

/// Pass 1: lse2 = max + log2(sum) in base-2 units and delta = sum_j P_ij dP_ij per query row.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    flashRowStatsKernel(float *lse2, float *delta, const T *q, const T *k, const T *v, const T *dy,
                        Geometry geo) {
  constexpr int kKeys = Tiles<D>::kBackwardKeys;
  extern __shared__ __align__(16) unsigned char shared[];
  QueryBlock block(geo);
  OnlineRows rows;
  float dot[2] = {0.0f, 0.0f}; // sum_j exp2(s_ij - max) dP_ij, this lane's columns
  streamKeyTiles<T, D>(shared, geo, block, q, k, v, dy,
                       [&](float(&s)[kKeys / 8][4], float(&dp)[kKeys / 8][4], const T *) {
                         float rescale[2], tileDot[2] = {0.0f, 0.0f};
                         rows.update<kKeys>(s, rescale);
                         forEachElement<kKeys>(
                             [&](int n, int e, int, int) { tileDot[e / 2] += s[n][e] * dp[n][e]; });
                         for (int r = 0; r < 2; ++r)
                           dot[r] = dot[r] * rescale[r] + tileDot[r];
                       });
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int r = 0; r < 2; ++r) {
    float sum = quadReduce(rows.sum[r], SumOp()), total = quadReduce(dot[r], SumOp());
    int64_t row = block.statsRow(geo) + warp * kWarpRows + lane / 4 + 8 * r;
    if (lane % 4 == 0) {
      lse2[row] = rows.max[r] + log2f(sum);
      delta[row] = total / sum;
    }
  }
}

/// Pass 2: dK and dV of 64 keys of one key/value head, over its group's query heads.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    flashKeyValueGradKernel(T *dk, T *dv, const T *q, const T *k, const T *v, const T *dy,
                            const float *lse2, const float *delta, Geometry geo) {
  using Shared = KeyValueGradShared<T, D>;
  constexpr int kQueries = Tiles<D>::kBackwardQueries, kStride = Tiles<D>::kStride;
  extern __shared__ __align__(16) unsigned char shared[];
  int warp = threadIdx.x / 32;
  int64_t batch = blockIdx.x / geo.kvHeads, kvh = blockIdx.x % geo.kvHeads;
  // Key block 0 has the most query tiles under the mask, and starts first.
  int64_t key0 = int64_t(blockIdx.y) * kBlockRows, warpKey0 = key0 + warp * kWarpRows;
  int64_t keyOffset = key0 * geo.kvRowStride;
  T *tileK = Shared::fixed(shared, 0), *tileV = Shared::fixed(shared, 1);
  T *warpK = tileK + warp * kWarpRows * kStride, *warpV = tileV + warp * kWarpRows * kStride;
  loadTile<kBlockRows, D>(tileK, geo.kvHead(k, batch, kvh) + keyOffset, geo.kvRowStride);
  loadTile<kBlockRows, D>(tileV, geo.kvHead(v, batch, kvh) + keyOffset, geo.kvRowStride);
  commitCopies();

  // Under the mask, queries before key0 see none of the block's keys.
  int firstTile = geo.causal ? int(key0 / kQueries) : 0;
  int tilesPerHead = int(geo.seq / kQueries) - firstTile;
  auto query0Of = [&](int i) { return int64_t(firstTile + i % tilesPerHead) * kQueries; };
  float gradK[D / 8][4] = {}, gradV[D / 8][4] = {};
  streamTiles(
      0, int(geo.group) * tilesPerHead,
      [&](int i, int buffer) {
        int64_t head = kvh * geo.group + i / tilesPerHead, query0 = query0Of(i);
        int64_t offset = query0 * geo.qRowStride;
        loadTile<kQueries, D>(Shared::streamed(shared, buffer, 0),
                              geo.queryHead(q, batch, head) + offset, geo.qRowStride);
        loadTile<kQueries, D>(Shared::streamed(shared, buffer, 1),
                              geo.queryHead(dy, batch, head) + offset, geo.qRowStride);
        int64_t stats = (batch * geo.heads + head) * geo.seq + query0;
        loadFloats<kQueries>(Shared::floats(shared, buffer), lse2 + stats);
        loadFloats<kQueries>(Shared::floats(shared, buffer) + kQueries, delta + stats);
      },
      [&](int i, int buffer) {
        const T *tileQ = Shared::streamed(shared, buffer, 0);
        const T *tileDy = Shared::streamed(shared, buffer, 1);
        const float *tileLse2 = Shared::floats(shared, buffer);
        const float *tileDelta = tileLse2 + kQueries;
        int64_t query0 = query0Of(i);
        // Transposed tiles: rows are the warp's keys, columns the tile's queries.
        float p[kQueries / 8][4] = {}, ds[kQueries / 8][4] = {};
        warpProductABt<T, kQueries, D>(p, warpK, tileQ, kStride);
        warpProductABt<T, kQueries, D>(ds, warpV, tileDy, kStride);
        bool crossesDiagonal = geo.causal && warpKey0 + kWarpRows - 1 > query0;
        forEachElement<kQueries>([&](int n, int e, int row, int column) {
          bool masked = crossesDiagonal && warpKey0 + row > query0 + column;
          float prob = masked ? 0.0f : exp2f(p[n][e] * geo.scaleLog2 - tileLse2[column]);
          p[n][e] = prob;
          ds[n][e] = prob * (ds[n][e] - tileDelta[column]);
        });
        uint32_t a[kQueries / 16][4];
        toFragments<T, kQueries>(a, p);
        warpProductAB<T, D, kQueries>(gradV, a, tileDy, kStride);
        toFragments<T, kQueries>(a, ds);
        warpProductAB<T, D, kQueries>(gradK, a, tileQ, kStride);
      });

  const float scale[2] = {geo.scale, geo.scale}, one[2] = {1.0f, 1.0f};
  storeFragments<T, D>(warpK, kStride, gradK, scale);
  storeFragments<T, D>(warpV, kStride, gradV, one);
  __syncthreads();
  storeTile<kBlockRows, D>(geo.kvHead(dk, batch, kvh) + keyOffset, geo.kvRowStride, tileK);
  storeTile<kBlockRows, D>(geo.kvHead(dv, batch, kvh) + keyOffset, geo.kvRowStride, tileV);
}

/// Pass 3: dQ = scale * sum_j dS_ij k_j for 64 queries.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    flashQueryGradKernel(T *dq, const T *q, const T *k, const T *v, const T *dy, const float *lse2,
                         const float *delta, Geometry geo) {
  using Shared = QueryGradShared<T, D>;
  constexpr int kKeys = Tiles<D>::kBackwardKeys, kStride = Tiles<D>::kStride;
  extern __shared__ __align__(16) unsigned char shared[];
  QueryBlock block(geo);
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float rowLse2[2], rowDelta[2];
  for (int r = 0; r < 2; ++r) {
    int64_t row = block.statsRow(geo) + warp * kWarpRows + lane / 4 + 8 * r;
    rowLse2[r] = lse2[row];
    rowDelta[r] = delta[row];
  }
  float grad[D / 8][4] = {};
  streamKeyTiles<T, D>(shared, geo, block, q, k, v, dy,
                       [&](float(&s)[kKeys / 8][4], float(&dp)[kKeys / 8][4], const T *tileK) {
                         // Masked scores are -inf: their dS is exactly 0.
                         forEachElement<kKeys>([&](int n, int e, int, int) {
                           s[n][e] = exp2f(s[n][e] - rowLse2[e / 2]) * (dp[n][e] - rowDelta[e / 2]);
                         });
                         uint32_t a[kKeys / 16][4];
                         toFragments<T, kKeys>(a, s);
                         warpProductAB<T, D, kKeys>(grad, a, tileK, kStride);
                       });
  T *warpQ = Shared::fixed(shared, 0) + warp * kWarpRows * kStride;
  const float scale[2] = {geo.scale, geo.scale};
  storeFragments<T, D>(warpQ, kStride, grad, scale);
  __syncthreads();
  storeTile<kBlockRows, D>(geo.queryHead(dq, block.batch, block.head) +
                               block.query0 * geo.qRowStride,
                           geo.qRowStride, Shared::fixed(shared, 0));
}

//===----------------------------------------------------------------------===//
// Host side
//===----------------------------------------------------------------------===//

/// Checks the arguments (throwing CudaError that names the kernel) and describes them.
Geometry geometry(const char *kernel, int64_t seq, int64_t batch, int64_t heads, int64_t kvHeads,
                  int64_t headDim, bool causal, std::initializer_list<const void *> buffers) {
  auto reject = [&](const std::string &why) {
    throwCallFailed(kernel, "argument check", why, __FILE__, __LINE__);
  };
  if (!flashAttentionSupports(seq, headDim))
    reject("seq " + std::to_string(seq) + " with head size " + std::to_string(headDim) +
           " is not supported: seq must be a positive multiple of 64 (at most 64 * 65535) and "
           "the head size 64 or 128");
  if (batch < 0 || heads <= 0 || kvHeads <= 0 || heads % kvHeads != 0)
    reject("kv_heads must divide heads, and both be positive");
  if (batch * heads > std::numeric_limits<int>::max())
    reject("batch * heads exceeds the grid");
  for (const void *buffer : buffers)
    if (reinterpret_cast<uintptr_t>(buffer) % 16 != 0)
      reject("every buffer must be 16-byte aligned");
  double scale = 1.0 / std::sqrt(double(headDim));
  return Geometry{seq,
                  batch,
                  heads,
                  kvHeads,
                  heads / kvHeads,
                  headDim,
                  batch * heads * headDim,
                  batch * kvHeads * headDim,
                  float(scale),
                  float(scale * kLog2e),
                  causal};
}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), unsigned gridX, int64_t seq, size_t sharedBytes,
            cudaStream_t stream, const char *name, Args... args) {
  PARC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(sharedBytes)),
                  name);
  dim3 grid(gridX, static_cast<unsigned>(seq / kBlockRows));
  kernel<<<grid, kThreads, sharedBytes, stream>>>(args...);
  checkLaunch(name);
}

template <typename T, int D>
void forward(T *y, const T *q, const T *k, const T *v, const Geometry &geo, cudaStream_t stream) {
  launch(flashForwardKernel<T, D>, unsigned(geo.batch * geo.heads), geo.seq,
         ForwardShared<T, D>::kBytes, stream, "flashAttentionForward", y, q, k, v, geo);
}

template <typename T, int D>
void backward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *dy,
              const Geometry &geo, cudaStream_t stream) {
  const char *name = "flashAttentionBackward";
  int64_t rows = geo.batch * geo.heads * geo.seq;
  StreamBuffer<float> stats(2 * size_t(rows), stream, "flashAttentionBackward row statistics");
  float *lse2 = stats.get(), *delta = stats.get() + rows;
  unsigned queryBlocks = unsigned(geo.batch * geo.heads);
  launch(flashRowStatsKernel<T, D>, queryBlocks, geo.seq, QueryGradShared<T, D>::kBytes, stream,
         name, lse2, delta, q, k, v, dy, geo);
  launch(flashKeyValueGradKernel<T, D>, unsigned(geo.batch * geo.kvHeads), geo.seq,
         KeyValueGradShared<T, D>::kBytes, stream, name, dk, dv, q, k, v, dy, lse2, delta, geo);
  launch(flashQueryGradKernel<T, D>, queryBlocks, geo.seq, QueryGradShared<T, D>::kBytes, stream,
         name, dq, q, k, v, dy, lse2, delta, geo);
}

} // namespace

bool flashAttentionSupports(int64_t seq, int64_t headDim) {
  return (headDim == 64 || headDim == 128) && seq > 0 && seq % kBlockRows == 0 &&
         seq / kBlockRows <= kMaxGridY;
}

template <typename T>
void flashAttentionForward(T *y, const T *q, const T *k, const T *v, int64_t seq, int64_t batch,
                           int64_t heads, int64_t kvHeads, int64_t headDim, bool causal,
                           cudaStream_t stream) {
  Geometry geo =
      geometry("flashAttentionForward", seq, batch, heads, kvHeads, headDim, causal, {y, q, k, v});
  if (batch == 0)
    return;
  if (headDim == 64)
    forward<T, 64>(y, q, k, v, geo, stream);
  else
    forward<T, 128>(y, q, k, v, geo, stream);
}

template <typename T>
void flashAttentionBackward(T *dq, T *dk, T *dv, const T *q, const T *k, const T *v, const T *dy,
                            int64_t seq, int64_t batch, int64_t heads, int64_t kvHeads,
                            int64_t headDim, bool causal, cudaStream_t stream) {
  Geometry geo = geometry("flashAttentionBackward", seq, batch, heads, kvHeads, headDim, causal,
                          {dq, dk, dv, q, k, v, dy});
  if (batch == 0)
    return;
  if (headDim == 64)
    backward<T, 64>(dq, dk, dv, q, k, v, dy, geo, stream);
  else
    backward<T, 128>(dq, dk, dv, q, k, v, dy, geo, stream);
}

#define PARC_INSTANTIATE(T)                                                                        \
  template void flashAttentionForward(T *, const T *, const T *, const T *, int64_t, int64_t,      \
                                      int64_t, int64_t, int64_t, bool, cudaStream_t);              \
  template void flashAttentionBackward(T *, T *, T *, const T *, const T *, const T *, const T *,  \
                                       int64_t, int64_t, int64_t, int64_t, int64_t, bool,          \
                                       cudaStream_t);
PARC_INSTANTIATE(__nv_bfloat16)
PARC_INSTANTIATE(__half)
#undef PARC_INSTANTIATE

} // namespace parc::runtime::cuda
