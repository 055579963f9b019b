#include "runtime/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace mqa {
namespace {

TEST(DType, HalfRoundTripsEveryFiniteHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = HalfBitsToFloat(bits);
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToHalfBits(f), bits) << "half bits " << h;
  }
}

TEST(DType, HalfRoundsToNearestEven) {
  EXPECT_EQ(HalfBitsToFloat(FloatToHalfBits(1.0f + 1.0f / 2048)), 1.0f);  // tie -> even
  EXPECT_EQ(HalfBitsToFloat(FloatToHalfBits(1.0f + 3.0f / 2048)), 1.0f + 4.0f / 2048);
  EXPECT_EQ(HalfBitsToFloat(FloatToHalfBits(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(HalfBitsToFloat(FloatToHalfBits(70000.0f))));
  EXPECT_EQ(HalfBitsToFloat(FloatToHalfBits(5.960464477539063e-08f)), 5.960464477539063e-08f);
  EXPECT_EQ(HalfBitsToFloat(FloatToHalfBits(1e-9f)), 0.0f);
}

TEST(DType, BFloat16RoundTripAndRounding) {
  for (uint32_t h = 0; h < 0x10000; h += 7) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = BFloat16BitsToFloat(bits);
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToBFloat16Bits(f), bits);
  }
  EXPECT_EQ(BFloat16BitsToFloat(FloatToBFloat16Bits(1.0f + 1.0f / 256)), 1.0f);  // tie -> even
  EXPECT_TRUE(std::isnan(BFloat16BitsToFloat(
      FloatToBFloat16Bits(std::numeric_limits<float>::quiet_NaN()))));
}

}  // namespace
}  // namespace mqa
