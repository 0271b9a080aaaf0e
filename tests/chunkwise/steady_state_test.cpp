// A chunkwise CpPlan on a reused context: after one warm-up forward + backward, repeating them
// (with other values in between) allocates nothing on any rank, for every backend and both
// composition policies, on one sequence, packed sequences and zigzag shards, and leaves the results
// bitwise unchanged.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "ctxpar/chunkwise/diagonal_gate.hpp"
#include "ctxpar/chunkwise/driver.hpp"
#include "ctxpar/chunkwise/gated_delta_product.hpp"
#include "ctxpar/chunkwise/gated_delta_rule.hpp"
#include "ctxpar/chunkwise/scalar_decay.hpp"
#include "ctxpar/core/allocation_counter.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar_test/harness.hpp"

namespace cw = ctxpar::chunkwise;
using ctxpar::test::world;

namespace {

using exec = Kokkos::DefaultExecutionSpace;
using mem = exec::memory_space;

/// Fills every element of `v` with a smooth function of its index and `seed`, scaled into range.
/// Computed where `v` lives: a host mirror would be an allocation on a GPU, and the refills run
/// inside the counted region.
template <class View>
void fill(const View& v, double seed, double scale, double shift = 0.0) {
  using value_type = typename View::value_type;
  value_type* data = v.data();
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<exec>(0, v.span()), KOKKOS_LAMBDA(const std::size_t i) {
        data[i] = static_cast<value_type>(
            shift + scale * ctxpar::compat::sin(seed * static_cast<double>(i + 1) + 0.1 * seed));
      });
}

template <class View>
std::vector<double> read(const View& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<double>(h.data(), h.data() + h.span());
}

/// One backend's inputs, output and gradients on this rank.
struct Gdn {
  using Backend = cw::GatedDeltaRuleBackend<double, mem>;
  Backend backend;
  cw::token_view<double, mem> q, k, v, out, dout;
  cw::head_view<double, mem> g, beta;
  typename Backend::gradients_type grads;
  Gdn(std::int64_t t, std::int64_t h, std::int64_t kd, std::int64_t vd)
      : q("q", t, h, kd),
        k("k", t, h, kd),
        v("v", t, h, vd),
        out("o", t, h, vd),
        dout("do", t, h, vd),
        g("g", t, h),
        beta("b", t, h) {
    grads.dq = cw::token_view<double, mem>("dq", t, h, kd);
    grads.dk = cw::token_view<double, mem>("dk", t, h, kd);
    grads.dv = cw::token_view<double, mem>("dv", t, h, vd);
    grads.dg = cw::head_view<double, mem>("dg", t, h);
    grads.dbeta = cw::head_view<double, mem>("db", t, h);
  }
  void set(double seed) {
    fill(q, seed, 0.5);
    fill(k, seed + 1, 0.3);
    fill(v, seed + 2, 1.0);
    fill(g, seed + 3, 0.2, -0.3);
    fill(beta, seed + 4, 0.3, 0.5);
    fill(dout, seed + 5, 1.0);
  }
  typename Backend::inputs_type inputs() const { return {q, k, v, g, beta}; }
  std::vector<std::vector<double>> results() const {
    return {read(out),      read(grads.dq), read(grads.dk),
            read(grads.dv), read(grads.dg), read(grads.dbeta)};
  }
};

struct Gdp {
  using Backend = cw::GatedDeltaProductBackend<double, mem>;
  static constexpr int n_h = 2;
  Backend backend{n_h};
  cw::token_view<double, mem> q, out, dout, beta;
  cw::substep_view<double, mem> k, v;
  cw::head_view<double, mem> g;
  typename Backend::gradients_type grads;
  Gdp(std::int64_t t, std::int64_t h, std::int64_t kd, std::int64_t vd)
      : q("q", t, h, kd),
        out("o", t, h, vd),
        dout("do", t, h, vd),
        beta("b", t, n_h, h),
        k("k", t, n_h, h, kd),
        v("v", t, n_h, h, vd),
        g("g", t, h) {
    grads.dq = cw::token_view<double, mem>("dq", t, h, kd);
    grads.dk = cw::substep_view<double, mem>("dk", t, n_h, h, kd);
    grads.dv = cw::substep_view<double, mem>("dv", t, n_h, h, vd);
    grads.dg = cw::head_view<double, mem>("dg", t, h);
    grads.dbeta = cw::token_view<double, mem>("db", t, n_h, h);
  }
  void set(double seed) {
    fill(q, seed, 0.5);
    fill(k, seed + 1, 0.3);
    fill(v, seed + 2, 1.0);
    fill(g, seed + 3, 0.2, -0.3);
    fill(beta, seed + 4, 0.3, 0.5);
    fill(dout, seed + 5, 1.0);
  }
  typename Backend::inputs_type inputs() const { return {q, k, v, g, beta}; }
  std::vector<std::vector<double>> results() const {
    return {read(out),      read(grads.dq), read(grads.dk),
            read(grads.dv), read(grads.dg), read(grads.dbeta)};
  }
};

/// Scalar decay (`g [T, H]`) or diagonal gates (`g [T, H, K]`).
template <class BackendType, class GateView>
struct Decay {
  using Backend = BackendType;
  Backend backend;
  cw::token_view<double, mem> q, k, v, out, dout;
  GateView g;
  typename Backend::gradients_type grads;
  static GateView gate(std::int64_t t, std::int64_t h, std::int64_t kd) {
    if constexpr (GateView::rank == 2)
      return GateView("g", t, h);
    else
      return GateView("g", t, h, kd);
  }
  Decay(std::int64_t t, std::int64_t h, std::int64_t kd, std::int64_t vd)
      : q("q", t, h, kd),
        k("k", t, h, kd),
        v("v", t, h, vd),
        out("o", t, h, vd),
        dout("do", t, h, vd),
        g(gate(t, h, kd)) {
    grads.dq = cw::token_view<double, mem>("dq", t, h, kd);
    grads.dk = cw::token_view<double, mem>("dk", t, h, kd);
    grads.dv = cw::token_view<double, mem>("dv", t, h, vd);
    grads.dg = gate(t, h, kd);
  }
  void set(double seed) {
    fill(q, seed, 0.5);
    fill(k, seed + 1, 0.3);
    fill(v, seed + 2, 1.0);
    fill(g, seed + 3, 0.2, -0.3);
    fill(dout, seed + 5, 1.0);
  }
  typename Backend::inputs_type inputs() const { return {q, k, v, g}; }
  std::vector<std::vector<double>> results() const {
    return {read(out), read(grads.dq), read(grads.dk), read(grads.dv), read(grads.dg)};
  }
};
using Scalar = Decay<cw::ScalarDecayBackend<double, mem>, cw::head_view<double, mem>>;
using Diagonal = Decay<cw::DiagonalGateBackend<double, mem>, cw::token_view<double, mem>>;

template <class Case, class Policy>
bool steady_on(const char* name, const cw::SequenceLayout& plan) {
  const auto& group = world();
  Case c(plan.local_length(), 2, 4, 3);
  auto cp = cw::make_cp_plan<Policy>(exec(), group, c.backend, plan, c.backend.shape(c.inputs()));
  cw::ChunkwiseContext<typename Case::Backend> ctx;
  auto call = [&] {
    cp.forward(c.inputs(), c.out, ctx);
    cp.backward(ctx, c.dout, c.grads);
    exec().fence();
  };
  c.set(1.0);
  call();  // warm-up: the plan's and the context's memory is allocated here
  const auto first = c.results();
  const std::size_t workspace = cp.workspace_bytes();
  std::int64_t allocations = 0;
  {
    ctxpar::AllocationCounter counter;
    for (int repeat = 0; repeat < 2; ++repeat) {
      c.set(2.0);
      call();
      c.set(1.0);
      call();
    }
    allocations = counter.allocations();
    if (allocations != 0) {
      std::cerr << "[rank " << group.rank() << "] " << name << ": " << allocations
                << " allocations in steady state:";
      for (const auto& [label, n] : counter.labels()) std::cerr << " " << label << " x" << n;
      std::cerr << "\n";
    }
  }
  const bool same = c.results() == first;
  if (!same) std::cerr << "[rank " << group.rank() << "] " << name << ": results changed\n";
  const bool held = workspace > 0 && cp.workspace_bytes() == workspace;
  if (!held)
    std::cerr << "[rank " << group.rank() << "] " << name << ": workspace " << workspace
              << " bytes after the warm-up, " << cp.workspace_bytes() << " after the repeats\n";
  return allocations == 0 && same && held;
}

/// The layouts a context is reused on: one sequence, three packed sequences, zigzag shards.
std::vector<cw::SequenceLayout> plans() {
  const auto& group = world();
  const std::int64_t p = group.size();
  return {cw::SequenceLayout::create(group, ctxpar::Contiguous{}, {0, 11 * p + 3}),
          cw::SequenceLayout::create(group, ctxpar::Contiguous{}, {0, 5, 5 + 7 * p, 13 * p + 6}),
          cw::SequenceLayout::create(group, ctxpar::Zigzag{}, {0, 12 * p})};
}

template <class Case, class Policy>
bool steady(const char* name) {
  bool ok = true;
  for (const auto& plan : plans()) ok = steady_on<Case, Policy>(name, plan) && ok;
  return ok;
}
}  // namespace

BOOST_AUTO_TEST_CASE(gated_delta_rule_steady_state_allocates_nothing) {
  bool ok = steady<Gdn, cw::GatherFold>("GDN GatherFold");
  ok = steady<Gdn, cw::ScanCompose>("GDN ScanCompose") && ok;
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE(gated_delta_product_steady_state_allocates_nothing) {
  bool ok = steady<Gdp, cw::GatherFold>("GDP GatherFold");
  ok = steady<Gdp, cw::ScanCompose>("GDP ScanCompose") && ok;
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE(scalar_decay_and_diagonal_gate_steady_state_allocate_nothing) {
  bool ok = steady<Scalar, cw::GatherFold>("scalar decay GatherFold");
  ok = steady<Scalar, cw::ScanCompose>("scalar decay ScanCompose") && ok;
  ok = steady<Diagonal, cw::GatherFold>("diagonal gate GatherFold") && ok;
  ok = steady<Diagonal, cw::ScanCompose>("diagonal gate ScanCompose") && ok;
  CTXPAR_TEST_ALL(world(), ok);
}
