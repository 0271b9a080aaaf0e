/// \file
/// The one windowed dot of the causal depthwise convolution, shared by the chunkwise short conv
/// (chunkwise/short_conv.hpp) and the GDP layer's conv (heads/impl/layer_kernels.hpp), forward and
/// input gradient alike. Callers differ only in where a tap's weight and input come from (the
/// carried prefix: a halo received from the previous rank, or nothing before the sequence start)
/// and in which taps count; the sum itself, its order and its rounding, are this one loop.
#pragma once

#include <Kokkos_Core.hpp>

namespace ctxpar::impl {

/// Every tap counts (the window was already clipped to the taps that exist).
struct EveryTap {
  /// True.
  template <class Index>
  KOKKOS_INLINE_FUNCTION constexpr bool operator()(Index) const {
    return true;
  }
};

/// `acc + Σ_k weight(k)·input(k)` over the taps `k = first, …, width − 1` that `counts(k)`
/// admits, added one at a time in increasing `k` (a skipped tap adds nothing, not a zero).
/// `T` may be a host vector type: the same operations lane by lane, so a vector of channels
/// gets the bits of one channel at a time.
template <class T, class Index, class Weight, class Input, class Counts = EveryTap>
KOKKOS_INLINE_FUNCTION T causal_window_dot(T acc, Index first, Index width, const Weight& weight,
                                           const Input& input, const Counts& counts = {}) {
  for (Index k = first; k < width; ++k)
    if (counts(k)) acc += weight(k) * input(k);
  return acc;
}

}  // namespace ctxpar::impl
