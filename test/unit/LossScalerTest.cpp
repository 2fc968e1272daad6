//===- LossScalerTest.cpp - The dynamic loss scale's state machine --------===//

#include "parc/Runtime/LossScaler.h"

#include <gtest/gtest.h>

using namespace parc::runtime;

namespace {

LossScaleOptions dynamicScale(double initial, int64_t window, int64_t hysteresis, double min) {
  LossScaleOptions options;
  options.mode = LossScaleOptions::Mode::Dynamic;
  options.initial = initial;
  options.window = window;
  options.hysteresis = hysteresis;
  options.min = min;
  return options;
}

TEST(LossScaler, OffIsOneAndNeverSkips) {
  LossScaler scaler{LossScaleOptions{}};
  EXPECT_FALSE(scaler.enabled());
  EXPECT_EQ(scaler.scale(), 1.0);
  EXPECT_FALSE(scaler.overflow());
}

TEST(LossScaler, StaticKeepsItsScaleAndNeverSkips) {
  LossScaleOptions options;
  options.mode = LossScaleOptions::Mode::Static;
  options.initial = 1024;
  LossScaler scaler(options);
  for (int i = 0; i < 5; ++i)
    scaler.finiteStep();
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_FALSE(scaler.overflow());
  EXPECT_EQ(scaler.exhaustedHint(), " at loss scale 1024; stopping before the update (lower "
                                    "--loss-scale, or use --loss-scale=dynamic)");
}

// Megatron-LM's DynamicGradScaler: hysteresis counts overflows since the scale last grew; once
// spent, every overflow halves the scale.
TEST(LossScaler, HysteresisDelaysOnlyTheFirstOverflows) {
  LossScaler scaler(dynamicScale(1024, 1000, 3, 1));
  EXPECT_TRUE(scaler.overflow());
  EXPECT_EQ(scaler.scale(), 1024.0);
  scaler.finiteStep(); // a finite step does not restore the hysteresis
  EXPECT_TRUE(scaler.overflow());
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_TRUE(scaler.overflow());
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_TRUE(scaler.overflow());
  EXPECT_EQ(scaler.scale(), 256.0);
}

TEST(LossScaler, GrowsAfterAWindowOfFiniteStepsAndRestoresTheHysteresis) {
  LossScaler scaler(dynamicScale(1024, 3, 2, 1));
  scaler.finiteStep();
  scaler.finiteStep();
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_TRUE(scaler.overflow()); // breaks the run of finite steps, keeps the scale
  scaler.finiteStep();
  scaler.finiteStep();
  EXPECT_EQ(scaler.scale(), 1024.0);
  scaler.finiteStep();
  EXPECT_EQ(scaler.scale(), 2048.0);
  EXPECT_TRUE(scaler.overflow());
  EXPECT_EQ(scaler.scale(), 2048.0);
  EXPECT_TRUE(scaler.overflow());
  EXPECT_EQ(scaler.scale(), 1024.0);
}

TEST(LossScaler, StopsAnOverflowAtTheFloor) {
  LossScaler scaler(dynamicScale(4, 1000, 1, 2));
  EXPECT_TRUE(scaler.overflow());
  EXPECT_EQ(scaler.scale(), 2.0);
  EXPECT_FALSE(scaler.overflow());
  EXPECT_EQ(scaler.scale(), 2.0);
  EXPECT_EQ(scaler.exhaustedHint(), " at the minimum loss scale 2; stopping before the update "
                                    "(lower --min-loss-scale)");
}

TEST(LossScaler, ValidateNamesTheOption) {
  EXPECT_EQ(dynamicScale(8, 1000, 2, 16).validate(),
            "--min-loss-scale must be positive and at most the initial scale 8, not 16");
  EXPECT_EQ(dynamicScale(8, 0, 2, 1).validate(), "--loss-scale-window must be 1 or more, not 0");
  EXPECT_EQ(dynamicScale(8, 10, 0, 1).validate(),
            "--loss-scale-hysteresis must be 1 or more, not 0");
  EXPECT_EQ(dynamicScale(-1, 10, 2, 1).validate(),
            "--initial-loss-scale must be a positive number up to 2^1000, not -1");
  EXPECT_EQ(dynamicScale(65536, 1000, 2, 1).validate(), "");
  EXPECT_EQ(dynamicScale(65536, 1000, 2, 1).describe(), "dynamic loss scale from 65536");
}

} // namespace
