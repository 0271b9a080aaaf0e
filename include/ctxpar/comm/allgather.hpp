/// \file
/// All-gather of contiguous Kokkos views, equal and uneven counts.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/impl/agreed_checks.hpp"
#include "ctxpar/comm/impl/mpi_buffer.hpp"
#include "ctxpar/comm/impl/mpi_stopwatch.hpp"
#include "ctxpar/comm/unchecked.hpp"
#include "ctxpar/core/fingerprint.hpp"

namespace ctxpar {

namespace impl {

/// The local preconditions of `allgather` (thrown at once through `require_local`).
template <class SendView, class RecvView>
void allgather_checks(const Group& group, const SendView& send, const RecvView& recv,
                      const std::string& op) {
  const std::int64_t n = static_cast<std::int64_t>(send.span());
  require_local(static_cast<std::int64_t>(recv.span()) == n * group.size(), op,
                "recv must hold size() * send.span() elements", n * group.size(), recv.span());
  require_buffers(send, recv, op);
  mpi_count(n, op);
}

/// The local preconditions of `allgatherv`.
template <class SendView, class RecvView>
void allgatherv_checks(const Group& group, const SendView& send, const RecvView& recv,
                       const std::vector<int>& counts, const std::string& op) {
  require_local(static_cast<int>(counts.size()) == group.size(), op, "one count per rank",
                group.size(), counts.size());
  displacements(counts, op);
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  require_local(static_cast<std::int64_t>(send.span()) == counts[group.rank()], op,
                "send.span() must equal counts[rank]", counts[group.rank()], send.span());
  require_local(static_cast<std::int64_t>(recv.span()) >= total, op,
                "recv must hold the sum of counts", total, recv.span());
  require_buffers(send, recv, op);
}

}  // namespace impl

/// `allgather` without the agreement (see `ctxpar::unchecked`): the preconditions are checked on
/// the calling rank only. Collective.
template <class ExecutionSpace, class SendView, class RecvView>
void allgather(const ExecutionSpace& space, const Group& group, const SendView& send,
               const RecvView& recv, Unchecked) {
  const std::string op = "ctxpar::allgather";
  impl::allgather_checks(group, send, recv, op);
  const std::int64_t n = static_cast<std::int64_t>(send.span());
  compat::fence(space, "ctxpar::comm::allgather::before");
  impl::MpiBuffer<SendView> s(send, true, op, group.staging());
  impl::MpiBuffer<RecvView> r(recv, false, op, group.staging());
  impl::MpiStopwatch clock;
  clock([&] {
    return MPI_Allgather(s.data(), impl::mpi_count(n, op), impl::mpi_datatype_of<SendView>(),
                         r.data(), impl::mpi_count(n, op), impl::mpi_datatype_of<RecvView>(),
                         group.mpi_comm());
  });
  r.copy_out();
  const std::int64_t bytes =
      n * static_cast<std::int64_t>(sizeof(typename impl::MpiBuffer<SendView>::value_type));
  group.record(CollectiveKind::allgather, bytes * (group.size() - 1), bytes * (group.size() - 1),
               clock.seconds());
}

/// Gathers every rank's `send` into `recv` in rank order; all ranks send the same number of
/// elements, and `recv` holds `size() * send.span()` elements. Collective. The preconditions
/// (sizes, contiguity, `int` counts, the same `send.span()` on every rank) are agreed first, at
/// the cost of one broadcast and one all-reduce: a violation on any rank makes every rank throw
/// the same `Error`. Pass `ctxpar::unchecked` to skip the agreement.
template <class ExecutionSpace, class SendView, class RecvView>
void allgather(const ExecutionSpace& space, const Group& group, const SendView& send,
               const RecvView& recv) {
  const std::string op = "ctxpar::allgather";
  impl::agree_on_checks(
      group, op, [&] { impl::allgather_checks(group, send, recv, op); },
      "send.span() (all-gather sends the same count from every rank)",
      static_cast<std::int64_t>(send.span()));
  allgather(space, group, send, recv, unchecked);
}

/// `allgatherv` without the agreement (see `ctxpar::unchecked`). Collective.
template <class ExecutionSpace, class SendView, class RecvView>
void allgatherv(const ExecutionSpace& space, const Group& group, const SendView& send,
                const RecvView& recv, const std::vector<int>& counts, Unchecked) {
  const std::string op = "ctxpar::allgatherv";
  impl::allgatherv_checks(group, send, recv, counts, op);
  const std::vector<int> displs = impl::displacements(counts, op);
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  compat::fence(space, "ctxpar::comm::allgatherv::before");
  impl::MpiBuffer<SendView> s(send, true, op, group.staging());
  impl::MpiBuffer<RecvView> r(recv, false, op, group.staging());
  impl::MpiStopwatch clock;
  clock([&] {
    return MPI_Allgatherv(s.data(), counts[group.rank()], impl::mpi_datatype_of<SendView>(),
                          r.data(), counts.data(), displs.data(), impl::mpi_datatype_of<RecvView>(),
                          group.mpi_comm());
  });
  r.copy_out(total);
  const std::int64_t elem = sizeof(typename impl::MpiBuffer<SendView>::value_type);
  const std::int64_t own = counts[group.rank()];
  group.record(CollectiveKind::allgather, own * elem * (group.size() - 1), (total - own) * elem,
               clock.seconds());
}

/// `allgatherv` in place, without the agreement (see `ctxpar::unchecked`): this rank's
/// `counts[rank]` elements already sit in `recv` at its displacement (the sum of the counts before
/// it), and every other rank's block arrives around them — no separate send buffer and no copy of
/// the rank's own block. Collective.
template <class ExecutionSpace, class RecvView>
void allgatherv_in_place(const ExecutionSpace& space, const Group& group, const RecvView& recv,
                         const std::vector<int>& counts, Unchecked) {
  const std::string op = "ctxpar::allgatherv_in_place";
  require_local(static_cast<int>(counts.size()) == group.size(), op, "one count per rank",
                group.size(), counts.size());
  const std::vector<int> displs = impl::displacements(counts, op);
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  require_local(static_cast<std::int64_t>(recv.span()) >= total, op,
                "recv must hold the sum of counts", total, recv.span());
  compat::fence(space, "ctxpar::comm::allgatherv_in_place::before");
  impl::MpiBuffer<RecvView> r(recv, true, op, group.staging());
  impl::MpiStopwatch clock;
  clock([&] {
    return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, r.data(), counts.data(),
                          displs.data(), impl::mpi_datatype_of<RecvView>(), group.mpi_comm());
  });
  r.copy_out(total);
  const std::int64_t elem = sizeof(typename impl::MpiBuffer<RecvView>::value_type);
  const std::int64_t own = counts[group.rank()];
  group.record(CollectiveKind::allgather, own * elem * (group.size() - 1), (total - own) * elem,
               clock.seconds());
}

/// Gathers every rank's `send` into `recv` in rank order with uneven contributions: `counts[j]`
/// elements come from rank `j` (zero is allowed) and `send.span()` must equal `counts[rank]`.
/// `recv` must hold at least the sum of `counts`. Collective. The preconditions, including the
/// same `counts` on every rank (a fingerprint), are agreed first (one broadcast, one all-reduce);
/// pass `ctxpar::unchecked` to skip the agreement.
template <class ExecutionSpace, class SendView, class RecvView>
void allgatherv(const ExecutionSpace& space, const Group& group, const SendView& send,
                const RecvView& recv, const std::vector<int>& counts) {
  const std::string op = "ctxpar::allgatherv";
  impl::agree_on_checks(
      group, op, [&] { impl::allgatherv_checks(group, send, recv, counts, op); },
      "counts (fingerprint)", fingerprint(counts));
  allgatherv(space, group, send, recv, counts, unchecked);
}

}  // namespace ctxpar
