/// \file
/// Policy tags of the context-parallel sliding-window attention step: how the key/value axis
/// reaches the ranks that need it.
#pragma once

#include "ctxpar/core/impl/one_of.hpp"

namespace ctxpar::swa {

/// Default policy: each rank rotates its own key shard at its own absolute positions, then one
/// all-gather (uneven counts) moves rotated K, raw V, positions and ids as one packed record per
/// token. RoPE is element-wise in the position, so the gathered keys are bit-identical to rotating
/// the whole axis at once.
struct RopeBeforeGather {
  /// Name in errors and plan fingerprints.
  static constexpr const char* name = "RopeBeforeGather";
};

/// Fallback policy: gather the raw keys (with V, positions and ids, one all-gather), rotate the
/// whole gathered axis once. Costs the rotation of the whole axis on every rank, saves the raw-key
/// exchange of the next cache.
struct RopeAfterGather {
  /// Name in errors and plan fingerprints.
  static constexpr const char* name = "RopeAfterGather";
};

/// Window-bounded policy: every rank receives only the `W - 1` keys before its first query (from
/// whichever ranks own them, point-to-point) instead of the whole axis; traffic O(W) per rank
/// instead of O(L). Unlimited windows (`W = 0`) fall back to every key before the rank's queries.
struct HaloKV {
  /// Name in errors and plan fingerprints.
  static constexpr const char* name = "HaloKV";
};

/// True for the three policy tags above.
template <class Policy>
inline constexpr bool is_policy_v =
    ctxpar::impl::is_one_of_v<Policy, RopeBeforeGather, RopeAfterGather, HaloKV>;

/// Key/value layout (default): the cache shard of rank `r` is `BalancedChunks(c, P)` of the cached
/// keys and its chunk keys are the keys of its own queries (`BalancedChunks(t, P)`), so the chunk
/// K/V never move before the attention and the halo of `HaloKV` is only the `W - 1` keys before a
/// rank's first query.
struct SegmentChunks {
  /// Name in errors and plan fingerprints.
  static constexpr const char* name = "SegmentChunks";
};

/// Key/value layout of the literal torch.chunk rule over the whole axis: for the step, rank `r`
/// owns the records `[BalancedChunks(L, P).begin(r), end(r))` of `cache ++ chunk` (raw K, V,
/// positions, ids); it rotates, gathers and receives the gradients of exactly those. The caller's
/// shards are the same as under `SegmentChunks` (queries and chunk K/V by `BalancedChunks(t, P)`,
/// the carried cache by `BalancedChunks(c, P)`); one all-to-all at the start of the forward moves
/// the records whose owner differs onto the axis owners (fused with the next-cache re-shard) and
/// one at the end of the backward sends their gradients back (fused with the next-cache gradient).
struct WholeAxisChunks {
  /// Name in errors and plan fingerprints.
  static constexpr const char* name = "WholeAxisChunks";
};

/// True for the two key/value layout tags above.
template <class Layout>
inline constexpr bool is_kv_layout_v =
    ctxpar::impl::is_one_of_v<Layout, SegmentChunks, WholeAxisChunks>;

}  // namespace ctxpar::swa
