// Chunkwise CP benchmark (mechanism B). Run once per rank count, e.g.
//   OMP_NUM_THREADS=1 mpirun -np P ctxpar_bench_chunkwise --out bench/results/chunkwise_P<P>.json
// Every figure is a same-run ratio or an exact count:
// - local kernels (P = 1 only, one thread): chunkwise forward GFLOP/s of the gated delta rule and
//   of scalar decay ÷ the same-run Eigen SGEMM rate, and the speed-up over a plain token-by-token
//   fp32 recurrence of the same family on the same data (checked to agree first);
// - CP efficiency at P = 2: T(1)/(2·T(2)) of the GDN forward+backward on a compute-bound size, both
//   measured in this run (T(1): rank 0 alone, the other rank waiting; contention ceiling beside
//   it);
// - summary bytes per rank (group counters) against the formula of each transition structure;
// - GatherFold vs ScanCompose: time of a latency-bound forward+backward and summary memory per
//   rank (buffers the driver allocates: P·slots records vs a constant number), for this P.
// - step vs kernel (P = 1, or rank 0 alone with --step-only, which runs nothing else): the GDN
//   plan's steady-state forward and backward ÷ the backend's local kernels on the same inputs.
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/json.hpp"
#include "common/kernel_profile.hpp"
#include "common/rank_scaling.hpp"
#include "common/sgemm.hpp"
#include "common/steady_state.hpp"
#include "common/timing.hpp"
#include "ctxpar/chunkwise/diagonal_gate.hpp"
#include "ctxpar/chunkwise/driver.hpp"
#include "ctxpar/chunkwise/gated_delta_rule.hpp"
#include "ctxpar/chunkwise/impl/gated_delta_reference.hpp"
#include "ctxpar/chunkwise/scalar_decay.hpp"

namespace {

namespace cw = ctxpar::chunkwise;
namespace bench = ctxpar::bench;
using exec = Kokkos::DefaultExecutionSpace;
using mem = exec::memory_space;

double value(std::uint64_t seed, std::int64_t i) {
  std::uint64_t z =
      seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i) + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-52 - 1.0;
}

// Global GDN-style inputs (unit-norm keys, β in (0.05, 0.95), log-gates in [-0.1, -0.02]).
struct Data {
  std::int64_t T, H, K, V;
  std::vector<float> q, k, v, g, beta, dout;
  Data(std::int64_t t, std::int64_t h, std::int64_t kd, std::int64_t vd)
      : T(t), H(h), K(kd), V(vd) {
    q.resize(T * H * K);
    k.resize(T * H * K);
    v.resize(T * H * V);
    dout.resize(T * H * V);
    g.resize(T * H);
    beta.resize(T * H);
    for (std::int64_t i = 0; i < T * H * K; ++i) q[i] = static_cast<float>(value(1, i));
    for (std::int64_t r = 0; r < T * H; ++r) {
      double n = 0;
      for (std::int64_t j = 0; j < K; ++j) n += value(2, r * K + j) * value(2, r * K + j);
      for (std::int64_t j = 0; j < K; ++j)
        k[r * K + j] = static_cast<float>(value(2, r * K + j) / std::sqrt(n));
      g[r] = static_cast<float>(-0.06 + 0.04 * value(3, r));
      beta[r] = static_cast<float>(0.5 + 0.45 * value(4, r));
    }
    for (std::int64_t i = 0; i < T * H * V; ++i) {
      v[i] = static_cast<float>(value(5, i));
      dout[i] = static_cast<float>(value(6, i));
    }
  }
};

template <class View>
View rows_of(const std::vector<float>& x, std::int64_t per, std::int64_t b, std::int64_t e,
             std::size_t e1, std::size_t e2 = KOKKOS_INVALID_INDEX) {
  typename View::non_const_type out("in", e - b, e1, e2);
  auto h = Kokkos::create_mirror_view(out);
  for (std::int64_t i = 0; i < (e - b) * per; ++i)
    h.data()[i] = x[static_cast<std::size_t>(b * per + i)];
  Kokkos::deep_copy(out, h);
  return out;
}

// The rank's inputs and a runnable forward(+backward) of family `B` over `group`.
template <class B>
struct Runner {
  const ctxpar::Group& group;
  B backend;
  cw::SequenceLayout plan;
  typename B::inputs_type in;
  typename B::gradients_type grads;
  cw::token_view<float, mem> o;
  cw::const_token_view<float, mem> dout;
  // One operator and one context per policy, built once; every call reuses their memory.
  cw::CpPlan<cw::GatherFold, B, exec> gather;
  cw::CpPlan<cw::ScanCompose, B, exec> scan;
  cw::ChunkwiseContext<B> gather_ctx, scan_ctx;

  Runner(const ctxpar::Group& g, const Data& d, int chunk, bool diagonal_gates = false)
      : group(g),
        backend(cw::BackendOptions{chunk, 0.0}),
        plan(
            cw::SequenceLayout::create(g, ctxpar::Contiguous{}, std::vector<std::int64_t>{0, d.T})),
        gather(exec(), g, backend, plan, cw::ChunkwiseShape{plan.local_length(), d.H, d.K, d.V}),
        scan(exec(), g, backend, plan, cw::ChunkwiseShape{plan.local_length(), d.H, d.K, d.V}) {
    const int v = g.rank();
    const std::int64_t b = plan.shard_begin(v), e = b + plan.shard_length(v);
    const std::size_t H = d.H, K = d.K, V = d.V;
    in.q = rows_of<cw::const_token_view<float, mem>>(d.q, H * K, b, e, H, K);
    in.k = rows_of<cw::const_token_view<float, mem>>(d.k, H * K, b, e, H, K);
    in.v = rows_of<cw::const_token_view<float, mem>>(d.v, H * V, b, e, H, V);
    grads.dq = decltype(grads.dq)("dq", e - b, H, K);
    grads.dk = decltype(grads.dk)("dk", e - b, H, K);
    grads.dv = decltype(grads.dv)("dv", e - b, H, V);
    if constexpr (std::is_same_v<typename B::transition_type, cw::DiagonalTransition>) {
      std::vector<float> gk(static_cast<std::size_t>(d.T * H * K));
      for (std::size_t i = 0; i < gk.size(); ++i) gk[i] = d.g[i / K];
      in.g = rows_of<cw::const_token_view<float, mem>>(gk, H * K, b, e, H, K);
      grads.dg = decltype(grads.dg)("dg", e - b, H, K);
    } else {
      in.g = rows_of<cw::const_head_view<float, mem>>(d.g, H, b, e, H);
      grads.dg = decltype(grads.dg)("dg", e - b, H);
    }
    if constexpr (std::is_same_v<typename B::transition_type, cw::DenseTransition>) {
      in.beta = rows_of<cw::const_head_view<float, mem>>(d.beta, H, b, e, H);
      grads.dbeta = decltype(grads.dbeta)("dbeta", e - b, H);
    }
    (void)diagonal_gates;
    o = cw::token_view<float, mem>("o", e - b, H, V);
    dout = rows_of<cw::const_token_view<float, mem>>(d.dout, H * V, b, e, H, V);
  }

  template <class Policy>
  auto& cp() {
    if constexpr (std::is_same_v<Policy, cw::GatherFold>)
      return gather;
    else
      return scan;
  }
  template <class Policy>
  cw::ChunkwiseContext<B>& ctx() {
    return std::is_same_v<Policy, cw::GatherFold> ? gather_ctx : scan_ctx;
  }
  template <class Policy = cw::GatherFold>
  void forward() {
    cp<Policy>().forward(in, o, ctx<Policy>());
    exec().fence();
  }
  template <class Policy = cw::GatherFold>
  void both() {
    cp<Policy>().forward(in, o, ctx<Policy>());
    cp<Policy>().backward(ctx<Policy>(), dout, grads);
    exec().fence();
  }
};

// Token-by-token fp32 recurrence (the oracle's algorithm, written for speed: contiguous rows,
// inner loops over V). `gated_delta`: S = αS + β k (v − α Sᵀk)ᵀ; else S = αS + k vᵀ, or with
// `diagonal` S = diag(α)S + k vᵀ with a gate per key row (the bench's diagonal gates repeat the
// head's gate along K, so both forms give the same outputs).
std::vector<float> recurrence(const Data& d, bool gated_delta, bool diagonal = false) {
  const std::int64_t H = d.H, K = d.K, V = d.V;
  const float scale = 1.0f / std::sqrt(static_cast<float>(K));
  std::vector<float> out(static_cast<std::size_t>(d.T * H * V)), S(static_cast<std::size_t>(K * V)),
      pred(static_cast<std::size_t>(V)), gates(static_cast<std::size_t>(K));
  for (std::int64_t h = 0; h < H; ++h) {
    std::fill(S.begin(), S.end(), 0.0f);
    for (std::int64_t t = 0; t < d.T; ++t) {
      const float* k = &d.k[static_cast<std::size_t>((t * H + h) * K)];
      const float* q = &d.q[static_cast<std::size_t>((t * H + h) * K)];
      const float* v = &d.v[static_cast<std::size_t>((t * H + h) * V)];
      const float a = std::exp(d.g[static_cast<std::size_t>(t * H + h)]);
      const float b = d.beta[static_cast<std::size_t>(t * H + h)];
      if (diagonal) std::fill(gates.begin(), gates.end(), a);  // row i's gate exp(g_t,i)
      if (gated_delta) {
        std::fill(pred.begin(), pred.end(), 0.0f);
        for (std::int64_t i = 0; i < K; ++i)
          for (std::int64_t j = 0; j < V; ++j) pred[j] += S[i * V + j] * k[i];
        for (std::int64_t j = 0; j < V; ++j) pred[j] = b * (v[j] - a * pred[j]);
        for (std::int64_t i = 0; i < K; ++i)
          for (std::int64_t j = 0; j < V; ++j) S[i * V + j] = a * S[i * V + j] + k[i] * pred[j];
      } else if (diagonal) {
        for (std::int64_t i = 0; i < K; ++i) {
          const float ai = gates[static_cast<std::size_t>(i)];
          for (std::int64_t j = 0; j < V; ++j) S[i * V + j] = ai * S[i * V + j] + k[i] * v[j];
        }
      } else {
        for (std::int64_t i = 0; i < K; ++i)
          for (std::int64_t j = 0; j < V; ++j) S[i * V + j] = a * S[i * V + j] + k[i] * v[j];
      }
      float* o = &out[static_cast<std::size_t>((t * H + h) * V)];
      std::fill(o, o + V, 0.0f);
      for (std::int64_t i = 0; i < K; ++i)
        for (std::int64_t j = 0; j < V; ++j) o[j] += scale * S[i * V + j] * q[i];
    }
  }
  return out;
}

double rel_l2(const std::vector<float>& a, const cw::token_view<float, mem>& b) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - h.data()[i]) * (a[i] - h.data()[i]);
    den += a[i] * a[i];
  }
  return std::sqrt(num / den);
}

// Relative L2 distance of two device views of the same extents.
template <class View>
double rel_l2_between(const View& a, const View& b) {
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ha.span(); ++i) {
    num += (ha.data()[i] - hb.data()[i]) * (ha.data()[i] - hb.data()[i]);
    den += hb.data()[i] * hb.data()[i];
  }
  return std::sqrt(num / den);
}

// Useful flops of the scalar-decay chunkwise forward per head and chunk of c tokens (the model of
// docs/chunkwise.md §8 for this family): scores QKᵀ⊙L C²K, their product with V 2·C²V/2·2,
// the inter-chunk read Γ Q S 2CKV, the chunk update dS = K̃ᵀV 2CKV.
double scalar_chunk_flops(double c, double k, double v) {
  return c * c * k + c * c * v + 2 * c * k * v + 2 * c * k * v;
}

// The gated delta single-device forward (no CP summary, so no dense transition M) with every
// triangular product counted at its triangular size, the convention of scalar_chunk_flops and of
// docs/performance.md ("Definitions"): A = strict-lower(KKᵀ) C²K; the triangular solve C³/3;
// Ũ, W̃ = T·(βV), T·(βK) with T lower triangular C²V + C²K; QKᵀ⊙L C²K; U = Ũ − W̃S 2CKV; outputs
// QS + (QKᵀ⊙L)U 2CKV + C²V; the state update 2CKV. The model of gated_delta_chunk_flops
// (docs/chunkwise.md §5) counts Ũ, W̃, QKᵀ⊙L and (QKᵀ⊙L)U at full size (2C²·) — 23% more at
// C = 64, K = V = 128.
double gdn_local_chunk_flops(double c, double k, double v) {
  return c * c * k + c * c * c / 3 + (c * c * v + c * c * k) + c * c * k + 2 * c * k * v +
         (2 * c * k * v + c * c * v) + 2 * c * k * v;
}

// The same model split by the kernel that does the work, for the profile of the chunk-size
// sweep: `intra_chunk` forms the strictly lower KK^T, the triangular solve, U~ and W~, and the
// causal QK^T (parallel over chunks); `forward_pass` the state-dependent U = U~ - W~S, the outputs
// and the state update (sequential over the chunks of a head). The two add up to the total above.
double gdn_intra_chunk_flops(double c, double k, double v) {
  return c * c * k + c * c * c / 3 + (c * c * v + c * c * k) + c * c * k;
}
double gdn_forward_pass_flops(double c, double k, double v) {
  return 2 * c * k * v + (2 * c * k * v + c * c * v) + 2 * c * k * v;
}

// The FLOP model string every GDN record carries.
constexpr const char* gdn_flop_model =
    "triangular: C^2K + C^3/3 + (C^2V + C^2K) + C^2K + 2CKV + (2CKV + C^2V) + 2CKV per chunk";

// The step a user calls next to the local kernels it runs, one rank, same run, same inputs: the
// GatherFold plan's steady-state forward (backward, after a forward filled the context) against
// the GDN backend's own forward_prepare + forward_apply (backward_prepare + backward_apply) on the
// same views, with the summary needs the driver passes at one rank, a kept saved bundle and a zero
// boundary state, and no composition or exchange. What the step adds: the per-call checks and
// their agreement, the summary and state buffers, the one-rank composition and the slicing. The
// target is at most 1.25 (the step as fast as its kernels).
bench::Record step_vs_kernel_case(const ctxpar::Group& self, std::int64_t T, std::int64_t H,
                                  std::int64_t K, std::int64_t V, int chunk, int repeats) {
  using B = cw::GatedDeltaRuleBackend<float, mem>;
  const Data d(T, H, K, V);
  Runner<B> step(self, d, chunk);
  cw::ChunkwiseContext<B>& ctx = step.ctx<cw::GatherFold>();
  // The kernels alone on the same input views, into their own output and gradients.
  const B& backend = step.backend;
  const cw::LocalSequences seqs = step.plan.local_sequences(0);
  const cw::SummaryNeeds forward_needs = cw::impl::forward_needs(seqs, false);
  const cw::SummaryNeeds backward_needs = cw::impl::backward_needs(seqs, false);
  cw::SummaryStore<cw::DenseTransition, mem> summary(cw::SummaryForm::packed, 1, H, K, V);
  cw::state_view<mem> zero("zero_state", H, K, V);
  typename B::saved_type saved;
  const typename B::table_type table = backend.make_table(seqs, backend.shape(step.in));
  cw::token_view<float, mem> o("kernel_o", T, H, V);
  typename B::gradients_type grads;
  grads.dq = decltype(grads.dq)("kernel_dq", T, H, K);
  grads.dk = decltype(grads.dk)("kernel_dk", T, H, K);
  grads.dv = decltype(grads.dv)("kernel_dv", T, H, V);
  grads.dg = decltype(grads.dg)("kernel_dg", T, H);
  grads.dbeta = decltype(grads.dbeta)("kernel_dbeta", T, H);
  const auto step_forward = [&] { step.forward(); };
  const auto kernel_forward = [&] {
    backend.forward_prepare(exec(), step.in, seqs, table, summary[0], saved, forward_needs);
    backend.forward_apply(exec(), step.in, seqs, table, zero, {}, o, {}, saved);
    exec().fence();
  };
  const auto step_backward = [&] {
    step.cp<cw::GatherFold>().backward(ctx, step.dout, step.grads);
    exec().fence();
  };
  const auto kernel_backward = [&] {
    backend.backward_prepare(exec(), saved, step.dout, seqs, table, summary[0], backward_needs);
    backend.backward_apply(exec(), saved, step.dout, seqs, table, zero, {}, grads, {},
                           cw::state_view<mem>());
    exec().fence();
  };
  // One warm-up round (the first calls take the plan's, the context's and the bundle's memory).
  const auto [step_f, kernel_f] = bench::time_alternating(step_forward, kernel_forward, 1, repeats);
  const auto [step_b, kernel_b] =
      bench::time_alternating(step_backward, kernel_backward, 1, repeats);
  // Recorded beside the ratio: 0 says both paths computed bitwise the same, so the same work.
  const double out_diff = rel_l2_between(step.o, o),
               dq_diff = rel_l2_between(step.grads.dq, grads.dq);
  // Untimed, after the timings: what the warm step still allocates, and where its time goes.
  const auto allocations = bench::count_steady_state_allocations([&] {
    step_forward();
    step_backward();
  });
  bench::Record r("chunkwise", "step vs kernel gdn");
  bench::profile_step_and_kernels(r, step_forward, step_backward, kernel_forward, kernel_backward);
  const double rf = step_f.median_s / kernel_f.median_s, rb = step_b.median_s / kernel_b.median_s;
  std::printf(
      "step vs kernel gdn T=%lld H=%lld K=%lld V=%lld C=%d (1 rank, median of %d): forward step "
      "%.5f s / kernel %.5f s = %.3f, backward step %.5f s / kernel %.5f s = %.3f (target <= "
      "1.25; rel L2 out %.2g, dq %.2g)\n",
      (long long)T, (long long)H, (long long)K, (long long)V, chunk, repeats, step_f.median_s,
      kernel_f.median_s, rf, step_b.median_s, kernel_b.median_s, rb, out_diff, dq_diff);
  std::printf("  steady state: %lld allocations in %d forward + backward calls\n",
              (long long)allocations.allocations, allocations.calls);
  std::fflush(stdout);
  r.set("kind", "step_vs_kernel").set("family", "gdn").set("policy", "GatherFold");
  r.set("tokens", T).set("heads", H).set("key_dim", K).set("value_dim", V).set("chunk", chunk);
  r.set("step_forward", step_f).set("kernel_forward", kernel_f);
  r.set("step_backward", step_b).set("kernel_backward", kernel_b);
  r.set("forward_step_over_kernel", rf).set("backward_step_over_kernel", rb);
  r.set("rel_l2_output_step_vs_kernel", out_diff).set("rel_l2_dq_step_vs_kernel", dq_diff);
  r.set("rule", "median over repeats").set("target", 1.25);
  bench::set_steady_state(r, allocations);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  {
    std::string out_path = "chunkwise.json";
    bool quick = false;
    // The step-vs-kernel case alone (one rank), for a profile of what the step adds.
    bool step_only = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--out" && i + 1 < argc) out_path = argv[++i];
      if (a == "--quick") quick = true;
      if (a == "--step-only") step_only = true;
    }
    const ctxpar::Group world(MPI_COMM_WORLD);
    const ctxpar::Group self(MPI_COMM_SELF);
    const int p = world.size(), rank = world.rank();
    bench::Report report(bench::this_machine());
    const int repeats = quick ? 3 : 5;
    // The shape of the GDN local kernel case below. Each call takes milliseconds, so more repeats
    // than the other cases keep the median of a ratio near 1 steady on a shared machine.
    auto add_step_vs_kernel = [&] {
      report.add(step_vs_kernel_case(self, quick ? 512 : 2048, 1, 128, 128, 64, quick ? 3 : 21));
    };
    if (step_only) {
      if (rank == 0) {
        add_step_vs_kernel();
        report.write(out_path);
      }
      MPI_Barrier(world.mpi_comm());
    }

    if (p == 1 && !step_only) add_step_vs_kernel();
    if (p == 1 && !step_only) {
      // Local kernels against the same-run SGEMM ceiling and the recurrence.
      // The ceiling is re-measured around every case (the mean of just before and just after):
      // on this shared machine the load drifts within a run.
      const int sgemm_n = quick ? 512 : 1024;
      auto sgemm = bench::sgemm_ceiling(sgemm_n, 3);
      auto around = [&](auto&& timed_case) {
        const double before = bench::sgemm_ceiling(sgemm_n, 3).gflops;
        timed_case();
        sgemm.gflops = 0.5 * (before + bench::sgemm_ceiling(sgemm_n, 3).gflops);
      };
      const std::int64_t K = 128, V = 128, C = 64, H = 1, T = quick ? 512 : 2048;
      const Data d(T, H, K, V);
      {
        Runner<cw::GatedDeltaRuleBackend<float, mem>> gdn(self, d, static_cast<int>(C));
        gdn.forward();
        const auto rec = recurrence(d, true);
        const double err = rel_l2(rec, gdn.o);
        bench::Timing t_chunk;
        around([&] { t_chunk = bench::time_it([&] { gdn.forward(); }, 1, repeats); });
        const auto t_rec = bench::time_it([&] { recurrence(d, true); }, 1, repeats);
        // Forward + backward through the driver on one rank (summaries included), the figure the
        // PyTorch autograd baseline is compared with.
        const auto t_both = bench::time_it([&] { gdn.both(); }, 1, repeats);
        // On one rank nobody reads the summary, so the driver no longer forms the dense M: count
        // the model without it (the work it does), as for the single-device sweep below.
        const double flops = gdn_local_chunk_flops(C, K, V) * (T / C) * H;
        const double gflops = flops / t_chunk.median_s * 1e-9;
        bench::Record r("chunkwise", "gdn_local_forward");
        r.set("kind", "local_kernel")
            .set("family", "gdn")
            .set("tokens", T)
            .set("heads", H)
            .set("key_dim", K);
        r.set("value_dim", V).set("chunk", C).set("flop_model", gdn_flop_model);
        r.set("chunkwise", t_chunk).set("recurrence", t_rec).set("gflops", gflops);
        r.set("forward_backward", t_both);
        r.set("sgemm_gflops", sgemm.gflops)
            .set("sgemm_n", sgemm.n)
            .set("forward_ratio", gflops / sgemm.gflops);
        r.set("speedup_vs_recurrence", t_rec.median_s / t_chunk.median_s)
            .set("rel_l2_vs_recurrence", err);
        report.add(r);
        std::cout << "gdn local forward: " << gflops << " GFLOP/s, SGEMM " << sgemm.gflops
                  << " (ratio " << gflops / sgemm.gflops << "), vs recurrence x"
                  << t_rec.median_s / t_chunk.median_s << " (rel L2 " << err << ")\n";
      }
      {
        Runner<cw::ScalarDecayBackend<float, mem>> sd(self, d, static_cast<int>(C));
        sd.forward();
        const auto rec = recurrence(d, false);
        const double err = rel_l2(rec, sd.o);
        bench::Timing t_chunk;
        around([&] { t_chunk = bench::time_it([&] { sd.forward(); }, 1, repeats); });
        const auto t_rec = bench::time_it([&] { recurrence(d, false); }, 1, repeats);
        const auto t_both = bench::time_it([&] { sd.both(); }, 1, repeats);
        const double flops = scalar_chunk_flops(C, K, V) * (T / C) * H;
        const double gflops = flops / t_chunk.median_s * 1e-9;
        bench::Record r("chunkwise", "scalar_local_forward");
        r.set("kind", "local_kernel_scalar")
            .set("family", "scalar")
            .set("tokens", T)
            .set("heads", H);
        r.set("key_dim", K)
            .set("value_dim", V)
            .set("chunk", C)
            .set("flop_model", "triangular: C^2K + C^2V + 4CKV per chunk");
        r.set("forward_backward", t_both);
        r.set("chunkwise", t_chunk)
            .set("recurrence", t_rec)
            .set("gflops", gflops)
            .set("sgemm_gflops", sgemm.gflops);
        r.set("scalar_ratio_to_sgemm", gflops / sgemm.gflops);
        r.set("scalar_speedup_vs_recurrence", t_rec.median_s / t_chunk.median_s)
            .set("rel_l2_vs_recurrence", err);
        report.add(r);
        std::cout << "scalar local forward: " << gflops << " GFLOP/s (ratio "
                  << gflops / sgemm.gflops << "), vs recurrence x"
                  << t_rec.median_s / t_chunk.median_s << " (rel L2 " << err << ")\n";
      }
      {
        // Diagonal gates (the head's gate repeated along K, so the recurrence above is its oracle
        // too); same flop model as scalar decay, the decays now per key column.
        Runner<cw::DiagonalGateBackend<float, mem>> dg(self, d, static_cast<int>(C));
        dg.forward();
        const double err = rel_l2(recurrence(d, false, true), dg.o);
        bench::Timing t_chunk;
        around([&] { t_chunk = bench::time_it([&] { dg.forward(); }, 1, repeats); });
        const auto t_rec = bench::time_it([&] { recurrence(d, false, true); }, 1, repeats);
        const auto t_both = bench::time_it([&] { dg.both(); }, 1, repeats);
        const double gflops = scalar_chunk_flops(C, K, V) * (T / C) * H / t_chunk.median_s * 1e-9;
        bench::Record r("chunkwise", "diagonal_local_forward");
        r.set("kind", "local_kernel_diagonal").set("family", "diagonal").set("tokens", T);
        r.set("heads", H).set("key_dim", K).set("value_dim", V).set("chunk", C);
        r.set("flop_model", "triangular: C^2K + C^2V + 4CKV per chunk");
        r.set("chunkwise", t_chunk).set("recurrence", t_rec).set("gflops", gflops);
        r.set("forward_backward", t_both);
        r.set("sgemm_gflops", sgemm.gflops).set("diagonal_ratio_to_sgemm", gflops / sgemm.gflops);
        r.set("diagonal_speedup_vs_recurrence", t_rec.median_s / t_chunk.median_s);
        r.set("rel_l2_vs_recurrence", err);
        report.add(r);
        std::cout << "diagonal local forward: " << gflops << " GFLOP/s (ratio "
                  << gflops / sgemm.gflops << "), vs recurrence x"
                  << t_rec.median_s / t_chunk.median_s << " (rel L2 " << err << ")\n";
      }
      {
        // GDN vs the token recurrence, chunk size sweep: the single-device forward (no CP summary,
        // so no dense M) against the library's vectorised recurrence on the same inputs. The
        // FLOP counts per token of both forms and their rates give the ceiling of the speed-up.
        cw::GatedDeltaRuleBackend<float, mem> rb(cw::BackendOptions{64, 0.0});
        Runner<cw::GatedDeltaRuleBackend<float, mem>> base(self, d, 64);
        cw::token_view<float, mem> o_rec("o_rec", T, H, V);
        const auto t_rec = bench::time_it(
            [&] {
              cw::impl::reference_recurrence_forward(exec(), rb, base.in, o_rec);
              exec().fence();
            },
            1, repeats);
        // The plain-loop recurrence of this file does the same work; the baseline is whichever of
        // the two is faster in this run (docs/performance.md, "Definitions").
        const auto t_loop = bench::time_it([&] { recurrence(d, true); }, 1, repeats);
        const double t_fastest = std::min(t_rec.median_s, t_loop.median_s);
        const char* fastest = t_rec.median_s <= t_loop.median_s ? "kokkos" : "plain_loop";
        const double rec_flops = cw::gated_delta_recurrence_flops(T, H, K, V);
        const double rec_gflops = rec_flops / t_fastest * 1e-9;
        for (const int chunk : {32, 64, 128}) {
          cw::GatedDeltaRuleBackend<float, mem> b(cw::BackendOptions{chunk, 0.0});
          cw::token_view<float, mem> o("o", T, H, V);
          // A kept table, bundle and zero state, as a plan keeps them: the time is the kernels',
          // not the allocations fresh ones make on every call (impl::reference_local_forward's).
          typename cw::GatedDeltaRuleBackend<float, mem>::saved_type saved;
          const cw::state_view<mem> zero("zero_state", H, K, V);
          const cw::LocalSequences seqs = cw::LocalSequences::single(T);
          const auto table = b.make_table(seqs, b.shape(base.in));
          auto run = [&] {
            b.forward_apply(exec(), base.in, seqs, table, zero, {}, o, {}, saved);
            exec().fence();
          };
          run();
          auto ho = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), o);
          auto hr = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), o_rec);
          double num = 0, den = 0;
          for (std::size_t i = 0; i < ho.span(); ++i) {
            num += (ho.data()[i] - hr.data()[i]) * (ho.data()[i] - hr.data()[i]);
            den += hr.data()[i] * hr.data()[i];
          }
          bench::Timing t;
          around([&] { t = bench::time_it(run, 1, repeats); });
          const double flops = gdn_local_chunk_flops(chunk, K, V) * (double(T) / chunk) * H;
          const double gflops = flops / t.median_s * 1e-9;
          const double fpt_chunk = flops / double(T * H), fpt_rec = rec_flops / double(T * H);
          bench::Record r("chunkwise", "gdn_vs_recurrence_C" + std::to_string(chunk));
          r.set("kind", "gdn_vs_recurrence").set("family", "gdn").set("tokens", T);
          r.set("heads", H).set("key_dim", K).set("value_dim", V).set("chunk", chunk);
          r.set("flop_model", gdn_flop_model);
          r.set("chunkwise", t).set("recurrence", t_rec).set("gflops", gflops);
          r.set("loop_recurrence", t_loop)
              .set("fastest_recurrence_median_s", t_fastest)
              .set("fastest_recurrence", fastest);
          r.set("recurrence_gflops", rec_gflops).set("sgemm_gflops", sgemm.gflops);
          r.set("flops_per_token_chunkwise", fpt_chunk).set("flops_per_token_recurrence", fpt_rec);
          r.set("local_speedup_vs_recurrence", t_fastest / t.median_s);
          // Best case: every chunkwise flop at the same-run SGEMM rate, against the fastest
          // recurrence's rate.
          r.set("speedup_ceiling", (sgemm.gflops / fpt_chunk) / (rec_gflops / fpt_rec));
          r.set("rel_l2_vs_recurrence", std::sqrt(num / den));
          // Where the time goes: the fastest of 3 profiled calls by kernel label, next to the
          // model's FLOPs of the two kernels that do the arithmetic.
          const bench::KernelProfile profile = bench::fastest_profile(3, run);
          bench::set_profile(r, "chunkwise_profile_", profile, 6);
          r.set("intra_chunk_flops", gdn_intra_chunk_flops(chunk, K, V) * (double(T) / chunk) * H)
              .set("forward_pass_flops",
                   gdn_forward_pass_flops(chunk, K, V) * (double(T) / chunk) * H);
          report.add(r);
          bench::print_profile("  C=" + std::to_string(chunk) + " forward profile", profile, 6);
          std::cout << "gdn C=" << chunk << " local forward " << gflops << " GFLOP/s, recurrence "
                    << rec_gflops << " GFLOP/s (fastest), speed-up x" << t_fastest / t.median_s
                    << " (ceiling x" << (sgemm.gflops / fpt_chunk) / (rec_gflops / fpt_rec)
                    << ", rel L2 " << std::sqrt(num / den) << ")\n";
        }
      }
    }
    if (p == 1 && !quick && !step_only) {
      // Growth with T (chunk 64, K = V = 128, one head): the time of each family's forward should
      // be linear in T, so its GFLOP/s flat. Every (length, family) case is built first and timed
      // in rounds, one call of each per round, so the longest length is not timed alone under
      // whatever load the end of the sweep meets; a call at 512 tokens takes under a millisecond,
      // so there are 4 × `repeats` rounds. Each record also carries where the time goes (the
      // fastest of 3 profiled calls after the timed ones), so a per-token growth reads by kernel.
      const auto sgemm = bench::sgemm_ceiling(1024, 3);
      struct SweepCase {
        std::int64_t tokens;
        const char* family;
        double flops;
        std::function<void()> forward;
      };
      std::vector<SweepCase> sweep;  // each case's forward owns its runner
      for (const std::int64_t T : {512, 1024, 2048, 4096, 8192}) {
        const Data d(T, 1, 128, 128);
        auto add = [&](auto runner, const char* family, double flops) {
          sweep.push_back({T, family, flops, [runner] { runner->forward(); }});
        };
        add(std::make_shared<Runner<cw::GatedDeltaRuleBackend<float, mem>>>(self, d, 64), "gdn",
            gdn_local_chunk_flops(64, 128, 128) * (T / 64));  // one rank: no M
        add(std::make_shared<Runner<cw::ScalarDecayBackend<float, mem>>>(self, d, 64), "scalar",
            scalar_chunk_flops(64, 128, 128) * (T / 64));
        add(std::make_shared<Runner<cw::DiagonalGateBackend<float, mem>>>(self, d, 64), "diagonal",
            scalar_chunk_flops(64, 128, 128) * (T / 64));
      }
      std::vector<std::function<void()>> steps;
      for (const auto& c : sweep) steps.push_back(c.forward);
      const auto timings =
          bench::time_interleaved_collective(self.mpi_comm(), steps, 1, 4 * repeats);
      for (std::size_t i = 0; i < sweep.size(); ++i) {
        const SweepCase& c = sweep[i];
        const bench::Timing& t = timings[i];
        const bench::KernelProfile profile = bench::fastest_profile(3, c.forward);
        bench::Record r("chunkwise",
                        std::string("t_sweep_") + c.family + "_T" + std::to_string(c.tokens));
        r.set("kind", "t_sweep").set("family", c.family).set("tokens", c.tokens).set("heads", 1);
        r.set("key_dim", 128).set("value_dim", 128).set("chunk", 64).set("forward", t);
        r.set("timing", "interleaved: one call of every case of the sweep per round");
        r.set("gflops", c.flops / t.median_s * 1e-9).set("sgemm_gflops", sgemm.gflops);
        bench::set_profile(r, "profile_", profile, 6);
        report.add(r);
        bench::print_profile(
            std::string("  t_sweep ") + c.family + " T=" + std::to_string(c.tokens), profile, 6);
      }
    }

    if (p == 2 && !step_only) {
      // CP efficiency on a compute-bound size (docs/performance.md, "Definitions"): T(1) is the
      // single-rank job on rank 0 alone while the other rank waits in a barrier, T(2) the CP run,
      // timed in alternating rounds; the machine's contention ceiling (SGEMM on both ranks at once
      // / alone) is recorded beside it, never folded into T(1).
      const std::int64_t T = quick ? 1024 : 4096;
      const Data d(T, 2, 64, 64);
      Runner<cw::GatedDeltaRuleBackend<float, mem>> one(self, d, 64);
      Runner<cw::GatedDeltaRuleBackend<float, mem>> two(world, d, 64);
      const auto before = bench::rank_scaling(world.mpi_comm());
      const auto [t1, t2] = bench::time_solo_and_collective(
          world.mpi_comm(), [&] { one.both(); }, [&] { two.both(); }, 1, repeats);
      const auto after = bench::rank_scaling(world.mpi_comm());
      // Where the time goes, after the timed calls: rank 0's single-rank call, and each rank's CP
      // call, by kernel label (the fastest of 3 each). What a CP call spends outside its kernels is
      // the exchange and the wait for the other rank's summary.
      bench::KernelProfile solo_profile;
      if (rank == 0) solo_profile = bench::fastest_profile(3, [&] { one.both(); });
      MPI_Barrier(world.mpi_comm());
      const bench::KernelProfile cp_profile = bench::fastest_profile(3, [&] { two.both(); });
      double kernels_s = cp_profile.kernels_s(), max_kernels_s = 0;
      MPI_Allreduce(&kernels_s, &max_kernels_s, 1, MPI_DOUBLE, MPI_MAX, world.mpi_comm());
      const double ceiling = 0.5 * (before.efficiency_ceiling + after.efficiency_ceiling);
      const double efficiency = t1.median_s / (p * t2.median_s);
      // What the algorithm itself predicts at P = 2, from rank 0's single-rank profile. The state
      // passes chain across the ranks: rank 1's forward pass needs rank 0's final state, rank 0's
      // reverse pass needs rank 1's state gradient, so each pass runs on one rank while the other
      // waits in the exchange; everything else splits evenly. With S the single-rank call's kernel
      // time and F, R its forward and reverse passes, each rank waits (F + R)/2 per call and a
      // call takes (S − F − R)/2 + F + R: an efficiency of S / (S + F + R) on any machine.
      auto solo_label_s = [&](const char* label) {
        const auto it = solo_profile.labels.find(label);
        return it == solo_profile.labels.end() ? 0.0 : it->second.seconds;
      };
      const double chained_s = solo_label_s("ctxpar::chunkwise::gated_delta::forward_pass") +
                               solo_label_s("ctxpar::chunkwise::gated_delta::reverse_pass");
      const double chain_efficiency =
          solo_profile.kernels_s() / (solo_profile.kernels_s() + chained_s);
      bench::Record r("chunkwise", "cp_efficiency_gdn");
      r.set("kind", "cp_efficiency")
          .set("family", "gdn")
          .set("tokens", T)
          .set("heads", 2)
          .set("key_dim", 64);
      r.set("value_dim", 64).set("ranks", p).set("single_rank", t1).set("two_ranks", t2);
      r.set("baseline", "solo")
          .set("cp_efficiency", efficiency)
          .set("cp_efficiency_of_minima", t1.min_s / (p * t2.min_s));
      r.set("machine_efficiency_ceiling", ceiling)
          .set("ceiling_rounds", before.rounds + after.rounds)
          .set("efficiency_vs_machine_ceiling", efficiency / ceiling)
          .set("t1_method", "rank 0 runs the whole sequence alone, the other rank waits")
          .set("timing", "alternating rounds: T(1) then T(P), one call each per round");
      bench::set_profile(r, "single_rank_profile_", solo_profile, 8);
      bench::set_profile(r, "two_ranks_profile_", cp_profile, 8);
      r.set("chain_efficiency", chain_efficiency)
          .set("chain_wait_s", chained_s / p)
          .set("chain_formula",
               "S / (S + F + R), a wait of (F + R)/2 per call: S the single-rank call's kernel "
               "time, F and R its forward and reverse state passes, which run one rank after the "
               "other at P = 2");
      r.set("two_ranks_profile_max_kernels_s", max_kernels_s)
          .set(
              "profile_method",
              "rank 0, the fastest of 3 untimed calls after the timed ones; Kokkos Tools begin/end "
              "callbacks of every parallel_for/reduce/scan and deep_copy");
      report.add(r);
      if (rank == 0) {
        bench::print_profile("  single-rank call profile", solo_profile, 8);
        bench::print_profile("  CP call profile, rank 0", cp_profile, 8);
        std::cout << "cp efficiency (gdn fwd+bwd, T=" << T << ", solo T(1)): " << efficiency
                  << " (machine ceiling " << ceiling << ", chained passes predict "
                  << chain_efficiency << ")\n";
      }
    }

    if (p >= 2 && !step_only) {
      // Summary bytes per structure vs formula, and GatherFold vs ScanCompose on a latency-bound
      // size (few tokens per rank).
      const std::int64_t H = 2, K = 32, V = 32, L = 32;
      const Data d(L * p, H, K, V);
      auto measure = [&](auto& runner, const char* family, std::int64_t m) {
        using R = std::decay_t<decltype(runner)>;
        (void)sizeof(R);
        const std::int64_t record = H * (K * V + m) * 4;
        world.reset_traffic();
        runner.template both<cw::GatherFold>();
        const ctxpar::Traffic ag =
            world.traffic(ctxpar::CollectiveKind::allgather);  // a copy: counters are reset below
        const std::int64_t formula = 2 * record * (p - 1);  // forward + backward, one record each
        const auto t_gather = bench::time_collective(
            world.mpi_comm(), [&] { runner.template both<cw::GatherFold>(); }, 2, repeats);
        world.reset_traffic();
        runner.template both<cw::ScanCompose>();
        const ctxpar::Traffic sc = world.traffic(ctxpar::CollectiveKind::scan);
        const std::int64_t scan_sent = sc.bytes_sent;
        const auto t_scan = bench::time_collective(
            world.mpi_comm(), [&] { runner.template both<cw::ScanCompose>(); }, 2, repeats);
        bench::Record r("chunkwise", std::string("summaries_") + family + "_P" + std::to_string(p));
        r.set("kind", "summaries")
            .set("family", family)
            .set("ranks", p)
            .set("heads", H)
            .set("key_dim", K);
        r.set("value_dim", V).set("tokens_per_rank", L).set("m_floats_per_head", m);
        r.set("bytes_received", ag.bytes_received).set("bytes_formula_value", formula);
        r.set("bytes_formula", "2 directions * H*(K*V+m)*4 * (P-1)");
        r.set("scan_bytes_sent", scan_sent);
        r.set("gather", t_gather)
            .set("scan", t_scan)
            .set("scan_over_gather", t_scan.median_s / t_gather.median_s);
        // Summary buffers the driver allocates per direction (fp32): GatherFold keeps the local and
        // the P gathered records plus a fold temporary; ScanCompose keeps the record and four
        // temporaries (the scan's inclusive/received/exclusive parts and the composition output).
        const std::int64_t scan_record = H * (K * V + std::max<std::int64_t>(m, 1)) * 4;
        r.set("gather_summary_memory_bytes", (1 + p) * record + H * K * V * 4);
        r.set("scan_summary_memory_bytes", 5 * scan_record);
        report.add(r);
        if (rank == 0) {
          std::cout << family << " P=" << p << ": allgather bytes received " << ag.bytes_received
                    << " (formula " << formula << "), gather " << t_gather.median_s * 1e6
                    << " us, scan " << t_scan.median_s * 1e6 << " us\n";
        }
      };
      Runner<cw::ScalarDecayBackend<float, mem>> sd(world, d, 16);
      measure(sd, "scalar", 1);
      Runner<cw::DiagonalGateBackend<float, mem>> dg(world, d, 16, true);
      measure(dg, "diagonal", K);
      Runner<cw::GatedDeltaRuleBackend<float, mem>> gdn(world, d, 16);
      measure(gdn, "gdn", K * K);
    }
    if (rank == 0 && !step_only) report.write(out_path);
  }
  Kokkos::finalize();
  MPI_Finalize();
  return 0;
}
