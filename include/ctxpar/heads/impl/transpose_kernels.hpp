/// \file
/// The pack and unpack kernels of the head transposes (named functors, device-safe). One team per
/// token row; a row's channels move as contiguous runs (a section's copy on one destination rank
/// is one run), so the inner loops are unit-stride copies.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace ctxpar::heads::impl {

/// A contiguous run of the concatenated channel map: `length` channels starting at `P = 1`
/// channel `source` go to rank `owner`, local channels `target - offset(owner)` onwards. `first`
/// is false when these channels already appeared for a lower rank (a repeated key group).
struct ChannelRun {
  std::int64_t source = 0, target = 0, length = 0;
  int owner = 0;
  int first = 1;
};

/// Sequence-parallel row `t` → the send buffer: every run copies `x(t, source + i)` into the block
/// for its rank, row-major `[rows, C_j]`.
template <class Src, class Buf, class MemorySpace, class ExecutionSpace>
struct PackSequence {
  using member = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  Src x;
  Buf buf;
  Kokkos::View<const ChannelRun*, MemorySpace> runs;
  Kokkos::View<const std::int64_t*, MemorySpace> offset;
  std::int64_t rows;

  KOKKOS_INLINE_FUNCTION void operator()(const member& m) const {
    const std::int64_t t = m.league_rank();
    Kokkos::parallel_for(
        Kokkos::TeamThreadRange(m, static_cast<std::int64_t>(runs.extent(0))), [&](std::int64_t r) {
          const ChannelRun run = runs(r);
          const std::int64_t o = offset(run.owner), cj = offset(run.owner + 1) - o;
          const std::int64_t dst = rows * o + t * cj + (run.target - o);
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, run.length),
                               [&](std::int64_t i) { buf(dst + i) = x(t, run.source + i); });
        });
  }
};

/// Receive buffer row `q` (sequence-parallel order) → head-parallel row `order.to_natural(q)`
/// (the zigzag undo; `Layout::to_natural` is evaluated once per row).
template <class Buf, class Dst, class Layout, class ExecutionSpace>
struct UnpackHead {
  using member = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  Buf buf;
  Dst y;
  Layout order;
  std::int64_t channels;

  KOKKOS_INLINE_FUNCTION void operator()(const member& m) const {
    const std::int64_t q = m.league_rank();
    const std::int64_t n = order.to_natural(q);
    Kokkos::parallel_for(Kokkos::TeamVectorRange(m, channels),
                         [&](std::int64_t c) { y(n, c) = buf(q * channels + c); });
  }
};

/// Head-parallel row `order.to_natural(q)` → send buffer row `q` (the zigzag redo).
template <class Src, class Buf, class Layout, class ExecutionSpace>
struct PackHead {
  using member = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  Src y;
  Buf buf;
  Layout order;
  std::int64_t channels;

  KOKKOS_INLINE_FUNCTION void operator()(const member& m) const {
    const std::int64_t q = m.league_rank();
    const std::int64_t n = order.to_natural(q);
    Kokkos::parallel_for(Kokkos::TeamVectorRange(m, channels),
                         [&](std::int64_t c) { buf(q * channels + c) = y(n, c); });
  }
};

/// Receive buffer (one `[rows, C_j]` block per source rank) → sequence-parallel row `t`. First
/// copies write (in parallel: they cover distinct channels); then, for the adjoint, the copies of
/// repeated key groups are added one run at a time in rank order, so the sum is deterministic.
/// Without `sum_repeats` the result is the inverse of `PackSequence` (the lowest rank's copy).
template <class Buf, class Dst, class MemorySpace, class ExecutionSpace>
struct UnpackSequence {
  using member = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  Buf buf;
  Dst x;
  Kokkos::View<const ChannelRun*, MemorySpace> runs;
  Kokkos::View<const std::int64_t*, MemorySpace> offset;
  std::int64_t rows;
  bool sum_repeats;

  KOKKOS_INLINE_FUNCTION void operator()(const member& m) const {
    const std::int64_t t = m.league_rank();
    const std::int64_t nruns = static_cast<std::int64_t>(runs.extent(0));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, nruns), [&](std::int64_t r) {
      const ChannelRun run = runs(r);
      if (!run.first) return;
      const std::int64_t o = offset(run.owner), cj = offset(run.owner + 1) - o;
      const std::int64_t src = rows * o + t * cj + (run.target - o);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, run.length),
                           [&](std::int64_t i) { x(t, run.source + i) = buf(src + i); });
    });
    if (!sum_repeats) return;
    for (std::int64_t r = 0; r < nruns; ++r) {
      const ChannelRun run = runs(r);
      if (run.first) continue;
      m.team_barrier();
      const std::int64_t o = offset(run.owner), cj = offset(run.owner + 1) - o;
      const std::int64_t src = rows * o + t * cj + (run.target - o);
      Kokkos::parallel_for(Kokkos::TeamVectorRange(m, run.length),
                           [&](std::int64_t i) { x(t, run.source + i) += buf(src + i); });
    }
  }
};

}  // namespace ctxpar::heads::impl
