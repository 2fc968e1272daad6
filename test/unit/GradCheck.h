//===- GradCheck.h - Central finite differences for the kernel tests ------===//
#ifndef PARC_TEST_UNIT_GRADCHECK_H
#define PARC_TEST_UNIT_GRADCHECK_H

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace parc::test {

using Vec = std::vector<double>;

/// How close an fp64 kernel's gradient must come to its central differences (h = 1e-5).
constexpr double gradTolerance = 1e-6;

inline double dot(const std::vector<double> &a, const std::vector<double> &b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i)
    sum += a[i] * b[i];
  return sum;
}

/// d loss / d x by central differences, one element of x at a time.
inline std::vector<double> numericGradient(const std::function<double()> &loss,
                                           std::vector<double> &x, double h = 1e-5) {
  std::vector<double> grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double saved = x[i];
    x[i] = saved + h;
    double plus = loss();
    x[i] = saved - h;
    double minus = loss();
    x[i] = saved;
    grad[i] = (plus - minus) / (2 * h);
  }
  return grad;
}

/// max |analytic - numeric| relative to the largest numeric component.
inline double relativeError(const std::vector<double> &analytic,
                            const std::vector<double> &numeric) {
  double error = 0, scale = 0;
  for (size_t i = 0; i < numeric.size(); ++i) {
    error = std::max(error, std::abs(analytic[i] - numeric[i]));
    scale = std::max(scale, std::abs(numeric[i]));
  }
  return error / scale;
}

inline std::vector<double> minus(const std::vector<double> &a, const std::vector<double> &b) {
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    d[i] = a[i] - b[i];
  return d;
}

} // namespace parc::test

#endif
