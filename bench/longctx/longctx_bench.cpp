// Long-context cost benchmark (issue 11, item 5): per-token time and peak resident memory per
// rank of each mechanism's steady state over T tokens per rank, forward and forward + backward.
//
//   mpirun -np P ctxpar_bench_longctx --mechanism swa|chunkwise|heads --tokens T --out FILE.json
//       [--repeats N] [--profile]   (--profile: no timing; where one call's time goes, by kernel)
//       [--independent]   (the control: each of the P processes runs the single-rank case on its
//                          own, all P at once, in lock-step; recorded as P = 1, concurrent_jobs =
//                          P)
//   mpirun -np P ctxpar_bench_longctx --out FILE.json [--quick]   (every mechanism and T in one
//       process: times only, the peak memory of such a run is the largest case's)
//
// bench/longctx/run_longctx.sh runs one process per (mechanism, P, T), because VmHWM only grows
// over a process's life: a process per case is the only way its peak belongs to that case.
// Each case builds its plan once, makes one untimed forward + backward call, then times `repeats`
// calls (slowest rank of each, after a barrier), first of the forward alone, then of forward +
// backward.
// The --independent control separates what P = 2 adds from what the machine does to any two
// processes at once: the two ranks share the cores' last-level cache and memory bandwidth, and a
// per-token time that grows with T because of that grows the same way for two single-rank jobs
// that never talk to each other.
// Shapes (fp32, one thread per rank):
//   swa       StepPlan<HaloKV, SegmentChunks>, a chunk of T·P tokens after a full cache of W − 1
//             keys, W = 512 (fixed: per-token work ∝ W; 512 keeps the full sweep under 15
//             minutes on 2 cores), Hq = 4, Hkv = 1, D = 64. HaloKV because its key/value memory per
//             rank is the rank's shard plus a W − 1 halo (the all-gather policies hold the whole
//             chunk's keys on every rank, linear in T, not T/P).
//   chunkwise gated delta rule backend, CpPlan<GatherFold>, Contiguous layout, chunk 64, H = 4,
//             K = V = 64, a reused ChunkwiseContext.
//   heads     GdpContextParallel<EvenHeads, Contiguous>, H = 4, d = 32, G = 2, N = 32, M = 1,
//             conv width 4, per-head D.
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <boost/mpi/environment.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/json.hpp"
#include "common/kernel_profile.hpp"
#include "common/timing.hpp"
#include "ctxpar/chunkwise/driver.hpp"
#include "ctxpar/chunkwise/gated_delta_rule.hpp"
#include "ctxpar/heads/gdp_context_parallel.hpp"
#include "ctxpar/swa/swa.hpp"
#include "swa/step_inputs.hpp"

namespace {

namespace cb = ctxpar::bench;
namespace cw = ctxpar::chunkwise;
namespace ch = ctxpar::heads;
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;

/// A field of /proc/self/status in bytes (VmHWM: peak resident set; VmRSS: current), or -1.
std::int64_t status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':')
      return std::atoll(line.c_str() + n + 1) * 1024;  // the kernel reports kB
  }
  return -1;
}

std::int64_t max_over_ranks(MPI_Comm comm, std::int64_t x) {
  std::int64_t m = 0;
  MPI_Allreduce(&x, &m, 1, MPI_INT64_T, MPI_MAX, comm);
  return m;
}

/// What a mechanism's case hands back: the two timings and its shape for the record.
struct Measured {
  cb::Timing forward, both;
  /// Rank 0's profile of one forward and of one forward + backward (only with --profile).
  cb::KernelProfile forward_profile, both_profile;
  cb::Record shape{"longctx", ""};
};

/// How a case is run: timed (the sweep) or profiled (one call of each pass, kernels timed).
struct Mode {
  int repeats = 3;
  bool profile = false;
  int profile_calls = 1;
  /// The communicator whose barrier starts every timed call and whose slowest rank is recorded:
  /// the case's own group, or every process of the run when each runs its own single-rank case.
  MPI_Comm lockstep = MPI_COMM_WORLD;
};

/// Times `fwd` and `both` (forward + backward) the same way for every mechanism: one untimed
/// forward + backward (the first calls allocate the plan's and the context's buffers; one call of
/// `both` warms the forward too, which saves a forward per case at 128 Ki), then `repeats` timed
/// collective calls of each.
template <class F, class B>
void time_passes(const Mode& mode, F&& fwd, B&& both, Measured& m) {
  both();
  if (mode.profile) {
    // The fastest of a few profiled calls: a single call on a shared machine is as noisy as a
    // single timed one.
    for (int i = 0; i < mode.profile_calls; ++i) {
      MPI_Barrier(mode.lockstep);
      auto f = cb::profile_kernels(fwd);
      if (i == 0 || f.wall_s < m.forward_profile.wall_s) m.forward_profile = std::move(f);
      MPI_Barrier(mode.lockstep);
      auto b = cb::profile_kernels(both);
      if (i == 0 || b.wall_s < m.both_profile.wall_s) m.both_profile = std::move(b);
    }
    return;
  }
  m.forward = cb::time_collective(mode.lockstep, fwd, 0, mode.repeats);
  m.both = cb::time_collective(mode.lockstep, both, 0, mode.repeats);
}

Measured swa_case(const ctxpar::Group& g, std::int64_t t, const Mode& mode) {
  namespace sw = ctxpar::swa;
  using namespace ctxpar::bench::swa;
  constexpr std::int64_t window = 512, hq = 4, hkv = 1, dim = 64, c = window - 1;
  Exec space;
  const std::int64_t total = t * g.size();
  const auto in = step_inputs(g.rank(), g.size(), c, total, hq, hkv, dim);
  const ctxpar::BalancedChunks ts{total, g.size()};
  const Tensor dout = random_tensor(4, ts.size(g.rank()), hq, dim, ts.begin(g.rank()));
  sw::Options o;
  o.window = window;
  sw::StepPlan<sw::HaloKV, sw::SegmentChunks, Exec, float, Mem> plan(
      space, g, sw::StepShape{hq, hkv, dim}, o);
  const Tensor out = sw::allocate_output<float, Mem>(plan.shape(), in.chunk.length());
  sw::Cache<float, Mem> next_cache;
  sw::DistributedState<float, Mem> state;
  const auto grads =
      sw::allocate_gradients<float, Mem>(plan.shape(), in.chunk.length(), in.cache.length());
  Measured m;
  time_passes(
      mode,
      [&] {
        plan.forward(in.chunk, in.cache, out, next_cache, state);
        space.fence();
      },
      [&] {
        plan.forward(in.chunk, in.cache, out, next_cache, state);
        plan.backward(state, dout, {}, grads);
        space.fence();
      },
      m);
  m.shape.set("policy", "HaloKV/SegmentChunks")
      .set("window", window)
      .set("cache", c)
      .set("q_heads", hq)
      .set("kv_heads", hkv)
      .set("dim", dim);
  return m;
}

/// A deterministic value in [-1, 1) of global element `i` (same on every rank).
float value(std::uint64_t seed, std::int64_t i) {
  return ctxpar::bench::swa::value(seed, static_cast<std::uint64_t>(i));
}

Measured chunkwise_case(const ctxpar::Group& g, std::int64_t t, const Mode& mode) {
  constexpr std::int64_t H = 4, K = 64, V = 64;
  constexpr int chunk = 64;
  using Backend = cw::GatedDeltaRuleBackend<float, Mem>;
  Exec space;
  const std::int64_t total = t * g.size();
  const cw::SequenceLayout plan =
      cw::SequenceLayout::create(g, ctxpar::Contiguous{}, std::vector<std::int64_t>{0, total});
  const std::int64_t b = plan.shard_begin(g.rank()), n = plan.shard_length(g.rank());
  // Inputs written straight into this rank's views (host-accessible on the host backends this
  // benchmark runs on), so no global copy of the sequence inflates the peak memory.
  cw::token_view<float, Mem> q("q", n, H, K), k("k", n, H, K), v("v", n, H, V),
      dout("dout", n, H, V), o("o", n, H, V);
  cw::head_view<float, Mem> gate("g", n, H), beta("beta", n, H);
  auto hq = Kokkos::create_mirror_view(q), hk = Kokkos::create_mirror_view(k),
       hv = Kokkos::create_mirror_view(v), hd = Kokkos::create_mirror_view(dout);
  auto hg = Kokkos::create_mirror_view(gate), hb = Kokkos::create_mirror_view(beta);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t row = (b + i) * H + h;
      double norm = 0;
      for (std::int64_t j = 0; j < K; ++j) {
        hq(i, h, j) = value(1, row * K + j);
        hk(i, h, j) = value(2, row * K + j);
        norm += double(hk(i, h, j)) * hk(i, h, j);
      }
      // Unit-norm keys and β in (0.05, 0.95), gates in [-0.1, -0.02]: the GDN regime.
      for (std::int64_t j = 0; j < K; ++j) hk(i, h, j) = float(hk(i, h, j) / std::sqrt(norm));
      for (std::int64_t j = 0; j < V; ++j) {
        hv(i, h, j) = value(5, row * V + j);
        hd(i, h, j) = value(6, row * V + j);
      }
      hg(i, h) = float(-0.06 + 0.04 * value(3, row));
      hb(i, h) = float(0.5 + 0.45 * value(4, row));
    }
  Kokkos::deep_copy(q, hq);
  Kokkos::deep_copy(k, hk);
  Kokkos::deep_copy(v, hv);
  Kokkos::deep_copy(dout, hd);
  Kokkos::deep_copy(gate, hg);
  Kokkos::deep_copy(beta, hb);
  const Backend backend(cw::BackendOptions{chunk, 0.0});
  Backend::inputs_type in{q, k, v, gate, beta};
  Backend::gradients_type grads{
      cw::token_view<float, Mem>("dq", n, H, K), cw::token_view<float, Mem>("dk", n, H, K),
      cw::token_view<float, Mem>("dv", n, H, V), cw::head_view<float, Mem>("dg", n, H),
      cw::head_view<float, Mem>("dbeta", n, H)};
  // The plan built once and one context reused by every call: a training loop's steady state.
  cw::CpPlan<cw::GatherFold, Backend, Exec> cp(space, g, backend, plan,
                                               cw::ChunkwiseShape{n, H, K, V});
  cw::ChunkwiseContext<Backend> ctx;
  const cw::const_token_view<float, Mem> dout_c = dout;
  Measured m;
  time_passes(
      mode,
      [&] {
        cp.forward(in, o, ctx);
        space.fence();
      },
      [&] {
        cp.forward(in, o, ctx);
        cp.backward(ctx, dout_c, grads);
        space.fence();
      },
      m);
  m.shape.set("policy", "GatherFold/Contiguous")
      .set("backend", "gated_delta_rule")
      .set("chunk", chunk)
      .set("heads", H)
      .set("key_dim", K)
      .set("value_dim", V)
      .set("api", "CpPlan forward/backward with a reused ChunkwiseContext");
  return m;
}

template <class View>
struct FillValues {
  View v;
  std::uint64_t seed;
  float scale;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    v.data()[i] = scale * (float((i * 2654435761ll + std::int64_t(seed)) % 2001) / 1000.0f - 1.0f);
  }
};
template <class View>
void fill(const View& v, std::uint64_t seed, float scale) {
  Kokkos::parallel_for("ctxpar::bench::longctx::fill",
                       Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(0, v.span()),
                       FillValues<View>{v, seed, scale});
}

Measured heads_case(const ctxpar::Group& g, std::int64_t t, const Mode& mode) {
  using Layer = ch::GdpContextParallel<ch::EvenHeads, ctxpar::Contiguous, Exec, float>;
  const ch::GdpShape s{4, 32, 2, 32, 1, 4, ch::SkipTerm::per_head};
  Exec space;
  Layer layer(space, g, s, t * g.size());
  Layer::saved_type saved;
  const std::int64_t rows = layer.input_plan().local_rows(), c = s.input_layout().channels(),
                     di = s.d_inner();
  Layer::matrix x("x", rows, c), y("y", rows, di), z("z", rows, di), dy("dy", rows, di),
      dz("dz", rows, di), dx("dx", rows, c);
  fill(x, 1, 1.0f);
  fill(dy, 2, 1.0f);
  fill(dz, 3, 1.0f);
  auto params = Layer::parameters::allocate(s), grads = Layer::parameters::allocate(s, "grads");
  // Small conv weights and a_log = dt_bias = 0 (decay e^(−softplus(0))): finite, stable values.
  fill(params.conv_weight, 4, 0.3f);
  fill(params.conv_bias, 5, 0.1f);
  fill(params.d, 6, 0.5f);
  space.fence();
  Measured m;
  time_passes(
      mode,
      [&] {
        layer.forward(x, params, y, z, saved);
        space.fence();
      },
      [&] {
        layer.forward(x, params, y, z, saved);
        layer.backward(saved, dy, dz, dx, grads);
        space.fence();
      },
      m);
  m.shape.set("policy", "EvenHeads/Contiguous")
      .set("heads", s.nheads)
      .set("headdim", s.headdim)
      .set("groups", s.ngroups)
      .set("d_state", s.d_state)
      .set("householder", s.householder)
      .set("conv_width", s.conv_width)
      .set("channels", c);
  return m;
}

int comm_rank(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

/// How many copies of the case run at once: 1, or the process count under --independent.
int concurrent_jobs(const ctxpar::Group& g, const Mode& mode) {
  int size = 1;
  MPI_Comm_size(mode.lockstep, &size);
  return size / g.size();
}

/// "P=2", or "P=1 x2 independent" for the control.
std::string series_label(const ctxpar::Group& g, const Mode& mode) {
  const int jobs = concurrent_jobs(g, mode);
  return "P=" + std::to_string(g.size()) +
         (jobs > 1 ? " x" + std::to_string(jobs) + " independent" : std::string());
}

/// The profile records of one case: the heaviest labels of rank 0's call, the rest summed, and
/// the time outside every kernel.
void add_profiles(const ctxpar::Group& g, cb::Report& report, const std::string& mechanism,
                  std::int64_t t, const Measured& m, const Mode& mode) {
  for (int pass = 0; pass < 2; ++pass) {
    const cb::KernelProfile& p = pass == 0 ? m.forward_profile : m.both_profile;
    const char* name = pass == 0 ? "forward" : "forward+backward";
    cb::Record r = m.shape;
    r.set("case", "profile " + mechanism + " " + name + " " + series_label(g, mode) +
                      " T=" + std::to_string(t));
    r.set("kind", "longctx_profile")
        .set("mechanism", mechanism)
        .set("pass", name)
        .set("P", g.size())
        .set("concurrent_jobs", concurrent_jobs(g, mode))
        .set("T_per_rank", t)
        .set("method",
             "rank 0, the fastest of profile_calls calls after one warm-up forward+backward; "
             "Kokkos Tools begin/end callbacks of every parallel_for/reduce/scan and deep_copy")
        .set("profile_calls", mode.profile_calls)
        .set("load_average", cb::load_average());
    cb::set_profile(r, "", p);
    report.add(r);
    if (comm_rank(mode.lockstep) == 0) {
      char heading[160];
      std::snprintf(heading, sizeof heading, "profile %-9s %-16s %s T=%7lld", mechanism.c_str(),
                    name, series_label(g, mode).c_str(), (long long)t);
      cb::print_profile(heading, p);
    }
  }
}

void run_case(const ctxpar::Group& g, cb::Report& report, const std::string& mechanism,
              std::int64_t t, const Mode& mode, bool own_process) {
  const std::int64_t rss_before = max_over_ranks(mode.lockstep, status_bytes("VmRSS"));
  Measured m;
  if (mechanism == "swa") {
    m = swa_case(g, t, mode);
  } else if (mechanism == "chunkwise") {
    m = chunkwise_case(g, t, mode);
  } else {
    m = heads_case(g, t, mode);
  }
  if (mode.profile) {
    add_profiles(g, report, mechanism, t, m, mode);
    return;
  }
  const std::int64_t peak = max_over_ranks(mode.lockstep, status_bytes("VmHWM"));
  const double load = cb::load_average();
  for (int pass = 0; pass < 2; ++pass) {
    const cb::Timing& tm = pass == 0 ? m.forward : m.both;
    const char* name = pass == 0 ? "forward" : "forward+backward";
    cb::Record r = m.shape;
    r.set("case", mechanism + " " + name + " " + series_label(g, mode) + " T=" + std::to_string(t));
    r.set("kind", "longctx")
        .set("mechanism", mechanism)
        .set("pass", name)
        .set("P", g.size())
        .set("concurrent_jobs", concurrent_jobs(g, mode))
        .set("T_per_rank", t)
        .set("tokens_total", t * g.size())
        .set("repeats", tm.repeats)
        .set("warmup", "one forward+backward before the timed calls")
        .set("median_s", tm.median_s)
        .set("min_s", tm.min_s)
        .set("max_s", tm.max_s)
        .set("per_token_ns_median", tm.median_s / double(t) * 1e9)
        .set("per_token_ns_min", tm.min_s / double(t) * 1e9)
        .set("timing",
             "slowest rank of each call after a barrier; per token = seconds / T_per_rank")
        // Peak of the whole process (largest over ranks): the case's own only when the process
        // ran this case alone (run_longctx.sh).
        .set("peak_rss_bytes", peak)
        .set("rss_before_bytes", rss_before)
        .set("rss_own_process", own_process)
        .set("load_average", load);
    report.add(r);
    if (comm_rank(mode.lockstep) == 0)
      std::printf(
          "%-9s %-16s %s T=%7lld: median %9.4f s min %9.4f s = %8.1f ns/token (min), "
          "peak RSS %7.1f MiB, load %.2f\n",
          mechanism.c_str(), name, series_label(g, mode).c_str(), (long long)t, tm.median_s,
          tm.min_s, tm.min_s / double(t) * 1e9, double(peak) / (1 << 20), load);
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char* argv[]) {
  boost::mpi::environment env(argc, argv, boost::mpi::threading::funneled);
  Kokkos::ScopeGuard kokkos(argc, argv);
  std::string out_path, mechanism;
  std::int64_t tokens = 0;
  int repeats = 3;
  bool quick = false, profile_only = false, independent = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
      out_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--mechanism") && i + 1 < argc) {
      mechanism = argv[++i];
    } else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) {
      tokens = std::atoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) {
      repeats = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--profile")) {
      profile_only = true;
    } else if (!std::strcmp(argv[i], "--independent")) {
      independent = true;
    } else {
      std::fprintf(
          stderr,
          "usage: mpirun -np P ctxpar_bench_longctx [--mechanism swa|chunkwise|heads "
          "--tokens T [--profile] [--independent]] [--repeats N] [--quick] [--out FILE.json]\n");
      return 2;
    }
  }
  const bool known =
      mechanism.empty() || mechanism == "swa" || mechanism == "chunkwise" || mechanism == "heads";
  if (!known || repeats < 1 || (!mechanism.empty() && tokens < 1) ||
      (independent && mechanism.empty())) {
    std::fprintf(stderr,
                 "ctxpar_bench_longctx: --mechanism needs --tokens T >= 1; repeats >= 1; "
                 "--independent needs --mechanism\n");
    return 2;
  }
  const ctxpar::Group world(MPI_COMM_WORLD);
  cb::Report report(cb::this_machine());
  if (!mechanism.empty()) {
    // Profiled calls: the fastest of 5 up to 8 Ki tokens per rank, 4 at 16 Ki, 3 from 32 Ki (one
    // 128 Ki call of a shared machine varies by more than the growth the profile is to explain).
    const int calls = static_cast<int>(std::clamp<std::int64_t>(65536 / tokens, 3, 5));
    // Under --independent each process is a group of its own and the world keeps them in step.
    const ctxpar::Group self(MPI_COMM_SELF);
    run_case(independent ? self : world, report, mechanism, tokens,
             Mode{repeats, profile_only, calls, MPI_COMM_WORLD}, true);
  } else {
    const Mode mode{quick ? 1 : repeats, false, 1, MPI_COMM_WORLD};
    for (const char* m : {"swa", "chunkwise", "heads"})
      for (std::int64_t t = 1024; t <= (quick ? 16384 : 131072); t *= 2)
        run_case(world, report, m, t, mode, false);
  }
  if (world.rank() == 0 && !out_path.empty()) report.write(out_path);
  return 0;
}
