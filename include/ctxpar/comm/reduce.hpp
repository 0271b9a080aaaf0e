/// \file
/// Sum reductions of contiguous Kokkos views: reduce-scatter with uneven counts, all-reduce.
#pragma once

#include <mpi.h>

#include <cstdint>
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

/// The local preconditions of `reduce_scatter` (thrown at once through `require_local`).
template <class SendView, class RecvView>
void reduce_scatter_checks(const Group& group, const SendView& send, const RecvView& recv,
                           const std::vector<int>& counts, const std::string& op) {
  require_local(static_cast<int>(counts.size()) == group.size(), op, "one count per rank",
                group.size(), counts.size());
  displacements(counts, op);
  std::int64_t total = 0;
  for (int c : counts) total += c;
  require_local(static_cast<std::int64_t>(send.span()) == total, op,
                "send must hold the sum of counts", total, send.span());
  require_local(static_cast<std::int64_t>(recv.span()) == counts[group.rank()], op,
                "recv.span() must equal counts[rank]", counts[group.rank()], recv.span());
  require_buffers(send, recv, op);
}

}  // namespace impl

/// `reduce_scatter` without the agreement (see `ctxpar::unchecked`). Collective.
template <class ExecutionSpace, class SendView, class RecvView>
void reduce_scatter(const ExecutionSpace& space, const Group& group, const SendView& send,
                    const RecvView& recv, const std::vector<int>& counts, Unchecked) {
  const std::string op = "ctxpar::reduce_scatter";
  impl::reduce_scatter_checks(group, send, recv, counts, op);
  std::int64_t total = 0;
  for (int c : counts) total += c;
  compat::fence(space, "ctxpar::comm::reduce_scatter::before");
  impl::MpiBuffer<SendView> s(send, true, op, group.staging());
  impl::MpiBuffer<RecvView> r(recv, false, op, group.staging());
  impl::MpiStopwatch clock;
  clock([&] {
    return MPI_Reduce_scatter(s.data(), r.data(), counts.data(),
                              impl::mpi_sum_datatype_of<SendView>(), MPI_SUM, group.mpi_comm());
  });
  r.copy_out();
  const std::int64_t elem = sizeof(typename impl::MpiBuffer<SendView>::value_type);
  const std::int64_t own = counts[group.rank()];
  group.record(CollectiveKind::reduce_scatter, (total - own) * elem,
               own * elem * (group.size() - 1), clock.seconds());
}

/// Sums `send` (the same length on every rank, the sum of `counts`) over all ranks and leaves on
/// rank `j` the `counts[j]` elements of the sum starting at the prefix sum of `counts` — the
/// adjoint of `allgatherv`. `recv.span()` must equal `counts[rank]`. Collective. The
/// preconditions, including the same `counts` on every rank (a fingerprint), are agreed first (one
/// broadcast, one all-reduce); pass `ctxpar::unchecked` to skip the agreement.
template <class ExecutionSpace, class SendView, class RecvView>
void reduce_scatter(const ExecutionSpace& space, const Group& group, const SendView& send,
                    const RecvView& recv, const std::vector<int>& counts) {
  const std::string op = "ctxpar::reduce_scatter";
  impl::agree_on_checks(
      group, op, [&] { impl::reduce_scatter_checks(group, send, recv, counts, op); },
      "counts (fingerprint)", fingerprint(counts));
  reduce_scatter(space, group, send, recv, counts, unchecked);
}

/// `allreduce_sum` without the agreement (see `ctxpar::unchecked`). Collective.
template <class ExecutionSpace, class View>
void allreduce_sum(const ExecutionSpace& space, const Group& group, const View& view, Unchecked) {
  const std::string op = "ctxpar::allreduce_sum";
  compat::fence(space, "ctxpar::comm::allreduce_sum::before");
  impl::MpiBuffer<View> b(view, true, op, group.staging());
  impl::MpiStopwatch clock;
  clock([&] {
    return MPI_Allreduce(MPI_IN_PLACE, b.data(), impl::mpi_count(b.size(), op),
                         impl::mpi_sum_datatype_of<View>(), MPI_SUM, group.mpi_comm());
  });
  b.copy_out();
  const std::int64_t bytes =
      b.size() * static_cast<std::int64_t>(sizeof(typename impl::MpiBuffer<View>::value_type));
  group.record(CollectiveKind::allreduce, bytes * (group.size() - 1), bytes * (group.size() - 1),
               clock.seconds());
}

/// Replaces `view` by its element-wise sum over all ranks (e.g. weight gradients). Collective.
/// The preconditions (contiguity, an `int` count, the same `view.span()` on every rank) are agreed
/// first (one broadcast, one all-reduce); pass `ctxpar::unchecked` to skip the agreement.
template <class ExecutionSpace, class View>
void allreduce_sum(const ExecutionSpace& space, const Group& group, const View& view) {
  const std::string op = "ctxpar::allreduce_sum";
  impl::agree_on_checks(
      group, op,
      [&] {
        require_contiguous(view, op, "every buffer handed to a collective");
        impl::mpi_count(static_cast<std::int64_t>(view.span()), op);
      },
      "view.span() (every rank sums the same number of elements)",
      static_cast<std::int64_t>(view.span()));
  allreduce_sum(space, group, view, unchecked);
}

}  // namespace ctxpar
