// Bad input to the gated delta backends through the CP driver, each on ONE rank only at every rank
// count: every rank must throw the same ctxpar::Error naming the operator, the failing rank and
// the expected and actual values, without hanging. Covers q/k/v/g/β shape mismatches, n_h < 1 and
// K or V of zero.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ctxpar/chunkwise/driver.hpp"
#include "ctxpar/chunkwise/gated_delta_product.hpp"
#include "ctxpar/chunkwise/gated_delta_rule.hpp"
#include "ctxpar_test/harness.hpp"

namespace cw = ctxpar::chunkwise;
using ctxpar::test::world;

namespace {

using exec = Kokkos::DefaultHostExecutionSpace;
using mem = exec::memory_space;

struct Shape {
  std::size_t tq, hq, kq;  // q
  std::size_t tk, hk, kk;  // k (GDN) / per-sub-step shape (GDP)
  std::size_t tv, hv, vv;  // v
  std::size_t tg, hg;      // g
  std::size_t tb, hb;      // beta
  int n_h = 1;
};

Shape good(std::size_t T, int n_h = 1) {
  return {T, 2, 4, T, 2, 4, T, 2, 3, T, 2, T, 2, n_h};
}

// Runs a GDN forward with views of the given shapes; every view is filled with small values.
void run_gdn(const Shape& s, const cw::SequenceLayout& plan) {
  cw::GatedDeltaRuleInputs<float, mem> in;
  in.q = cw::token_view<float, mem>("q", s.tq, s.hq, s.kq);
  in.k = cw::token_view<float, mem>("k", s.tk, s.hk, s.kk);
  in.v = cw::token_view<float, mem>("v", s.tv, s.hv, s.vv);
  in.g = cw::head_view<float, mem>("g", s.tg, s.hg);
  in.beta = cw::head_view<float, mem>("beta", s.tb, s.hb);
  cw::token_view<float, mem> out("o", s.tq, s.hq, s.vv);
  const cw::GatedDeltaRuleBackend<float, mem> backend;
  cw::ChunkwiseContext<cw::GatedDeltaRuleBackend<float, mem>> ctx;
  cw::make_cp_plan<cw::GatherFold>(exec(), world(), backend, plan, backend.shape(in))
      .forward(in, out, ctx);
}

void run_gdp(const Shape& s, const cw::SequenceLayout& plan) {
  cw::GatedDeltaProductInputs<float, mem> in;
  const std::size_t n = s.n_h >= 1 ? std::size_t(s.n_h) : 1;
  in.q = cw::token_view<float, mem>("q", s.tq, s.hq, s.kq);
  in.k = cw::substep_view<float, mem>("k", s.tk, n, s.hk, s.kk);
  in.v = cw::substep_view<float, mem>("v", s.tv, n, s.hv, s.vv);
  in.g = cw::head_view<float, mem>("g", s.tg, s.hg);
  in.beta = cw::token_view<float, mem>("beta", s.tb, n, s.hb);
  cw::token_view<float, mem> out("o", s.tq, s.hq, s.vv);
  const cw::GatedDeltaProductBackend<float, mem> backend(s.n_h);
  cw::ChunkwiseContext<cw::GatedDeltaProductBackend<float, mem>> ctx;
  cw::make_cp_plan<cw::GatherFold>(exec(), world(), backend, plan, backend.shape(in))
      .forward(in, out, ctx);
}

template <class Run, class Break>
bool refused(Run run, Break corrupt, const std::string& needle, int n_h = 1) {
  const auto& group = world();
  const int bad = group.size() - 1;
  const auto plan =
      cw::SequenceLayout::create(group, ctxpar::Contiguous{}, {0, 8 * std::int64_t(group.size())});
  Shape s = good(static_cast<std::size_t>(plan.local_length()), n_h);
  if (group.rank() == bad) corrupt(s);
  return ctxpar::test::throws_everywhere(
      group, [&] { run(s, plan); }, needle, bad);
}

}  // namespace

BOOST_AUTO_TEST_CASE(gdn_shape_mismatches_are_refused_on_every_rank) {
  const auto& group = world();
  CTXPAR_TEST_ALL(group, refused(
                             run_gdn, [](Shape& s) { s.kk = 5; }, "k must be [T, H, K]"));
  CTXPAR_TEST_ALL(group, refused(
                             run_gdn, [](Shape& s) { s.hk = 3; }, "k must be [T, H, K]"));
  CTXPAR_TEST_ALL(group, refused(
                             run_gdn, [](Shape& s) { s.tv += 1; }, "v must be [T, H, V]"));
  CTXPAR_TEST_ALL(group, refused(
                             run_gdn, [](Shape& s) { s.tg -= 1; }, "g must be [T, H]"));
  CTXPAR_TEST_ALL(group, refused(
                             run_gdn, [](Shape& s) { s.hb = 1; }, "beta must be [T, H]"));
  CTXPAR_TEST_ALL(
      group, refused(
                 run_gdn, [](Shape& s) { s.kq = s.kk = 0; }, "key dimension K must be positive"));
  CTXPAR_TEST_ALL(group,
                  refused(
                      run_gdn, [](Shape& s) { s.vv = 0; }, "value dimension V must be positive"));
}

BOOST_AUTO_TEST_CASE(gdp_bad_householder_steps_and_shapes_are_refused_on_every_rank) {
  const auto& group = world();
  CTXPAR_TEST_ALL(group, refused(
                             run_gdp, [](Shape& s) { s.n_h = 0; }, "n_h must be at least 1", 2));
  CTXPAR_TEST_ALL(group, refused(
                             run_gdp, [](Shape& s) { s.n_h = -1; }, "n_h must be at least 1", 2));
  CTXPAR_TEST_ALL(group, refused(
                             run_gdp, [](Shape& s) { s.kk = 3; }, "k must be [T, n_h, H, K]", 2));
  CTXPAR_TEST_ALL(group, refused(
                             run_gdp, [](Shape& s) { s.hv = 1; }, "v must be [T, n_h, H, V]", 3));
  CTXPAR_TEST_ALL(group, refused(
                             run_gdp, [](Shape& s) { s.tb += 2; }, "beta must be [T, n_h, H]", 2));
  CTXPAR_TEST_ALL(group, refused(
                             run_gdp, [](Shape& s) { s.kq = s.kk = 0; },
                             "key dimension K must be positive", 2));
  CTXPAR_TEST_ALL(
      group, refused(
                 run_gdp, [](Shape& s) { s.vv = 0; }, "value dimension V must be positive", 3));
}

namespace {

// One GDN (n_h = 1) or GDP (n_h = 2) forward over 8 tokens per rank with `options`, deterministic
// inputs that differ per rank; returns the output on the host.
std::vector<float> forward_with(int n_h, const cw::BackendOptions& options) {
  const auto& group = world();
  const auto plan =
      cw::SequenceLayout::create(group, ctxpar::Contiguous{}, 8 * std::int64_t(group.size()));
  const std::size_t T = static_cast<std::size_t>(plan.local_length()), H = 2, K = 4, V = 3;
  const std::size_t n = static_cast<std::size_t>(n_h);
  auto fill = [&](auto view, std::uint64_t seed, double lo, double hi) {
    auto h = Kokkos::create_mirror_view(view);
    for (std::size_t i = 0; i < h.span(); ++i) {
      const double u = ctxpar::test::uniform(
          seed, static_cast<std::uint64_t>(group.rank()) * 100000 + static_cast<std::uint64_t>(i));
      h.data()[i] = static_cast<float>(lo + (hi - lo) * 0.5 * (u + 1.0));
    }
    Kokkos::deep_copy(view, h);
    return view;
  };
  cw::token_view<float, mem> out("o", T, H, V);
  auto q = fill(cw::token_view<float, mem>("q", T, H, K), 1, -0.5, 0.5);
  auto g = fill(cw::head_view<float, mem>("g", T, H), 4, -0.3, -0.01);
  if (n_h == 1) {
    cw::GatedDeltaRuleInputs<float, mem> in;
    in.q = q;
    in.k = fill(cw::token_view<float, mem>("k", T, H, K), 2, -0.5, 0.5);
    in.v = fill(cw::token_view<float, mem>("v", T, H, V), 3, -1.0, 1.0);
    in.g = g;
    in.beta = fill(cw::head_view<float, mem>("beta", T, H), 5, 0.1, 0.9);
    const cw::GatedDeltaRuleBackend<float, mem> backend(options);
    cw::ChunkwiseContext<cw::GatedDeltaRuleBackend<float, mem>> ctx;
    cw::make_cp_plan<cw::GatherFold>(exec(), group, backend, plan, backend.shape(in))
        .forward(in, out, ctx);
  } else {
    cw::GatedDeltaProductInputs<float, mem> in;
    in.q = q;
    in.k = fill(cw::substep_view<float, mem>("k", T, n, H, K), 2, -0.5, 0.5);
    in.v = fill(cw::substep_view<float, mem>("v", T, n, H, V), 3, -1.0, 1.0);
    in.g = g;
    in.beta = fill(cw::token_view<float, mem>("beta", T, n, H), 5, 0.1, 0.9);
    const cw::GatedDeltaProductBackend<float, mem> backend(n_h, options);
    cw::ChunkwiseContext<cw::GatedDeltaProductBackend<float, mem>> ctx;
    cw::make_cp_plan<cw::GatherFold>(exec(), group, backend, plan, backend.shape(in))
        .forward(in, out, ctx);
  }
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  return std::vector<float>(h.data(), h.data() + h.span());
}

}  // namespace

// A NaN or infinite scale on one rank (or every rank) is refused on every rank, for GDN and GDP.
BOOST_AUTO_TEST_CASE(non_finite_scale_is_refused_on_every_rank) {
  const auto& group = world();
  const int p = group.size();
  for (int n_h : {1, 2}) {
    for (int bad_rank : {p - 1, 0, -1}) {
      const bool bad = bad_rank < 0 || group.rank() == bad_rank;
      for (double scale :
           {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
        auto call = [&] { forward_with(n_h, cw::BackendOptions{16, bad ? scale : 0.0}); };
        CTXPAR_TEST_ALL(group,
                        ctxpar::test::throws_everywhere(group, call, "the scale must be finite",
                                                        bad_rank < 0 ? 0 : bad_rank));
      }
    }
  }
}

// A chunk far beyond the shard (INT_MAX: chunk · n_h would not even fit an int) is clamped to the
// shard: the output equals, bit for bit, that of a chunk of exactly the shard's length.
BOOST_AUTO_TEST_CASE(huge_chunk_is_clamped_to_the_shard) {
  const auto& group = world();
  bool ok = true;
  for (int n_h : {1, 2}) {
    try {
      const auto huge = forward_with(n_h, cw::BackendOptions{std::numeric_limits<int>::max(), 0.0});
      const auto exact = forward_with(n_h, cw::BackendOptions{8, 0.0});
      ok = ok && huge == exact;
      if (huge != exact) std::cerr << "[rank " << group.rank() << "] n_h " << n_h << ": differs\n";
    } catch (const std::exception& e) {
      std::cerr << "[rank " << group.rank() << "] n_h " << n_h << ": " << e.what() << "\n";
      ok = false;
    }
  }
  CTXPAR_TEST_ALL(group, ok);
}
