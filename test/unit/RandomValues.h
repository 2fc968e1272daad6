//===- RandomValues.h - Test inputs bounded away from zero ----------------===//
#ifndef PARC_TEST_UNIT_RANDOMVALUES_H
#define PARC_TEST_UNIT_RANDOMVALUES_H

#include <cstdint>
#include <random>
#include <vector>

namespace parc::test {

/// Values with magnitude in [0.5, 1.5] times `scale` and a random sign: never zero.
inline std::vector<double> randomVec(size_t n, std::mt19937_64 &rng, double scale = 1.0) {
  std::uniform_real_distribution<double> magnitude(0.5, 1.5);
  std::bernoulli_distribution negative(0.5);
  std::vector<double> v(n);
  for (double &x : v)
    x = scale * magnitude(rng) * (negative(rng) ? -1.0 : 1.0);
  return v;
}

/// `n` values uniform in [-scale, scale] from `seed`, rounded to T.
template <typename T>
std::vector<T> randomValues(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> value(-scale, scale);
  std::vector<T> v(n);
  for (T &x : v)
    x = T(value(rng));
  return v;
}

} // namespace parc::test

#endif
