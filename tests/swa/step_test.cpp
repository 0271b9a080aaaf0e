// The single-rank sliding-window attention step against the fp64 oracle (forward and backward,
// edge cases, a long stream with the carried cache), and the oracle against finite differences.
#include <Kokkos_Core.hpp>

#include <array>
#include <cmath>
#include <iostream>
#include <vector>

#include "ctxpar/swa/impl/reference_step.hpp"
#include "ctxpar_test/harness.hpp"
#include "fixtures.hpp"

namespace ts = ctxpar::test::swa;
using ctxpar::test::world;

namespace {

double loss(const ts::Problem& p, const ts::Tensor& dout) {
  const auto f = ts::forward(p);
  double s = 0;
  for (std::size_t i = 0; i < f.out.data.size(); ++i) s += f.out.data[i] * dout.data[i];
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(oracle_gradients_match_central_differences) {
  ts::StreamSpec spec;
  spec.tokens = 7;
  spec.hq = 4;
  spec.hkv = 2;
  spec.dim = 4;
  spec.window = 3;
  spec.first_position = 5;
  spec.document_starts = {4};
  spec.base = 100.0;
  auto s = ts::make_stream<double>(spec);
  const auto f = ts::forward(s.problem);
  const auto g = ts::backward(s.problem, f, s.dout);
  // Central differences with step h have truncation error h^2/6 |f'''| (|f'''| = O(1) for inputs in
  // [-1, 1)) and rounding error ~ u |f| / h: with h = 1e-5 both stay below 1e-9.
  const double h = 1e-5, tol = 1e-8;
  bool ok = true;
  auto check = [&](ts::Tensor ts::Problem::*member, const ts::Tensor& grad, const char* name) {
    for (std::size_t i = 0; i < (s.problem.*member).data.size(); ++i) {
      ts::Problem plus = s.problem, minus = s.problem;
      (plus.*member).data[i] += h;
      (minus.*member).data[i] -= h;
      const double fd = (loss(plus, s.dout) - loss(minus, s.dout)) / (2 * h);
      if (std::fabs(fd - grad.data[i]) > tol) {
        std::cerr << name << "[" << i << "]: analytic " << grad.data[i] << " vs finite difference "
                  << fd << "\n";
        ok = false;
      }
    }
  };
  check(&ts::Problem::q, g.dq, "dq");
  check(&ts::Problem::k, g.dk, "dk");
  check(&ts::Problem::v, g.dv, "dv");
  CTXPAR_TEST_ALL(world(), ok);
}

namespace {

/// One step with cache = tokens [0, c) and chunk = tokens [c, c + t) of a stream, against the
/// oracle on the whole stream (dout zero on the cache rows, whose queries the step does not
/// compute), with the kernels `kernels` picks.
template <class Case>
bool one_step_matches(ts::StreamSpec spec, std::int64_t c, ctxpar::swa::KernelChoice kernels) {
  using Scalar = typename Case::scalar_type;
  using Mem = typename Case::memory_space;
  typename Case::execution_space space;
  auto s = ts::make_stream<Scalar>(spec);
  for (std::int64_t i = 0; i < c; ++i)
    for (std::int64_t a = 0; a < spec.hq; ++a)
      for (std::int64_t d = 0; d < spec.dim; ++d) s.dout(i, a, d) = 0;
  const std::int64_t t = spec.tokens - c;
  const auto f = ts::forward(s.problem);
  const auto g = ts::backward(s.problem, f, s.dout);
  const auto b = ts::bounds(s.problem, f, s.dout, ctxpar::test::unit_roundoff<Scalar>());
  ctxpar::swa::Options o;
  o.window = spec.window;
  o.rope_base = spec.base;
  o.kernels = kernels;
  auto chunk = ts::chunk_of<Scalar, Mem>(s.problem, c, t);
  auto cache = ts::block_of<Scalar, Mem>(s.problem, 0, c);
  auto r = ctxpar::swa::impl::reference_step_forward(space, chunk, cache, o);
  auto dout = ts::to_view<Scalar, Mem>(s.dout, c, t);
  auto gr = ctxpar::swa::impl::reference_step_backward(space, r.state, dout);
  bool ok = ts::close_to("out", r.out, f.out, b.out, c);
  ok = ts::close_to("dq", gr.dq, g.dq, b.dq, c) && ok;
  ok = ts::close_to("dk", gr.dk, g.dk, b.dk, c) && ok;
  ok = ts::close_to("dv", gr.dv, g.dv, b.dv, c) && ok;
  ok = ts::close_to("dk_cache", gr.dk_cache, g.dk, b.dk, 0) && ok;
  ok = ts::close_to("dv_cache", gr.dv_cache, g.dv, b.dv, 0) && ok;
  // The next cache is the raw tail of the axis.
  const std::int64_t n = ctxpar::swa::next_cache_length(spec.window, spec.tokens);
  ok = ok && static_cast<std::int64_t>(r.next_cache.length()) == n;
  ok = ok &&
       ts::bitwise_equal(r.next_cache.k, ts::to_view<Scalar, Mem>(s.problem.k, spec.tokens - n, n));
  if (!ok)
    std::cerr << "  (case: c=" << c << " t=" << t << " W=" << spec.window << " Hq=" << spec.hq
              << " kernels " << static_cast<int>(kernels) << ")\n";
  return ok;
}

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(step_matches_oracle_on_edge_cases, Case, ctxpar::test::cases) {
  struct Variant {
    std::int64_t tokens, c, window, hq, hkv, dim, first;
    std::vector<std::int64_t> docs;
  };
  const std::vector<Variant> variants = {
      {37, 0, 0, 2, 2, 16, 0, {}},           // c = 0, unlimited window
      {40, 7, 8, 4, 1, 16, 3, {}},           // Hq = 4 Hkv, positions not starting at 0
      {41, 10, 11, 2, 1, 8, 100, {4, 20}},   // document boundary inside the cache and the chunk
      {9, 8, 9, 2, 2, 8, 0, {}},             // t = 1 (decode)
      {20, 0, 1, 2, 1, 8, 0, {}},            // W = 1: self only
      {70, 20, 100, 2, 1, 64, 0, {}},        // W >= L
      {130, 31, 32, 2, 2, 32, 0, {33, 34}},  // a one-token document, several key tiles
      {230, 100, 140, 4, 2, 16, 0, {170}},   // key tiles fully visible to query tiles (fast path)
      {90, 30, 40, 2, 1, 72, 0, {}},         // D > 64, W < 2048: the measured rule of `automatic`
  };
  // Every kernel choice where the host kernels exist; elsewhere every choice runs the portable
  // kernels, so one run covers them.
  using ctxpar::swa::KernelChoice;
  std::vector<KernelChoice> choices = {KernelChoice::automatic};
  if constexpr (ctxpar::swa::impl::uses_host_kernels<typename Case::execution_space>)
    choices = {KernelChoice::automatic, KernelChoice::portable, KernelChoice::host_fused,
               KernelChoice::host_unfused};
  bool ok = true;
  std::uint64_t seed = 11;
  for (const auto& v : variants) {
    ts::StreamSpec spec;
    spec.tokens = v.tokens;
    spec.window = v.window;
    spec.hq = v.hq;
    spec.hkv = v.hkv;
    spec.dim = v.dim;
    spec.first_position = v.first;
    spec.document_starts = v.docs;
    spec.seed = seed++;
    for (const auto kernels : choices) ok = one_step_matches<Case>(spec, v.c, kernels) && ok;
  }
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(streamed_steps_equal_one_dense_pass, Case, ctxpar::test::cases) {
  using Scalar = typename Case::scalar_type;
  using Mem = typename Case::memory_space;
  typename Case::execution_space space;
  ts::StreamSpec spec;
  spec.tokens = 107;
  spec.window = 9;
  spec.hq = 4;
  spec.hkv = 2;
  spec.dim = 8;
  spec.first_position = 2;
  spec.position_step = 3;
  spec.document_starts = {50, 51, 77};
  spec.seed = 5;
  auto s = ts::make_stream<Scalar>(spec);
  const auto f = ts::forward(s.problem);
  const auto g = ts::backward(s.problem, f, s.dout);
  const auto b = ts::bounds(s.problem, f, s.dout, ctxpar::test::unit_roundoff<Scalar>());
  ctxpar::swa::Options o;
  o.window = spec.window;
  const std::int64_t step = 5;  // 22 steps, the last one shorter
  std::vector<ctxpar::swa::impl::ReferenceState<Scalar, Mem>> states;
  auto cache = ctxpar::swa::empty_cache<Scalar, Mem>(spec.hkv, spec.dim);
  cache.ids = ctxpar::swa::Ids<Mem>("ids", 0);
  bool ok = true;
  for (std::int64_t from = 0; from < spec.tokens; from += step) {
    const std::int64_t t = std::min(step, spec.tokens - from);
    auto r = ctxpar::swa::impl::reference_step_forward(
        space, ts::chunk_of<Scalar, Mem>(s.problem, from, t), cache, o);
    ok = ts::close_to("streamed out", r.out, f.out, b.out, from) && ok;
    cache = r.next_cache;
    states.push_back(r.state);
  }
  ctxpar::swa::CacheGradient<Scalar, Mem> carried;
  std::int64_t from = spec.tokens;
  for (auto it = states.rbegin(); it != states.rend(); ++it) {
    const std::int64_t t = it->q_rot.extent(0);
    from -= t;
    auto gr = ctxpar::swa::impl::reference_step_backward(
        space, *it, ts::to_view<Scalar, Mem>(s.dout, from, t), carried);
    ok = ts::close_to("streamed dq", gr.dq, g.dq, b.dq, from) && ok;
    ok = ts::close_to("streamed dk", gr.dk, g.dk, b.dk, from) && ok;
    ok = ts::close_to("streamed dv", gr.dv, g.dv, b.dv, from) && ok;
    carried.dk = gr.dk_cache;
    carried.dv = gr.dv_cache;
  }
  BOOST_TEST(states.size() >= 20u);
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(queries_without_visible_keys_give_zeros_not_nan, Case,
                              ctxpar::test::cases) {
  using Scalar = typename Case::scalar_type;
  using Mem = typename Case::memory_space;
  typename Case::execution_space space;
  // Queries of document 1 against keys of document 0 only: no query sees any key.
  ts::StreamSpec spec;
  spec.tokens = 40;
  spec.dim = 8;
  spec.window = 0;
  spec.document_starts = {20};
  auto s = ts::make_stream<Scalar>(spec);
  ctxpar::swa::AttentionInputs<Scalar, Mem> in;
  auto q = ts::to_view<Scalar, Mem>(s.problem.q, 20, 20);
  auto k = ts::to_view<Scalar, Mem>(s.problem.k, 0, 20);
  auto v = ts::to_view<Scalar, Mem>(s.problem.v, 0, 20);
  in.q = q;
  in.k = k;
  in.v = v;
  in.q_pos = ts::vector_view<Mem, std::int64_t, ctxpar::swa::Positions<Mem>>(s.problem.pos, 20, 20);
  in.q_ids = ts::vector_view<Mem, std::int32_t, ctxpar::swa::Ids<Mem>>(s.problem.ids, 20, 20);
  in.k_pos = ts::vector_view<Mem, std::int64_t, ctxpar::swa::Positions<Mem>>(s.problem.pos, 0, 20);
  in.k_ids = ts::vector_view<Mem, std::int32_t, ctxpar::swa::Ids<Mem>>(s.problem.ids, 0, 20);
  in.scale = 0.5;
  ctxpar::swa::Tensor<Scalar, Mem> out("out", 20, 2, 8), dq("dq", 20, 2, 8), dk("dk", 20, 1, 8),
      dv("dv", 20, 1, 8);
  Kokkos::View<ctxpar::swa::accumulator_t<Scalar>**, Kokkos::LayoutRight, Mem> lse("lse", 20, 2);
  Kokkos::deep_copy(out, Scalar(7));
  const auto mask = ctxpar::swa::document_mask();
  ctxpar::swa::AttentionWorkspace<Mem> workspace;
  ctxpar::swa::attention_forward(space, mask, in, out, lse, workspace);
  auto dout = ts::to_view<Scalar, Mem>(s.dout, 20, 20);
  ctxpar::swa::attention_backward(
      space, mask, in, Kokkos::View<const Scalar***, Kokkos::LayoutRight, Mem>(out),
      Kokkos::View<const ctxpar::swa::accumulator_t<Scalar>**, Kokkos::LayoutRight, Mem>(lse),
      Kokkos::View<const Scalar***, Kokkos::LayoutRight, Mem>(dout), dq, dk, dv, workspace);
  bool ok = true;
  for (const auto& view : {out, dq, dk, dv}) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
    for (std::size_t i = 0; i < h.span(); ++i) ok = ok && h.data()[i] == Scalar(0);
  }
  CTXPAR_TEST_ALL(world(), ok);
}

// The window reaches the kernels only through their inputs, never through the mask: any mask
// (here the document mask with `all()` joined, a type the kernels know nothing of, so they test
// every pair of the tiles the window cuts) gets the same windowed result, to the bit, as
// `document_mask()` (whose cut tiles are masked by lane ranges), on every kernel path, forward
// and backward. A kernel that took the window from the mask would let keys outside the window
// through here.
BOOST_AUTO_TEST_CASE_TEMPLATE(the_window_comes_from_the_inputs_not_the_mask, Case,
                              ctxpar::test::cases) {
  using Scalar = typename Case::scalar_type;
  using Mem = typename Case::memory_space;
  using Tensor = ctxpar::swa::Tensor<Scalar, Mem>;
  using Lse = Kokkos::View<ctxpar::swa::accumulator_t<Scalar>**, Kokkos::LayoutRight, Mem>;
  using ConstLse =
      Kokkos::View<const ctxpar::swa::accumulator_t<Scalar>**, Kokkos::LayoutRight, Mem>;
  using ConstTensor = Kokkos::View<const Scalar***, Kokkos::LayoutRight, Mem>;
  typename Case::execution_space space;
  bool ok = true;
  for (const std::int64_t window : {1, 7, 33, 0}) {
    ts::StreamSpec spec;
    spec.tokens = 150;
    spec.hq = 4;
    spec.hkv = 2;
    spec.dim = 8;
    spec.window = window;
    spec.document_starts = {61};
    auto s = ts::make_stream<Scalar>(spec);
    const std::int64_t n = spec.tokens;
    ctxpar::swa::AttentionInputs<Scalar, Mem> in;
    in.q = ts::to_view<Scalar, Mem>(s.problem.q, 0, n);
    in.k = ts::to_view<Scalar, Mem>(s.problem.k, 0, n);
    in.v = ts::to_view<Scalar, Mem>(s.problem.v, 0, n);
    in.q_pos = ts::vector_view<Mem, std::int64_t, ctxpar::swa::Positions<Mem>>(s.problem.pos, 0, n);
    in.q_ids = ts::vector_view<Mem, std::int32_t, ctxpar::swa::Ids<Mem>>(s.problem.ids, 0, n);
    in.k_pos = in.q_pos;
    in.k_ids = in.q_ids;
    in.window = window;
    in.scale = 0.25;
    const auto dout = ts::to_view<Scalar, Mem>(s.dout, 0, n);
    for (const auto kernels :
         {ctxpar::swa::KernelChoice::automatic, ctxpar::swa::KernelChoice::portable}) {
      auto run = [&](const auto& mask) {
        Tensor out("out", n, 4, 8), dq("dq", n, 4, 8), dk("dk", n, 2, 8), dv("dv", n, 2, 8);
        Lse lse("lse", n, 4);
        ctxpar::swa::AttentionWorkspace<Mem> workspace;
        ctxpar::swa::attention_forward(space, mask, in, out, lse, workspace, kernels);
        ctxpar::swa::attention_backward(space, mask, in, ConstTensor(out), ConstLse(lse),
                                        ConstTensor(dout), dq, dk, dv, workspace, kernels);
        return std::array<Tensor, 4>{out, dq, dk, dv};
      };
      const auto fast = run(ctxpar::swa::document_mask());
      const auto pairwise = run(ctxpar::swa::document_mask() && ctxpar::mask::all());
      for (std::size_t i = 0; i < fast.size(); ++i) {
        if (!ts::bitwise_equal(fast[i], pairwise[i])) {
          std::cerr << "window " << window << ", kernels " << static_cast<int>(kernels)
                    << ": result " << i << " depends on the mask type\n";
          ok = false;
        }
      }
    }
  }
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(documents_are_isolated, Case, ctxpar::test::cases) {
  using Scalar = typename Case::scalar_type;
  using Mem = typename Case::memory_space;
  typename Case::execution_space space;
  // Perturbing document 1 leaves document 0's outputs bit-identical, and document 0's gradients
  // are exactly zero when only document 1 has an upstream gradient.
  ts::StreamSpec spec;
  spec.tokens = 45;
  spec.dim = 8;
  spec.window = 0;
  spec.document_starts = {17, 30};
  auto s = ts::make_stream<Scalar>(spec);
  ctxpar::swa::Options o;
  auto a =
      ctxpar::swa::impl::reference_step_forward(space, ts::chunk_of<Scalar, Mem>(s.problem, 0, 45),
                                                ts::block_of<Scalar, Mem>(s.problem, 0, 0), o);
  ts::Problem p = s.problem;
  for (std::int64_t i = 17; i < 30; ++i)
    for (std::int64_t d = 0; d < spec.dim; ++d) {
      p.v(i, 0, d) += 0.25;
      p.k(i, 0, d) -= 0.5;
      p.q(i, 1, d) *= 2;
    }
  auto b = ctxpar::swa::impl::reference_step_forward(space, ts::chunk_of<Scalar, Mem>(p, 0, 45),
                                                     ts::block_of<Scalar, Mem>(p, 0, 0), o);
  bool ok = ts::bitwise_equal(ctxpar::swa::impl::tokens(a.out, 0, 17),
                              ctxpar::swa::impl::tokens(b.out, 0, 17));
  ok = ts::bitwise_equal(ctxpar::swa::impl::tokens(a.out, 30, 15),
                         ctxpar::swa::impl::tokens(b.out, 30, 15)) &&
       ok;
  ts::Tensor dout(45, spec.hq, spec.dim);
  for (std::int64_t i = 17; i < 30; ++i)
    for (std::int64_t h = 0; h < spec.hq; ++h)
      for (std::int64_t d = 0; d < spec.dim; ++d) dout(i, h, d) = s.dout(i, h, d);
  auto g = ctxpar::swa::impl::reference_step_backward(space, a.state,
                                                      ts::to_view<Scalar, Mem>(dout, 0, 45));
  // A named array, not a braced list: nvcc's front end rewrites a range-for over a braced list
  // into code its host compiler cannot parse.
  const std::array<decltype(g.dq), 3> gradients{g.dq, g.dk, g.dv};
  for (const auto& view : gradients) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
    const std::size_t per = h.extent(1) * h.extent(2);
    for (std::size_t i = 0; i < h.span(); ++i) {
      const std::size_t token = i / per;
      if (token < 17 || token >= 30) ok = ok && h.data()[i] == Scalar(0);
    }
  }
  CTXPAR_TEST_ALL(world(), ok);
}
