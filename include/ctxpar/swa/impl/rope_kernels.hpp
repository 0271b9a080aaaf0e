/// \file
/// The RoPE kernels behind `swa::rope_forward`/`rope_backward` (swa/rope.hpp), and the pieces the
/// record packing shares with them so every rotation gives the same bits: the frequency, the
/// rotation of one pair, the token blocks of the portable and host work items.
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/core/team_size.hpp"
#include "ctxpar/core/view_checks.hpp"

namespace ctxpar::swa {

namespace impl {

/// Tokens one work item of a RoPE kernel rotates. The frequency `base^(-2d/D)` of pair `d` is a
/// `pow` that costs about as much as the cosine and sine together, so an item evaluates it once and
/// reuses it for this many tokens; adjacent items still take adjacent `d`, so a GPU warp reads
/// contiguous memory.
constexpr std::int64_t rope_tokens_per_item = 8;

/// Work items of a RoPE kernel over `tokens` tokens with `per_block` items per token block.
KOKKOS_INLINE_FUNCTION std::int64_t rope_items(std::int64_t tokens, std::int64_t per_block) {
  return (tokens + rope_tokens_per_item - 1) / rope_tokens_per_item * per_block;
}

/// Tokens `[first, last)` of a RoPE kernel's token block.
struct RopeBlock {
  std::int64_t first, last;
};

/// Block `block` of a RoPE kernel over `tokens` tokens (the last block may be short).
KOKKOS_INLINE_FUNCTION RopeBlock rope_block(std::int64_t block, std::int64_t tokens) {
  const std::int64_t first = block * rope_tokens_per_item;
  return {first, first + rope_tokens_per_item < tokens ? first + rope_tokens_per_item : tokens};
}

/// The RoPE frequency `base^(-2d/D)` of pair `(d, d + half)`, in double.
KOKKOS_INLINE_FUNCTION double rope_frequency(std::int64_t d, std::int64_t half, double base) {
  const double dim = static_cast<double>(2 * half);
  return compat::pow(base, -2.0 * static_cast<double>(d) / dim);
}

/// Cosine and `sign` times the sine of the RoPE angle `pos * frequency`, where `frequency` is
/// `rope_frequency(d, half, base)`. Everything is evaluated in double from nothing but
/// (position, d), so every kernel that rotates (this file's, and the record packing that rotates
/// keys on the way into a message) produces the same bits.
KOKKOS_INLINE_FUNCTION void rope_rotation(std::int64_t pos, double frequency, double sign,
                                          double& c, double& s) {
  const double angle = static_cast<double>(pos) * frequency;
  c = compat::cos(angle);
  s = sign * compat::sin(angle);
}

/// Writes into `(ya, yb)` the pair `(xa, xb)` rotated by cosine `c` and signed sine `s`, in double:
/// the expressions of every RoPE kernel, so all of them give the same bits. Both inputs are read
/// before either output is written, so `y` may alias `x`.
template <class In, class Out>
KOKKOS_INLINE_FUNCTION void rotate_pair(const In& xa, const In& xb, double c, double s, Out& ya,
                                        Out& yb) {
  const double a = static_cast<double>(ctxpar::widen(xa));
  const double b = static_cast<double>(ctxpar::widen(xb));
  ya = ctxpar::narrow<Out>(a * c - b * s);
  yb = ctxpar::narrow<Out>(b * c + a * s);
}

/// Rotates pair `(d, d + D/2)` of every head of the tokens of one block by
/// `sign * pos * base^(-2d/D)`. The angle, its cosine and sine and the products are evaluated in
/// double from nothing but (position, d), so a token's rotation is the same bit pattern whichever
/// shard or batch it is rotated in. One work item per (block of `rope_tokens_per_item` tokens, d)
/// serves every head: the angle does not depend on the head, and the transcendental functions cost
/// far more than the rotation itself.
template <class InView, class OutView, class PosView>
struct RopeFunctor {
  InView x;
  OutView y;
  PosView pos;
  double base;
  double sign;
  std::int64_t tokens, heads, half;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t flat) const {
    const std::int64_t d = flat % half;
    const RopeBlock block = rope_block(flat / half, tokens);
    const double frequency = rope_frequency(d, half, base);
    for (std::int64_t i = block.first; i < block.last; ++i) {
      double c = 1.0, s = 0.0;
      rope_rotation(pos(i), frequency, sign, c, s);
      for (std::int64_t h = 0; h < heads; ++h)
        rotate_pair(x(i, h, d), x(i, h, d + half), c, s, y(i, h, d), y(i, h, d + half));
    }
  }
};

/// Tokens one work item of a host fast path handles (RoPE, record packing, gradient routing). A
/// host thread walks whole token rows, so the copies and rotations are contiguous loops the
/// compiler vectorises; the GPU-shaped items above (one pair `d` of a few tokens) would make every
/// access a stride-`D` gather on a CPU.
constexpr std::int64_t host_tokens_per_item = 32;

/// Token block `block` of a host fast path over `tokens` tokens (the last block may be short).
inline RopeBlock host_block(std::int64_t block, std::int64_t tokens) {
  const std::int64_t first = block * host_tokens_per_item;
  return {first, first + host_tokens_per_item < tokens ? first + host_tokens_per_item : tokens};
}

/// Work items of a host fast path over `tokens` tokens.
inline std::int64_t host_items(std::int64_t tokens) {
  return (tokens + host_tokens_per_item - 1) / host_tokens_per_item;
}

/// Pairs of one block of the host RoPE (the rotations of a token are evaluated this many at a
/// time).
constexpr int host_rope_pairs = 32;

/// Host RoPE driver over tokens `[first, last)`: for each block of `host_rope_pairs` pairs it
/// evaluates the frequencies once, then each token's cosines and signed sines (the same functions
/// as the portable kernels, so the same bits), and calls `rotate(i, d0, n, c, s)` for pairs
/// `[d0, d0 + n)` of token `i`.
template <class PosOf, class Rotate>
inline void host_rope_tokens(std::int64_t first, std::int64_t last, std::int64_t half, double base,
                             double sign, const PosOf& pos_of, const Rotate& rotate) {
  double frequency[host_rope_pairs], c[host_rope_pairs], s[host_rope_pairs];
  for (std::int64_t d0 = 0; d0 < half; d0 += host_rope_pairs) {
    const int n = static_cast<int>(half - d0 < host_rope_pairs ? half - d0 : host_rope_pairs);
    for (int u = 0; u < n; ++u) frequency[u] = rope_frequency(d0 + u, half, base);
    for (std::int64_t i = first; i < last; ++i) {
      const std::int64_t p = pos_of(i);
      for (int u = 0; u < n; ++u) rope_rotation(p, frequency[u], sign, c[u], s[u]);
      rotate(i, d0, n, c, s);
    }
  }
}

/// Rotates pairs `[d0, d0 + n)` of every head of one token row `x` (`heads * 2 * half` scalars,
/// head-major) into `y` by `c, s` (`rotate_pair`). `y` may be `x`.
template <class In, class Out>
inline void host_rotate_pairs(const In* x, Out* y, std::int64_t heads, std::int64_t half,
                              std::int64_t d0, int n, const double* c, const double* s) {
  for (std::int64_t h = 0; h < heads; ++h) {
    const In* xa = x + h * 2 * half + d0;
    const In* xb = xa + half;
    Out* ya = y + h * 2 * half + d0;
    Out* yb = ya + half;
    for (int u = 0; u < n; ++u) rotate_pair(xa[u], xb[u], c[u], s[u], ya[u], yb[u]);
  }
}

/// The host fast path of `rope_apply` (row-major views): one work item per block of
/// `host_tokens_per_item` tokens.
template <class InView, class OutView, class PosView>
struct HostRopeFunctor {
  InView x;
  OutView y;
  PosView pos;
  double base, sign;
  std::int64_t tokens, heads, half;
  void operator()(const std::int64_t block) const {
    const RopeBlock tokens_here = host_block(block, tokens);
    host_rope_tokens(
        tokens_here.first, tokens_here.last, half, base, sign,
        [&](std::int64_t i) { return pos(i); },
        [&](std::int64_t i, std::int64_t d0, int n, const double* c, const double* s) {
          host_rotate_pairs(&x(i, 0, 0), &y(i, 0, 0), heads, half, d0, n, c, s);
        });
  }
};

template <class ExecutionSpace, class InView, class OutView, class PosView>
void rope_apply(const ExecutionSpace& space, const InView& x, const PosView& pos, double base,
                double sign, const OutView& y, const char* label) {
  const std::string op = "ctxpar::swa::rope";
  require_local(x.extent(2) % 2 == 0, op, "the head dimension must be even", "an even D",
                x.extent(2));
  // base^(-2d/D) is NaN or Inf for a base of 0, a negative base or NaN: every output would be NaN.
  require_local(std::isfinite(base) && base > 0.0, op, "the RoPE base must be finite and positive",
                "a finite base > 0", base);
  require_local(
      x.extent(0) == y.extent(0) && x.extent(1) == y.extent(1) && x.extent(2) == y.extent(2), op,
      "input and output shapes must match", x.extent(0), y.extent(0));
  require_local(pos.extent(0) == x.extent(0), op, "one position per token", x.extent(0),
                pos.extent(0));
  const std::int64_t n = static_cast<std::int64_t>(x.extent(0)),
                     heads = static_cast<std::int64_t>(x.extent(1));
  const std::int64_t half = static_cast<std::int64_t>(x.extent(2)) / 2;
  if (n * heads * half == 0) return;
  constexpr bool rows_contiguous =
      std::is_same_v<typename InView::array_layout, Kokkos::LayoutRight> &&
      std::is_same_v<typename OutView::array_layout, Kokkos::LayoutRight>;
  if constexpr (ctxpar::impl::uses_host_fast_path_v<ExecutionSpace> && rows_contiguous) {
    Kokkos::parallel_for(
        label,
        Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0,
                                                                             host_items(n)),
        HostRopeFunctor<InView, OutView, PosView>{x, y, pos, base, sign, n, heads, half});
    return;
  }
  Kokkos::parallel_for(
      label,
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0,
                                                                           rope_items(n, half)),
      RopeFunctor<InView, OutView, PosView>{x, y, pos, base, sign, n, heads, half});
}

}  // namespace impl

}  // namespace ctxpar::swa
