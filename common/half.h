// Conversions between float32 and the two 16-bit float formats Ringmaster reduces: IEEE 754
// binary16 ("float16", 1-5-10) and bfloat16 (1-8-7, the top half of a float32). Narrowing rounds to
// nearest, ties to even, in integer arithmetic (independent of the floating-point environment);
// values too large become infinity, infinities stay infinities, and a NaN stays a NaN (made quiet,
// sign kept).
#pragma once

#include <bit>
#include <cstdint>

namespace ringmaster {

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) {  // Infinity or NaN; the payload moves to the top of the float mantissa.
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);  // Signed zero.
    // Subnormal: mantissa * 2^-24, which is a normal float. Shift the leading one into the
    // implicit-bit position, lowering the exponent as we go.
    exponent = 113;  // The biased float exponent of 2^-14.
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    return std::bit_cast<float>(sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) {  // NaN: quiet it and keep the top payload bits.
    return static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  }
  // 65520 (halfway between 65504, the largest half, and 65536) and above round to infinity; this
  // includes infinity itself.
  if (magnitude >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (magnitude >= 0x38800000u) {  // At least 2^-14: a normal half.
    // Rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest-even; a
    // carry out of the mantissa correctly bumps the exponent.
    const uint32_t odd = (magnitude >> 13) & 1u;
    return static_cast<uint16_t>(sign | ((magnitude - 0x38000000u + 0xFFFu + odd) >> 13));
  }
  // Subnormal half (or zero): round(|f| / 2^-24). |f| = m * 2^(e - 150) with the implicit bit in m,
  // so the quotient is m >> (126 - e), rounded on the bits shifted out.
  const uint32_t exponent = magnitude >> 23;
  const uint32_t shift = 126 - exponent;  // At least 14 here.
  if (shift > 24) return sign;            // Below 2^-25: rounds to zero.
  const uint32_t m = (magnitude & 0x7FFFFFu) | 0x800000u;
  uint32_t quotient = m >> shift;
  const uint32_t remainder = m & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  if (remainder > halfway || (remainder == halfway && (quotient & 1u))) ++quotient;
  return static_cast<uint16_t>(sign | quotient);  // 0x400 (the smallest normal) when it rounds up.
}

inline float Bfloat16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t FloatToBfloat16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: truncation could clear the payload; quiet it.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round the low 16 bits to nearest-even; large finite values carry into infinity, as they should.
  const uint32_t odd = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7FFFu + odd) >> 16);
}

}  // namespace ringmaster
