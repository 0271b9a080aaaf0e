/// \file
/// All-to-all of contiguous Kokkos views, equal and uneven counts.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/impl/mpi_buffer.hpp"

namespace ctxpar {

/// Block `j` of `send` (of `send.span() / size()` elements) goes to rank `j`; block `i` of `recv`
/// comes from rank `i`. Both views hold the same number of elements, divisible by `size()`.
/// Collective.
template <class ExecutionSpace, class SendView, class RecvView>
void alltoall(const ExecutionSpace& space, const Group& group, const SendView& send,
              const RecvView& recv) {
  const std::string op = "ctxpar::alltoall";
  const std::int64_t p = group.size();
  require_local(send.span() % p == 0, op, "send.span() must be divisible by the group size",
                "a multiple of " + std::to_string(p), send.span());
  require_local(recv.span() == send.span(), op, "recv must hold as many elements as send",
                send.span(), recv.span());
  const std::int64_t block = static_cast<std::int64_t>(send.span()) / p;
  compat::fence(space, "ctxpar::comm::alltoall::before");
  impl::MpiBuffer<SendView> s(send, true, op);
  impl::MpiBuffer<RecvView> r(recv, false, op);
  MPI_Alltoall(s.data(), impl::mpi_count(block, op), impl::mpi_datatype_of<SendView>(), r.data(),
               impl::mpi_count(block, op), impl::mpi_datatype_of<RecvView>(), group.mpi_comm());
  r.copy_out();
  const std::int64_t bytes = block * (p - 1) * static_cast<std::int64_t>(sizeof(typename impl::MpiBuffer<SendView>::value_type));
  group.record(CollectiveKind::alltoall, bytes, bytes);
}

/// `send_counts[j]` elements (in rank order, packed) go to rank `j`; `recv_counts[i]` come from
/// rank `i`, packed in rank order into `recv`. Zero counts are allowed. Collective.
template <class ExecutionSpace, class SendView, class RecvView>
void alltoallv(const ExecutionSpace& space, const Group& group, const SendView& send,
               const std::vector<int>& send_counts, const RecvView& recv,
               const std::vector<int>& recv_counts) {
  const std::string op = "ctxpar::alltoallv";
  const int p = group.size();
  require_local(static_cast<int>(send_counts.size()) == p && static_cast<int>(recv_counts.size()) == p,
                op, "one send and one receive count per rank", p, send_counts.size());
  const std::vector<int> sdispl = impl::displacements(send_counts, op);
  const std::vector<int> rdispl = impl::displacements(recv_counts, op);
  std::int64_t stotal = 0, rtotal = 0;
  for (int j = 0; j < p; ++j) {
    stotal += send_counts[j];
    rtotal += recv_counts[j];
  }
  require_local(static_cast<std::int64_t>(send.span()) >= stotal, op,
                "send must hold the sum of send_counts", stotal, send.span());
  require_local(static_cast<std::int64_t>(recv.span()) >= rtotal, op,
                "recv must hold the sum of recv_counts", rtotal, recv.span());
  compat::fence(space, "ctxpar::comm::alltoallv::before");
  impl::MpiBuffer<SendView> s(send, true, op);
  impl::MpiBuffer<RecvView> r(recv, false, op);
  MPI_Alltoallv(s.data(), send_counts.data(), sdispl.data(), impl::mpi_datatype_of<SendView>(),
                r.data(), recv_counts.data(), rdispl.data(), impl::mpi_datatype_of<RecvView>(),
                group.mpi_comm());
  r.copy_out(rtotal);
  const std::int64_t elem = sizeof(typename impl::MpiBuffer<SendView>::value_type);
  const int me = group.rank();
  group.record(CollectiveKind::alltoall, (stotal - send_counts[me]) * elem,
               (rtotal - recv_counts[me]) * elem);
}

}  // namespace ctxpar
