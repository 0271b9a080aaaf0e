/// \file
/// `ctxpar::bfloat16`: the 16-bit brain-float storage type (1 sign, 8 exponent, 7 fraction bits:
/// the upper half of an IEEE fp32), the same on every backend, so a buffer written on the host is
/// the bit pattern a GPU's tensor-core instructions read. Storage only: arithmetic converts to
/// `float` (`to_float`) and rounds back (`from_float`), as the kernels accumulate in fp32.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>

namespace ctxpar {

/// A bfloat16 value held as its bit pattern (trivially copyable, 2 bytes, no implicit
/// conversions).
struct bfloat16 {
  std::uint16_t bits;  ///< The bit pattern: the upper half of the fp32 value it holds.

  /// `x` rounded to the nearest bfloat16, ties to even (the rounding of CUDA's
  /// `__float2bfloat16_rn` and of PyTorch's `torch.bfloat16` conversion); a NaN stays a NaN
  /// (quiet, sign kept), ±inf and ±0 stay themselves, and a finite value past the largest
  /// bfloat16 rounds to ±inf.
  KOKKOS_INLINE_FUNCTION static bfloat16 from_float(float x) {
    std::uint32_t u = 0;
    std::memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0u)
      return bfloat16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
    // Adding 0x7fff plus the lowest kept bit carries into the kept half exactly when the dropped
    // half is above one half, or equal to it with an odd kept half.
    const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
    return bfloat16{static_cast<std::uint16_t>(rounded >> 16)};
  }

  /// The value as a float (exact: every bfloat16 is a float).
  KOKKOS_INLINE_FUNCTION float to_float() const {
    const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float x = 0;
    std::memcpy(&x, &u, sizeof x);
    return x;
  }
};

static_assert(sizeof(bfloat16) == 2, "bfloat16 is two bytes");

}  // namespace ctxpar
