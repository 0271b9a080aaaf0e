/// \file
/// `SkipTerm`: whether a GDP layer has the skip parameter `D`, and its shape (the reference's
/// `D_cp1` / `D_has_hdim`).
#pragma once

#include <cstdint>

#include "ctxpar/core/impl/enum_name.hpp"

namespace ctxpar::heads {

/// The skip term `y += D ⊙ x_V`, where `x_V` is the first householder copy of the V section after
/// the conv and SiLU (the value the recurrence reads at sub-step 0 of each token).
enum class SkipTerm : int {
  none = 0,         ///< no `D` (the usual GDP layer)
  per_head = 1,     ///< `D [nheads]`, one value shared by a head's `headdim` channels
  per_channel = 2,  ///< `D [d_inner]` (`D_has_hdim`), one value per value channel
};

/// Elements of `D` for `skip` over `nheads` heads of `headdim` channels (0 for `SkipTerm::none`).
inline std::int64_t skip_size(SkipTerm skip, int nheads, int headdim) {
  switch (skip) {
    case SkipTerm::per_head:
      return nheads;
    case SkipTerm::per_channel:
      return std::int64_t{nheads} * headdim;
    default:
      return 0;
  }
}

/// The name used in messages and reports: `none`, `per_head` or `per_channel`.
inline const char* skip_name(SkipTerm skip) {
  static constexpr const char* names[] = {"none", "per_head", "per_channel"};
  return ctxpar::impl::enum_name(skip, names, "none");
}

}  // namespace ctxpar::heads
