/// \file
/// The network ceilings: MPI ping-pong latency and bandwidth between ranks 0 and 1, and all-gather
/// bandwidth over a communicator (shared-memory transport on one machine).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

#include "common/timing.hpp"

namespace ctxpar::bench {

/// One ping-pong measurement between ranks 0 and 1.
struct PingPong {
  /// Message size in bytes.
  std::size_t bytes = 0;
  /// Half the round trip, median over repeats (seconds): the one-way time.
  double one_way_s = 0;
  /// bytes / one_way_s, in GB/s.
  double gbps = 0;
  /// The repeats (round trips).
  Timing round_trip;
};

/// Ping-pong of `bytes` between ranks 0 and 1 of `comm` (other ranks only join the barriers).
/// Collective; needs at least 2 ranks. Every rank returns the same figures.
inline PingPong pingpong(MPI_Comm comm, std::size_t bytes, int repeats = 10) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::vector<char> buffer(bytes > 0 ? bytes : 1, static_cast<char>(rank + 1));
  const int count = static_cast<int>(bytes);
  // Many round trips per timed repeat, so small messages are not dominated by the clock.
  const int trips = bytes <= 4096 ? 200 : (bytes <= (1u << 20) ? 20 : 4);
  PingPong out;
  out.bytes = bytes;
  out.round_trip = time_collective(
      comm,
      [&] {
        for (int t = 0; t < trips; ++t) {
          if (rank == 0) {
            MPI_Send(buffer.data(), count, MPI_BYTE, 1, 7, comm);
            MPI_Recv(buffer.data(), count, MPI_BYTE, 1, 7, comm, MPI_STATUS_IGNORE);
          } else if (rank == 1) {
            MPI_Recv(buffer.data(), count, MPI_BYTE, 0, 7, comm, MPI_STATUS_IGNORE);
            MPI_Send(buffer.data(), count, MPI_BYTE, 0, 7, comm);
          }
        }
      },
      2, repeats);
  out.round_trip.median_s /= trips;
  out.round_trip.min_s /= trips;
  out.round_trip.max_s /= trips;
  out.one_way_s = 0.5 * out.round_trip.median_s;
  out.gbps = double(bytes) / out.one_way_s * 1e-9;
  return out;
}

/// One all-gather measurement.
struct AllGather {
  /// Bytes each rank contributes.
  std::size_t bytes_per_rank = 0;
  /// Bytes each rank receives from the others per call divided by the median time, in GB/s.
  double gbps = 0;
  /// The repeats.
  Timing timing;
};

/// MPI_Allgather of `bytes_per_rank` from every rank of `comm`. Collective.
inline AllGather allgather_bandwidth(MPI_Comm comm, std::size_t bytes_per_rank, int repeats = 10) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  std::vector<char> send(bytes_per_rank, static_cast<char>(rank + 1));
  std::vector<char> recv(bytes_per_rank * static_cast<std::size_t>(size));
  const int count = static_cast<int>(bytes_per_rank);
  AllGather out;
  out.bytes_per_rank = bytes_per_rank;
  out.timing = time_collective(
      comm,
      [&] { MPI_Allgather(send.data(), count, MPI_BYTE, recv.data(), count, MPI_BYTE, comm); }, 2,
      repeats);
  out.gbps = double(bytes_per_rank) * double(size - 1) / out.timing.median_s * 1e-9;
  return out;
}

}  // namespace ctxpar::bench
