// ctxpar_bench_ceilings: the machine's same-run ceilings every benchmark compares with: Eigen SGEMM
// (fp32, one thread, n = 512 and 1024), the core's fp32 FMA peak in registers, a STREAM-like triad
// on the default execution space, and at two or more ranks MPI ping-pong latency/bandwidth,
// all-gather bandwidth and the machine's contention ceiling for CP efficiency (SGEMM on every rank
// at once ÷ rank 0 alone), the ceiling shown beside the efficiency of figures that do not measure
// their own (the hybrid stack).
//
// Usage: mpirun -np 2 ctxpar_bench_ceilings [--out FILE.json] [--quick]
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <cstdio>
#include <cstring>
#include <string>

#include "common/fma_peak.hpp"
#include "common/json.hpp"
#include "common/network.hpp"
#include "common/rank_scaling.hpp"
#include "common/sgemm.hpp"
#include "common/triad.hpp"

int main(int argc, char* argv[]) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int exit_code = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    std::string out_path;
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
      if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
        out_path = argv[++i];
      } else if (!std::strcmp(argv[i], "--quick")) {
        quick = true;
      } else {
        std::fprintf(stderr, "usage: ctxpar_bench_ceilings [--out FILE.json] [--quick]\n");
        exit_code = 2;
      }
    }
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    namespace cb = ctxpar::bench;
    cb::Report report(cb::this_machine());
    if (exit_code == 0) {
      // Compute and memory ceilings on rank 0 only: one thread per core, the other ranks wait.
      if (rank == 0) {
        for (int n : {512, 1024}) {
          const auto s = cb::sgemm_ceiling(n, quick ? 2 : 5);
          std::printf("sgemm fp32 1 thread n=%d: %.1f GFLOP/s (best %.1f)\n", n, s.gflops,
                      s.best_gflops);
          report.add(cb::Record("ceilings", "sgemm_n" + std::to_string(n))
                         .set("n", n)
                         .set("flops_formula", "2*n^3")
                         .set("gflops", s.gflops)
                         .set("best_gflops", s.best_gflops)
                         .set("time", s.timing));
        }
        const auto f = cb::fma_peak_ceiling(quick ? 2 : 5);
        std::printf("fma peak fp32 1 thread (%d lanes, %d chains): %.1f GFLOP/s (best %.1f)\n",
                    f.lanes, f.chains, f.gflops, f.best_gflops);
        report.add(cb::Record("ceilings", "fma_peak")
                       .set("lanes", f.lanes)
                       .set("chains", f.chains)
                       .set("flops_formula", "2*lanes*chains*iterations")
                       .set("gflops", f.gflops)
                       .set("best_gflops", f.best_gflops)
                       .set("time", f.timing));
        const auto t = cb::triad_ceiling(Kokkos::DefaultExecutionSpace(),
                                         quick ? std::size_t{1} << 22 : std::size_t{1} << 24);
        std::printf("triad (%s, %d threads): %.1f GB/s (best %.1f)\n",
                    report.machine().backend.c_str(), report.machine().threads, t.gbps,
                    t.best_gbps);
        report.add(cb::Record("ceilings", "triad")
                       .set("n", static_cast<std::int64_t>(t.n))
                       .set("bytes_formula", "3*8*n")
                       .set("gbps", t.gbps)
                       .set("best_gbps", t.best_gbps)
                       .set("time", t.timing));
      }
      MPI_Barrier(MPI_COMM_WORLD);
      if (size >= 2) {
        for (std::size_t bytes : {std::size_t{8}, std::size_t{1} << 16, std::size_t{1} << 22}) {
          const auto p = cb::pingpong(MPI_COMM_WORLD, bytes, quick ? 3 : 10);
          if (rank == 0) {
            std::printf("ping-pong %zu B: one-way %.2f us, %.3f GB/s\n", bytes, p.one_way_s * 1e6,
                        p.gbps);
            report.add(cb::Record("ceilings", "pingpong_" + std::to_string(bytes) + "B")
                           .set("bytes", static_cast<std::int64_t>(bytes))
                           .set("one_way_us", p.one_way_s * 1e6)
                           .set("gbps", p.gbps)
                           .set("round_trip", p.round_trip));
          }
        }
        const std::size_t gather_bytes = std::size_t{1} << 22;
        const auto g = cb::allgather_bandwidth(MPI_COMM_WORLD, gather_bytes, quick ? 3 : 10);
        if (rank == 0) {
          std::printf("allgather %zu B per rank at %d ranks: %.3f GB/s received per rank\n",
                      gather_bytes, size, g.gbps);
          report.add(cb::Record("ceilings", "allgather_" + std::to_string(gather_bytes) + "B")
                         .set("bytes_per_rank", static_cast<std::int64_t>(gather_bytes))
                         .set("bytes_formula", "bytes_per_rank*(P-1) received per rank")
                         .set("gbps", g.gbps)
                         .set("time", g.timing));
        }
        const auto scaling = cb::rank_scaling(MPI_COMM_WORLD, 512, quick ? 3 : 5);
        if (rank == 0) {
          std::printf("contention ceiling at %d ranks: %.3f (SGEMM %.1f alone, %.1f all at once)\n",
                      size, scaling.efficiency_ceiling, scaling.solo_gflops,
                      scaling.concurrent_gflops);
          report.add(cb::Record("ceilings", "contention_P" + std::to_string(size))
                         .set("ranks", size)
                         .set("solo_sgemm_gflops", scaling.solo_gflops)
                         .set("concurrent_sgemm_gflops", scaling.concurrent_gflops)
                         .set("machine_efficiency_ceiling", scaling.efficiency_ceiling)
                         .set("ceiling_rounds", scaling.rounds));
        }
      } else if (rank == 0) {
        std::printf("network ceilings skipped: run with at least 2 ranks\n");
      }
      if (rank == 0 && !out_path.empty()) {
        report.write(out_path);
        std::printf("wrote %s\n", out_path.c_str());
      }
    }
  }
  MPI_Finalize();
  return exit_code;
}
