// Mechanism C benchmark. Every figure that matters is a same-run ratio:
//  - pack/unpack GB/s of the head transposes ÷ the same-run triad GB/s (target >= 0.5), at P = 1
//    with the channel map of a simulated P_sim-way partition (the kernels touch every element
//    once whatever P is);
//  - all-to-all time and bytes per rank vs the formula (P−1)/P·(T/P)·C·sizeof at the run's P;
//  - the crossover against the chunkwise summary exchange of mechanism B: per rank, B all-gathers
//    one fp32 summary (M [K, K] + dS [K, V]) per head, independent of T; C transposes the input
//    projection and y, z back, linear in T/P. Both measured in the same run.
//  - the layer step a user calls (GdpContextParallel forward, backward) ÷ the gated delta product
//    kernels it runs, at P = 1 (or rank 0 alone with --step-only, which runs nothing else).
//   mpirun -np P ctxpar_bench_heads --out FILE [--quick] [--step-only]
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/json.hpp"
#include "common/kernel_profile.hpp"
#include "common/steady_state.hpp"
#include "common/timing.hpp"
#include "common/triad.hpp"
#include "ctxpar/chunkwise/gated_delta_product.hpp"
#include "ctxpar/comm/allgather.hpp"
#include "ctxpar/heads/gdp_context_parallel.hpp"
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
// triad measured right before it under the same (shared-machine) contention. Every rank starts
// each of the three together (a barrier before each): the triad and the kernel it is divided into
// then share the memory bandwidth, and the cores, with the same work on the other ranks. Each
// round also times a contiguous copy of `x` (the same bytes the pack moves, in one run): no
// gather of those bytes can be faster, so kernel ÷ copy says how far the kernel is from the
// machine's own copy rate, which on some machines sits well below the triad's.
template <class HeadPolicy>
void kernels(cb::Report& report, const ctxpar::Group& group, int rounds, std::size_t triad_n,
             std::int64_t per_rank, const ch::GdpShape& s, const std::string& name) {
  const int p = group.size();
  ch::TransposePlan<HeadPolicy, ch::ZigzagPerSequence, exec, scalar> plan(
      exec(), group, s.input_layout(), per_rank * p);
  matrix x("x", plan.local_rows(), plan.channels()), y("y", per_rank * p, plan.local_channels());
  fill(x);
  plan.to_head_parallel(x, y);  // fills the receive buffer once
  matrix x_copy("x_copy", plan.local_rows(), plan.channels());
  for (int round = 0; round < rounds; ++round) {
    MPI_Barrier(group.mpi_comm());
    const double triad = cb::triad_gbps(exec(), triad_n);
    MPI_Barrier(group.mpi_comm());
    const auto copy = cb::time_it([&] {
      Kokkos::deep_copy(exec(), x_copy, x);
      exec().fence();
    });
    MPI_Barrier(group.mpi_comm());
    const auto pack = cb::time_it([&] {
      plan.pack(x);
      exec().fence();
    });
    MPI_Barrier(group.mpi_comm());
    const auto unpack = cb::time_it([&] {
      plan.unpack(y);
      exec().fence();
    });
    const double load = cb::load_average();
    // Read + write of every element moved (the triad counts its three streams the same way).
    std::int64_t packed = 0;
    for (int j = 0; j < p; ++j) packed += plan.local_channels(j);
    const double pack_bytes = 2.0 * sizeof(scalar) * double(plan.local_rows()) * double(packed);
    const double unpack_bytes =
        2.0 * sizeof(scalar) * double(per_rank * p) * double(plan.local_channels());
    const double copy_gbps = 2.0 * sizeof(scalar) * double(x.span()) / copy.median_s * 1e-9;
    for (int which = 0; which < 2; ++which) {
      const auto& t = which == 0 ? pack : unpack;
      const double bytes = which == 0 ? pack_bytes : unpack_bytes;
      const double gbps = bytes / t.median_s * 1e-9;
      cb::Record r("heads", std::string(which == 0 ? "pack" : "unpack_zigzag") + "_" + name);
      r.set("tokens_per_rank", per_rank).set("bytes_moved", bytes).set("time", t).set("gbps", gbps);
      r.set("triad_gbps", triad).set("ratio_to_triad", gbps / triad).set("target_ratio", 0.5);
      r.set("copy_gbps", copy_gbps).set("ratio_to_copy", gbps / copy_gbps);
      r.set("round", round).set("load_average_after", load);
      report.add(r);
      if (group.rank() == 0)
        std::cout << "P=" << p << " round " << round << " " << (which == 0 ? "pack   " : "unpack ")
                  << name << ": " << gbps << " GB/s, triad " << triad << " GB/s, ratio "
                  << gbps / triad << ", copy " << copy_gbps << " GB/s, ratio " << gbps / copy_gbps
                  << ", load " << load << "\n";
    }
  }
}

// One to_head_parallel at the run's P: time (slowest rank) and bytes per rank vs the formula.
template <class HeadPolicy>
void transpose(cb::Report& report, const ctxpar::Group& group, std::int64_t per_rank,
               const ch::GdpShape& s, const std::string& name, int repeats) {
  const int p = group.size();
  ch::TransposePlan<HeadPolicy, ch::ZigzagPerSequence, exec, scalar> in_plan(
      exec(), group, s.input_layout(), per_rank * p);
  ch::TransposePlan<HeadPolicy, ch::ZigzagPerSequence, exec, scalar> out_plan(
      exec(), group, s.output_layout(), per_rank * p);
  matrix x("x", in_plan.local_rows(), in_plan.channels()),
      u("u", per_rank * p, in_plan.local_channels());
  matrix yh("yh", per_rank * p, out_plan.local_channels()),
      ys("ys", out_plan.local_rows(), out_plan.channels());
  fill(x);
  fill(yh);
  group.reset_traffic();
  in_plan.to_head_parallel(x, u);
  const auto counted = group.traffic(ctxpar::CollectiveKind::alltoall).bytes_sent;
  const double formula =
      double(p - 1) / p * double(per_rank) * double(in_plan.channels()) * sizeof(scalar);
  const auto t_in = cb::time_collective(
      group.mpi_comm(),
      [&] {
        in_plan.to_head_parallel(x, u);
        exec().fence();
      },
      1, repeats);
  const auto t_out = cb::time_collective(
      group.mpi_comm(),
      [&] {
        out_plan.to_sequence_parallel(yh, ys);
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

// A value in [-1, 1) from a seed and an index (splitmix64), so inputs need no generator state.
double hashed(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-52 - 1.0;
}

// Fills `v` with `shift + scale · hashed(seed, i)` in memory order.
template <class View>
void fill_hashed(const View& v, std::uint64_t seed, double scale, double shift = 0.0) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < h.span(); ++i)
    h.data()[i] = static_cast<scalar>(shift + scale * hashed(seed, i));
  Kokkos::deep_copy(v, h);
}

// The layer step a user calls next to the recurrence kernels it runs, one rank, same run: the
// steady-state `GdpContextParallel::forward` (`backward`) against the gated delta product backend's
// `forward_apply` (`backward_apply`) on head-sharded inputs of the shape the layer hands it
// ([T, M, H, N] keys, [T, M, H, d] values, ...), with a kept saved bundle and a zero boundary
// state, as the layer's core (`heads::impl::GdpLayerCore`, `heads/impl/gdp_layer_core.hpp`) calls
// it, and no transpose. The layer keeps its q, k, v, β, g private: the kernels get the layer's β
// and log-gates recomputed from the same x and parameters, and q, k, v of the same shapes
// (unit-norm keys). What the step adds: the transposes (local copies at P = 1), parameter slicing
// and gradient folding, the conv and SiLU, the split and L2 normalisation, the gates, and their
// backward. Target at most 1.25.
cb::Record step_vs_kernel_case(const ch::GdpShape& s, std::int64_t t, int chunk, int repeats) {
  MPI_Comm solo_comm;
  MPI_Comm_split(MPI_COMM_SELF, 0, 0, &solo_comm);
  cb::Record r("heads", "step vs kernel gdp_M" + std::to_string(s.householder));
  {  // the layer and its group end before their communicator is freed
    const ctxpar::Group solo(solo_comm);
    const std::int64_t c = s.input_layout().channels(), di = s.d_inner();
    const int m = s.householder, h = s.nheads, n = s.d_state, d = s.headdim;
    ch::GdpContextParallel<ch::EvenHeads, ctxpar::Contiguous, exec, scalar> layer(
        exec(), solo, s, t, {}, ch::GdpOptions{1e-6, chunk});
    ch::GdpSaved<scalar, mem> layer_saved;
    matrix x("x", t, c), y("y", t, di), z("z", t, di), dy("dy", t, di), dz("dz", t, di),
        dx("dx", t, c);
    auto params = ch::GdpParameters<scalar, mem>::allocate(s),
         grads = ch::GdpParameters<scalar, mem>::allocate(s, "grads");
    // The ranges of the layer tests' inputs (tests/heads/gdp_layer_test.cpp).
    fill_hashed(x, 1, 1.0);
    fill_hashed(dy, 2, 1.0);
    fill_hashed(dz, 3, 1.0);
    fill_hashed(params.conv_weight, 4, 0.6);
    fill_hashed(params.conv_bias, 5, 0.2);
    fill_hashed(params.dt_bias, 6, 1.0);
    fill_hashed(params.a_log, 7, 0.5);
    namespace cw = ctxpar::chunkwise;
    using backend_type = cw::GatedDeltaProductBackend<scalar, mem>;
    const backend_type backend(m, cw::BackendOptions{chunk, 0.0});
    cw::token_view<scalar, mem> q("q", t, h, n), o("o", t, h, d), dout("dout", t, h, d),
        beta("beta", t, m, h);
    cw::substep_view<scalar, mem> k("k", t, m, h, n), v("v", t, m, h, d);
    cw::head_view<scalar, mem> g("g", t, h);
    fill_hashed(q, 8, 1.0);
    fill_hashed(v, 9, 1.0);
    fill_hashed(dout, 10, 1.0);
    {
      // The layer's own gates from the same x, dt_bias and A_log (u = x at P = 1), so the
      // kernels work on the decays the step's recurrence sees (a guessed gate range would set
      // other exponents in every decay factor).
      const auto& dims = layer.local_dims();
      auto x_of = [&](std::int64_t row, std::int64_t col) {
        return static_cast<scalar>(hashed(1, static_cast<std::uint64_t>(row * c + col)));
      };
      auto hg = Kokkos::create_mirror_view(g);
      auto hb = Kokkos::create_mirror_view(beta);
      for (std::int64_t r = 0; r < t; ++r)
        for (int j = 0; j < h; ++j) {
          const auto dt = static_cast<scalar>(hashed(6, j)),
                     a_log = static_cast<scalar>(0.5 * hashed(7, j));
          hg(r, j) = -std::exp(a_log) * ch::impl::softplus(x_of(r, dims.off_a + j) + dt);
          for (int i = 0; i < m; ++i)
            hb(r, i, j) = ch::impl::sigmoid(x_of(r, dims.off_b + std::int64_t(i) * h + j));
        }
      Kokkos::deep_copy(g, hg);
      Kokkos::deep_copy(beta, hb);
    }
    {
      auto hk = Kokkos::create_mirror_view(k);
      for (std::int64_t r = 0; r < t * m * h; ++r) {
        double norm = 0;
        for (int j = 0; j < n; ++j) norm += hashed(13, r * n + j) * hashed(13, r * n + j);
        for (int j = 0; j < n; ++j)
          hk.data()[r * n + j] = static_cast<scalar>(hashed(13, r * n + j) / std::sqrt(norm));
      }
      Kokkos::deep_copy(k, hk);
    }
    typename backend_type::inputs_type in{q, k, v, g, beta};
    typename backend_type::gradients_type kg;
    kg.dq = cw::token_view<scalar, mem>("dq", t, h, n);
    kg.dk = cw::substep_view<scalar, mem>("dk", t, m, h, n);
    kg.dv = cw::substep_view<scalar, mem>("dv", t, m, h, d);
    kg.dg = cw::head_view<scalar, mem>("dg", t, h);
    kg.dbeta = cw::token_view<scalar, mem>("dbeta", t, m, h);
    const cw::LocalSequences seqs = cw::LocalSequences::from_cu_seqlens({0, t});
    const cw::state_view<mem> zero("zero_state", h, n, d);
    typename backend_type::saved_type saved;
    const auto table = backend.make_table(seqs, backend.shape(in));  // as the layer keeps it
    const auto step_forward = [&] {
      layer.forward(x, params, y, z, layer_saved);
      exec().fence();
    };
    const auto kernel_forward = [&] {
      // As the layer does: the same bundle on new values (forward_apply alone recomputes them).
      backend.forward_apply(exec(), in, seqs, table, zero, {}, o, {}, saved);
      exec().fence();
    };
    const auto step_backward = [&] {
      layer.backward(layer_saved, dy, dz, dx, grads);
      exec().fence();
    };
    const auto kernel_backward = [&] {
      backend.backward_apply(exec(), saved, dout, seqs, table, zero, {}, kg, {}, {});
      exec().fence();
    };
    // One warm-up round, after which the layer allocates nothing.
    const auto [step_f, kernel_f] = cb::time_alternating(step_forward, kernel_forward, 1, repeats);
    const auto [step_b, kernel_b] =
        cb::time_alternating(step_backward, kernel_backward, 1, repeats);
    // Untimed, after the timings: what the warm step still allocates, and where its time goes.
    const auto allocations = cb::count_steady_state_allocations([&] {
      step_forward();
      step_backward();
    });
    cb::profile_step_and_kernels(r, step_forward, step_backward, kernel_forward, kernel_backward);
    const double rf = step_f.median_s / kernel_f.median_s, rb = step_b.median_s / kernel_b.median_s;
    std::printf(
        "step vs kernel gdp T=%lld H=%d d=%d G=%d N=%d M=%d w=%d C=%d (1 rank, median of %d): "
        "forward step %.5f s / kernel %.5f s = %.3f, backward step %.5f s / kernel %.5f s = %.3f "
        "(target <= 1.25)\n",
        (long long)t, h, d, s.ngroups, n, m, s.conv_width, chunk, repeats, step_f.median_s,
        kernel_f.median_s, rf, step_b.median_s, kernel_b.median_s, rb);
    std::printf("  steady state: %lld allocations in %d forward + backward calls\n",
                (long long)allocations.allocations, allocations.calls);
    std::fflush(stdout);
    r.set("kind", "step_vs_kernel").set("tokens", t).set("heads", h).set("headdim", d);
    r.set("groups", s.ngroups).set("d_state", n).set("householder", m);
    r.set("conv_width", s.conv_width).set("chunk", chunk);
    r.set("step_forward", step_f).set("kernel_forward", kernel_f);
    r.set("step_backward", step_b).set("kernel_backward", kernel_b);
    r.set("forward_step_over_kernel", rf).set("backward_step_over_kernel", rb);
    r.set("kernel_inputs",
          "the layer's gates and beta from the same x and parameters; q, k, v of the same shapes");
    r.set("rule", "median over repeats").set("target", 1.25);
    cb::set_steady_state(r, allocations);
  }
  MPI_Comm_free(&solo_comm);
  return r;
}

}  // namespace

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    std::string out = "heads.json";
    bool quick = false;
    // The step-vs-kernel case alone (rank 0), for a profile of what the step adds.
    bool step_only = false;
    for (int i = 1; i < argc; ++i) {
      if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) out = argv[++i];
      if (std::strcmp(argv[i], "--quick") == 0) quick = true;
      if (std::strcmp(argv[i], "--step-only") == 0) step_only = true;
    }
    const ctxpar::Group group(MPI_COMM_WORLD);
    cb::Report report(cb::this_machine());
    // GDN-like (M = 1) and GDP (M = 2) layers, 8 heads of 64, d_state 64, 2 key groups.
    const ch::GdpShape gdn{8, 64, 2, 64, 1, 4}, gdp{8, 64, 2, 64, 2, 4};
    // One rank (the P = 1 run, or rank 0 alone under --step-only) at the GDP shape below.
    if ((step_only || group.size() == 1) && group.rank() == 0)
      report.add(step_vs_kernel_case(gdp, quick ? 512 : 2048, 64, quick ? 3 : 7));
    MPI_Barrier(group.mpi_comm());
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
    if (!step_only) {
      if (even)
        run(ch::EvenHeads{});
      else
        run(ch::UnevenHeads{});
    }
    if (group.rank() == 0) report.write(out);
  }
  MPI_Finalize();
  return 0;
}
