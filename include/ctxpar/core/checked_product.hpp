/// \file
/// `ctxpar::impl::checked_product`: element counts from extents without a silent int64 wrap.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>

namespace ctxpar::impl {

/// The product of non-negative `factors`, or -1 when a factor is negative or the product does not
/// fit in int64 (so that a check `checked_product(...) <= limit` fails instead of wrapping).
inline std::int64_t checked_product(std::initializer_list<std::int64_t> factors) {
  std::int64_t out = 1;
  for (std::int64_t f : factors) {
    if (f < 0) return -1;
    if (f != 0 && out > std::numeric_limits<std::int64_t>::max() / f) return -1;
    out *= f;
  }
  return out;
}

}  // namespace ctxpar::impl
