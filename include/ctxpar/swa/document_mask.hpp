/// \file
/// The mask of sliding-window attention as a `ctxpar::mask` expression, inlined by the kernels: ids
/// and causality only. The window itself is not part of it: the kernels take it from their inputs
/// (`AttentionInputs::window`) through their one window reader, `impl::WindowRange`.
#pragma once

#include <cstdint>

#include "ctxpar/expr/mask.hpp"

namespace ctxpar::swa {

/// `causal() && same_sequence()`: key `j` may be visible to query `i` iff `pos_j <= pos_i` and
/// both belong to the same document; the kernels add the window (`pos_i - W < pos_j`).
inline auto document_mask() {
  return mask::causal() && mask::same_sequence();
}

/// The type of `document_mask`, for explicit instantiations; the kernels mask the tiles the window
/// cuts by lane ranges under it.
using DocumentMask = decltype(document_mask());

}  // namespace ctxpar::swa
