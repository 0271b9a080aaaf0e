/// \file
/// All-to-all of contiguous Kokkos views, equal and uneven counts.
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

namespace ctxpar {

namespace impl {

/// The local preconditions of `alltoall` (thrown at once through `require_local`).
template <class SendView, class RecvView>
void alltoall_checks(const Group& group, const SendView& send, const RecvView& recv,
                     const std::string& op) {
  const std::int64_t p = group.size();
  require_local(send.span() % p == 0, op, "send.span() must be divisible by the group size",
                "a multiple of " + std::to_string(p), send.span());
  require_local(recv.span() == send.span(), op, "recv must hold as many elements as send",
                send.span(), recv.span());
  require_buffers(send, recv, op);
  mpi_count(static_cast<std::int64_t>(send.span()) / p, op);
}

/// The local preconditions of `alltoallv`.
template <class SendView, class RecvView>
void alltoallv_checks(const Group& group, const SendView& send, const std::vector<int>& send_counts,
                      const RecvView& recv, const std::vector<int>& recv_counts,
                      const std::string& op) {
  const int p = group.size();
  require_local(
      static_cast<int>(send_counts.size()) == p && static_cast<int>(recv_counts.size()) == p, op,
      "one send and one receive count per rank", p, send_counts.size());
  displacements(send_counts, op);
  displacements(recv_counts, op);
  std::int64_t stotal = 0, rtotal = 0;
  for (int j = 0; j < p; ++j) {
    stotal += send_counts[j];
    rtotal += recv_counts[j];
  }
  require_local(static_cast<std::int64_t>(send.span()) >= stotal, op,
                "send must hold the sum of send_counts", stotal, send.span());
  require_local(static_cast<std::int64_t>(recv.span()) >= rtotal, op,
                "recv must hold the sum of recv_counts", rtotal, recv.span());
  require_buffers(send, recv, op);
}

}  // namespace impl

/// `alltoall` without the agreement (see `ctxpar::unchecked`). Collective.
template <class ExecutionSpace, class SendView, class RecvView>
void alltoall(const ExecutionSpace& space, const Group& group, const SendView& send,
              const RecvView& recv, Unchecked) {
  const std::string op = "ctxpar::alltoall";
  impl::alltoall_checks(group, send, recv, op);
  const std::int64_t p = group.size();
  const std::int64_t block = static_cast<std::int64_t>(send.span()) / p;
  compat::fence(space, "ctxpar::comm::alltoall::before");
  impl::MpiBuffer<SendView> s(send, true, op, group.staging());
  impl::MpiBuffer<RecvView> r(recv, false, op, group.staging());
  impl::MpiStopwatch clock;
  clock([&] {
    return MPI_Alltoall(s.data(), impl::mpi_count(block, op), impl::mpi_datatype_of<SendView>(),
                        r.data(), impl::mpi_count(block, op), impl::mpi_datatype_of<RecvView>(),
                        group.mpi_comm());
  });
  r.copy_out();
  const std::int64_t bytes =
      block * (p - 1) *
      static_cast<std::int64_t>(sizeof(typename impl::MpiBuffer<SendView>::value_type));
  group.record(CollectiveKind::alltoall, bytes, bytes, clock.seconds());
}

/// Block `j` of `send` (of `send.span() / size()` elements) goes to rank `j`; block `i` of `recv`
/// comes from rank `i`. Both views hold the same number of elements, divisible by `size()`, the
/// same on every rank. Collective. The preconditions are agreed first (one broadcast, one
/// all-reduce); pass `ctxpar::unchecked` to skip the agreement.
template <class ExecutionSpace, class SendView, class RecvView>
void alltoall(const ExecutionSpace& space, const Group& group, const SendView& send,
              const RecvView& recv) {
  const std::string op = "ctxpar::alltoall";
  impl::agree_on_checks(
      group, op, [&] { impl::alltoall_checks(group, send, recv, op); },
      "send.span() (all-to-all moves equal blocks)", static_cast<std::int64_t>(send.span()));
  alltoall(space, group, send, recv, unchecked);
}

/// `alltoallv` without the agreement (see `ctxpar::unchecked`). Collective.
template <class ExecutionSpace, class SendView, class RecvView>
void alltoallv(const ExecutionSpace& space, const Group& group, const SendView& send,
               const std::vector<int>& send_counts, const RecvView& recv,
               const std::vector<int>& recv_counts, Unchecked) {
  const std::string op = "ctxpar::alltoallv";
  impl::alltoallv_checks(group, send, send_counts, recv, recv_counts, op);
  const int p = group.size();
  const std::vector<int> sdispl = impl::displacements(send_counts, op);
  const std::vector<int> rdispl = impl::displacements(recv_counts, op);
  std::int64_t stotal = 0, rtotal = 0;
  for (int j = 0; j < p; ++j) {
    stotal += send_counts[j];
    rtotal += recv_counts[j];
  }
  compat::fence(space, "ctxpar::comm::alltoallv::before");
  impl::MpiBuffer<SendView> s(send, true, op, group.staging());
  impl::MpiBuffer<RecvView> r(recv, false, op, group.staging());
  impl::MpiStopwatch clock;
  clock([&] {
    return MPI_Alltoallv(s.data(), send_counts.data(), sdispl.data(),
                         impl::mpi_datatype_of<SendView>(), r.data(), recv_counts.data(),
                         rdispl.data(), impl::mpi_datatype_of<RecvView>(), group.mpi_comm());
  });
  r.copy_out(rtotal);
  const std::int64_t elem = sizeof(typename impl::MpiBuffer<SendView>::value_type);
  const int me = group.rank();
  group.record(CollectiveKind::alltoall, (stotal - send_counts[me]) * elem,
               (rtotal - recv_counts[me]) * elem, clock.seconds());
}

/// `send_counts[j]` elements (in rank order, packed) go to rank `j`; `recv_counts[i]` come from
/// rank `i`, packed in rank order into `recv`. Zero counts are allowed. Collective. The local
/// preconditions (one count per rank, `int` counts and displacements, buffer sizes, contiguity)
/// are agreed first (one all-reduce); that `send_counts[j]` on rank `i` equals `recv_counts[i]`
/// on rank `j` is not checked (it would take a second all-to-all). Pass `ctxpar::unchecked` to
/// skip the agreement.
template <class ExecutionSpace, class SendView, class RecvView>
void alltoallv(const ExecutionSpace& space, const Group& group, const SendView& send,
               const std::vector<int>& send_counts, const RecvView& recv,
               const std::vector<int>& recv_counts) {
  const std::string op = "ctxpar::alltoallv";
  impl::agree_on_checks(
      group, op, [&] { impl::alltoallv_checks(group, send, send_counts, recv, recv_counts, op); });
  alltoallv(space, group, send, send_counts, recv, recv_counts, unchecked);
}

}  // namespace ctxpar
