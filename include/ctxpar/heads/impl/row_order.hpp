/// \file
/// Where a sequence-parallel row lands in natural token order (zigzag undo as an index map).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace ctxpar::heads::impl {

/// Maps the position `q` of a row in sequence-parallel order (rank-major: rank `i`'s shard rows
/// `q = i·(T/P) + t`) to its natural token index. Identity when `zigzag` is false. Under zigzag
/// every sequence `s` (start `c_s`, length `L_s`, `half = L_s/(2P)`) contributes, on rank `i`,
/// its natural chunk `i` then its natural chunk `2P-1-i`, at local offset `c_s/P`. Device
/// copyable; `starts` is `cu_seqlens` (a dense sequence is `{0, T}`).
template <class MemorySpace>
struct RowOrder {
  bool zigzag = false;
  int parts = 1;
  std::int64_t rows_per_rank = 0;
  Kokkos::View<const std::int64_t*, MemorySpace> starts;

  /// Natural index of sequence-parallel position `q`.
  KOKKOS_INLINE_FUNCTION std::int64_t natural(std::int64_t q) const {
    if (!zigzag) return q;
    const std::int64_t i = q / rows_per_rank;
    const std::int64_t t = q - i * rows_per_rank;
    // The last sequence whose local offset c_s/P is <= t (empty sequences share offsets).
    std::int64_t lo = 0, hi = static_cast<std::int64_t>(starts.extent(0)) - 1;
    while (hi - lo > 1) {
      const std::int64_t mid = (lo + hi) / 2;
      if (starts(mid) / parts <= t) lo = mid; else hi = mid;
    }
    const std::int64_t start = starts(lo);
    const std::int64_t half = (starts(lo + 1) - start) / (2 * parts);
    const std::int64_t off = t - start / parts;
    const std::int64_t chunk = off < half ? i : 2 * parts - 1 - i;
    return start + chunk * half + (off < half ? off : off - half);
  }
};

}  // namespace ctxpar::heads::impl
