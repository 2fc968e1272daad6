//===- LossScaler.cpp - Loss scaling for fp16 gradients -------------------===//

#include "parc/Runtime/LossScaler.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>

namespace parc::runtime {

std::string formatLossScale(double scale) {
  std::string text;
  llvm::raw_string_ostream(text) << llvm::format("%.10g", scale);
  return text;
}

std::string LossScaleOptions::validate() const {
  if (mode == Mode::None)
    return "";
  // Above 2^1000 the scaled loss overflows even a double.
  if (!(initial > 0 && initial <= std::ldexp(1.0, 1000)))
    return "--" + std::string(mode == Mode::Static ? "loss-scale" : "initial-loss-scale") +
           " must be a positive number up to 2^1000, not " + formatLossScale(initial);
  if (mode == Mode::Static)
    return "";
  if (!(min > 0 && min <= initial))
    return "--min-loss-scale must be positive and at most the initial scale " +
           formatLossScale(initial) + ", not " + formatLossScale(min);
  if (window < 1)
    return "--loss-scale-window must be 1 or more, not " + std::to_string(window);
  if (hysteresis < 1)
    return "--loss-scale-hysteresis must be 1 or more, not " + std::to_string(hysteresis);
  return "";
}

std::string LossScaleOptions::describe() const {
  switch (mode) {
  case Mode::None:
    return "";
  case Mode::Static:
    return "loss scale " + formatLossScale(initial);
  case Mode::Dynamic:
    return "dynamic loss scale from " + formatLossScale(initial);
  }
  return "";
}

std::string LossScaleOptions::flags() const {
  switch (mode) {
  case Mode::None:
    return "--loss-scale=none";
  case Mode::Static:
    return "--loss-scale=" + formatLossScale(initial);
  case Mode::Dynamic:
    return "--loss-scale=dynamic --initial-loss-scale=" + formatLossScale(initial) +
           " --min-loss-scale=" + formatLossScale(min) +
           " --loss-scale-window=" + std::to_string(window) +
           " --loss-scale-hysteresis=" + std::to_string(hysteresis);
  }
  return "";
}

LossScaler::LossScaler(const LossScaleOptions &options)
    : options(options), current(enabled() ? options.initial : 1.0),
      overflowsLeft(options.hysteresis) {}

void LossScaler::finiteStep() {
  if (options.mode != LossScaleOptions::Mode::Dynamic || ++finiteInARow < options.window)
    return;
  finiteInARow = 0;
  overflowsLeft = options.hysteresis;
  // Past 2^1000 the scaled loss itself would overflow a double.
  current = std::min(current * 2, std::ldexp(1.0, 1000));
}

std::string LossScaler::exhaustedHint() const {
  if (options.mode == LossScaleOptions::Mode::Dynamic)
    return " at the minimum loss scale " + formatLossScale(current) +
           "; stopping before the update (lower --min-loss-scale)";
  return " at loss scale " + formatLossScale(current) +
         "; stopping before the update (lower --loss-scale, or use --loss-scale=dynamic)";
}

bool LossScaler::overflow() {
  if (options.mode != LossScaleOptions::Mode::Dynamic)
    return false;
  finiteInARow = 0;
  if (--overflowsLeft > 0)
    return true;
  if (current <= options.min)
    return false;
  current = std::max(current / 2, options.min);
  return true;
}

} // namespace parc::runtime
