/// \file
/// `ctxpar::float16`: the IEEE binary16 storage type (1 sign, 5 exponent, 10 fraction bits), the
/// same on every backend, so a buffer written on the host is the bit pattern a GPU's tensor-core
/// instructions read. Storage only, like `bfloat16`: arithmetic converts to `float` and rounds
/// back.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>

namespace ctxpar {

/// An IEEE half-precision value held as its bit pattern (trivially copyable, 2 bytes, no
/// implicit conversions).
struct float16 {
  std::uint16_t bits;  ///< The IEEE binary16 bit pattern.

  /// `x` rounded to the nearest half, ties to even, subnormals included; a NaN stays a NaN
  /// (quiet, sign kept), and a finite value at or past 65520 (halfway between the largest half,
  /// 65504, and 2^16) rounds to ±inf.
  KOKKOS_INLINE_FUNCTION static float16 from_float(float x) {
    std::uint32_t u = 0;
    std::memcpy(&u, &x, sizeof u);
    const std::uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a >= 0x7f800000u)  // inf, or NaN with the top of its payload and the quiet bit
      return float16{static_cast<std::uint16_t>(
          sign | 0x7c00u | (a > 0x7f800000u ? 0x0200u | ((a >> 13) & 0x03ffu) : 0u))};
    if (a >= 0x477ff000u) return float16{static_cast<std::uint16_t>(sign | 0x7c00u)};
    if (a >= 0x38800000u) {
      // A normal half: rebias the exponent by 127 - 15 and round the 13 dropped bits to nearest
      // even; a carry out of the fraction moves into the exponent, as it should.
      const std::uint32_t rounded = a - 0x38000000u + 0x0fffu + ((a >> 13) & 1u);
      return float16{static_cast<std::uint16_t>(sign | (rounded >> 13))};
    }
    // Subnormal or zero: the count of 2^-24 units, rounded to nearest even by the float adder
    // (|x|·2^24 < 2^10 is exact; adding and removing 2^23 rounds it to an integer), 1024 being
    // the smallest normal.
    float magnitude = 0;
    std::memcpy(&magnitude, &a, sizeof magnitude);
    const float units = magnitude * 16777216.0f;
    volatile float shifted = units + 8388608.0f;  // kept apart so no compiler folds the pair
    const float whole = shifted - 8388608.0f;
    return float16{static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(whole))};
  }

  /// The value as a float (exact: every half is a float).
  KOKKOS_INLINE_FUNCTION float to_float() const {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
    const std::uint32_t exponent = (bits >> 10) & 0x1fu, fraction = bits & 0x03ffu;
    std::uint32_t u = 0;
    if (exponent == 0x1fu) {
      u = sign | 0x7f800000u | (fraction << 13);
    } else if (exponent != 0) {
      u = sign | ((exponent + 112u) << 23) | (fraction << 13);
    } else {
      const float value = static_cast<float>(fraction) * (1.0f / 16777216.0f);  // exact
      std::memcpy(&u, &value, sizeof u);
      u |= sign;
    }
    float x = 0;
    std::memcpy(&x, &u, sizeof x);
    return x;
  }
};

static_assert(sizeof(float16) == 2, "float16 is two bytes");

}  // namespace ctxpar
