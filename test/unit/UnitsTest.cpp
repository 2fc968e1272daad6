#include "parc/Support/Units.h"
#include <gtest/gtest.h>

using namespace parc;

TEST(Units, BinaryAndDecimalSizes) {
  EXPECT_EQ(lookupUnit("GiB")->intScale, int64_t(1) << 30);
  EXPECT_EQ(lookupUnit("GB")->intScale, 1000000000);
  EXPECT_EQ(lookupUnit("GiB")->dim, Dimension::size());
}

TEST(Units, BitRatesAreAnEighthOfByteRates) {
  EXPECT_DOUBLE_EQ(lookupUnit("Gb/s")->scale * 8, lookupUnit("GB/s")->scale);
  EXPECT_EQ(lookupUnit("Gb/s")->dim, Dimension::bandwidth());
}

TEST(Units, UnknownAndCaseSensitive) {
  EXPECT_FALSE(lookupUnit("gib").has_value());
  EXPECT_FALSE(lookupUnit("GBps").has_value());
}

TEST(Units, DimensionArithmetic) {
  EXPECT_EQ(Dimension::size() / Dimension::time(), Dimension::bandwidth());
  EXPECT_EQ(Dimension::size() / Dimension::bandwidth(), Dimension::time());
  EXPECT_EQ(Dimension::flopRate() * Dimension::time(), Dimension::flopCount());
  EXPECT_TRUE((Dimension::size() / Dimension::size()).isNone());
}

TEST(Units, Describe) {
  EXPECT_EQ(Dimension::size().describe(), "a size in bytes");
  EXPECT_EQ(Dimension::bandwidth().describe(), "a bandwidth");
  EXPECT_EQ((Dimension::size() * Dimension::size()).describe(), "a quantity in B^2");
}

TEST(Units, Formatting) {
  EXPECT_EQ(formatBytes(80.0 * (1 << 30)), "80.0 GiB");
  EXPECT_EQ(formatBytes(12), "12 B");
  EXPECT_EQ(formatQuantity(3e11, Dimension::bandwidth()), "300 GB/s");
  EXPECT_EQ(formatQuantity(312e12, Dimension::flopRate()), "312 TFLOPS");
}
