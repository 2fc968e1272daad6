//===- VecMath.h - exp and erfc in float, branch-free so that loops vectorise --===//
//
// Private to the CPU kernels. The fp32 kernels evaluate their transcendentals here instead of
// calling libm in double: both functions are straight-line float arithmetic (no calls, no
// branches), so that a `#pragma omp simd` loop over them runs in vector registers. The fp64
// kernels keep libm in double (the finite-difference tests and the equivalence sweep's 1e-10
// need it).
//
//   expf:  Cephes' range reduction x = n ln2 + r (ln2 in two parts) and its degree-5
//          polynomial; 2^n built in the exponent bits. About 1 ulp from -87.34 (the smallest
//          normal float's logarithm; 0 below, exp(-inf) included) to 88.376 (2^127.5; the
//          result stays there above, finite).
//   erfcPositive(a) = erfc(a), a >= 0: Abramowitz & Stegun 7.1.26 (absolute error 1.5e-7,
//          the formula torch's vectorised erf uses), returned as erfc so that 1 + erf(-a) =
//          erfc(a) has no cancellation where GELU's x is negative.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_KERNELS_CPU_VECMATH_H
#define PARC_RUNTIME_KERNELS_CPU_VECMATH_H

#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

// The loops over these functions also get AVX-512 and AVX2 clones beside the baseline (SSE2)
// one, and the loader picks the widest the machine has (GCC and clang's target_clones). No
// clone may fuse a multiply and an add (the kernels build with -ffp-contract=off: both
// compilers would fuse in the AVX-512 one), so all round every operation alike and their
// results are bit-identical; only the vectors are two or four times as wide. Sanitizer
// builds keep one version, as an ifunc resolver runs before the sanitizer's runtime is up:
// -DPARC_SANITIZE defines PARC_NO_VECTOR_CLONES, and so do the sanitizers either compiler
// announces (GCC announces no UBSan; the CMake option covers it).
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) ||                         \
    __has_feature(undefined_behavior_sanitizer)
#define PARC_NO_VECTOR_CLONES 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PARC_NO_VECTOR_CLONES 1
#endif
#if defined(__x86_64__) && defined(__linux__) && !defined(PARC_NO_VECTOR_CLONES)
#define PARC_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PARC_VECTOR_CLONES
#endif
// A lambda called in a cloned function is a function of its own, built for the baseline
// target unless it is inlined into each clone: the lambdas of a cloned loop carry this.
#define PARC_INLINE_LAMBDA __attribute__((always_inline))

namespace parc::runtime::cpu::detail {

/// sum of term(i) over i in [0, n), added into `Lanes` partial sums of type Acc that are then
/// added in order. A single running sum is a chain the compiler may not reorder; the lanes are
/// independent and vectorise, and their order is fixed by the code, not by the vector width,
/// so every clone (and every machine) gets the same bits. `term` may store as it goes.
/// Several terms are summed in one pass over i, each in its own lanes: the bits of one
/// laneSum per term, for one loop and one read of the row they share.
///
/// rowLaneSums does the same for `Rows` rows at once, term(r, i) being row r's term at i: row
/// r's sums are the bits laneSums gives that row alone. Each lane is a chain of dependent adds,
/// which bounds a short row by the adder's latency; the rows' chains are independent, so
/// interleaving them lets the adds of one row fill the others' wait.
template <typename Acc, int64_t Lanes, size_t... Row, typename... Terms>
[[gnu::always_inline]] inline std::array<std::array<Acc, sizeof...(Terms)>, sizeof...(Row)>
rowLaneSumsOf(std::index_sequence<Row...>, int64_t n, const Terms &...terms) {
  constexpr size_t termCount = sizeof...(Terms);
  Acc part[sizeof...(Row)][termCount][Lanes] = {};
  // Every row and term in one statement, the row a constant, so that the accumulators stay
  // in registers.
  auto add = [&](int64_t j, int64_t i) PARC_INLINE_LAMBDA {
    auto addRow = [&](size_t r) PARC_INLINE_LAMBDA {
      size_t t = 0;
      ((part[r][t++][j] += terms(int64_t(r), i)), ...);
    };
    (addRow(Row), ...);
  };
  int64_t i = 0;
  for (; i + Lanes <= n; i += Lanes) {
#pragma omp simd
    for (int64_t j = 0; j < Lanes; ++j)
      add(j, i + j);
  }
  for (int64_t j = 0; i < n; ++i, ++j)
    add(j, i);
  std::array<std::array<Acc, termCount>, sizeof...(Row)> sums{};
  for (size_t r = 0; r < sizeof...(Row); ++r)
    for (size_t t = 0; t < termCount; ++t)
      for (Acc p : part[r][t])
        sums[r][t] += p;
  return sums;
}

template <typename Acc, int64_t Lanes, int64_t Rows, typename... Terms>
[[gnu::always_inline]] inline std::array<std::array<Acc, sizeof...(Terms)>, Rows>
rowLaneSums(int64_t n, const Terms &...terms) {
  return rowLaneSumsOf<Acc, Lanes>(std::make_index_sequence<Rows>{}, n, terms...);
}

template <typename Acc, int64_t Lanes, typename... Terms>
[[gnu::always_inline]] inline std::array<Acc, sizeof...(Terms)> laneSums(int64_t n,
                                                                         const Terms &...terms) {
  return rowLaneSums<Acc, Lanes, 1>(n, [&](int64_t, int64_t i) { return terms(i); }...)[0];
}

template <typename Acc, int64_t Lanes, typename Term>
[[gnu::always_inline]] inline Acc laneSum(int64_t n, const Term &term) {
  return laneSums<Acc, Lanes>(n, term)[0];
}

inline float expf(float x) {
  // e^x = 2^n e^r, n = round(x / ln2), |r| <= ln2 / 2. Below e^-87.34, the smallest normal
  // float, the result is 0 (as exp(-inf) must be). n stays <= 127, as 2^128 is no float (its
  // bits are infinity's): from e^88.376 = 2^127.5 on, the result stays at that value.
  bool underflows = x < -87.33654f;
  x = underflows ? -87.33654f : x;
  x = x > 88.376f ? 88.376f : x;
  // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer.
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // A NaN passes the clamps and stays in p; converting it to int would be undefined
  // (UBSan caught it on a diverging run), so its exponent is taken as 0.
  n = n == n ? n : 0.0f;
  int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return underflows ? 0.0f : p * scale;
}

/// erfc(a) for a >= 0, given e = exp(-a^2) (callers often need e itself too).
inline float erfcPositive(float a, float e) {
  float t = 1.0f / (1.0f + 0.3275911f * a);
  float q = 1.061405429f;
  q = q * t - 1.453152027f;
  q = q * t + 1.421413741f;
  q = q * t - 0.284496736f;
  q = q * t + 0.254829592f;
  return q * t * e;
}

} // namespace parc::runtime::cpu::detail

#endif
