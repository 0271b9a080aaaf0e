/// \file
/// Pieces shared by every sliding-window attention kernel (host SIMD and portable team kernels):
/// the problem shape, the query and key tokens the mask reads, the key range a query tile can see
/// on the global key-tile grid, and the test that lets a tile skip the mask. The window reaches the
/// kernels only through `window_range` (tile and lane ranges) and the mask (pairs).
#pragma once

#include <Kokkos_Core.hpp>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "ctxpar/expr/mask.hpp"
#include "ctxpar/swa/attention_inputs.hpp"
#include "ctxpar/swa/document_mask.hpp"
#include "ctxpar/swa/impl/kernel_math.hpp"
#include "ctxpar/swa/impl/window_range.hpp"

namespace ctxpar::swa::impl {

template <class T>
KOKKOS_INLINE_FUNCTION constexpr T masked_score() {
  return std::is_same_v<T, float> ? static_cast<T>(-FLT_MAX) : static_cast<T>(-DBL_MAX);
}

template <class Scalar, class MemorySpace>
struct KernelShape {
  std::int64_t tq, nk;
  int hq, hkv, dim, group;
  KernelShape() = default;
  explicit KernelShape(const AttentionInputs<Scalar, MemorySpace>& in)
      : tq(static_cast<std::int64_t>(in.q.extent(0))),
        nk(static_cast<std::int64_t>(in.k.extent(0))),
        hq(static_cast<int>(in.q.extent(1))),
        hkv(static_cast<int>(in.k.extent(1))),
        dim(static_cast<int>(in.q.extent(2))),
        group(hkv > 0 ? static_cast<int>(in.q.extent(1) / in.k.extent(1)) : 1) {}
};

/// What a forward kernel family writes: the output `[tq, Hq, D]` and the row log-sum-exps
/// `[tq, Hq]` its backward reads.
template <class Scalar, class MemorySpace>
struct ForwardViews {
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace> out;
  Kokkos::View<accumulator_t<Scalar>**, Kokkos::LayoutRight, MemorySpace> lse;
};

/// What a backward kernel family reads besides the inputs, and writes: the forward's row
/// log-sum-exps and the row deltas `dout_i · out_i` `[tq, Hq]`, the output gradient `[tq, Hq, D]`,
/// and the gradients of the rotated queries `[tq, Hq, D]`, rotated keys and values `[nk, Hkv, D]`.
template <class Scalar, class MemorySpace>
struct BackwardViews {
  Kokkos::View<const accumulator_t<Scalar>**, Kokkos::LayoutRight, MemorySpace> lse, delta;
  Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace> dout;
  Kokkos::View<accumulator_t<Scalar>***, Kokkos::LayoutRight, MemorySpace> dq, dk, dv;
};

template <class Scalar, class MemorySpace>
KOKKOS_INLINE_FUNCTION mask::Token query_token(const AttentionInputs<Scalar, MemorySpace>& in,
                                               std::int64_t i) {
  return mask::Token{in.q_pos(i), in.q_ids.extent(0) > 0 ? in.q_ids(i) : 0};
}
template <class Scalar, class MemorySpace>
KOKKOS_INLINE_FUNCTION mask::Token key_token(const AttentionInputs<Scalar, MemorySpace>& in,
                                             std::int64_t j) {
  return mask::Token{in.k_pos(j), in.k_ids.extent(0) > 0 ? in.k_ids(j) : 0};
}

/// The window of the inputs as the kernels' one range type; no kernel reads `in.window` otherwise.
template <class Scalar, class MemorySpace>
KOKKOS_INLINE_FUNCTION WindowRange window_range(const AttentionInputs<Scalar, MemorySpace>& in) {
  return WindowRange{in.window};
}

/// Keys `[lo, hi)` that some query with position in `[first, last]` may see under the window,
/// and the first key-tile start (local index, possibly negative) of the global tile grid.
template <class Scalar, class MemorySpace>
KOKKOS_INLINE_FUNCTION void key_range(const AttentionInputs<Scalar, MemorySpace>& in,
                                      const WindowRange& range, std::int64_t nk, std::int64_t first,
                                      std::int64_t last, std::int64_t& lo, std::int64_t& hi,
                                      std::int64_t& tile0) {
  range.keys(in.k_pos, 0, nk, first, last, lo, hi);
  const std::int64_t g = in.key_origin + lo;
  tile0 = (g / key_tile) * key_tile - in.key_origin;
}

/// True when key token `k` is visible to query token `q`: inside the window (`range`) and admitted
/// by the caller's `mask`. The one per-pair test of every kernel.
template <class Mask>
KOKKOS_INLINE_FUNCTION bool visible(const Mask& mask, const WindowRange& range,
                                    const mask::Token& q, const mask::Token& k) {
  return range.admits(q.pos, k.pos) && mask(q, k);
}

/// True when every (query, key) pair of the tiles is visible, so the kernels may skip evaluating
/// it per pair (the weights are then the same bits either way). Only for `DocumentMask`, where a
/// tile inside the window and inside one document is wholly visible; any other mask is always
/// evaluated pair by pair.
template <class Mask>
KOKKOS_INLINE_FUNCTION bool tile_fully_visible(const Mask& mask, const WindowRange& range,
                                               const mask::Token* qtok, int rows,
                                               const mask::Token* ktok, const bool* valid) {
  (void)mask;
  if constexpr (std::is_same_v<Mask, DocumentMask>) {
    if (!valid[0] || !valid[key_tile - 1]) return false;
    if (!range.admits_all(qtok[0].pos, qtok[rows - 1].pos, ktok[0].pos, ktok[key_tile - 1].pos))
      return false;
    const std::int32_t id = ktok[0].seq;
    for (int j = 0; j < key_tile; ++j)
      if (ktok[j].seq != id) return false;
    for (int r = 0; r < rows; ++r)
      if (qtok[r].seq != id) return false;
    return true;
  } else {
    (void)range;
    (void)qtok;
    (void)rows;
    (void)ktok;
    (void)valid;
    return false;
  }
}
}  // namespace ctxpar::swa::impl
