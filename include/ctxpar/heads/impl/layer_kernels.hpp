/// \file
/// Element-wise and short-stencil kernels of the GDP layer core on head-sharded data: the causal
/// depthwise conv with SiLU, the split into per-head q/k/v with L2 normalisation, the gates, and
/// their backward passes. All are named functors over natural token order; `seq_start(t)` /
/// `seq_end(t)` bound every stencil to the token's own packed sequence (zero initial conv state
/// per sequence).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/impl/causal_conv.hpp"
#include "ctxpar/core/impl/fast_exp.hpp"
#include "ctxpar/core/impl/gates.hpp"
#include "ctxpar/core/impl/isa_dispatch.hpp"
#include "ctxpar/core/impl/simd.hpp"
#include "ctxpar/expr/unary.hpp"
#include "ctxpar/heads/skip_term.hpp"

// The conv and SiLU kernels run through `with_host_isa` on a host core, at the vector width of
// the instruction set their launch chose (`Bytes`).
CTXPAR_WIDE_VECTORS_BEGIN
namespace ctxpar::heads::impl {

// The gate functions live with the other gates (core/impl/gates.hpp); these names stay the layer's.
using ctxpar::impl::sigmoid;
using ctxpar::impl::silu_grad;
using ctxpar::impl::softplus;

/// The gate's sigmoid as an expression-layer operation. Kept apart from `expr::op::Sigmoid`
/// because it takes `exp(x)/(1 + exp(x))` for negative `x` (no overflow of `exp(-x)`) through the
/// library's `fast_exp`, the same function as the layer's SiLU, on host and device alike.
struct GateSigmoid : expr::op::SameType {
  /// Applies the operation.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T apply(T x) {
    return sigmoid(x);
  }
};
/// The gate's softplus (`x` itself above 20) as an expression-layer operation; see `GateSigmoid`.
struct GateSoftplus : expr::op::SameType {
  /// Applies the operation.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T apply(T x) {
    return softplus(x);
  }
};
/// `GateSigmoid` applied to an expression node.
template <class E>
expr::Unary<GateSigmoid, E> gate_sigmoid(const E& e) {
  return {e};
}
/// `GateSoftplus` applied to an expression node.
template <class E>
expr::Unary<GateSoftplus, E> gate_softplus(const E& e) {
  return {e};
}

/// Local sizes of the layer on one rank (heads, key groups, offsets of the sections in the
/// head-parallel input `u`).
struct LocalDims {
  int heads = 0, groups = 0, headdim = 1, d_state = 1, copies = 1, width = 1;
  int head_begin = 0, group_begin = 0, heads_per_group = 1;
  SkipTerm skip = SkipTerm::none;                // D per head or per channel, or none
  std::int64_t off_v = 0, off_b = 0, off_a = 0;  // section offsets in u; K and Q follow V
  KOKKOS_INLINE_FUNCTION std::int64_t d_inner() const { return std::int64_t(heads) * headdim; }
  KOKKOS_INLINE_FUNCTION std::int64_t k_channels() const { return std::int64_t(groups) * d_state; }
  KOKKOS_INLINE_FUNCTION std::int64_t conv_channels() const {
    return d_inner() * copies + k_channels() * (copies + 1);
  }
  /// Local group of local head `h`.
  KOKKOS_INLINE_FUNCTION int group_of(int h) const {
    return (head_begin + h) / heads_per_group - group_begin;
  }
};

#if CTXPAR_HOST_SIMD
/// `sigmoid` on every lane of a `Bytes`-wide vector, the same operations lane by lane (`simd_exp`
/// is `fast_exp` on every lane).
template <class T, int Bytes = CTXPAR_SIMD_BYTES>
inline ctxpar::impl::simd_t<T, Bytes> simd_sigmoid(ctxpar::impl::simd_t<T, Bytes> x) {
  const auto zero = ctxpar::impl::simd_zero<T, Bytes>();
  const auto positive = x >= zero;
  const auto e = ctxpar::impl::simd_exp(positive ? zero - x : x);
  return (positive ? ctxpar::impl::simd_broadcast<T, Bytes>(T(1)) : e) / (T(1) + e);
}
#endif

/// Over `n` contiguous channels: `act[c] = pre[c]·sigmoid(pre[c])` when `grad` is false, else
/// `out[c] *= SiLU'(pre[c])`. Whole vectors on hosts with vector extensions (a loop over the
/// scalar functions stays scalar), the scalar functions on the tail and everywhere else; the same
/// operations in the same order either way. Vectors are `Bytes` wide.
template <int Bytes = CTXPAR_SIMD_BYTES, class T>
KOKKOS_INLINE_FUNCTION void silu_row(const T* pre, T* out, std::int64_t n, bool grad) {
  std::int64_t c = 0;
#if CTXPAR_HOST_SIMD
  using ctxpar::impl::simd_load;
  constexpr int lanes = ctxpar::impl::Simd<T, Bytes>::lanes;
  for (; c + lanes <= n; c += lanes) {
    const auto x = simd_load<T, Bytes>(pre + c);
    const auto s = simd_sigmoid<T, Bytes>(x);
    if (grad)
      ctxpar::impl::simd_store(out + c,
                               simd_load<T, Bytes>(out + c) * (s * (T(1) + x * (T(1) - s))));
    else
      ctxpar::impl::simd_store(out + c, x * s);
  }
#endif
  for (; c < n; ++c) out[c] = grad ? out[c] * silu_grad(pre[c]) : pre[c] * sigmoid(pre[c]);
}

/// Channels per work item of the conv kernels on a host core: one token's whole row (a GPU takes
/// one channel per thread, so that neighbouring threads read neighbouring channels).
inline constexpr std::int64_t host_channel_block = std::int64_t(1) << 30;

/// Work items of a conv kernel over `[T, C]` with `block` channels each.
KOKKOS_INLINE_FUNCTION std::int64_t channel_items(std::int64_t tokens, std::int64_t channels,
                                                  std::int64_t block) {
  return tokens * ((channels + block - 1) / block);
}

/// What work item `i` of a conv kernel over `C = channels` with `block` channels each owns:
/// token `t` and the `n` channels from `c0`.
struct ChannelBlock {
  std::int64_t t, c0, n;
};

/// Work item `i`'s `ChannelBlock`.
KOKKOS_INLINE_FUNCTION ChannelBlock channel_block(std::int64_t i, std::int64_t channels,
                                                  std::int64_t block) {
  const std::int64_t blocks = (channels + block - 1) / block;
  const std::int64_t c0 = (i % blocks) * block;
  return {i / blocks, c0, channels - c0 < block ? channels - c0 : block};
}

/// taps(k, c) = w(c, k): the conv weights tap-major, so that one tap's weights of neighbouring
/// channels are adjacent (a contiguous row on a host core, coalesced loads on a GPU).
template <class W, class Taps>
struct TransposeTaps {
  W w;
  Taps taps;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t c) const {
    for (int k = 0; k < static_cast<int>(taps.extent(0)); ++k) taps(k, c) = w(c, k);
  }
};

/// pre(t, c) = bias(c) + Σ_k w(c, k)·u(t − w + 1 + k, off_v + c) within the token's sequence;
/// act = SiLU(pre). Work item `i` owns token `t` and channels `[c0, c0 + block)`. With one
/// channel (GPU) the taps sum in a register; with a row (host) they sum in the registers of a
/// whole vector of channels (`pre_row`), and SiLU runs on whole vectors. The taps add in the same
/// order either way, so `pre` and `act` have the same bits.
template <class U, class W, class B, class Out, class Idx>
struct ConvForward {
  U u;
  W w;  // tap-major, [width, C] (see TransposeTaps)
  B bias;
  Out pre, act;
  Idx seq_start;
  std::int64_t off, channels, block;
  int width;
  /// The instruction set of the host fast path, chosen on the launching thread.
  HostIsa isa = ctxpar::impl::active_host_isa();
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    ctxpar::impl::run_kernel<ctxpar::impl::uses_host_fast_path_v<typename Out::execution_space>>(
        isa, *this, i);
  }
  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(std::int64_t i) const {
    using T = typename Out::non_const_value_type;
    const ChannelBlock item = channel_block(i, channels, block);
    const std::int64_t t = item.t, c0 = item.c0, n = item.n;
    const int k0 = first_tap(t);
    if (n == 1) {
      const T s = pre_of(bias(c0), t, c0, k0);
      pre(t, c0) = s;
      act(t, c0) = s * sigmoid(s);
      return;
    }
    silu_row<Bytes>(pre_row<Bytes>(t, c0, n, k0), &act(t, c0), n, false);
  }
  /// `start + Σ_{k ≥ k0} w(k, c)·u(t − w + 1 + k, off + c)`: the conv's one windowed dot
  /// (`causal_window_dot`), on channel `c` alone or (`T` a vector) on the channels from `c` on.
  template <class T, class Load>
  KOKKOS_INLINE_FUNCTION T pre_of(T start, std::int64_t t, std::int64_t c, int k0,
                                  const Load& load) const {
    const std::int64_t first = t - (width - 1);
    return ctxpar::impl::causal_window_dot(
        start, k0, width, [&](int k) { return load(&w(k, c)); },
        [&](int k) { return load(&u(first + k, off + c)); });
  }
  /// `pre_of` on one channel.
  template <class T>
  KOKKOS_INLINE_FUNCTION T pre_of(T start, std::int64_t t, std::int64_t c, int k0) const {
    return pre_of(start, t, c, k0, [](const auto* p) { return *p; });
  }
  /// `pre(t, c0 + j)` for `j < n` (the host form), from tap `k0` on: a vector of channels sums
  /// its taps in registers and is stored once (a pass over the row per tap was bound by its
  /// stores); the channels past the last whole vector take the same sum one at a time. Vectors
  /// are `Bytes` wide.
  template <int Bytes = CTXPAR_SIMD_BYTES>
  KOKKOS_INLINE_FUNCTION typename Out::pointer_type pre_row(std::int64_t t, std::int64_t c0,
                                                            std::int64_t n, int k0) const {
    using T = typename Out::non_const_value_type;
    const auto row = &pre(t, c0);
    std::int64_t j = 0;
#if CTXPAR_HOST_SIMD
    using ctxpar::impl::simd_load;
    constexpr int lanes = ctxpar::impl::Simd<T, Bytes>::lanes;
    const auto load = [](const T* p) { return simd_load<T, Bytes>(p); };
    for (; j + lanes <= n; j += lanes)
      ctxpar::impl::simd_store(row + j, pre_of(load(&bias(c0 + j)), t, c0 + j, k0, load));
#endif
    for (; j < n; ++j) row[j] = pre_of(bias(c0 + j), t, c0 + j, k0);
    return row;
  }
  /// The first tap of token `t` inside its sequence.
  KOKKOS_INLINE_FUNCTION int first_tap(std::int64_t t) const {
    const std::int64_t skipped = seq_start(t) - (t - (width - 1));
    return skipped > 0 ? static_cast<int>(skipped) : 0;
  }
};

/// du(t, off_v + c) = Σ_k w(c, k)·dpre(t + w − 1 − k, c) over outputs in the token's sequence.
/// Work items as in `ConvForward`: one channel in a register (GPU), or a row of `du` accumulated
/// tap by tap (host), the taps in the same order either way.
template <class Dpre, class W, class Du, class Idx>
struct ConvBackwardInput {
  Dpre dpre;
  W w;  // tap-major, [width, C] (see TransposeTaps)
  Du du;
  Idx seq_end;
  std::int64_t off, channels, block;
  int width;
  /// The instruction set of the host fast path, chosen on the launching thread.
  HostIsa isa = ctxpar::impl::active_host_isa();
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    ctxpar::impl::run_kernel<ctxpar::impl::uses_host_fast_path_v<typename Du::execution_space>>(
        isa, *this, i);
  }
  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(std::int64_t i) const {
    using T = typename Du::non_const_value_type;
    const ChannelBlock item = channel_block(i, channels, block);
    const std::int64_t t = item.t, c0 = item.c0, n = item.n;
    // Tap k reads output t + w − 1 − k, which must lie before the sequence's end.
    const std::int64_t past = t + width - seq_end(t);
    const int k0 = past > 0 ? static_cast<int>(past) : 0;
    if (n == 1) {
      // The transposed window: tap k meets output t + w − 1 − k.
      du(t, off + c0) = ctxpar::impl::causal_window_dot(
          T(0), k0, width, [&](int k) { return w(k, c0); },
          [&](int k) { return dpre(t + (width - 1) - k, c0); });
      return;
    }
    T* const row = &du(t, off + c0);
    for (std::int64_t j = 0; j < n; ++j) row[j] = T(0);
    for (int k = k0; k < width; ++k) {
      const std::int64_t out = t + (width - 1) - k;
      for (std::int64_t j = 0; j < n; ++j) row[j] += w(k, c0 + j) * dpre(out, c0 + j);
    }
  }
};

/// dw(c, k) = Σ_t dpre(t, c)·u(t − w + 1 + k, off_v + c) (same sequence); db(c) = Σ_t dpre(t, c).
///
/// Work item `i` owns channels `[i·block, i·block + block)`. On a GPU `block` is 1: neighbouring
/// threads read neighbouring channels of one row, so the loads coalesce. On a host core one item
/// walks the rows for all of its channels at once: each row's cache lines then serve `block`
/// channels instead of being fetched again for every channel, which is what keeps the cost per
/// token flat once `[T, C]` no longer fits in cache. The walk strides a whole row per token, so
/// nearly every token is a new page and a missed line: four lines per visit (64 floats) make four
/// times fewer walks than one, and the sums (5 × 64 floats at width 4) still fit a core's vector
/// registers or its L1. Every channel's sum runs over `t` in the same order for any `block`, so
/// the result is bitwise the same.
template <class Dpre, class U, class Dw, class Db, class Idx>
struct ConvBackwardWeights {
  /// Most channels one work item owns (four 64-byte lines of floats).
  static constexpr int max_block = 64;
  Dpre dpre;
  U u;
  Dw dw;
  Db db;
  Idx seq_start;
  std::int64_t off, tokens;
  int width;
  std::int64_t channels;
  int block;
  /// The instruction set of the host fast path, chosen on the launching thread.
  HostIsa isa = ctxpar::impl::active_host_isa();
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    ctxpar::impl::run_kernel<ctxpar::impl::uses_host_fast_path_v<typename Dw::execution_space>>(
        isa, *this, i);
  }
  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(std::int64_t i) const {
    const std::int64_t c0 = i * block;
    const int n = static_cast<int>(channels - c0 < block ? channels - c0 : block);
    // A full block with its size known to the compiler, whose loops over it then vectorise; at
    // the usual width all taps in one pass over the rows, their sums held in registers.
    if (n == max_block && width == 4)
      sums_one_pass<max_block, 4>(c0);
    else if (n == max_block)
      sums<max_block>(c0, n);
    else
      sums<0>(c0, n);
  }
  // The sums of a full block with `Taps` taps in one pass over the rows: each sum still runs over
  // `t` in increasing order, so the bits are those of `sums`.
  template <int Block, int Taps>
  KOKKOS_INLINE_FUNCTION void sums_one_pass(std::int64_t c0) const {
    using T = typename Dw::non_const_value_type;
    T sb[Block], sk[Taps][Block];
    for (int j = 0; j < Block; ++j) sb[j] = 0;
    for (int k = 0; k < Taps; ++k)
      for (int j = 0; j < Block; ++j) sk[k][j] = 0;
    for (std::int64_t t = 0; t < tokens; ++t) {
      const std::int64_t first = seq_start(t);
      for (int j = 0; j < Block; ++j) sb[j] += dpre(t, c0 + j);
      for (int k = 0; k < Taps; ++k) {
        const std::int64_t src = t - (Taps - 1) + k;
        if (src < first) continue;
        for (int j = 0; j < Block; ++j) sk[k][j] += dpre(t, c0 + j) * u(src, off + c0 + j);
      }
    }
    for (int j = 0; j < Block; ++j) db(c0 + j) = sb[j];
    for (int k = 0; k < Taps; ++k)
      for (int j = 0; j < Block; ++j) dw(c0 + j, k) = sk[k][j];
  }
  // The sums of channels [c0, c0 + n); `Fixed` is n when it is known at compile time, else 0.
  template <int Fixed>
  KOKKOS_INLINE_FUNCTION void sums(std::int64_t c0, int n_runtime) const {
    using T = typename Dw::non_const_value_type;
    const int n = Fixed > 0 ? Fixed : n_runtime;
    T s[max_block];
    for (int j = 0; j < n; ++j) s[j] = 0;
    for (std::int64_t t = 0; t < tokens; ++t)
      for (int j = 0; j < n; ++j) s[j] += dpre(t, c0 + j);
    for (int j = 0; j < n; ++j) db(c0 + j) = s[j];
    for (int k = 0; k < width; ++k) {
      for (int j = 0; j < n; ++j) s[j] = 0;
      for (std::int64_t t = 0; t < tokens; ++t) {
        const std::int64_t src = t - (width - 1) + k;
        if (src < seq_start(t)) continue;
        for (int j = 0; j < n; ++j) s[j] += dpre(t, c0 + j) * u(src, off + c0 + j);
      }
      for (int j = 0; j < n; ++j) dw(c0 + j, k) = s[j];
    }
  }
};

/// Reciprocal L2 norms of the keys `[T, M, G]` and queries `[T, G]` over `d_state`, and the
/// normalised per-head copies: k̂ `[T·M, H, N]`, q̂ `[T, H, N]`, v `[T·M, H, d]`.
template <class Act, class R, class K3, class V3>
struct SplitNormalize {
  Act act;
  R rk;  // [T, M+1, G]: copies 0..M-1 are keys, copy M the query
  K3 k, q;
  V3 v;
  LocalDims dims;
  double eps;
  bool copy_values = true;  // false where the SiLU wrote v itself (`ConvSplitForward`)
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t t) const {
    using T = typename K3::non_const_value_type;
    const std::int64_t off_k = dims.d_inner() * dims.copies;
    for (int m = 0; m <= dims.copies; ++m) {
      for (int g = 0; g < dims.groups; ++g) {
        const std::int64_t base = off_k + (std::int64_t(m) * dims.groups + g) * dims.d_state;
        T ss = 0;
        for (int n = 0; n < dims.d_state; ++n) ss += act(t, base + n) * act(t, base + n);
        rk(t, m, g) = T(1) / compat::sqrt(ss + T(eps));
      }
    }
    // Rows are contiguous (LayoutRight): the copies below run over adjacent memory.
    const int n_state = dims.d_state, d = dims.headdim;
    for (int m = 0; m <= dims.copies; ++m) {
      for (int h = 0; h < dims.heads; ++h) {
        const int g = dims.group_of(h);
        const T r = rk(t, m, g);
        const auto* const x = &act(t, off_k + (std::int64_t(m) * dims.groups + g) * n_state);
        T* const out = m < dims.copies ? &k(t * dims.copies + m, h, 0) : &q(t, h, 0);
        for (int n = 0; n < n_state; ++n) out[n] = x[n] * r;
        if (m == dims.copies || !copy_values) continue;
        const auto* const xv = &act(t, (std::int64_t(m) * dims.heads + h) * d);
        T* const vo = &v(t * dims.copies + m, h, 0);
        for (int j = 0; j < d; ++j) vo[j] = xv[j];
      }
    }
  }
};

/// The layer's prologue on a host core, one token per work item, in one pass over the token's row
/// while it is in cache: the conv row (`ConvForward::pre_row`), SiLU written straight into the
/// token's householder rows of v for the V channels (`[T·M, H, d]` is the V section's own
/// order, `M·H·d` per token) and into `act` for K and Q, the norms and q̂, k̂ from that row
/// (`SplitNormalize` without the value copy), and the token's z section copied out of `u`. The
/// same operations as the separate passes, so the same bits; `act` then holds no V channels
/// (the layer reads x_V from v).
template <class Conv, class Split, class Z>
struct ConvSplitForward {
  Conv conv;
  Split split;
  Z z;
  /// The instruction set of the host fast path, chosen on the launching thread.
  HostIsa isa = ctxpar::impl::active_host_isa();
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t t) const {
    ctxpar::impl::run_kernel<ctxpar::impl::uses_host_fast_path_v<typename Z::execution_space>>(
        isa, *this, t);
  }
  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(std::int64_t t) const {
    const LocalDims& dims = split.dims;
    const std::int64_t values = dims.d_inner() * dims.copies, cc = dims.conv_channels();
    const auto row = conv.template pre_row<Bytes>(t, 0, cc, conv.first_tap(t));
    silu_row<Bytes>(row, &split.v(t * dims.copies, 0, 0), values, false);
    silu_row<Bytes>(row + values, &conv.act(t, values), cc - values, false);
    split(t);
    if (dims.d_inner() == 0) return;
    const auto* const zin = &conv.u(t, 0);
    auto* const zout = &z(t, 0);
    for (std::int64_t c = 0; c < dims.d_inner(); ++c) zout[c] = zin[c];
  }
};

/// Backward of `SplitNormalize`, then of the skip term and of the SiLU, in one pass: per key
/// group, sums the gradients of the heads that read it and applies the L2-norm Jacobian
/// `r·(dx̂ − x̂ (x̂·dx̂))`; on the V channels of householder copy 0 adds `D ⊙ dy` when the layer has
/// a skip term (it reads x_V); and stores each gradient times SiLU'(pre) as `dpre`, for every conv
/// channel (V, K and Q). The SiLU factor is applied last, over the token's whole row (one pass
/// that vectorises on a host), with the operands in the order the separate passes used.
template <class Act, class R, class K3, class V3, class D, class Dy, class Skip>
struct SplitNormalizeBackward {
  Act act, pre;
  R rk;
  K3 dk, dq;
  V3 dv;
  D dpre;
  Dy dy;    // [T, H·d], read only with a skip term
  Skip dd;  // D: [H] or [H·d] per dims.skip
  LocalDims dims;
  /// The instruction set of the host fast path, chosen on the launching thread.
  HostIsa isa = ctxpar::impl::active_host_isa();
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t t) const {
    ctxpar::impl::run_kernel<ctxpar::impl::uses_host_fast_path_v<typename D::execution_space>>(
        isa, *this, t);
  }
  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(std::int64_t t) const {
    using T = typename D::non_const_value_type;
    const std::int64_t off_k = dims.d_inner() * dims.copies;
    // Rows are contiguous (LayoutRight), so every loop below runs over adjacent memory.
    const int d = dims.headdim;
    for (int m = 0; m < dims.copies; ++m)
      for (int h = 0; h < dims.heads; ++h) {
        T* const out = &dpre(t, (std::int64_t(m) * dims.heads + h) * d);
        const auto* const in = &dv(t * dims.copies + m, h, 0);
        if (m == 0 && dims.skip == SkipTerm::per_head) {
          const T w = dd(h);
          const auto* const dyr = &dy(t, std::int64_t(h) * d);
          for (int j = 0; j < d; ++j) out[j] = in[j] + w * dyr[j];
        } else if (m == 0 && dims.skip == SkipTerm::per_channel) {
          const auto* const w = &dd(std::int64_t(h) * d);
          const auto* const dyr = &dy(t, std::int64_t(h) * d);
          for (int j = 0; j < d; ++j) out[j] = in[j] + w[j] * dyr[j];
        } else {
          for (int j = 0; j < d; ++j) out[j] = in[j];
        }
      }
    const int n_state = dims.d_state;
    for (int m = 0; m <= dims.copies; ++m) {
      for (int g = 0; g < dims.groups; ++g) {
        const std::int64_t base = off_k + (std::int64_t(m) * dims.groups + g) * n_state;
        const T r = rk(t, m, g);
        T* const dx = &dpre(t, base);
        const auto* const x = &act(t, base);
        // The local heads that read group g, [h0, h1): a group's heads are consecutive.
        const int first = (dims.group_begin + g) * dims.heads_per_group - dims.head_begin;
        const int h0 = first > 0 ? first : 0;
        const int h1 =
            first + dims.heads_per_group < dims.heads ? first + dims.heads_per_group : dims.heads;
        // dx̂ summed over those heads in order (kept in dpre until the dot is known), then x̂·dx̂.
        for (int n = 0; n < n_state; ++n) dx[n] = T(0);
        for (int h = h0; h < h1; ++h) {
          const auto* const src = m < dims.copies ? &dk(t * dims.copies + m, h, 0) : &dq(t, h, 0);
          for (int n = 0; n < n_state; ++n) dx[n] += src[n];
        }
        T dot = 0;
        for (int n = 0; n < n_state; ++n) dot += dx[n] * x[n] * r;
        for (int n = 0; n < n_state; ++n) dx[n] = r * (dx[n] - x[n] * r * dot);
      }
    }
    // SiLU's backward over the token's whole row, as one pass that vectorises on a host.
    silu_row<Bytes>(&pre(t, 0), &dpre(t, 0), dims.conv_channels(), true);
  }
};

/// Per-head parameter gradients of the gates: ddt_bias(h) = Σ_t da(t, h), dA_log(h) = Σ_t dg·g.
template <class D, class B2, class P>
struct GateParamGrads {
  D du;
  B2 dg, g;
  P ddt_bias, da_log;
  LocalDims dims;
  std::int64_t tokens;
  KOKKOS_INLINE_FUNCTION void operator()(int h) const {
    using T = typename P::non_const_value_type;
    T s_dt = 0, s_a = 0;
    for (std::int64_t t = 0; t < tokens; ++t) {
      s_dt += du(t, dims.off_a + h);
      s_a += dg(t, h) * g(t, h);
    }
    ddt_bias(h) = s_dt;
    da_log(h) = s_a;
  }
};

/// Gradient of the skip term: dD(u) = Σ_t Σ_{c ∈ unit u} dy(t, c)·x_V(t, c), a unit being a head
/// (`width` = headdim) or one channel (`width` = 1). Tokens in order, so the sum is deterministic.
template <class Dy, class X, class D>
struct SkipGrad {
  Dy dy;
  X xv;
  D dd;
  std::int64_t tokens;
  int width;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t unit) const {
    using T = typename D::non_const_value_type;
    T s = 0;
    for (std::int64_t t = 0; t < tokens; ++t)
      for (int j = 0; j < width; ++j) s += dy(t, unit * width + j) * xv(t, unit * width + j);
    dd(unit) = s;
  }
};

/// Copies a column block of a 2-D view: dst(t, c) = src(t, off + c) (or the reverse with `to_src`).
template <class Src, class Dst>
struct CopyColumns {
  Src src;
  Dst dst;
  std::int64_t off;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t t, std::int64_t c) const {
    dst(t, c) = src(t, off + c);
  }
};
template <class Src, class Dst>
struct CopyIntoColumns {
  Src src;
  Dst dst;
  std::int64_t off;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t t, std::int64_t c) const {
    dst(t, off + c) = src(t, c);
  }
};

}  // namespace ctxpar::heads::impl
CTXPAR_WIDE_VECTORS_END
