/// \file
/// The summary algebra: composition `(M2, d2) ∘ (M1, d1) = (M2·M1, M2·d1 + d2)` ("first 1, then
/// 2"), application `h ← M·h + d`, the identity summary and segmented-scan resets, each one named
/// kernel per step, specialised on the transition structure so the work is the minimum for each
/// family (identity: an add; scalar: an axpy; diagonal: a row-scaled axpy; dense: a small GEMM).
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

namespace ctxpar::chunkwise {

namespace impl {

template <class MemorySpace>
using const_part = Kokkos::View<const float**, Kokkos::LayoutStride, MemorySpace>;
template <class MemorySpace>
using part = Kokkos::View<float**, Kokkos::LayoutStride, MemorySpace>;

// out = later ∘ earlier over H heads. Element e < K·V of a head is the state part (row e / V),
// e >= K·V the transition part. `with_transition = false` computes only the state part, which is
// the application `out = M_later·earlier + d_later` of `later` to the state `earlier`.
template <class Transition, class MemorySpace>
struct ComposeKernel {
  const_part<MemorySpace> later_d, later_m, earlier_d, earlier_m;
  part<MemorySpace> out_d, out_m;
  std::int64_t k, v, width;

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t h = i / width, e = i % width, kv = k * v;
    if (e < kv) {
      const std::int64_t row = e / v, col = e % v;
      float acc = later_d(h, e);
      if constexpr (std::is_same_v<Transition, IdentityTransition>) {
        acc += earlier_d(h, e);
      } else if constexpr (std::is_same_v<Transition, ScalarTransition>) {
        acc += later_m(h, 0) * earlier_d(h, e);
      } else if constexpr (std::is_same_v<Transition, DiagonalTransition>) {
        acc += later_m(h, row) * earlier_d(h, e);
      } else {
        for (std::int64_t l = 0; l < k; ++l)
          acc += later_m(h, row * k + l) * earlier_d(h, l * v + col);
      }
      out_d(h, e) = acc;
    } else {
      const std::int64_t j = e - kv;
      if constexpr (std::is_same_v<Transition, DenseTransition>) {
        const std::int64_t a = j / k, b = j % k;
        float acc = 0;
        for (std::int64_t l = 0; l < k; ++l) acc += later_m(h, a * k + l) * earlier_m(h, l * k + b);
        out_m(h, j) = acc;
      } else if constexpr (!std::is_same_v<Transition, IdentityTransition>) {
        out_m(h, j) = later_m(h, j) * earlier_m(h, j);
      }
    }
  }
};

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
/// value dim `v`. `out` must not alias either input (dense composition reads whole rows). One
/// kernel.
template <class Transition, class ExecutionSpace, class MemorySpace>
void compose_summaries(const ExecutionSpace& space, const SummaryViews<MemorySpace>& later,
                       const SummaryViews<MemorySpace>& earlier,
                       const SummaryViews<MemorySpace>& out, std::int64_t k, std::int64_t v) {
  const std::int64_t heads = later.state.extent(0), width = k * v + Transition::m_size(k);
  Kokkos::parallel_for(
      "ctxpar::chunkwise::compose",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, heads * width),
      impl::ComposeKernel<Transition, MemorySpace>{later.state, later.transition, earlier.state,
                                                   earlier.transition, out.state, out.transition, k,
                                                   v, width});
}

/// `out = M·state + d` for the summary `(M, d)` and a state `[H, K·V]` (both as rank-2 views of
/// fp32). `out` must not alias `state`. One kernel.
template <class Transition, class ExecutionSpace, class MemorySpace>
void apply_summary(
    const ExecutionSpace& space, const SummaryViews<MemorySpace>& summary,
    const Kokkos::View<const float**, Kokkos::LayoutStride, typename ExecutionSpace::memory_space>&
        state,
    const Kokkos::View<float**, Kokkos::LayoutStride, typename ExecutionSpace::memory_space>& out,
    std::int64_t k, std::int64_t v) {
  const std::int64_t heads = summary.state.extent(0), width = k * v;
  Kokkos::parallel_for(
      "ctxpar::chunkwise::apply",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, heads * width),
      impl::ComposeKernel<Transition, MemorySpace>{summary.state, summary.transition, state,
                                                   impl::const_part<MemorySpace>(), out,
                                                   impl::part<MemorySpace>(), k, v, width});
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
