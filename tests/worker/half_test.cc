#include "common/half.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace ringmaster {
namespace {

float Bits(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- float16 ----

TEST(HalfTest, KnownValuesBothWays) {
  const struct {
    uint16_t half;
    float value;
  } cases[] = {
      {0x0000, 0.0f},
      {0x8000, -0.0f},
      {0x3C00, 1.0f},
      {0xBC00, -1.0f},
      {0x4000, 2.0f},
      {0x3800, 0.5f},
      {0x3555, 0.333251953125f},
      {0x7BFF, 65504.0f},  // Largest finite.
      {0xFBFF, -65504.0f},
      {0x0400, 6.103515625e-05f},        // Smallest normal, 2^-14.
      {0x03FF, 6.097555160522461e-05f},  // Largest subnormal, 1023 * 2^-24.
      {0x0001, 5.960464477539063e-08f},  // Smallest subnormal, 2^-24.
      {0x8001, -5.960464477539063e-08f},
      {0x7C00, kInf},
      {0xFC00, -kInf},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(testing::Message() << std::hex << "half 0x" << c.half);
    EXPECT_EQ(Bits(HalfToFloat(c.half)), Bits(c.value));
    EXPECT_EQ(FloatToHalf(c.value), c.half);
  }
}

TEST(HalfTest, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      // The payload's top bit is set (quiet) and the sign and other payload bits are kept.
      ASSERT_EQ(FloatToHalf(f), h | 0x0200) << std::hex << h;
    } else {
      ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
    }
  }
}

TEST(HalfTest, NanStaysNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const uint16_t h = FloatToHalf(nan);
  EXPECT_EQ(h & 0x7C00, 0x7C00);
  EXPECT_NE(h & 0x03FF, 0);
  EXPECT_TRUE(std::isnan(HalfToFloat(h)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7C01)));  // Signalling half NaN.
  // A float NaN whose payload lies entirely in the bits a half drops must not become infinity.
  const uint16_t low_payload = FloatToHalf(Bits(0x7F800001u));
  EXPECT_TRUE(std::isnan(HalfToFloat(low_payload)));
  EXPECT_EQ(FloatToHalf(Bits(0xFFC00000u)) & 0x8000, 0x8000);  // Sign kept.
}

TEST(HalfTest, RoundsToNearestEven) {
  // Between 1 (0x3C00) and 1 + 2^-10 (0x3C01): below, at and above the midpoint.
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-12f), 0x3C00);
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3C00);  // Tie: to even (0x3C00).
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);
  // Between 0x3C01 and 0x3C02 the tie goes up, to the even 0x3C02.
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-10f + 0x1p-11f), 0x3C02);
  // Rounding carries into the exponent: just under 2 becomes 2.
  EXPECT_EQ(FloatToHalf(Bits(0x3FFFFFFFu)), 0x4000);
  // Near the top: 65519 rounds down to 65504, the 65520 tie rounds up to infinity.
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);
  EXPECT_EQ(FloatToHalf(-65520.0f), 0xFC00);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7C00);
}

TEST(HalfTest, SubnormalRounding) {
  // 2^-25 is half the smallest subnormal: a tie, to even (zero). Just above it rounds up.
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0x1p-25f), 0x8000);
  EXPECT_EQ(FloatToHalf(0x1p-25f + 0x1p-40f), 0x0001);
  EXPECT_EQ(FloatToHalf(0x1p-26f), 0x0000);
  // 1.5 * 2^-24 is a tie between 0x0001 and 0x0002: to even.
  EXPECT_EQ(FloatToHalf(0x1.8p-24f), 0x0002);
  // 2.5 * 2^-24 ties between 0x0002 and 0x0003: to even.
  EXPECT_EQ(FloatToHalf(0x1.4p-23f), 0x0002);
  // The largest subnormal plus a half-step ties to the smallest normal (0x0400, even).
  EXPECT_EQ(FloatToHalf(1023.5f * 0x1p-24f), 0x0400);
  // Float subnormals and the smallest floats become (signed) zero.
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::min()), 0x8000);
}

// ---- bfloat16 ----

TEST(Bfloat16Test, KnownValuesBothWays) {
  const struct {
    uint16_t bf16;
    float value;
  } cases[] = {
      {0x0000, 0.0f},
      {0x8000, -0.0f},
      {0x3F80, 1.0f},
      {0xBF80, -1.0f},
      {0x4000, 2.0f},
      {0x3F00, 0.5f},
      {0x4049, 3.140625f},
      {0x7F7F, 3.3895313892515355e38f},  // Largest finite.
      {0x0001, 9.183549615799121e-41f},  // Smallest subnormal.
      {0x7F80, kInf},
      {0xFF80, -kInf},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(testing::Message() << std::hex << "bfloat16 0x" << c.bf16);
    EXPECT_EQ(Bits(Bfloat16ToFloat(c.bf16)), Bits(c.value));
    EXPECT_EQ(FloatToBfloat16(c.value), c.bf16);
  }
}

TEST(Bfloat16Test, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBfloat16(Bits(0x3F808000u)), 0x3F80);  // Tie, 0x3F80 is even.
  EXPECT_EQ(FloatToBfloat16(Bits(0x3F818000u)), 0x3F82);  // Tie, 0x3F81 is odd: up.
  EXPECT_EQ(FloatToBfloat16(Bits(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(FloatToBfloat16(Bits(0x3F808001u)), 0x3F81);
  EXPECT_EQ(FloatToBfloat16(Bits(0xBF808001u)), 0xBF81);
  // The largest finite float is above the last bfloat16 midpoint: infinity.
  EXPECT_EQ(FloatToBfloat16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(FloatToBfloat16(Bits(0x7F7F7FFFu)), 0x7F7F);
}

TEST(Bfloat16Test, NanStaysNan) {
  EXPECT_TRUE(
      std::isnan(Bfloat16ToFloat(FloatToBfloat16(std::numeric_limits<float>::quiet_NaN()))));
  // Payload only in the low 16 bits: truncation alone would give infinity.
  const uint16_t low_payload = FloatToBfloat16(Bits(0x7F800001u));
  EXPECT_TRUE(std::isnan(Bfloat16ToFloat(low_payload)));
  EXPECT_EQ(FloatToBfloat16(Bits(0xFF800001u)) & 0x8000, 0x8000);
  // An all-ones payload must not carry into the sign.
  EXPECT_EQ(FloatToBfloat16(Bits(0x7FFFFFFFu)), 0x7FFF);
}

TEST(Bfloat16Test, EveryBfloat16RoundTripsThroughFloat) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float f = Bfloat16ToFloat(static_cast<uint16_t>(b));
    if ((b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0) {
      ASSERT_TRUE(std::isnan(f));
      ASSERT_EQ(FloatToBfloat16(f), b | 0x0040) << std::hex << b;
    } else {
      ASSERT_EQ(FloatToBfloat16(f), b) << std::hex << b;
    }
  }
}

}  // namespace
}  // namespace ringmaster
