// What `CpPlan` decides at construction and what its context carries: a configuration that differs
// on one rank throws the same error on every rank when the plan is built (before any call); a
// context filled by another plan's forward is refused by the backward on every rank, and refilled
// correctly by this plan's forward.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "ctxpar/chunkwise/driver.hpp"
#include "ctxpar/chunkwise/scalar_decay.hpp"
#include "ctxpar_test/harness.hpp"

namespace cw = ctxpar::chunkwise;
using ctxpar::test::world;

namespace {

// The default space: the device in a CUDA/HIP build (the views are read through mirrors).
using exec = Kokkos::DefaultExecutionSpace;
using mem = exec::memory_space;
using backend_t = cw::ScalarDecayBackend<float, mem>;
constexpr std::int64_t H = 2, K = 4, V = 3;

// True when `f` throws a ctxpar::Error from operator `op` whose condition contains `needle` and
// that names `rank`; prints what it saw otherwise. Call on every rank, then agree on the verdict.
template <class F>
bool throws_from(F&& f, const std::string& op, const std::string& needle, int rank) {
  std::string seen = "no exception";
  try {
    f();
  } catch (const ctxpar::Error& e) {
    if (e.op() == op && e.condition().find(needle) != std::string::npos && e.rank() == rank)
      return true;
    seen = e.what();
  }
  std::cerr << "[rank " << world().rank() << "] expected " << op << " to refuse '" << needle
            << "' naming rank " << rank << ", saw: " << seen << "\n";
  return false;
}

// The rank an agreement failure names: the bad rank, or rank 1 when rank 0 is the odd one out.
int named(int bad_rank) {
  return bad_rank == 0 ? 1 : bad_rank;
}

/// One rank's inputs, output and gradients, filled from the global token index.
struct Problem {
  cw::token_view<float, mem> q, k, v, out, dout;
  cw::head_view<float, mem> g;
  cw::ScalarDecayGradients<float, mem> grads;

  Problem(const cw::SequenceLayout& plan, std::uint64_t seed)
      : q("q", plan.local_length(), H, K),
        k("k", plan.local_length(), H, K),
        v("v", plan.local_length(), H, V),
        out("o", plan.local_length(), H, V),
        dout("do", plan.local_length(), H, V),
        g("g", plan.local_length(), H) {
    const std::int64_t t = plan.local_length();
    grads = {cw::token_view<float, mem>("dq", t, H, K), cw::token_view<float, mem>("dk", t, H, K),
             cw::token_view<float, mem>("dv", t, H, V), cw::head_view<float, mem>("dg", t, H)};
    const std::uint64_t base = static_cast<std::uint64_t>(world().rank()) * 100000;
    auto fill = [&](auto view, std::uint64_t s, double lo, double hi) {
      auto h = Kokkos::create_mirror_view(view);
      for (std::size_t i = 0; i < h.span(); ++i)
        h.data()[i] = static_cast<float>(
            lo + (hi - lo) * 0.5 * (ctxpar::test::uniform(seed + s, base + i) + 1.0));
      Kokkos::deep_copy(view, h);
    };
    fill(q, 1, -0.5, 0.5);
    fill(k, 2, -0.5, 0.5);
    fill(v, 3, -1.0, 1.0);
    fill(g, 4, -0.3, -0.01);
    fill(dout, 5, -1.0, 1.0);
  }
  cw::ScalarDecayInputs<float, mem> inputs() const { return {q, k, v, g}; }
  cw::ChunkwiseShape shape() const { return {static_cast<std::int64_t>(q.extent(0)), H, K, V}; }
  std::vector<float> results() const {
    std::vector<float> all;
    auto add = [&](const auto& view) {
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
      all.insert(all.end(), h.data(), h.data() + h.span());
    };
    add(out);
    add(grads.dq);
    add(grads.dk);
    add(grads.dv);
    add(grads.dg);
    return all;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_configuration_differing_on_one_rank_throws_at_construction_everywhere) {
  const auto& group = world();
  const int p = group.size();
  const std::int64_t T = 8 * p;
  const auto contiguous = cw::SequenceLayout::create(group, ctxpar::Contiguous{}, {0, 3, T});
  const auto zigzag = cw::SequenceLayout::create(group, ctxpar::Zigzag{}, {0, 3, T});
  const backend_t backend(cw::BackendOptions{4, 0.0});
  const cw::ChunkwiseShape shape{contiguous.local_length(), H, K, V};
  const std::string op = "ctxpar::chunkwise::CpPlan";
  for (int bad_rank : {p - 1, 0}) {
    const bool bad = group.rank() == bad_rank;
    BOOST_TEST_CONTEXT("bad rank " << bad_rank) {
      // Rank-local violations name the bad rank itself.
      auto tokens = [&] {
        cw::make_cp_plan<cw::GatherFold>(exec(), group, backend, contiguous,
                                         cw::ChunkwiseShape{shape.tokens + (bad ? 1 : 0), H, K, V});
      };
      CTXPAR_TEST_ALL(group, throws_from(tokens, op, "the local token count must match", bad_rank));
      auto chunk = [&] {
        cw::make_cp_plan<cw::GatherFold>(exec(), group, backend_t(cw::BackendOptions{bad ? 0 : 4}),
                                         contiguous, shape);
      };
      CTXPAR_TEST_ALL(group, throws_from(chunk, op, "the chunk size must be positive", bad_rank));
      if (p == 1) continue;  // one rank always agrees with itself
      auto policy = [&] {
        if (bad)
          cw::make_cp_plan<cw::ScanCompose>(exec(), group, backend, contiguous, shape);
        else
          cw::make_cp_plan<cw::GatherFold>(exec(), group, backend, contiguous, shape);
      };
      CTXPAR_TEST_ALL(group, throws_from(policy, op,
                                         "every rank must agree on the composition "
                                         "policy",
                                         named(bad_rank)));
      auto form = [&] {
        cw::DriverOptions options;
        if (bad) options.form = cw::SummaryForm::unpacked;
        cw::make_cp_plan<cw::GatherFold>(exec(), group, backend, contiguous, shape, options);
      };
      CTXPAR_TEST_ALL(group, throws_from(form, op, "every rank must agree on the summary form",
                                         named(bad_rank)));
      auto layout = [&] {
        cw::make_cp_plan<cw::GatherFold>(exec(), group, backend, bad ? zigzag : contiguous, shape);
      };
      CTXPAR_TEST_ALL(group, throws_from(layout, op, "every rank must agree on the sequence layout",
                                         named(bad_rank)));
      auto value_dim = [&] {
        cw::make_cp_plan<cw::GatherFold>(exec(), group, backend, contiguous,
                                         cw::ChunkwiseShape{shape.tokens, H, K, bad ? V + 1 : V});
      };
      CTXPAR_TEST_ALL(group,
                      throws_from(value_dim, op, "every rank must agree on the value dimension V",
                                  named(bad_rank)));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_context_of_another_plan_is_refused_by_backward_and_refilled_by_forward) {
  const auto& group = world();
  const std::int64_t T = 10 * group.size();
  const auto layout = cw::SequenceLayout::create(group, ctxpar::Zigzag{}, {0, 4, T});
  Problem a(layout, 10), b(layout, 20);
  // Another policy and another chunk size: the other plan's saved arrays have other shapes.
  auto other = cw::make_cp_plan<cw::GatherFold>(exec(), group, backend_t(cw::BackendOptions{3}),
                                                layout, a.shape());
  auto plan = cw::make_cp_plan<cw::ScanCompose>(exec(), group, backend_t(cw::BackendOptions{4}),
                                                layout, b.shape());
  // The reference: this plan on a fresh context.
  cw::ChunkwiseContext<backend_t> fresh;
  plan.forward(b.inputs(), b.out, fresh);
  plan.backward(fresh, b.dout, b.grads);
  const std::vector<float> expected = b.results();

  const std::string op = "ctxpar::chunkwise::CpPlan::backward";
  cw::ChunkwiseContext<backend_t> empty;
  CTXPAR_TEST_ALL(group, throws_from([&] { plan.backward(empty, b.dout, b.grads); }, op,
                                     "the context must come from a forward of this plan", 0));
  cw::ChunkwiseContext<backend_t> ctx;
  other.forward(a.inputs(), a.out, ctx);
  CTXPAR_TEST_ALL(group, throws_from([&] { plan.backward(ctx, b.dout, b.grads); }, op,
                                     "the context must come from a forward of this plan", 0));
  // Refilled by this plan's forward, the same context gives this plan's results bit for bit.
  plan.forward(b.inputs(), b.out, ctx);
  plan.backward(ctx, b.dout, b.grads);
  const bool same = b.results() == expected;
  if (!same) std::cerr << "[rank " << group.rank() << "] the refilled context differs\n";
  CTXPAR_TEST_ALL(group, same);
  // And the other plan refuses it now.
  CTXPAR_TEST_ALL(group, throws_from([&] { other.backward(ctx, a.dout, a.grads); }, op,
                                     "the context must come from a forward of this plan", 0));
}
