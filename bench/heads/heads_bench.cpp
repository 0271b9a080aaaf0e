// Mechanism C benchmark. Every figure that matters is a same-run ratio:
//  - pack/unpack GB/s of the head transposes ÷ the same-run triad GB/s (target >= 0.5), at P = 1
//    with the channel map of a simulated P_sim-way partition (the kernels touch every element
//    once whatever P is);
//  - all-to-all time and bytes per rank vs the formula (P−1)/P·(T/P)·C·sizeof at the run's P;
//  - the crossover against the chunkwise summary exchange of mechanism B: per rank, B all-gathers
//    one fp32 summary (M [K, K] + dS [K, V]) per head, independent of T; C transposes the input
//    projection and y, z back, linear in T/P. Both measured in the same run.
//   mpirun -np P ctxpar_bench_heads --out FILE [--quick]
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <iostream>
#include <string>
#include <type_traits>
#include <vector>

#include "common/json.hpp"
#include "common/timing.hpp"
#include "common/triad.hpp"
#include "ctxpar/comm/allgather.hpp"
#include "ctxpar/heads/transpose_plan.hpp"

namespace {
namespace ch = ctxpar::heads;
namespace cb = ctxpar::bench;
using exec = Kokkos::DefaultExecutionSpace;
using mem = exec::memory_space;
using scalar = float;
using flat = Kokkos::View<scalar*, mem>;
using matrix = Kokkos::View<scalar**, Kokkos::LayoutRight, mem>;

template <class View>
struct FillRows {
  View v;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    v.data()[i] = scalar(1) + scalar(1e-6) * scalar(i % 997);
  }
};
template <class View>
void fill(const View& v) {
  Kokkos::parallel_for("ctxpar::bench::heads::fill",
                       Kokkos::RangePolicy<exec, Kokkos::IndexType<std::int64_t>>(0, v.span()),
                       FillRows<View>{v});
  exec().fence();
}

// Pack and unpack kernels alone (no communication) on this rank of `group`, GB/s ÷ triad, in
// `rounds` rounds of {triad, pack, unpack} back to back, so each ratio pairs a kernel with the
// triad measured right before it under the same (shared-machine) contention.
template <class HeadPolicy>
void kernels(cb::Report& report, const ctxpar::Group& group, int rounds, std::size_t triad_n,
             std::int64_t per_rank, const ch::GdpShape& s, const std::string& name) {
  const int p = group.size();
  ch::TransposePlan<scalar, mem, HeadPolicy, ch::Zigzag> plan(group, s.input_layout(),
                                                              per_rank * p);
  matrix x("x", plan.local_rows(), plan.channels()), y("y", per_rank * p, plan.local_channels());
  fill(x);
  plan.to_head_parallel(exec(), x, y);  // fills the receive buffer once
  for (int round = 0; round < rounds; ++round) {
    const double triad = cb::triad_gbps(exec(), triad_n);
    const auto pack = cb::time_it([&] {
      plan.pack(exec(), x);
      exec().fence();
    });
    const auto unpack = cb::time_it([&] {
      plan.unpack(exec(), y);
      exec().fence();
    });
    const double load = cb::load_average();
    // Read + write of every element moved (the triad counts its three streams the same way).
    std::int64_t packed = 0;
    for (int j = 0; j < p; ++j) packed += plan.local_channels(j);
    const double pack_bytes = 2.0 * sizeof(scalar) * double(plan.local_rows()) * double(packed);
    const double unpack_bytes =
        2.0 * sizeof(scalar) * double(per_rank * p) * double(plan.local_channels());
    for (int which = 0; which < 2; ++which) {
      const auto& t = which == 0 ? pack : unpack;
      const double bytes = which == 0 ? pack_bytes : unpack_bytes;
      const double gbps = bytes / t.median_s * 1e-9;
      cb::Record r("heads", std::string(which == 0 ? "pack" : "unpack_zigzag") + "_" + name);
      r.set("tokens_per_rank", per_rank).set("bytes_moved", bytes).set("time", t).set("gbps", gbps);
      r.set("triad_gbps", triad).set("ratio_to_triad", gbps / triad).set("target_ratio", 0.5);
      r.set("round", round).set("load_average_after", load);
      report.add(r);
      if (group.rank() == 0)
        std::cout << "P=" << p << " round " << round << " " << (which == 0 ? "pack   " : "unpack ")
                  << name << ": " << gbps << " GB/s, triad " << triad << " GB/s, ratio "
                  << gbps / triad << ", load " << load << "\n";
    }
  }
}

// One to_head_parallel at the run's P: time (slowest rank) and bytes per rank vs the formula.
template <class HeadPolicy>
void transpose(cb::Report& report, const ctxpar::Group& group, std::int64_t per_rank,
               const ch::GdpShape& s, const std::string& name, int repeats) {
  const int p = group.size();
  ch::TransposePlan<scalar, mem, HeadPolicy, ch::Zigzag> in_plan(group, s.input_layout(),
                                                                 per_rank * p);
  ch::TransposePlan<scalar, mem, HeadPolicy, ch::Zigzag> out_plan(group, s.output_layout(),
                                                                  per_rank * p);
  matrix x("x", in_plan.local_rows(), in_plan.channels()),
      u("u", per_rank * p, in_plan.local_channels());
  matrix yh("yh", per_rank * p, out_plan.local_channels()),
      ys("ys", out_plan.local_rows(), out_plan.channels());
  fill(x);
  fill(yh);
  group.reset_traffic();
  in_plan.to_head_parallel(exec(), x, u);
  const auto counted = group.traffic(ctxpar::CollectiveKind::alltoall).bytes_sent;
  const double formula =
      double(p - 1) / p * double(per_rank) * double(in_plan.channels()) * sizeof(scalar);
  const auto t_in = cb::time_collective(
      group.mpi_comm(),
      [&] {
        in_plan.to_head_parallel(exec(), x, u);
        exec().fence();
      },
      1, repeats);
  const auto t_out = cb::time_collective(
      group.mpi_comm(),
      [&] {
        out_plan.to_sequence_parallel(exec(), yh, ys);
        exec().fence();
      },
      1, repeats);
  // Mechanism B's exchange for the same heads: one fp32 summary (K·K + K·V) per head per rank.
  const std::int64_t summary = std::int64_t(s.nheads) * s.d_state * (s.d_state + s.headdim);
  Kokkos::View<float*, mem> mine("summary", summary), all("summaries", summary * p);
  const auto t_b = cb::time_collective(
      group.mpi_comm(), [&] { ctxpar::allgather(exec(), group, mine, all); }, 1, repeats);
  cb::Record r("heads", "transpose_" + name);
  r.set("tokens_per_rank", per_rank)
      .set("channels", in_plan.channels())
      .set("householder", s.householder);
  // The formula holds for an even split without key-group repeats; otherwise the plan's own
  // per-rank expectation (rows × channels held by the other ranks) is the reference.
  const bool plain = std::is_same_v<HeadPolicy, ch::EvenHeads> && s.ngroups >= p;
  r.set("even_heads", std::is_same_v<HeadPolicy, ch::EvenHeads>).set("group_repeat", s.ngroups < p);
  r.set("bytes_sent_counted", counted).set("bytes_sent_formula", formula);
  r.set("bytes_sent_plan", in_plan.bytes_per_transpose());
  r.set("bytes_ratio_formula", plain ? double(counted) / formula : -1.0);
  r.set("bytes_ratio_plan", double(counted) / double(in_plan.bytes_per_transpose()));
  r.set("to_head_parallel", t_in).set("to_sequence_parallel_y", t_out);
  const double c_bytes = double(counted) + 2.0 * double(out_plan.bytes_per_transpose());
  const double b_bytes = double(summary) * sizeof(float) * (p - 1);
  r.set("mechanism_c_bytes_forward", c_bytes).set("mechanism_b_bytes_forward", b_bytes);
  r.set("mechanism_c_seconds_forward", t_in.median_s + 2 * t_out.median_s)
      .set("mechanism_b_allgather", t_b);
  report.add(r);
  if (group.rank() == 0)
    std::cout << "P=" << p << " " << name << " T/P=" << per_rank << ": C bytes " << c_bytes << " ("
              << t_in.median_s + 2 * t_out.median_s << " s), B bytes " << b_bytes << " ("
              << t_b.median_s << " s), counter/plan "
              << double(counted) / double(in_plan.bytes_per_transpose())
              << (plain ? ", counter/formula " + std::to_string(double(counted) / formula)
                        : std::string())
              << "\n";
}

}  // namespace

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    std::string out = "heads.json";
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
      if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) out = argv[++i];
      if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    }
    const ctxpar::Group group(MPI_COMM_WORLD);
    cb::Report report(cb::this_machine());
    // GDN-like (M = 1) and GDP (M = 2) layers, 8 heads of 64, d_state 64, 2 key groups.
    const ch::GdpShape gdn{8, 64, 2, 64, 1, 4}, gdp{8, 64, 2, 64, 2, 4};
    // Same-run memory ceiling on every rank (ranks share the machine's bandwidth, as the
    // kernels do), measured again before every round of kernels.
    const std::size_t triad_n = std::size_t{1} << (quick ? 22 : 24);
    const int rounds = quick ? 2 : 3;
    // Rows per rank so that every buffer (~per_rank × 1944 × 4 bytes) is far past the caches.
    const std::int64_t kernel_rows = quick ? 2048 : 8192;
    const int p = group.size();
    const bool even =
        gdp.nheads % p == 0 && (gdp.ngroups >= p ? gdp.ngroups % p == 0 : p % gdp.ngroups == 0);
    auto run = [&](auto policy) {
      using hp = decltype(policy);
      kernels<hp>(report, group, rounds, triad_n, kernel_rows, gdp, "gdp_M2");
      kernels<hp>(report, group, rounds, triad_n, kernel_rows, gdn, "gdn_M1");
      if (p > 1) {
        for (std::int64_t per_rank : quick ? std::vector<std::int64_t>{64, 512}
                                           : std::vector<std::int64_t>{32, 256, 2048}) {
          transpose<hp>(report, group, per_rank, gdn, "gdn_M1", quick ? 3 : 5);
          transpose<hp>(report, group, per_rank, gdp, "gdp_M2", quick ? 3 : 5);
        }
      }
    };
    if (even) {
      run(ch::EvenHeads{});
    } else {
      run(ch::UnevenHeads{});
    }
    if (group.rank() == 0) report.write(out);
  }
  MPI_Finalize();
  return 0;
}
