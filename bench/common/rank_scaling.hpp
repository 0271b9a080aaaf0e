/// \file
/// The machine's own ceiling for CP efficiency: how much compute P ranks get together. On a shared
/// or SMT machine two FMA-bound processes can get far less than twice one process's throughput,
/// and then no context-parallel operator can reach T(1)/(P·T(P)) = 1 however little it
/// communicates. Measured in the same run as the CP efficiency it qualifies.
#pragma once

#include <mpi.h>

#include <algorithm>

#include "common/sgemm.hpp"

namespace ctxpar::bench {

/// SGEMM rate of rank 0 alone and of every rank at once (same n), and their ratio.
struct RankScaling {
  /// Ranks that ran concurrently.
  int ranks = 1;
  /// Rank 0's SGEMM GFLOP/s while the other ranks wait in a barrier.
  double solo_gflops = 0;
  /// The slowest rank's SGEMM GFLOP/s while all ranks run it at the same time.
  double concurrent_gflops = 0;
  /// `concurrent_gflops / solo_gflops`: the CP efficiency a purely compute-bound operator with no
  /// communication would show on this machine in this run.
  double efficiency_ceiling = 0;
};

/// Collective over `comm`. Rank 0 times SGEMM alone, then all ranks time it together (started by a
/// barrier); the slowest rank's rate counts, as the slowest rank sets a CP step's time.
inline RankScaling rank_scaling(MPI_Comm comm, int n = 512, int repeats = 5) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  RankScaling out;
  out.ranks = size;
  if (rank == 0) out.solo_gflops = sgemm_ceiling(n, repeats).gflops;
  MPI_Barrier(comm);
  const double mine = sgemm_ceiling(n, repeats).gflops;
  MPI_Allreduce(&mine, &out.concurrent_gflops, 1, MPI_DOUBLE, MPI_MIN, comm);
  MPI_Bcast(&out.solo_gflops, 1, MPI_DOUBLE, 0, comm);
  out.efficiency_ceiling = out.solo_gflops > 0 ? out.concurrent_gflops / out.solo_gflops : 0;
  return out;
}

}  // namespace ctxpar::bench
