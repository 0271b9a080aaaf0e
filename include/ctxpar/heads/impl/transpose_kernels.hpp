/// \file
/// The pack and unpack kernels of the head transposes (named functors, device-safe). One team per
/// token row; a row's channels move as contiguous runs (a section's copy on one destination rank
/// is one run), each a unit-stride copy between two raw row pointers: the run table carries the
/// destination block's base and row stride, so the per-run work is one multiply-add and the inner
/// loop has no index arithmetic beyond `i`.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

#include "ctxpar/core/storage.hpp"
#include "ctxpar/core/team_size.hpp"

namespace ctxpar::heads::impl {

/// Runs `functor` with one team per row of `rows`, the team size by the library's one rule
/// (`choose_team_size`: device recommended size, host `host_team_size()`), so the row's
/// `TeamThreadRange` splits run on concurrent threads wherever the backend allows.
template <class ExecutionSpace, class Functor>
void for_each_row(const char* label, const ExecutionSpace& space, std::int64_t rows,
                  const Functor& functor) {
  const Kokkos::TeamPolicy<ExecutionSpace> probe(space, static_cast<int>(rows), 1);
  Kokkos::parallel_for(
      label,
      Kokkos::TeamPolicy<ExecutionSpace>(space, static_cast<int>(rows),
                                         ::ctxpar::impl::choose_team_size(probe, functor)),
      functor);
}

/// A contiguous run of the concatenated channel map: `length` channels starting at `P = 1`
/// channel `source` go to rank `owner`, local channels `target - offset(owner)` onwards. `first`
/// is false when these channels already appeared for a lower rank (a repeated key group).
/// `block_base + t·block_stride` is the run's first element for row `t` in the `[rows, C_owner]`
/// block of the owner inside the flat send/receive buffer.
struct ChannelRun {
  std::int64_t source = 0, target = 0, length = 0;
  int owner = 0;
  int first = 1;
  std::int64_t block_base = 0, block_stride = 0;
};

/// Pointer to element `(t, c)` of a rank-2 view whose channel axis is contiguous (LayoutRight, or
/// a LayoutStride view with unit channel stride — the plans check that).
template <class View>
KOKKOS_INLINE_FUNCTION typename View::pointer_type row_pointer(const View& v, std::int64_t t) {
  return v.data() + t * static_cast<std::int64_t>(v.stride(0));
}

/// `dst[i] = src[i]` for every `i` of `range` (a team's or a thread's share of one run or row).
template <class Range, class Src, class Dst>
KOKKOS_INLINE_FUNCTION void copy_elements(const Range& range, const Src* src, Dst* dst) {
  Kokkos::parallel_for(range, [&](std::int64_t i) { dst[i] = src[i]; });
}

/// The zigzag undo and redo around the head transpose, one row `q` of the flat buffer (`[rows,
/// channels]`, sequence-parallel order) per team: `ToHead` copies it to head-parallel row
/// `order.to_natural(q)` of the view (the undo), otherwise that row of the view into it (the
/// redo). `Layout::to_natural` is evaluated once per row.
template <class Src, class Dst, class Layout, class ExecutionSpace, bool ToHead>
struct ZigzagRowCopy {
  using member = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  Src src;
  Dst dst;
  Layout order;
  std::int64_t channels;

  KOKKOS_INLINE_FUNCTION void operator()(const member& m) const {
    const std::int64_t q = m.league_rank();
    const std::int64_t natural = order.to_natural(q);
    if constexpr (ToHead)
      copy_elements(Kokkos::TeamVectorRange(m, channels), src.data() + q * channels,
                    row_pointer(dst, natural));
    else
      copy_elements(Kokkos::TeamVectorRange(m, channels), row_pointer(src, natural),
                    dst.data() + q * channels);
  }
};

/// Receive buffer row `q` (sequence-parallel order) → head-parallel row `order.to_natural(q)`.
template <class Buf, class Dst, class Layout, class ExecutionSpace>
using UnpackHead = ZigzagRowCopy<Buf, Dst, Layout, ExecutionSpace, true>;

/// Head-parallel row `order.to_natural(q)` → send buffer row `q`.
template <class Src, class Buf, class Layout, class ExecutionSpace>
using PackHead = ZigzagRowCopy<Src, Buf, Layout, ExecutionSpace, false>;

/// Between sequence-parallel row `t` of `x` and the buffer of `[rows, C_j]` blocks, one per
/// rank, one row per team. `ToBuffer` (the pack) copies every run `x(t, source + i)` into its
/// rank's block. Otherwise (the unpack) the first copy of each channel writes (in parallel: they
/// cover distinct channels); then, with `sum_repeats` (the adjoint), the copies of repeated key
/// groups are added one run at a time in rank order, so the sum is deterministic. Without it the
/// unpack is the inverse of the pack (the lowest rank's copy).
template <class Seq, class Buf, class MemorySpace, class ExecutionSpace, bool ToBuffer>
struct SequenceRunCopy {
  using member = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  Seq x;
  Buf buf;
  Kokkos::View<const ChannelRun*, MemorySpace> runs;
  bool sum_repeats = false;

  KOKKOS_INLINE_FUNCTION void operator()(const member& m) const {
    const std::int64_t t = m.league_rank();
    const std::int64_t nruns = static_cast<std::int64_t>(runs.extent(0));
    auto* const row = row_pointer(x, t);
    auto* const blocks = buf.data();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, nruns), [&](std::int64_t r) {
      const ChannelRun run = runs(r);
      auto* const block_row = blocks + run.block_base + t * run.block_stride;
      const auto range = Kokkos::ThreadVectorRange(m, run.length);
      if constexpr (ToBuffer)
        copy_elements(range, row + run.source, block_row);
      else if (run.first)
        copy_elements(range, block_row, row + run.source);
    });
    // 16-bit rows are only moved: their sums are formed in the compute type (the plan's adjoint
    // takes fp32 gradients).
    if constexpr (!ToBuffer && !is_narrow_storage_v<typename Seq::non_const_value_type>)
      if (sum_repeats) add_repeats(m, t, row, blocks);
  }

  /// The unpack's adjoint part: adds the copies of repeated key groups (the runs that are not a
  /// channel's first) to row `t`, one run at a time in rank order.
  template <class Row, class Blocks>
  KOKKOS_INLINE_FUNCTION void add_repeats(const member& m, std::int64_t t, Row* row,
                                          const Blocks* blocks) const {
    for (std::int64_t r = 0; r < static_cast<std::int64_t>(runs.extent(0)); ++r) {
      const ChannelRun run = runs(r);
      if (run.first) continue;
      m.team_barrier();
      const Blocks* const src = blocks + run.block_base + t * run.block_stride;
      Row* const dst = row + run.source;
      Kokkos::parallel_for(Kokkos::TeamVectorRange(m, run.length),
                           [&](std::int64_t i) { dst[i] += src[i]; });
    }
  }
};

/// Sequence-parallel row `t` of `x` → the send buffer.
template <class Src, class Buf, class MemorySpace, class ExecutionSpace>
using PackSequence = SequenceRunCopy<Src, Buf, MemorySpace, ExecutionSpace, true>;

/// Receive buffer → sequence-parallel row `t` of `x` (summing repeated copies on request).
template <class Buf, class Dst, class MemorySpace, class ExecutionSpace>
using UnpackSequence = SequenceRunCopy<Dst, Buf, MemorySpace, ExecutionSpace, false>;

}  // namespace ctxpar::heads::impl
