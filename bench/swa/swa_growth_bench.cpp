// Growth of the context-parallel sliding-window attention step with T, W and P: forward +
// backward time of one distributed streaming step and bytes per rank from the traffic counters,
// for every policy under both key/value layouts. Run once per rank count (bench/swa/run_swa.sh:
// P = 1..4, oversubscribed on a small machine); every record carries P.
//
// The step is the steady state of a stream: a full cache of W - 1 keys and a chunk of T tokens
// (L = T + W - 1), Hq = 4, Hkv = 1, D = 64, fp32, one thread per rank. Two sweeps:
//   vs T at W = 256 (T = 512 ... 4096), vs W at T = 2048 (W = 64 ... 1024).
// Bytes are the payload to/from other ranks (own block excluded) of every data collective, the
// largest over the ranks, for the forward and the backward separately.
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <boost/mpi/environment.hpp>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/json.hpp"
#include "common/timing.hpp"
#include "ctxpar/swa/swa.hpp"
#include "swa/step_inputs.hpp"

namespace {

using namespace ctxpar::bench::swa;

constexpr std::int64_t hq = 4, hkv = 1, dim = 64;

struct Inputs : StepInputs {
  Tensor dout;  ///< upstream gradient of this rank's queries
};

/// This rank's shards (the same under both layouts): cache by BalancedChunks(c, P), chunk by
/// BalancedChunks(T, P).
Inputs inputs(int rank, int ranks, std::int64_t c, std::int64_t t) {
  Inputs s;
  static_cast<StepInputs&>(s) = step_inputs(rank, ranks, c, t, hq, hkv, dim);
  const ctxpar::BalancedChunks ts{t, ranks};
  s.dout = random_tensor(4, ts.size(rank), hq, dim, ts.begin(rank));
  return s;
}

std::int64_t data_bytes(const ctxpar::Group& g, bool sent) {
  using K = ctxpar::CollectiveKind;
  std::int64_t b = 0;
  for (K k : {K::allgather, K::alltoall, K::reduce_scatter, K::sendrecv, K::allreduce}) {
    const auto tr = g.traffic(k);
    b += sent ? tr.bytes_sent : tr.bytes_received;
  }
  return b;
}

std::int64_t max_over_ranks(const ctxpar::Group& g, std::int64_t x) {
  std::int64_t m = 0;
  MPI_Allreduce(&x, &m, 1, MPI_INT64_T, MPI_MAX, g.mpi_comm());
  return m;
}

/// One case of a sweep, built once: its step (one forward + backward on the plan, fenced) and
/// the record of a timing of it.
struct GrowthCase {
  std::function<void()> step;
  std::function<ctxpar::bench::Record(const ctxpar::bench::Timing&)> record;
};

/// What a case keeps alive between its calls: the plan, its inputs and every output, reused by
/// every call as a training loop's steady state does.
template <class Policy, class Layout>
struct CaseState {
  Exec space;
  Inputs in;
  ctxpar::swa::StepPlan<Policy, Layout, Exec, float, Mem> plan;
  Tensor out;
  ctxpar::swa::Cache<float, Mem> next_cache;
  ctxpar::swa::DistributedState<float, Mem> state;
  ctxpar::swa::StepGradients<float, Mem> grads;

  CaseState(const ctxpar::Group& g, std::int64_t t, std::int64_t window,
            const ctxpar::swa::Options& o)
      : in(inputs(g.rank(), g.size(), window - 1, t)),
        plan(space, g, ctxpar::swa::StepShape{hq, hkv, dim}, o),
        out(ctxpar::swa::allocate_output<float, Mem>(plan.shape(), in.chunk.length())),
        grads(ctxpar::swa::allocate_gradients<float, Mem>(plan.shape(), in.chunk.length(),
                                                          in.cache.length())) {}
  void forward() { plan.forward(in.chunk, in.cache, out, next_cache, state); }
  void backward() { plan.backward(state, in.dout, {}, grads); }
};

template <class Policy, class Layout>
GrowthCase growth_case(const ctxpar::Group& g, const char* sweep, const char* policy,
                       const char* layout, std::int64_t t, std::int64_t window) {
  const std::int64_t c = window - 1;
  ctxpar::swa::Options o;
  o.window = window;
  // The plan is built once (outside the counters and the timed calls).
  const auto cs = std::make_shared<CaseState<Policy, Layout>>(g, t, window, o);
  // Bytes of one step, forward and backward apart.
  g.reset_traffic();
  cs->forward();
  const std::int64_t fwd_recv = max_over_ranks(g, data_bytes(g, false));
  const std::int64_t fwd_sent = max_over_ranks(g, data_bytes(g, true));
  g.reset_traffic();
  cs->backward();
  const std::int64_t bwd_recv = max_over_ranks(g, data_bytes(g, false));
  const std::int64_t bwd_sent = max_over_ranks(g, data_bytes(g, true));
  GrowthCase gc;
  gc.step = [cs] {
    cs->forward();
    cs->backward();
    cs->space.fence();
  };
  const int ranks = g.size(), rank = g.rank();
  gc.record = [=](const ctxpar::bench::Timing& timing) {
    if (rank == 0)
      std::printf(
          "P=%d %-3s T=%5lld W=%5lld %-16s %-15s fwd+bwd %8.4f s  bytes/rank fwd recv %9lld sent "
          "%9lld, bwd recv %9lld sent %9lld\n",
          ranks, sweep, (long long)t, (long long)window, policy, layout, timing.median_s,
          (long long)fwd_recv, (long long)fwd_sent, (long long)bwd_recv, (long long)bwd_sent);
    return ctxpar::bench::Record("swa_growth", std::string(policy) + " " + layout)
        .set("kind", "growth")
        .set("sweep", sweep)
        // The report's generic growth section groups by "policy": name the layout in it when it
        // is not the default one.
        .set("policy", std::strcmp(layout, "SegmentChunks") == 0
                           ? std::string(policy)
                           : std::string(policy) + "/whole-axis")
        .set("policy_tag", policy)
        .set("layout", layout)
        .set("ranks", ranks)
        .set("chunk", t)
        .set("tokens", t)
        .set("window", window)
        .set("cache", c)
        .set("axis_length", c + t)
        .set("q_heads", hq)
        .set("kv_heads", hkv)
        .set("dim", dim)
        .set("step", timing)
        .set("step_median_s", timing.median_s)
        .set("timing", "interleaved: one call of every case of the sweep per round")
        .set("forward_bytes_received_max", fwd_recv)
        .set("forward_bytes_sent_max", fwd_sent)
        .set("backward_bytes_received_max", bwd_recv)
        .set("backward_bytes_sent_max", bwd_sent);
  };
  return gc;
}

/// Every policy under both layouts at one (T, W).
void add_cases(std::vector<GrowthCase>& cases, const ctxpar::Group& g, const char* sweep,
               std::int64_t t, std::int64_t w) {
  using namespace ctxpar::swa;
  cases.push_back(growth_case<RopeBeforeGather, SegmentChunks>(g, sweep, "RopeBeforeGather",
                                                               "SegmentChunks", t, w));
  cases.push_back(growth_case<RopeAfterGather, SegmentChunks>(g, sweep, "RopeAfterGather",
                                                              "SegmentChunks", t, w));
  cases.push_back(growth_case<HaloKV, SegmentChunks>(g, sweep, "HaloKV", "SegmentChunks", t, w));
  cases.push_back(growth_case<RopeBeforeGather, WholeAxisChunks>(g, sweep, "RopeBeforeGather",
                                                                 "WholeAxisChunks", t, w));
  cases.push_back(growth_case<RopeAfterGather, WholeAxisChunks>(g, sweep, "RopeAfterGather",
                                                                "WholeAxisChunks", t, w));
  cases.push_back(
      growth_case<HaloKV, WholeAxisChunks>(g, sweep, "HaloKV", "WholeAxisChunks", t, w));
}

/// Times every case of one sweep interleaved (`repeats` rounds) and adds their records.
void time_sweep(const ctxpar::Group& g, ctxpar::bench::Report& report,
                const std::vector<GrowthCase>& cases, int repeats) {
  std::vector<std::function<void()>> steps;
  for (const auto& c : cases) steps.push_back(c.step);
  const auto timings = ctxpar::bench::time_interleaved_collective(g.mpi_comm(), steps, 1, repeats);
  for (std::size_t i = 0; i < cases.size(); ++i) report.add(cases[i].record(timings[i]));
}

}  // namespace

int main(int argc, char** argv) {
  boost::mpi::environment env(argc, argv, boost::mpi::threading::funneled);
  Kokkos::ScopeGuard kokkos(argc, argv);
  std::string out_path;
  int repeats = 5;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
      out_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) {
      repeats = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else {
      std::fprintf(stderr,
                   "usage: mpirun -np P ctxpar_bench_swa_growth [--out FILE.json] [--repeats N] "
                   "[--quick]\n");
      return 2;
    }
  }
  const ctxpar::Group world(MPI_COMM_WORLD);
  ctxpar::bench::Report report(ctxpar::bench::this_machine());
  const std::vector<std::int64_t> ts = quick ? std::vector<std::int64_t>{256, 512}
                                             : std::vector<std::int64_t>{512, 1024, 2048, 4096};
  const std::vector<std::int64_t> ws = quick ? std::vector<std::int64_t>{64, 128}
                                             : std::vector<std::int64_t>{64, 128, 256, 512, 1024};
  const std::int64_t fixed_w = quick ? 64 : 256, fixed_t = quick ? 512 : 2048;
  // Each sweep's cases are built first and then timed in rounds, one call of each per round: the
  // per-token ratios compare lengths (and windows) measured under the same drift of the load.
  {
    std::vector<GrowthCase> cases;
    for (std::int64_t t : ts) add_cases(cases, world, "T", t, fixed_w);
    time_sweep(world, report, cases, repeats);
  }
  {
    std::vector<GrowthCase> cases;
    for (std::int64_t w : ws) add_cases(cases, world, "W", fixed_t, w);
    time_sweep(world, report, cases, repeats);
  }
  if (world.rank() == 0 && !out_path.empty()) report.write(out_path);
  return 0;
}
