/// \file
/// The inputs of the local sliding-window attention kernels (rotated queries and keys with their
/// positions), their accumulator type and the tile sizes that fix every summation order.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "ctxpar/core/storage.hpp"

namespace ctxpar::swa {

/// Accumulator type of the kernels, and the type of their gradients: the storage type's compute
/// type (`core/storage.hpp`): fp32 for fp32 and the 16-bit types, fp64 for fp64.
template <class Scalar>
using accumulator_t = compute_t<Scalar>;

/// Queries per tile of the kernels.
inline constexpr int query_tile = 32;
/// Keys per tile of the kernels. Key tiles start at multiples of `key_tile` on the whole key axis
/// (see `AttentionInputs::key_origin`), so every query sums its keys in the same groups whatever
/// part of the axis a rank holds.
inline constexpr int key_tile = 32;

/// Rotated inputs of the attention kernels: queries `[tq, Hq, D]` and keys/values `[nk, Hkv, D]`
/// with their absolute positions (strictly increasing on each side) and optional ids.
template <class Scalar, class MemorySpace>
struct AttentionInputs {
  /// Rotated queries `[tq, Hq, D]`.
  Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace> q;
  /// Query positions `[tq]`.
  Kokkos::View<const std::int64_t*, MemorySpace> q_pos;
  /// Query ids `[tq]`, or empty (one document).
  Kokkos::View<const std::int32_t*, MemorySpace> q_ids;
  /// Rotated keys `[nk, Hkv, D]`.
  Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace> k;
  /// Values `[nk, Hkv, D]`.
  Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace> v;
  /// Key positions `[nk]`.
  Kokkos::View<const std::int64_t*, MemorySpace> k_pos;
  /// Key ids `[nk]`, or empty.
  Kokkos::View<const std::int32_t*, MemorySpace> k_ids;
  /// Index of key 0 on the whole key axis; it anchors the key tiles.
  std::int64_t key_origin = 0;
  /// Window `W` bounding the keys a query may see to positions `(pos - W, pos]`; 0 = unlimited.
  /// Keys outside are skipped without evaluating the mask, so the mask must not admit them.
  std::int64_t window = 0;
  /// Softmax scale.
  double scale = 1.0;
};

}  // namespace ctxpar::swa
