/// \file
/// The one reader of the sliding window below the step plan: which keys a query (or a run of
/// queries) may see and which queries see a key (or a run of keys), over strictly increasing
/// absolute positions, and from that the axis ranges the exchange tables move (the halo a rank
/// reads, the cache a step carries). The host and portable attention kernels and the tables ask
/// this type instead of doing arithmetic with the window, so the convention
/// (`pos_q - W < pos_k <= pos_q`, `W = 0` unlimited) is written once; masks carry no window.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "ctxpar/swa/impl/kernel_math.hpp"

namespace ctxpar::swa::impl {

/// Visibility ranges under a causal sliding window of `window` tokens: key position `k` is in the
/// window of query position `q` iff `q - window < k <= q` (`window == 0`: iff `k <= q`). Indices
/// are found by binary search over strictly increasing positions (a view or any `pos(i)` callable).
/// The range knows nothing of document ids: a key inside it may still be masked.
struct WindowRange {
  /// Window `W` in tokens; 0 means unlimited.
  std::int64_t window = 0;

  /// True when the window bounds how far back a query sees (`W > 0`).
  KOKKOS_INLINE_FUNCTION constexpr bool limited() const { return window > 0; }

  /// True when key position `k` lies in the window of query position `q`.
  KOKKOS_INLINE_FUNCTION constexpr bool admits(std::int64_t q, std::int64_t k) const {
    return k <= q && (!limited() || q - k < window);
  }

  /// True when every query position in `[q_first, q_last]` admits every key position in
  /// `[k_first, k_last]` (both sorted runs): the window test may then be skipped for the pairs.
  KOKKOS_INLINE_FUNCTION constexpr bool admits_all(std::int64_t q_first, std::int64_t q_last,
                                                   std::int64_t k_first,
                                                   std::int64_t k_last) const {
    return k_last <= q_first && (!limited() || q_last - k_first < window);
  }

  /// Keys `[lo, hi)` of the sorted key positions `pos[begin, end)` that some query with position
  /// in `[q_first, q_last]` admits.
  template <class Pos>
  KOKKOS_INLINE_FUNCTION void keys(const Pos& pos, std::int64_t begin, std::int64_t end,
                                   std::int64_t q_first, std::int64_t q_last, std::int64_t& lo,
                                   std::int64_t& hi) const {
    const Shifted<Pos> p{pos, begin};
    lo = begin + (limited() ? lower_bound(p, end - begin, q_first - window + 1) : 0);
    hi = begin + upper_bound(p, end - begin, q_last);
  }

  /// Queries `[lo, hi)` of the sorted query positions `pos[0, n)` that admit some key with
  /// position in `[k_first, k_last]`.
  template <class Pos>
  KOKKOS_INLINE_FUNCTION void queries(const Pos& pos, std::int64_t n, std::int64_t k_first,
                                      std::int64_t k_last, std::int64_t& lo,
                                      std::int64_t& hi) const {
    lo = lower_bound(pos, n, k_first);
    hi = limited() ? upper_bound(pos, n, k_last + window - 1) : n;
  }

  /// The first axis index the query at index `q` may see: positions strictly increase, so at most
  /// `W - 1` keys before it lie in its window (0 when unlimited).
  KOKKOS_INLINE_FUNCTION constexpr std::int64_t first_reachable(std::int64_t q) const {
    return limited() && q - (window - 1) > 0 ? q - (window - 1) : 0;
  }

  /// Keys of an axis of `length` tokens that later queries may still see: the last
  /// `min(W - 1, length)`, all of them when unlimited (the cache a step carries).
  KOKKOS_INLINE_FUNCTION constexpr std::int64_t carried(std::int64_t length) const {
    return !limited() ? length : (window - 1 < length ? window - 1 : length);
  }

  /// Tiles of `tile` consecutive positions that cover one window (`W > 0`).
  KOKKOS_INLINE_FUNCTION constexpr std::int64_t tiles_per_window(std::int64_t tile) const {
    return (window + tile - 1) / tile;
  }

 private:
  /// `pos` seen from index `begin`, so the searches run on a sub-range.
  template <class Pos>
  struct Shifted {
    const Pos& pos;
    std::int64_t begin;
    KOKKOS_INLINE_FUNCTION std::int64_t operator()(std::int64_t i) const { return pos(begin + i); }
  };
};

}  // namespace ctxpar::swa::impl
