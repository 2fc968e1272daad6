#include "parc/Support/CheckedInt.h"
#include <gtest/gtest.h>

using namespace parc;

TEST(CheckedInt, MultiplyOverflowIsReported) {
  EXPECT_EQ(checkedMul(1 << 20, 1 << 20), int64_t(1) << 40);
  EXPECT_FALSE(checkedMul(INT64_MAX / 2 + 1, 2).has_value());
  EXPECT_FALSE(checkedAdd(INT64_MAX, 1).has_value());
  EXPECT_FALSE(checkedSub(INT64_MIN, 1).has_value());
}

TEST(CheckedInt, DivisionDistinguishesExactInexactAndZero) {
  EXPECT_EQ(checkedDiv(96, 8).status, IntDivision::Exact);
  EXPECT_EQ(checkedDiv(96, 8).quotient, 12);
  EXPECT_EQ(checkedDiv(96, 5).status, IntDivision::Inexact);
  EXPECT_EQ(checkedDiv(1, 0).status, IntDivision::ByZero);
  EXPECT_EQ(checkedDiv(INT64_MIN, -1).status, IntDivision::Overflow);
}

TEST(CheckedInt, DecimalLiteralLimits) {
  EXPECT_EQ(parseDecimalInt("9223372036854775807"), INT64_MAX);
  EXPECT_FALSE(parseDecimalInt("9223372036854775808").has_value());
  EXPECT_FALSE(parseDecimalInt("1000000000000000000000000000000").has_value());
  EXPECT_FALSE(parseDecimalInt("").has_value());
}

TEST(CheckedInt, RoundUpToMultiple) {
  EXPECT_EQ(roundUpToMultiple(51200, 1024), 51200);
  EXPECT_EQ(roundUpToMultiple(50257, 1024), 51200);
  EXPECT_FALSE(roundUpToMultiple(INT64_MAX - 1, 1024).has_value());
}
