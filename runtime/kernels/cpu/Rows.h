//===- Rows.h - Row-parallel loops and reductions over rows of the CPU kernels --===//
//
// Private to the CPU kernels. Elementwise kernels run over contiguous ranges of elements or
// rows on the kernel threads (Parallel.h). A sum over rows (a bias gradient, a norm's weight
// gradient) is cut into blocks of a fixed number of rows whose partial sums are added in block
// order, or split by columns (forColumns), so that the result is the same bits whatever the
// number of threads.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_KERNELS_CPU_ROWS_H
#define PARC_RUNTIME_KERNELS_CPU_ROWS_H

#include "Parallel.h"

#include <algorithm>
#include <vector>

namespace parc::runtime::cpu::detail {

/// Elements per thread below which a second thread costs more than it saves. From 16384 to
/// 4096 (tiny.par's 128 x 128 activations now split), tiny.par's 1 rank on 2 threads gained
/// 1.0-1.2 % with the two cores near and 3-5 % with them apart (medians of 68-88 alternated
/// pairs of runs; docs/runtime.md); 2048 did no better.
inline constexpr int64_t elementGrain = 4096;

/// body(begin, end) over [0, n) elements on the kernel threads.
template <typename Body> void forElements(int64_t n, const Body &body) {
  parallelFor(n, elementGrain, body);
}

/// body(begin, end) over [0, rows) rows of `dim` elements on the kernel threads.
template <typename Body> void forRows(int64_t rows, int64_t dim, const Body &body) {
  parallelFor(rows, std::max<int64_t>(1, elementGrain / std::max<int64_t>(1, dim)), body);
}

/// Columns per unit of forColumns: a cache line of floats, so that two threads write one line
/// only where a row does not start on one (false sharing: each column is still one thread's).
inline constexpr int64_t columnUnit = 16;

/// body(c0, c1) over [0, columns) columns of `rows` elements each on the kernel threads, in
/// ranges of whole cache lines: a sum over rows that gives each thread its columns adds every
/// column over all rows in the serial order.
template <typename Body> void forColumns(int64_t columns, int64_t rows, const Body &body) {
  int64_t units = (columns + columnUnit - 1) / columnUnit;
  int64_t grain = std::max<int64_t>(1, elementGrain / std::max<int64_t>(1, columnUnit * rows));
  parallelFor(units, grain, [&](int64_t first, int64_t last) {
    body(first * columnUnit, std::min(columns, last * columnUnit));
  });
}

/// y[r, i] = f(T(x[r, i] + bias[i])) over rows [first, last): a bias add and what follows it in
/// one pass, the sum rounded to T as a separate bias_add would leave it. Inline, so that a
/// cloned caller's copy is vectorised for its target (f carries PARC_INLINE_LAMBDA).
template <typename T, typename F>
[[gnu::always_inline]] inline void mapBiasedRows(T *y, const T *x, const T *bias, int64_t first,
                                                 int64_t last, int64_t dim, const F &f) {
  for (int64_t r = first; r < last; ++r) {
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i)
      y[r * dim + i] = f(T(x[r * dim + i] + bias[i]));
  }
}

/// Rows per block of a reduction over rows; fixed, so the sums do not depend on the threads.
inline constexpr int64_t reductionBlockRows = 32;

/// Runs body(rowBegin, rowEnd, partial) on blocks of rows, `partial` `width` zeroed
/// accumulators of that block, and returns the blocks' partials added in block order (`width`
/// values, valid until the next call on this thread).
template <typename T, typename Body>
const T *sumOverRowBlocks(int64_t rows, int64_t width, const Body &body) {
  thread_local std::vector<T> partials, total;
  int64_t blocks = (rows + reductionBlockRows - 1) / reductionBlockRows;
  partials.assign(size_t(std::max<int64_t>(1, blocks) * width), T(0));
  total.assign(size_t(width), T(0));
  T *base = partials.data();
  parallelFor(blocks, std::max<int64_t>(1, elementGrain / std::max<int64_t>(1, reductionBlockRows * width)),
              [&](int64_t first, int64_t last) {
                for (int64_t b = first; b < last; ++b)
                  body(b * reductionBlockRows, std::min(rows, (b + 1) * reductionBlockRows),
                       base + b * width);
              });
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t j = 0; j < width; ++j)
      total[size_t(j)] += base[b * width + j];
  return total.data();
}

} // namespace parc::runtime::cpu::detail

#endif
