/// \file
/// The machine's own ceiling for CP efficiency: how much compute P ranks get together. On a shared
/// or SMT machine two FMA-bound processes can get far less than twice one process's throughput,
/// and then no context-parallel operator can reach T(1)/(P·T(P)) = 1 however little it
/// communicates. Measured in the same run as the CP efficiency it qualifies.
#pragma once

#include <mpi.h>

#include <vector>

#include "common/sgemm.hpp"
#include "common/timing.hpp"

namespace ctxpar::bench {

/// SGEMM rate of rank 0 alone and of every rank at once (same n), and their ratio.
struct RankScaling {
  /// Ranks that ran concurrently.
  int ranks = 1;
  /// Rank 0's SGEMM GFLOP/s while the other ranks wait in a barrier (median of the rounds).
  double solo_gflops = 0;
  /// The slowest rank's SGEMM GFLOP/s while all ranks run it at the same time (median).
  double concurrent_gflops = 0;
  /// `concurrent_gflops / solo_gflops` (the median of the rounds' ratios): the CP efficiency a
  /// purely compute-bound operator with no communication would show on this machine in this run.
  double efficiency_ceiling = 0;
  /// Alternating (alone, together) rounds the figures are the medians of.
  int rounds = 1;
};

/// Collective over `comm`. Rank 0 times SGEMM alone, then all ranks time it together (started by a
/// barrier); the slowest rank's rate counts, as the slowest rank sets a CP step's time. The pair is
/// measured in `rounds` alternating rounds and each figure is the median over them: a shared
/// machine's per-core speed drifts by up to 2x within minutes, and one pair caught across such a
/// change gives a ceiling far from the machine's (seen: 0.46 once, 0.95-1.12 just after).
inline RankScaling rank_scaling(MPI_Comm comm, int n = 512, int repeats = 5, int rounds = 3) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  std::vector<double> solo, concurrent, ratio;
  for (int r = 0; r < rounds; ++r) {
    double alone = 0, together = 0;
    if (rank == 0) alone = sgemm_ceiling(n, repeats).gflops;
    MPI_Barrier(comm);
    const double mine = sgemm_ceiling(n, repeats).gflops;
    MPI_Allreduce(&mine, &together, 1, MPI_DOUBLE, MPI_MIN, comm);
    MPI_Bcast(&alone, 1, MPI_DOUBLE, 0, comm);
    solo.push_back(alone);
    concurrent.push_back(together);
    ratio.push_back(alone > 0 ? together / alone : 0);
  }
  RankScaling out;
  out.ranks = size;
  out.rounds = rounds;
  // summarise() takes the median of any list, here of rates and ratios instead of seconds.
  out.solo_gflops = summarise(solo).median_s;
  out.concurrent_gflops = summarise(concurrent).median_s;
  out.efficiency_ceiling = summarise(ratio).median_s;
  return out;
}

}  // namespace ctxpar::bench
