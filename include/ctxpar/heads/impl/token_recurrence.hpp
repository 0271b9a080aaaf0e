/// \file
/// A token-by-token gated delta product recurrence, forward and backward, one thread per head.
/// It is the fallback of the layer core when no chunkwise GDP backend is available, and it keeps
/// every sub-step state for the backward pass (memory `T·M·H·N·d`): correct but not fast.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "ctxpar/core/compat.hpp"

namespace ctxpar::heads::impl {

/// Views of one recurrence problem on one rank: q `[T, H, N]`, k `[T·M, H, N]`, v `[T·M, H, d]`,
/// β `[T·M, H]`, g `[T, H]` (log-gate, applied before the first sub-step of a token), output
/// `[T, H, d]` = scale · Sᵀ q after the last sub-step; state resets where `seq_start(t) == t`.
template <class Scalar, class MemorySpace>
struct RecurrenceViews {
  using v3 = Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace>;
  using v2 = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>;
  v3 q, k, v, o;
  v2 beta, g;
  Kokkos::View<std::int64_t*, MemorySpace> seq_start;
  int copies = 1;
  Scalar scale = 1;
};

/// Forward, one thread per head; `after [T·M, H, N, d]` receives the state after every sub-step.
template <class Scalar, class MemorySpace>
struct TokenRecurrenceForward {
  RecurrenceViews<Scalar, MemorySpace> p;
  Kokkos::View<Scalar****, Kokkos::LayoutRight, MemorySpace> after;
  KOKKOS_INLINE_FUNCTION void operator()(int h) const {
    const std::int64_t tokens = p.q.extent(0);
    const int nk = p.q.extent(2), nv = p.v.extent(2), m_all = p.copies;
    for (std::int64_t t = 0; t < tokens; ++t) {
      const std::int64_t r0 = t * m_all;
      const bool start = p.seq_start(t) == t;
      const Scalar alpha = compat::exp(p.g(t, h));
      for (int m = 0; m < m_all; ++m) {
        const std::int64_t r = r0 + m;
        for (int j = 0; j < nv; ++j) {
          Scalar ks = 0;  // kᵀ S_before column j
          for (int n = 0; n < nk; ++n) {
            const Scalar prev = m > 0 ? after(r - 1, h, n, j) : (start ? Scalar(0) : alpha * after(r0 - 1, h, n, j));
            after(r, h, n, j) = prev;
            ks += p.k(r, h, n) * prev;
          }
          const Scalar e = p.beta(r, h) * (p.v(r, h, j) - ks);
          for (int n = 0; n < nk; ++n) after(r, h, n, j) += p.k(r, h, n) * e;
        }
      }
      for (int j = 0; j < nv; ++j) {
        Scalar s = 0;
        for (int n = 0; n < nk; ++n) s += p.q(t, h, n) * after(r0 + m_all - 1, h, n, j);
        p.o(t, h, j) = p.scale * s;
      }
    }
  }
};

/// Backward of `TokenRecurrenceForward`, one thread per head, sequences walked in reverse.
template <class Scalar, class MemorySpace>
struct TokenRecurrenceBackward {
  RecurrenceViews<Scalar, MemorySpace> p;
  Kokkos::View<Scalar****, Kokkos::LayoutRight, MemorySpace> after;
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace> ds;  // [H, N, d]
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> e, kds;  // [H, d]
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace> dout, dq, dk, dv;
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> dbeta, dg;

  KOKKOS_INLINE_FUNCTION Scalar before(std::int64_t r, int m, std::int64_t r0, bool start, Scalar alpha, int h,
                                       int n, int j) const {
    return m > 0 ? after(r - 1, h, n, j) : (start ? Scalar(0) : alpha * after(r0 - 1, h, n, j));
  }

  KOKKOS_INLINE_FUNCTION void operator()(int h) const {
    const std::int64_t tokens = p.q.extent(0);
    const int nk = p.q.extent(2), nv = p.v.extent(2), m_all = p.copies;
    for (std::int64_t t = tokens - 1; t >= 0; --t) {
      const std::int64_t r0 = t * m_all;
      const bool start = p.seq_start(t) == t;
      if (t + 1 == tokens || p.seq_start(t + 1) == t + 1)
        for (int n = 0; n < nk; ++n)
          for (int j = 0; j < nv; ++j) ds(h, n, j) = 0;
      const Scalar alpha = compat::exp(p.g(t, h));
      const std::int64_t rl = r0 + m_all - 1;
      for (int n = 0; n < nk; ++n) {
        Scalar s = 0;
        for (int j = 0; j < nv; ++j) {
          s += after(rl, h, n, j) * dout(t, h, j);
          ds(h, n, j) += p.scale * p.q(t, h, n) * dout(t, h, j);
        }
        dq(t, h, n) = p.scale * s;
      }
      for (int m = m_all - 1; m >= 0; --m) {
        const std::int64_t r = r0 + m;
        const Scalar b = p.beta(r, h);
        for (int j = 0; j < nv; ++j) {
          Scalar ks = 0, kd = 0;
          for (int n = 0; n < nk; ++n) {
            ks += p.k(r, h, n) * before(r, m, r0, start, alpha, h, n, j);
            kd += p.k(r, h, n) * ds(h, n, j);
          }
          e(h, j) = p.v(r, h, j) - ks;
          kds(h, j) = kd;
          dv(r, h, j) = b * kd;
        }
        Scalar db = 0;
        for (int n = 0; n < nk; ++n) {
          Scalar de = 0, sk = 0;
          for (int j = 0; j < nv; ++j) {
            de += ds(h, n, j) * e(h, j);
            sk += before(r, m, r0, start, alpha, h, n, j) * kds(h, j);
          }
          db += p.k(r, h, n) * de;
          dk(r, h, n) = b * (de - sk);
        }
        dbeta(r, h) = db;
        for (int n = 0; n < nk; ++n)
          for (int j = 0; j < nv; ++j) ds(h, n, j) -= b * p.k(r, h, n) * kds(h, j);
      }
      Scalar da = 0;
      if (!start)
        for (int n = 0; n < nk; ++n)
          for (int j = 0; j < nv; ++j) da += ds(h, n, j) * after(r0 - 1, h, n, j);
      dg(t, h) = da * alpha;
      for (int n = 0; n < nk; ++n)
        for (int j = 0; j < nv; ++j) ds(h, n, j) *= alpha;
    }
  }
};

}  // namespace ctxpar::heads::impl
