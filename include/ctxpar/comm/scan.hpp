/// \file
/// Prefix scans of fixed-size records over the ranks of a group, with a user-supplied associative,
/// **non-commutative** operation (e.g. composing state summaries).
#pragma once

#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/impl/agreed_checks.hpp"
#include "ctxpar/comm/impl/mpi_buffer.hpp"
#include "ctxpar/comm/impl/mpi_stopwatch.hpp"
#include "ctxpar/comm/unchecked.hpp"
#include "ctxpar/core/workspace.hpp"

namespace ctxpar {

/// Order in which ranks are scanned: rank 0 first (`forward`) or rank `size()-1` first (`reverse`,
/// for suffix scans such as a backward pass).
enum class ScanDirection { forward, reverse };

/// Scratch of a scan (three records), kept by a caller that scans repeatedly so that a
/// steady-state scan allocates nothing.
template <class MemorySpace>
struct ScanWorkspace {
  /// The running inclusive part.
  GrowingBuffer<MemorySpace> inclusive{"ctxpar::comm::scan::inclusive"};
  /// The record received in a round.
  GrowingBuffer<MemorySpace> received{"ctxpar::comm::scan::received"};
  /// The exclusive result.
  GrowingBuffer<MemorySpace> exclusive{"ctxpar::comm::scan::exclusive"};
};

namespace impl {

// Hillis–Steele over sendrecv: ceil(log2 P) rounds, O(1) records of memory per rank. `combine`
// must be associative; it is never assumed commutative: `combine(earlier, inout)` sets
// `inout := earlier ∘ inout` where `earlier` covers ranks that come first in scan order.
template <class ExecutionSpace, class View, class Combine>
bool scan_records(const ExecutionSpace& space, const Group& group, const View& record,
                  Combine&& combine, ScanDirection direction, bool inclusive,
                  ScanWorkspace<typename View::memory_space>& work) {
  const std::string op = "ctxpar::scan";
  static_assert(compat::view_rank<View> == 1,
                "ctxpar::exclusive_scan / inclusive_scan: the record must be a rank-1 view");
  const int p = group.size();
  const int me = direction == ScanDirection::forward ? group.rank() : p - 1 - group.rank();
  auto to_rank = [&](int ordinal) {
    return direction == ScanDirection::forward ? ordinal : p - 1 - ordinal;
  };
  using buffer_type =
      Kokkos::View<typename View::non_const_value_type*, typename View::memory_space>;
  const auto n = record.extent(0);
  const buffer_type inclusive_part = carve<buffer_type>(work.inclusive, n);
  const buffer_type received = carve<buffer_type>(work.received, n);
  const buffer_type exclusive_part = carve<buffer_type>(work.exclusive, n);
  Kokkos::deep_copy(space, inclusive_part, record);
  bool have_exclusive = false;
  std::int64_t sent = 0, got = 0;
  // Every round's MPI call, not the combines between them: the scan is recorded as one call.
  MpiStopwatch clock;
  const std::int64_t bytes =
      static_cast<std::int64_t>(n * sizeof(typename View::non_const_value_type));
  for (int d = 1; d < p; d <<= 1) {
    const int dest = me + d < p ? to_rank(me + d) : MPI_PROC_NULL;
    const int source = me - d >= 0 ? to_rank(me - d) : MPI_PROC_NULL;
    compat::fence(space, "ctxpar::comm::scan::before");
    MpiBuffer<buffer_type> s(inclusive_part, dest != MPI_PROC_NULL, op, group.staging());
    MpiBuffer<buffer_type> r(received, false, op, group.staging());
    clock([&] {
      return MPI_Sendrecv(s.data(), mpi_count(n, op), mpi_datatype_of<buffer_type>(), dest, 17,
                          r.data(), mpi_count(n, op), mpi_datatype_of<buffer_type>(), source, 17,
                          group.mpi_comm(), MPI_STATUS_IGNORE);
    });
    if (dest != MPI_PROC_NULL) sent += bytes;
    if (source == MPI_PROC_NULL) continue;
    r.copy_out();
    got += bytes;
    if (have_exclusive) {
      combine(received, exclusive_part);
    } else {
      Kokkos::deep_copy(space, exclusive_part, received);
      have_exclusive = true;
    }
    combine(received, inclusive_part);
  }
  group.record(CollectiveKind::scan, sent, got, clock.seconds());
  if (inclusive) {
    Kokkos::deep_copy(space, record, inclusive_part);
  } else if (have_exclusive) {
    Kokkos::deep_copy(space, record, exclusive_part);
  }
  // The caller may reuse the workspace at once; the copy must finish before it reads `record`.
  compat::fence(space, "ctxpar::comm::scan::after");
  return inclusive || have_exclusive;
}

// The agreed preconditions of a scan: an `int` record length, the same on every rank.
template <class View>
void agree_scan(const Group& group, const View& record) {
  const std::string op = "ctxpar::scan";
  const auto n = static_cast<std::int64_t>(record.extent(0));
  agree_on_checks(
      group, op, [&] { mpi_count(n, op); },
      "the record length record.extent(0) (every rank scans records of one size)", n);
}

}  // namespace impl

/// `exclusive_scan` without the agreement (see `ctxpar::unchecked`), its scratch in `work`.
/// Collective.
template <class ExecutionSpace, class View, class Combine>
bool exclusive_scan(const ExecutionSpace& space, const Group& group, const View& record,
                    Combine&& combine, ScanDirection direction, Unchecked,
                    ScanWorkspace<typename View::memory_space>& work) {
  return impl::scan_records(space, group, record, combine, direction, false, work);
}

/// `exclusive_scan` without the agreement (see `ctxpar::unchecked`). Collective.
template <class ExecutionSpace, class View, class Combine>
bool exclusive_scan(const ExecutionSpace& space, const Group& group, const View& record,
                    Combine&& combine, ScanDirection direction, Unchecked) {
  ScanWorkspace<typename View::memory_space> work;
  return impl::scan_records(space, group, record, combine, direction, false, work);
}

/// `inclusive_scan` without the agreement (see `ctxpar::unchecked`). Collective.
template <class ExecutionSpace, class View, class Combine>
void inclusive_scan(const ExecutionSpace& space, const Group& group, const View& record,
                    Combine&& combine, ScanDirection direction, Unchecked) {
  ScanWorkspace<typename View::memory_space> work;
  impl::scan_records(space, group, record, combine, direction, true, work);
}

/// Exclusive scan: on return `record` holds `r_first ∘ … ∘ r_prev` over the ranks before this one
/// in scan order, and the function returns true; on the first rank in scan order `record` is left
/// unchanged and it returns false (there is no identity to write, the operation need not have one).
/// `combine(earlier, inout)` must set `inout := earlier ∘ inout` (associative, need not commute)
/// on views of the record's memory space. Collective; ceil(log2 P) rounds, after the agreement on
/// the record length (one broadcast, one all-reduce; pass `ctxpar::unchecked` to skip it).
template <class ExecutionSpace, class View, class Combine>
bool exclusive_scan(const ExecutionSpace& space, const Group& group, const View& record,
                    Combine&& combine, ScanDirection direction = ScanDirection::forward) {
  impl::agree_scan(group, record);
  ScanWorkspace<typename View::memory_space> work;
  return impl::scan_records(space, group, record, combine, direction, false, work);
}

/// Inclusive scan: on return `record` holds the composition over this rank and every rank before
/// it in scan order. See `exclusive_scan` for `combine`. Collective, agreed as `exclusive_scan`.
template <class ExecutionSpace, class View, class Combine>
void inclusive_scan(const ExecutionSpace& space, const Group& group, const View& record,
                    Combine&& combine, ScanDirection direction = ScanDirection::forward) {
  impl::agree_scan(group, record);
  ScanWorkspace<typename View::memory_space> work;
  impl::scan_records(space, group, record, combine, direction, true, work);
}

}  // namespace ctxpar
