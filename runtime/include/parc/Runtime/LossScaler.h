//===- LossScaler.h - Loss scaling for fp16 gradients ---------------------===//
//
// fp16 holds magnitudes from 6e-8 to 65504, and activation gradients of a large model fall
// below that range. Scaling the loss by S before the backward scales every gradient by S
// (the backward is linear in the loss): cross_entropy_bwd multiplies its loss gradient by S
// (OpInterpreter::setLossScale), and the optimizer divides the fp32 gradients by S before
// the norm, so clipping, the norm it reports and the update are those of the unscaled
// gradients. With S a power of two both scalings are exact, so where nothing over- or
// underflows the result is bitwise that of S = 1.
//
// A dynamic scale follows Megatron-LM's DynamicGradScaler: a step whose gradients are not
// finite is skipped (no update; the learning-rate schedule and Adam's step count do not
// advance). The first `hysteresis` - 1 overflows since the scale last grew leave it as it is,
// every later one halves it, down to `min`; after `window` finite steps in a row it doubles.
// Running out of room (an overflow that finds the scale at its minimum, or any overflow under
// a static scale) stops the run, as an overflow does without scaling.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_LOSSSCALER_H
#define PARC_RUNTIME_LOSSSCALER_H

#include <cstdint>
#include <string>

namespace parc::runtime {

struct LossScaleOptions {
  enum class Mode { None, Static, Dynamic };
  Mode mode = Mode::None;
  /// The static scale, or the dynamic scale's start (DeepSpeed's initial_scale_power 16).
  double initial = 65536;
  int64_t window = 1000;  // finite steps before the scale doubles
  int64_t hysteresis = 2; // overflows before it halves
  double min = 1;

  /// Empty when the numbers make sense; otherwise what is wrong, naming parrun's option.
  std::string validate() const;
  /// "dynamic loss scale from 65536" / "loss scale 1024" / "".
  std::string describe() const;
  /// The parrun options that give these settings, all of them.
  std::string flags() const;
};

/// "65536", "1e+40": exact for the scales a dynamic scaler reaches from a power of two.
std::string formatLossScale(double scale);

class LossScaler {
public:
  /// What a checkpoint keeps of the scaler, so that a resumed run scales as the first would.
  struct State {
    double scale = 1;
    int64_t finiteInARow = 0;
    int64_t overflowsLeft = 0;
  };

  explicit LossScaler(const LossScaleOptions &options);

  /// What the loss is multiplied by in this step (1 without scaling).
  double scale() const { return current; }
  bool enabled() const { return options.mode != LossScaleOptions::Mode::None; }

  /// A step whose gradients were finite and applied.
  void finiteStep();
  /// A step whose gradients were not finite. True when the step is skipped and the run goes
  /// on (the scale may have halved); false when the scale has no room left.
  bool overflow();
  /// Why an overflow that overflow() did not absorb stops the run, and what to change.
  std::string exhaustedHint() const;

  State state() const { return {current, finiteInARow, overflowsLeft}; }
  void restore(const State &state) {
    current = state.scale;
    finiteInARow = state.finiteInARow;
    overflowsLeft = state.overflowsLeft;
  }

private:
  LossScaleOptions options;
  double current;
  int64_t finiteInARow = 0;
  int64_t overflowsLeft;
};

} // namespace parc::runtime

#endif
