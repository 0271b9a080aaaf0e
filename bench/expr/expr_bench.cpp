// ctxpar_bench_expr: fused element-wise expressions (`ctxpar::assign`) against the same computation
// written by hand as a Kokkos functor over the same policy.
//
//   --mode time       interleaved repeats of both, median/min/max and the time ratio (JSON)
//   --mode callgrind  each case once per variant between callgrind client requests, so
//                     `valgrind --tool=callgrind --collect-atstart=no` dumps one instruction count
//                     per (case, variant); bench/expr/run_callgrind.sh computes the ratios.
//
// Cases: the gated-delta decay exp(-exp(A_log) * softplus(a + dt_bias)) with per-head broadcasts
// ([T, H]), a SiLU-gated product silu(g) * x ([N]), and a RoPE-like rotation x1*cos - x2*sin with
// tables broadcast over heads ([T, H, D/2]).
#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/json.hpp"
#include "common/timing.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/expr/expr.hpp"

#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define CTXPAR_HAVE_CALLGRIND 1
#endif
#endif
#ifndef CTXPAR_HAVE_CALLGRIND
#define CALLGRIND_TOGGLE_COLLECT
#define CALLGRIND_DUMP_STATS_AT(label) (void)(label)
#define CTXPAR_HAVE_CALLGRIND 0
#endif

namespace {

using Scalar = float;
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using V1 = Kokkos::View<Scalar*, Mem>;
using V2 = Kokkos::View<Scalar**, Mem>;
using V3 = Kokkos::View<Scalar***, Mem>;
namespace ex = ctxpar::expr;
namespace cm = ctxpar::compat;

// ---- the hand-written functors: what a careful Kokkos programmer writes for each case ----

struct GateByHand {
  V2 g, a;
  V1 a_log, dt_bias;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t t, std::int64_t h) const {
    const Scalar x = a(t, h) + dt_bias(h);
    const Scalar sp = x > Scalar(0) ? x + cm::log1p(cm::exp(-x)) : cm::log1p(cm::exp(x));
    g(t, h) = cm::exp(-cm::exp(a_log(h)) * sp);
  }
};

struct SiluGateByHand {
  V1 out, g, x;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    out(i) = g(i) / (Scalar(1) + cm::exp(-g(i))) * x(i);
  }
};

struct RopeByHand {
  V3 out, x1, x2;
  V2 cs, sn;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t t, std::int64_t h, std::int64_t d) const {
    out(t, h, d) = x1(t, h, d) * cs(t, d) - x2(t, h, d) * sn(t, d);
  }
};

// Deterministic non-zero inputs in [lo, hi).
struct Fill {
  Kokkos::View<Scalar*, Mem> flat;
  double lo, hi;
  std::uint64_t seed;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    std::uint64_t z = (seed + 1) * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i);
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 29;
    flat(i) = static_cast<Scalar>(lo + (hi - lo) * double(z >> 11) * 0x1.0p-53);
  }
};

template <class View>
void fill(const View& v, double lo, double hi, std::uint64_t seed) {
  Kokkos::View<Scalar*, Mem, Kokkos::MemoryUnmanaged> flat(v.data(), v.size());
  Kokkos::parallel_for("ctxpar::bench::expr::fill",
                       Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(0, v.size()),
                       Fill{flat, lo, hi, seed});
}

// Largest |expr - hand| relative to max(1, |hand|), over all elements.
template <class View>
double max_relative_difference(const View& x, const View& y) {
  auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  double worst = 0;
  for (std::size_t i = 0; i < hx.span(); ++i) {
    const double d = std::fabs(double(hx.data()[i]) - double(hy.data()[i])) /
                     std::fmax(1.0, std::fabs(double(hy.data()[i])));
    worst = std::fmax(worst, d);
  }
  return worst;
}

// One case: its inputs, the fused and the hand-written evaluation, and the output views.
struct Gate {
  static constexpr const char* name = "gate";
  std::int64_t tokens, heads;
  V2 a, g_expr, g_hand;
  V1 a_log, dt_bias;
  Gate(std::int64_t t, std::int64_t h)
      : tokens(t),
        heads(h),
        a("a", t, h),
        g_expr("g_expr", t, h),
        g_hand("g_hand", t, h),
        a_log("A_log", h),
        dt_bias("dt_bias", h) {
    fill(a, -6, 6, 1);
    fill(a_log, -1, 1, 2);
    fill(dt_bias, -1, 1, 3);
  }
  std::int64_t elements() const { return tokens * heads; }
  void fused(const Exec& space) const {
    ctxpar::assign(space, g_expr,
                   ex::exp(-ex::exp(ex::broadcast<0>(a_log, tokens)) *
                           ex::softplus(ex::view(a) + ex::broadcast<0>(dt_bias, tokens))));
  }
  void by_hand(const Exec& space) const {
    Kokkos::parallel_for("ctxpar::bench::expr::gate_by_hand",
                         ctxpar::impl::assign_policy<Exec, 2>(space, ex::Shape::of_view(g_hand)),
                         GateByHand{g_hand, a, a_log, dt_bias});
  }
  double difference() const { return max_relative_difference(g_expr, g_hand); }
};

struct SiluGate {
  static constexpr const char* name = "silu_gate";
  std::int64_t n;
  V1 g, x, out_expr, out_hand;
  explicit SiluGate(std::int64_t n_)
      : n(n_), g("g", n_), x("x", n_), out_expr("out_expr", n_), out_hand("out_hand", n_) {
    fill(g, -8, 8, 4);
    fill(x, -1, 1, 5);
  }
  std::int64_t elements() const { return n; }
  void fused(const Exec& space) const { ctxpar::assign(space, out_expr, ex::silu(g) * x); }
  void by_hand(const Exec& space) const {
    Kokkos::parallel_for("ctxpar::bench::expr::silu_gate_by_hand",
                         ctxpar::impl::assign_policy<Exec, 1>(space, ex::Shape::of_view(out_hand)),
                         SiluGateByHand{out_hand, g, x});
  }
  double difference() const { return max_relative_difference(out_expr, out_hand); }
};

struct Rope {
  static constexpr const char* name = "rope";
  std::int64_t tokens, heads, half;
  V3 x1, x2, out_expr, out_hand;
  V2 cs, sn;
  Rope(std::int64_t t, std::int64_t h, std::int64_t d2)
      : tokens(t),
        heads(h),
        half(d2),
        x1("x1", t, h, d2),
        x2("x2", t, h, d2),
        out_expr("out_expr", t, h, d2),
        out_hand("out_hand", t, h, d2),
        cs("cos", t, d2),
        sn("sin", t, d2) {
    fill(x1, -1, 1, 6);
    fill(x2, -1, 1, 7);
    fill(cs, -1, 1, 8);
    fill(sn, -1, 1, 9);
  }
  std::int64_t elements() const { return tokens * heads * half; }
  void fused(const Exec& space) const {
    ctxpar::assign(
        space, out_expr,
        ex::view(x1) * ex::broadcast<1>(cs, heads) - ex::view(x2) * ex::broadcast<1>(sn, heads));
  }
  void by_hand(const Exec& space) const {
    Kokkos::parallel_for("ctxpar::bench::expr::rope_by_hand",
                         ctxpar::impl::assign_policy<Exec, 3>(space, ex::Shape::of_view(out_hand)),
                         RopeByHand{out_hand, x1, x2, cs, sn});
  }
  double difference() const { return max_relative_difference(out_expr, out_hand); }
};

// Interleaves the two variants repeat by repeat so machine drift hits both alike.
template <class Case>
ctxpar::bench::Record time_case(const Case& c, const char* size, int repeats) {
  const Exec space;
  std::vector<double> fused, hand;
  auto run_fused = [&] {
    return ctxpar::bench::time_it(
        [&] {
          c.fused(space);
          space.fence();
        },
        0, 1);
  };
  auto run_hand = [&] {
    return ctxpar::bench::time_it(
        [&] {
          c.by_hand(space);
          space.fence();
        },
        0, 1);
  };
  for (int r = 0; r < repeats + 2; ++r) {
    // Alternate which variant runs first, so an order effect (cache, frequency) cancels.
    ctxpar::bench::Timing tf, th;
    if (r % 2 == 0) {
      tf = run_fused();
      th = run_hand();
    } else {
      th = run_hand();
      tf = run_fused();
    }
    if (r >= 2) {  // the first two rounds warm up
      fused.push_back(tf.median_s);
      hand.push_back(th.median_s);
    }
  }
  const auto tf = ctxpar::bench::summarise(fused);
  const auto th = ctxpar::bench::summarise(hand);
  const double diff = c.difference();
  std::printf(
      "%-10s %-5s %9lld elements: fused %.3f ms, by hand %.3f ms, time ratio %.4f (of minima "
      "%.4f), max rel diff %.2g\n",
      Case::name, size, static_cast<long long>(c.elements()), tf.median_s * 1e3, th.median_s * 1e3,
      tf.median_s / th.median_s, tf.min_s / th.min_s, diff);
  return ctxpar::bench::Record("expr", std::string(Case::name) + " " + size)
      .set("elements", c.elements())
      .set("scalar", "float")
      .set("fused", tf)
      .set("by_hand", th)
      .set("time_ratio", tf.median_s / th.median_s)
      .set("time_ratio_of_minima", tf.min_s / th.min_s)
      .set("ns_per_element_fused", tf.median_s / double(c.elements()) * 1e9)
      .set("max_relative_difference", diff);
}

// One collection window per (case, variant); callgrind dumps and zeroes the counters at each
// CALLGRIND_DUMP_STATS_AT. Labels are string literals: the client request reads them by address.
template <class Case>
void count_case(const Case& c, int repeats, const char* fused_label, const char* hand_label) {
  const Exec space;
  c.fused(space);  // warm-up, outside the windows
  c.by_hand(space);
  space.fence();
  CALLGRIND_TOGGLE_COLLECT;
  for (int r = 0; r < repeats; ++r) {
    c.fused(space);
    space.fence();
  }
  CALLGRIND_TOGGLE_COLLECT;
  CALLGRIND_DUMP_STATS_AT(fused_label);
  CALLGRIND_TOGGLE_COLLECT;
  for (int r = 0; r < repeats; ++r) {
    c.by_hand(space);
    space.fence();
  }
  CALLGRIND_TOGGLE_COLLECT;
  CALLGRIND_DUMP_STATS_AT(hand_label);
  std::printf("%s: %lld elements, max relative difference fused vs by hand %.2g\n", Case::name,
              static_cast<long long>(c.elements()), c.difference());
}

}  // namespace

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  std::string mode = "time", out_path;
  int repeats = 31;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--mode") && i + 1 < argc) {
      mode = argv[++i];
    } else if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
      out_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) {
      repeats = std::atoi(argv[++i]);
    } else {
      std::fprintf(
          stderr,
          "usage: ctxpar_bench_expr [--mode time|callgrind] [--out FILE.json] [--repeats N]\n");
      return 2;
    }
  }
  // Two sizes per case: "large" (memory-bound, the figure that matters) and "small" (3% of a
  // small kernel leaves little room for per-call overhead). Callgrind runs ~50x slower, so the
  // callgrind mode repeats less.
  const Gate gate(16384, 64), gate_small(1024, 32);
  const SiluGate silu(1 << 22), silu_small(1 << 15);
  const Rope rope(2048, 16, 64), rope_small(128, 8, 32);
  if (mode == "callgrind") {
    if (!CTXPAR_HAVE_CALLGRIND) std::printf("built without valgrind/callgrind.h: no counts\n");
    count_case(gate, 1, "gate large fused", "gate large by_hand");
    count_case(silu, 1, "silu_gate large fused", "silu_gate large by_hand");
    count_case(rope, 1, "rope large fused", "rope large by_hand");
    count_case(gate_small, 3, "gate small fused", "gate small by_hand");
    count_case(silu_small, 3, "silu_gate small fused", "silu_gate small by_hand");
    count_case(rope_small, 3, "rope small fused", "rope small by_hand");
    return 0;
  }
  ctxpar::bench::Report report(ctxpar::bench::this_machine());
  report.add(time_case(gate, "large", repeats));
  report.add(time_case(silu, "large", repeats));
  report.add(time_case(rope, "large", repeats));
  report.add(time_case(gate_small, "small", repeats));
  report.add(time_case(silu_small, "small", repeats));
  report.add(time_case(rope_small, "small", repeats));
  if (!out_path.empty()) report.write(out_path);
  return 0;
}
