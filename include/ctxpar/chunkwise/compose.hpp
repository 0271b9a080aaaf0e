/// \file
/// The summary algebra: composition `(M2, d2) ∘ (M1, d1) = (M2·M1, M2·d1 + d2)` ("first 1, then
/// 2"), application `h ← M·h + d`, the identity summary and segmented-scan resets, specialised on
/// the transition structure so the work is the minimum for each family (identity: an add; scalar:
/// an axpy; diagonal: a row-scaled axpy; dense: a small `K×K` product). Application and
/// composition are written with the expression layer (`ctxpar::assign`, `M` broadcast or
/// contracted with `ctxpar::expr::contract`): one kernel per step when the output is one packed
/// record (the two parts joined with `ctxpar::expr::concat`), one per part otherwise.
///
/// The same kernels serve forward summaries `(M, dS)` and backward summaries `(Mᵀ, γ)`: a backward
/// summary stores `Mᵀ`, so folding `d ← Mᵀ·d + γ` is the same application.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

#include "ctxpar/chunkwise/summary.hpp"
#include "ctxpar/chunkwise/transition.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/expr/expr.hpp"

namespace ctxpar::chunkwise {

namespace impl {

template <class MemorySpace>
using const_part = Kokkos::View<const float**, Kokkos::LayoutStride, MemorySpace>;
template <class MemorySpace>
using part = Kokkos::View<float**, Kokkos::LayoutStride, MemorySpace>;

// A `[H, K·V]` (or `[H, K·K]`) part, rows contiguous per head, read as `[H, rows, cols]`.
template <class T, class MemorySpace, class Part>
Kokkos::View<T***, Kokkos::LayoutStride, MemorySpace> as_matrices(const Part& p, std::int64_t rows,
                                                                  std::int64_t cols) {
  const Kokkos::LayoutStride layout(p.extent(0), p.stride(0), rows, cols * p.stride(1), cols,
                                    p.stride(1));
  return Kokkos::View<T***, Kokkos::LayoutStride, MemorySpace>(p.data(), layout);
}

// M·h + d for every head, as one expression `[H, K, V]`: `M` broadcast over the rows it scales
// (scalar, diagonal) or contracted with `h` (dense). `h` and `d` are `[H, K, V]`, `m` is the
// transition part `[H, m]`. The dense contraction accumulates onto `d` in order l = 0 … K−1, the
// order the earlier named functor used, so composed summaries are bitwise what they were.
template <class Transition, class MemorySpace, class State>
auto affine_expression(const const_part<MemorySpace>& m, const State& h, const State& d,
                       std::int64_t k, std::int64_t v) {
  namespace ex = ::ctxpar::expr;
  if constexpr (std::is_same_v<Transition, IdentityTransition>) {
    return ex::view(h) + ex::view(d);
  } else if constexpr (std::is_same_v<Transition, ScalarTransition>) {
    const Kokkos::View<const float*, Kokkos::LayoutStride, MemorySpace> scale =
        Kokkos::subview(m, Kokkos::ALL, 0);
    return ex::broadcast<2>(ex::broadcast<1>(scale, k), v) * ex::view(h) + ex::view(d);
  } else if constexpr (std::is_same_v<Transition, DiagonalTransition>) {
    return ex::broadcast<2>(m, v) * ex::view(h) + ex::view(d);
  } else {
    return ex::contract(as_matrices<const float, MemorySpace>(m, k, k), h, d);
  }
}

// out = M·h + d (one assign).
template <class Transition, class ExecutionSpace, class MemorySpace, class State>
void affine_assign(const ExecutionSpace& space, const const_part<MemorySpace>& m, const State& h,
                   const State& d,
                   const Kokkos::View<float***, Kokkos::LayoutStride, MemorySpace>& out,
                   std::int64_t k, std::int64_t v) {
  ::ctxpar::assign(space, out, affine_expression<Transition, MemorySpace>(m, h, d, k, v));
}

// M_l·M_e in the transition storage `[H, m]`: an element-wise product, or the `K×K` contraction
// read row-major (not for the identity, which stores nothing).
template <class Transition, class MemorySpace>
auto product_expression(const const_part<MemorySpace>& later,
                        const const_part<MemorySpace>& earlier, std::int64_t k) {
  namespace ex = ::ctxpar::expr;
  if constexpr (std::is_same_v<Transition, DenseTransition>) {
    return ex::flatten(ex::contract(as_matrices<const float, MemorySpace>(later, k, k),
                                    as_matrices<const float, MemorySpace>(earlier, k, k)));
  } else {
    return ex::view(later) * ex::view(earlier);
  }
}

// The whole record `[H, K·V + m]` when the two parts of `s` lie side by side in one buffer with
// one index map (the packed form, and the driver's scan records); an empty view otherwise.
template <class MemorySpace>
part<MemorySpace> packed_record(const SummaryViews<MemorySpace>& s, std::int64_t kv) {
  const auto &d = s.state, &m = s.transition;
  const std::int64_t heads = d.extent(0);
  const bool side_by_side =
      m.extent(0) == d.extent(0) && static_cast<std::int64_t>(d.extent(1)) == kv &&
      (heads <= 1 || m.stride(0) == d.stride(0)) && m.stride(1) == d.stride(1) &&
      m.data() == d.data() + kv * static_cast<std::int64_t>(d.stride(1));
  if (!side_by_side) return {};
  const Kokkos::LayoutStride layout(heads, d.stride(0), kv + m.extent(1), d.stride(1));
  return part<MemorySpace>(d.data(), layout);
}

// Identity summary: d = 0, M = I (in the structure's storage).
template <class Transition, class MemorySpace>
struct IdentityKernel {
  part<MemorySpace> d, m;
  std::int64_t k, v, width;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t h = i / width, e = i % width, kv = k * v;
    if (e < kv) {
      d(h, e) = 0;
    } else {
      const std::int64_t j = e - kv;
      if constexpr (std::is_same_v<Transition, DenseTransition>) {
        m(h, j) = (j / k == j % k) ? 1.0f : 0.0f;
      } else {
        m(h, j) = 1.0f;
      }
    }
  }
};

// Segmented-scan reset, step 1: d ← M·h0 + d (h0 optional, in the activation type [H, K, V]).
template <class Transition, class Scalar, class MemorySpace>
struct BakeInitialKernel {
  part<MemorySpace> d;
  const_part<MemorySpace> m;
  Kokkos::View<const Scalar***, Kokkos::LayoutStride, MemorySpace> h0;
  std::int64_t k, v;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t kv = k * v, h = i / kv, e = i % kv, row = e / v, col = e % v;
    float acc = d(h, e);
    if constexpr (std::is_same_v<Transition, IdentityTransition>) {
      acc += static_cast<float>(h0(h, row, col));
    } else if constexpr (std::is_same_v<Transition, ScalarTransition>) {
      acc += m(h, 0) * static_cast<float>(h0(h, row, col));
    } else if constexpr (std::is_same_v<Transition, DiagonalTransition>) {
      acc += m(h, row) * static_cast<float>(h0(h, row, col));
    } else {
      for (std::int64_t l = 0; l < k; ++l)
        acc += m(h, row * k + l) * static_cast<float>(h0(h, l, col));
    }
    d(h, e) = acc;
  }
};

// out(h, j) = in(h, j), or `value` everywhere when `in` is empty (Kokkos 3.4 cannot fill or copy
// every strided layout with deep_copy).
template <class MemorySpace>
struct CopyPartKernel {
  const_part<MemorySpace> in;
  part<MemorySpace> out;
  float value;
  std::int64_t width;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t h = i / width, j = i % width;
    out(h, j) = in.data() ? in(h, j) : value;
  }
};

template <class ExecutionSpace, class MemorySpace>
void copy_part(const ExecutionSpace& space, const const_part<MemorySpace>& in,
               const part<MemorySpace>& out, float value = 0.0f) {
  const std::int64_t heads = out.extent(0), width = out.extent(1);
  if (heads * width == 0) return;
  Kokkos::parallel_for(
      "ctxpar::chunkwise::copy_summary_part",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, heads * width),
      CopyPartKernel<MemorySpace>{in, out, value, width});
}

}  // namespace impl

/// `out = later ∘ earlier`, i.e. `(M_l·M_e, M_l·d_e + d_l)`, for `H` heads of key dim `k` and
/// value dim `v`.
///
/// Kernels: one (`ctxpar::assign` of `concat(flatten(M_l·d_e + d_l), M_l·M_e)` over the whole
/// record) when `out`'s two parts lie side by side in one buffer — the packed form and the
/// driver's scan records; two (one assign per part, state first) when `out` is unpacked. The
/// identity stores no transition: one kernel in either form. Results are bitwise the same.
///
/// `out` may overlap an input only as that very input, index for index, under the identity,
/// scalar or diagonal structure: `out == earlier` in any form (one kernel when packed), `out ==
/// later` when unpacked (two kernels: the state part reads `M_l` before the second overwrites it;
/// in a packed record of several heads `M_l` lies inside the state part's span, which is
/// refused). Any other overlap, and any overlap under the dense structure (its products read
/// whole rows), throws `ctxpar::Error` before the launch.
template <class Transition, class ExecutionSpace, class MemorySpace>
void compose_summaries(const ExecutionSpace& space, const SummaryViews<MemorySpace>& later,
                       const SummaryViews<MemorySpace>& earlier,
                       const SummaryViews<MemorySpace>& out, std::int64_t k, std::int64_t v) {
  namespace ex = ::ctxpar::expr;
  using impl::as_matrices;
  using impl::const_part;
  const auto state = impl::affine_expression<Transition, MemorySpace>(
      const_part<MemorySpace>(later.transition),
      as_matrices<const float, MemorySpace>(earlier.state, k, v),
      as_matrices<const float, MemorySpace>(later.state, k, v), k, v);
  if constexpr (std::is_same_v<Transition, IdentityTransition>) {
    ::ctxpar::assign(space, as_matrices<float, MemorySpace>(out.state, k, v), state);
  } else {
    const auto transition = impl::product_expression<Transition, MemorySpace>(
        const_part<MemorySpace>(later.transition), const_part<MemorySpace>(earlier.transition), k);
    const impl::part<MemorySpace> record = impl::packed_record(out, k * v);
    if (record.data() != nullptr) {
      const auto whole = ex::concat(ex::flatten(state), transition);
      if (whole.alias_safe(ex::Footprint::of_view(record), true)) {
        ::ctxpar::assign(space, record, whole);
        return;
      }
    }
    ::ctxpar::assign(space, as_matrices<float, MemorySpace>(out.state, k, v), state);
    ::ctxpar::assign(space, out.transition, transition);
  }
}

/// `out = M·state + d` for the summary `(M, d)` and a state `[H, K·V]` (both as rank-2 views of
/// fp32). Overlaps of `out` with the inputs follow `compose_summaries`. One
/// expression-layer kernel (`ctxpar::assign`): `M` broadcast over the rows it scales (identity,
/// scalar, diagonal) or contracted with the state (dense).
template <class Transition, class ExecutionSpace, class MemorySpace>
void apply_summary(
    const ExecutionSpace& space, const SummaryViews<MemorySpace>& summary,
    const Kokkos::View<const float**, Kokkos::LayoutStride, typename ExecutionSpace::memory_space>&
        state,
    const Kokkos::View<float**, Kokkos::LayoutStride, typename ExecutionSpace::memory_space>& out,
    std::int64_t k, std::int64_t v) {
  impl::affine_assign<Transition>(space, impl::const_part<MemorySpace>(summary.transition),
                                  impl::as_matrices<const float, MemorySpace>(state, k, v),
                                  impl::as_matrices<const float, MemorySpace>(summary.state, k, v),
                                  impl::as_matrices<float, MemorySpace>(out, k, v), k, v);
}

/// Writes the identity summary `(I, 0)` into `out`. One kernel.
template <class Transition, class ExecutionSpace, class MemorySpace>
void identity_summary(const ExecutionSpace& space, const SummaryViews<MemorySpace>& out,
                      std::int64_t k, std::int64_t v) {
  const std::int64_t heads = out.state.extent(0), width = k * v + Transition::m_size(k);
  Kokkos::parallel_for(
      "ctxpar::chunkwise::identity",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, heads * width),
      impl::IdentityKernel<Transition, MemorySpace>{out.state, out.transition, k, v, width});
}

}  // namespace ctxpar::chunkwise
