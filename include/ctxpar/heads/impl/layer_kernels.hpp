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
#include "ctxpar/expr/unary.hpp"
#include "ctxpar/heads/skip_term.hpp"

namespace ctxpar::heads::impl {

/// `1/(1 + e^−x)` for `x ≥ 0`, `e^x/(1 + e^x)` below (no overflow of `e^−x`). One `exp` of `−|x|`
/// serves both sides and the side is chosen after it, so a random sign costs no mispredicted
/// branch around the `exp` (the same bits as evaluating the chosen side alone).
template <class T>
KOKKOS_INLINE_FUNCTION T sigmoid(T x) {
  const T e = compat::exp(x >= T(0) ? -x : x);
  const T one_plus = T(1) + e;
  return (x >= T(0) ? T(1) : e) / one_plus;
}
template <class T>
KOKKOS_INLINE_FUNCTION T softplus(T x) {
  return x > T(20) ? x : compat::log1p(compat::exp(x));
}

/// The gate's sigmoid as an expression-layer operation. Kept apart from `expr::op::Sigmoid`
/// because it takes `exp(x)/(1 + exp(x))` for negative `x` (no overflow of `exp(-x)`), and the
/// layer's results must stay bit-identical to the recorded ones.
struct GateSigmoid {
  /// Same type.
  template <class T>
  using result = T;
  /// Applies the operation.
  template <class T>
  KOKKOS_INLINE_FUNCTION static T apply(T x) {
    return sigmoid(x);
  }
};
/// The gate's softplus (`x` itself above 20) as an expression-layer operation; see `GateSigmoid`.
struct GateSoftplus {
  /// Same type.
  template <class T>
  using result = T;
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

/// pre(t, c) = bias(c) + Σ_k w(c, k)·u(t − w + 1 + k, off_v + c) within the token's sequence;
/// act = SiLU(pre).
template <class U, class W, class B, class Out, class Idx>
struct ConvForward {
  U u;
  W w;
  B bias;
  Out pre, act;
  Idx seq_start;
  std::int64_t off;
  int width;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t t, std::int64_t c) const {
    using T = typename Out::non_const_value_type;
    T s = bias(c);
    const std::int64_t first = seq_start(t);
    for (int k = 0; k < width; ++k) {
      const std::int64_t src = t - (width - 1) + k;
      if (src >= first) s += w(c, k) * u(src, off + c);
    }
    pre(t, c) = s;
    act(t, c) = s * sigmoid(s);
  }
};

/// SiLU'(x) = s·(1 + x·(1 − s)) with s = sigmoid(x).
template <class T>
KOKKOS_INLINE_FUNCTION T silu_grad(T x) {
  const T s = sigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}

/// du(t, off_v + c) = Σ_k w(c, k)·dpre(t + w − 1 − k, c) over outputs in the token's sequence.
template <class Dpre, class W, class Du, class Idx>
struct ConvBackwardInput {
  Dpre dpre;
  W w;
  Du du;
  Idx seq_end;
  std::int64_t off;
  int width;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t t, std::int64_t c) const {
    using T = typename Du::non_const_value_type;
    T s = 0;
    const std::int64_t last = seq_end(t);
    for (int k = 0; k < width; ++k) {
      const std::int64_t out = t + (width - 1) - k;
      if (out < last) s += w(c, k) * dpre(out, c);
    }
    du(t, off + c) = s;
  }
};

/// dw(c, k) = Σ_t dpre(t, c)·u(t − w + 1 + k, off_v + c) (same sequence); db(c) = Σ_t dpre(t, c).
///
/// Work item `i` owns channels `[i·block, i·block + block)`. On a GPU `block` is 1: neighbouring
/// threads read neighbouring channels of one row, so the loads coalesce. On a host core one item
/// walks the rows for all of its channels at once: each row's cache line then serves `block`
/// channels instead of being fetched again for every channel, which is what keeps the cost per
/// token flat once `[T, C]` no longer fits in cache. Every channel's sum runs over `t` in the same
/// order for any `block`, so the result is bitwise the same.
template <class Dpre, class U, class Dw, class Db, class Idx>
struct ConvBackwardWeights {
  /// Most channels one work item owns (a 64-byte line of doubles).
  static constexpr int max_block = 8;
  Dpre dpre;
  U u;
  Dw dw;
  Db db;
  Idx seq_start;
  std::int64_t off, tokens;
  int width;
  std::int64_t channels;
  int block;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    using T = typename Dw::non_const_value_type;
    const std::int64_t c0 = i * block;
    const int n = static_cast<int>(channels - c0 < block ? channels - c0 : block);
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
    for (int m = 0; m < dims.copies; ++m) {
      for (int h = 0; h < dims.heads; ++h) {
        const int g = dims.group_of(h);
        const std::int64_t base = off_k + (std::int64_t(m) * dims.groups + g) * dims.d_state;
        for (int n = 0; n < dims.d_state; ++n)
          k(t * dims.copies + m, h, n) = act(t, base + n) * rk(t, m, g);
        for (int j = 0; j < dims.headdim; ++j)
          v(t * dims.copies + m, h, j) =
              act(t, (std::int64_t(m) * dims.heads + h) * dims.headdim + j);
      }
    }
    for (int h = 0; h < dims.heads; ++h) {
      const int g = dims.group_of(h);
      const std::int64_t base =
          off_k + (std::int64_t(dims.copies) * dims.groups + g) * dims.d_state;
      for (int n = 0; n < dims.d_state; ++n) q(t, h, n) = act(t, base + n) * rk(t, dims.copies, g);
    }
  }
};

/// Backward of `SplitNormalize`, then of the skip term and of the SiLU, in one pass: per key
/// group, sums the gradients of the heads that read it and applies the L2-norm Jacobian
/// `r·(dx̂ − x̂ (x̂·dx̂))`; on the V channels of householder copy 0 adds `D ⊙ dy` when the layer has
/// a skip term (it reads x_V); and stores each gradient times SiLU'(pre) as `dpre`, for every conv
/// channel (V, K and Q). The SiLU factor is applied at the store, in the order the separate passes
/// used, so `dpre` is the same as theirs.
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
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t t) const {
    using T = typename D::non_const_value_type;
    const std::int64_t off_k = dims.d_inner() * dims.copies;
    for (int m = 0; m < dims.copies; ++m)
      for (int h = 0; h < dims.heads; ++h)
        for (int j = 0; j < dims.headdim; ++j) {
          const std::int64_t c = (std::int64_t(m) * dims.heads + h) * dims.headdim + j;
          T g = dv(t * dims.copies + m, h, j);
          if (m == 0 && dims.skip != SkipTerm::none) {
            const std::int64_t hj = std::int64_t(h) * dims.headdim + j;
            const T w = dims.skip == SkipTerm::per_head ? dd(h) : dd(hj);
            g = g + w * dy(t, hj);
          }
          dpre(t, c) = g * silu_grad(pre(t, c));
        }
    for (int m = 0; m <= dims.copies; ++m) {
      for (int g = 0; g < dims.groups; ++g) {
        const std::int64_t base = off_k + (std::int64_t(m) * dims.groups + g) * dims.d_state;
        const T r = rk(t, m, g);
        // The local heads that read group g, [h0, h1): a group's heads are consecutive.
        const int first = (dims.group_begin + g) * dims.heads_per_group - dims.head_begin;
        const int h0 = first > 0 ? first : 0;
        const int h1 =
            first + dims.heads_per_group < dims.heads ? first + dims.heads_per_group : dims.heads;
        // dx̂ summed over those heads in order (kept in dpre until the dot is known), then x̂·dx̂.
        T dot = 0;
        for (int n = 0; n < dims.d_state; ++n) {
          T s = 0;
          if (m < dims.copies)
            for (int h = h0; h < h1; ++h) s += dk(t * dims.copies + m, h, n);
          else
            for (int h = h0; h < h1; ++h) s += dq(t, h, n);
          dpre(t, base + n) = s;
          dot += s * act(t, base + n) * r;
        }
        for (int n = 0; n < dims.d_state; ++n) {
          const T dx = r * (dpre(t, base + n) - act(t, base + n) * r * dot);
          dpre(t, base + n) = dx * silu_grad(pre(t, base + n));
        }
      }
    }
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
