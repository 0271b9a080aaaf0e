/// \file
/// Policy tags of the context-parallel sliding-window attention step: how the key/value axis
/// reaches the ranks that need it.
#pragma once

#include <type_traits>

namespace ctxpar::swa {

/// Default policy: each rank rotates its own key shard at its own absolute positions, then one
/// all-gather (uneven counts) moves rotated K, raw V, positions and ids as one packed record per
/// token. RoPE is element-wise in the position, so the gathered keys are bit-identical to rotating
/// the whole axis at once.
struct RopeBeforeGather {};

/// Fallback policy: gather the raw keys (with V, positions and ids, one all-gather), rotate the
/// whole gathered axis once. Costs the rotation of the whole axis on every rank, saves the raw-key
/// exchange of the next cache.
struct RopeAfterGather {};

/// Window-bounded policy: every rank receives only the `W - 1` keys before its first query (from
/// whichever ranks own them, point-to-point) instead of the whole axis; traffic O(W) per rank
/// instead of O(L). Unlimited windows (`W = 0`) fall back to every key before the rank's queries.
struct HaloKV {};

/// True for the three policy tags above.
template <class Policy>
inline constexpr bool is_policy_v =
    std::is_same_v<Policy, RopeBeforeGather> || std::is_same_v<Policy, RopeAfterGather> ||
    std::is_same_v<Policy, HaloKV>;

}  // namespace ctxpar::swa
