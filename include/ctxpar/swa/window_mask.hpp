/// \file
/// The mask of sliding-window attention as a `ctxpar::mask` expression, inlined by the kernels.
#pragma once

#include <cstdint>

#include "ctxpar/expr/mask.hpp"

namespace ctxpar::swa {

/// `causal() && sliding_window(W) && same_sequence()`: key `j` is visible to query `i` iff
/// `pos_i - W < pos_j <= pos_i` (`W = 0`: unlimited) and both belong to the same document.
inline auto window_mask(std::int64_t window) {
  return mask::causal() && mask::sliding_window(window) && mask::same_sequence();
}

/// The type of `window_mask`, for explicit instantiations.
using WindowMask = decltype(window_mask(0));

}  // namespace ctxpar::swa
