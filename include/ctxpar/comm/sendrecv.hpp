/// \file
/// Neighbour exchange of contiguous Kokkos views.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/impl/mpi_buffer.hpp"
#include "ctxpar/comm/impl/mpi_stopwatch.hpp"

namespace ctxpar {

/// Tag value of `sendrecv` when no partner exists on that side.
inline constexpr int no_rank = -1;

/// Sends `send` to rank `dest` and receives `recv` from rank `source` in one step (either may be
/// `no_rank`; an empty view is a valid message). The caller is responsible for matching sizes on
/// both sides: a receive shorter than the message is an MPI truncation error. Collective over the
/// pairs involved.
template <class ExecutionSpace, class SendView, class RecvView>
void sendrecv(const ExecutionSpace& space, const Group& group, const SendView& send, int dest,
              const RecvView& recv, int source, int tag = 0) {
  const std::string op = "ctxpar::sendrecv";
  require_local(dest == no_rank || (dest >= 0 && dest < group.size()), op,
                "dest must be a rank of the group or no_rank", "[0, size)", dest);
  require_local(source == no_rank || (source >= 0 && source < group.size()), op,
                "source must be a rank of the group or no_rank", "[0, size)", source);
  compat::fence(space, "ctxpar::comm::sendrecv::before");
  impl::MpiBuffer<SendView> s(send, dest != no_rank, op, group.staging());
  impl::MpiBuffer<RecvView> r(recv, false, op, group.staging());
  MPI_Status status;
  impl::MpiStopwatch clock;
  clock([&] {
    return MPI_Sendrecv(s.data(), impl::mpi_count(dest == no_rank ? 0 : s.size(), op),
                        impl::mpi_datatype_of<SendView>(), dest == no_rank ? MPI_PROC_NULL : dest,
                        tag, r.data(), impl::mpi_count(source == no_rank ? 0 : r.size(), op),
                        impl::mpi_datatype_of<RecvView>(),
                        source == no_rank ? MPI_PROC_NULL : source, tag, group.mpi_comm(), &status);
  });
  if (source != no_rank) {
    // The message may be shorter than `recv`: copy back only what arrived.
    int received = 0;
    MPI_Get_count(&status, impl::mpi_datatype_of<RecvView>(), &received);
    r.copy_out(received);
  }
  const std::int64_t elem = sizeof(typename impl::MpiBuffer<SendView>::value_type);
  // A message to this rank itself (a ring at np 1) is not traffic.
  const bool to_other = dest != no_rank && dest != group.rank();
  const bool from_other = source != no_rank && source != group.rank();
  group.record(CollectiveKind::sendrecv, to_other ? s.size() * elem : 0,
               from_other ? r.size() * elem : 0, clock.seconds());
}

}  // namespace ctxpar
