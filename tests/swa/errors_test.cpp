// Bad input on ONE rank only makes every rank throw the same ctxpar::Error naming that rank,
// before any data moves (no hang); the next good call still works.
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "ctxpar/swa/distributed_step.hpp"
#include "ctxpar/swa/rope.hpp"
#include "ctxpar/swa/step.hpp"
#include "ctxpar_test/harness.hpp"
#include "fixtures.hpp"

namespace ts = ctxpar::test::swa;
using ctxpar::BalancedChunks;
using ctxpar::test::world;

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Scalar = float;

struct Inputs {
  ctxpar::swa::Chunk<Scalar, Mem> chunk;
  ctxpar::swa::Cache<Scalar, Mem> cache;
  std::int64_t chunk_length;
  ctxpar::swa::Options options;
};

/// A valid step for this rank: window 2P + 1, a full cache of 2P keys, a chunk of 3P tokens (every
/// rank holds 2 cache keys and 3 chunk tokens).
Inputs good_inputs(std::int64_t hq = 4, std::int64_t hkv = 2, std::int64_t dim = 8,
                   bool ids = true) {
  const auto& g = world();
  const int p = g.size(), r = g.rank();
  ts::StreamSpec spec;
  spec.hq = hq;
  spec.hkv = hkv;
  spec.dim = dim;
  spec.window = 2 * p + 1;
  const std::int64_t c = 2 * p, t = 3 * p;
  spec.tokens = c + t;
  if (ids) spec.document_starts = {c + 1};
  auto s = ts::make_stream<Scalar>(spec);
  const BalancedChunks cs{c, p}, tc{t, p};
  Inputs in;
  in.cache = ts::block_of<Scalar, Mem>(s.problem, cs.begin(r), cs.size(r));
  in.chunk = ts::chunk_of<Scalar, Mem>(s.problem, c + tc.begin(r), tc.size(r));
  in.chunk_length = t;
  in.options.window = spec.window;
  return in;
}

bool expect_error(const std::string& needle, int bad, const std::function<void(Inputs&)>& spoil) {
  const auto& g = world();
  Inputs in = good_inputs();
  if (g.rank() == bad) spoil(in);
  auto call = [&] {
    ctxpar::swa::forward(Exec(), g, in.chunk, in.chunk_length, in.cache, in.options);
  };
  const bool ok = ctxpar::test::throws_everywhere(g, call, needle, bad);
  if (!ok && g.rank() == 0)
    std::cerr << "  (expected '" << needle << "' from rank " << bad << ")\n";
  return ok;
}

template <class View>
View resized(const View& v, std::int64_t tokens, std::int64_t heads, std::int64_t dim) {
  return View("bad", tokens, heads, dim);
}

}  // namespace

BOOST_AUTO_TEST_CASE(each_bad_input_on_one_rank_gives_the_same_error_everywhere) {
  const auto& g = world();
  const int last = g.size() - 1;
  bool ok = true;
  for (int bad : {0, last}) {
    ok = expect_error(
             "query heads must be a multiple of key/value heads", bad,
             [](Inputs& in) { in.chunk.q = resized(in.chunk.q, in.chunk.length(), 3, 8); }) &&
         ok;
    ok = expect_error("the head dimension must be even", bad,
                      [](Inputs& in) {
                        const auto t = in.chunk.length();
                        in.chunk.q = resized(in.chunk.q, t, 4, 7);
                        in.chunk.k = resized(in.chunk.k, t, 2, 7);
                        in.chunk.v = resized(in.chunk.v, t, 2, 7);
                      }) &&
         ok;
    ok = expect_error(
             "q, k and v must have the same tokens", bad,
             [](Inputs& in) { in.chunk.v = resized(in.chunk.v, in.chunk.length(), 2, 6); }) &&
         ok;
    ok = expect_error("ids must be absent or one per chunk token", bad,
                      [](Inputs& in) {
                        in.chunk.ids = ctxpar::swa::Ids<Mem>("bad", in.chunk.length() + 1);
                      }) &&
         ok;
    ok = expect_error("strictly increasing", bad,
                      [](Inputs& in) {
                        // The first chunk position repeats the previous token's position on the
                        // axis (within this shard's cache, or across the border to the previous
                        // rank).
                        auto h =
                            Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), in.chunk.pos);
                        h(0) -= 1;
                        Kokkos::deep_copy(in.chunk.pos, h);
                      }) &&
         ok;
    ok = expect_error("inputs must be finite", bad,
                      [](Inputs& in) {
                        in.options.check_finite = true;
                        auto h =
                            Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), in.chunk.k);
                        h(0, 1, 3) = std::numeric_limits<Scalar>::quiet_NaN();
                        Kokkos::deep_copy(in.chunk.k, h);
                      }) &&
         ok;
  }
  // A cache longer than W - 1 (one extra key on one rank) is a property of the whole axis: every
  // rank sees it, and the lowest rank reports it.
  ok = expect_error("the cache must not be longer than W - 1", 0,
                    [](Inputs& in) {
                      in.options.window = in.options.window;
                      auto longer = ctxpar::swa::allocate_block<Scalar, Mem>(in.cache.length() + 1,
                                                                             2, 8, true, "bad");
                      Kokkos::deep_copy(ctxpar::swa::impl::tokens(longer.pos, 1, in.cache.length()),
                                        in.cache.pos);
                      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), longer.pos);
                      h(0) = in.cache.length() > 0 ? h(1) - 1000 : -1000;
                      Kokkos::deep_copy(longer.pos, h);
                      in.cache = longer;
                    }) &&
       ok;
  if (g.size() > 1) {
    // Disagreements on the plan: the odd rank out (the last) is named.
    ok = expect_error("every rank must agree on the window", last,
                      [](Inputs& in) { in.options.window += 1; }) &&
         ok;
    ok = expect_error("every rank must agree on the head dimension", last,
                      [](Inputs& in) {
                        const auto t = in.chunk.length(), c = in.cache.length();
                        in.chunk.q = resized(in.chunk.q, t, 4, 10);
                        in.chunk.k = resized(in.chunk.k, t, 2, 10);
                        in.chunk.v = resized(in.chunk.v, t, 2, 10);
                        in.cache.k = resized(in.cache.k, c, 2, 10);
                        in.cache.v = resized(in.cache.v, c, 2, 10);
                      }) &&
         ok;
    ok = expect_error(
             "every rank must agree on the query head count", last,
             [](Inputs& in) { in.chunk.q = resized(in.chunk.q, in.chunk.length(), 6, 8); }) &&
         ok;
    ok = expect_error("chunk", last, [](Inputs& in) { in.chunk_length += 1; }) && ok;
  }
  // The group is still usable: a good call succeeds on every rank.
  Inputs in = good_inputs();
  bool good = true;
  try {
    ctxpar::swa::forward(Exec(), g, in.chunk, in.chunk_length, in.cache, in.options);
  } catch (const std::exception& e) {
    good = false;
  }
  CTXPAR_TEST_ALL(g, ok && good);
}

BOOST_AUTO_TEST_CASE(bad_dout_on_one_rank_gives_the_same_error_everywhere) {
  const auto& g = world();
  Inputs in = good_inputs();
  auto r = ctxpar::swa::forward(Exec(), g, in.chunk, in.chunk_length, in.cache, in.options);
  const int bad = g.size() - 1;
  ctxpar::swa::Tensor<Scalar, Mem> dout("dout", r.out.extent(0) + (g.rank() == bad ? 1 : 0), 4, 8);
  auto call = [&] { ctxpar::swa::backward(Exec(), g, r.state, dout); };
  CTXPAR_TEST_ALL(g, ctxpar::test::throws_everywhere(g, call, "dout must have the shape", bad));
}

BOOST_AUTO_TEST_CASE(single_rank_step_rejects_bad_input) {
  Inputs in = good_inputs();
  bool ok = true;
  auto throws = [&](const std::string& needle, const std::function<void(Inputs&)>& spoil) {
    Inputs x = good_inputs();
    spoil(x);
    try {
      ctxpar::swa::step_forward(Exec(), x.chunk, x.cache, x.options);
    } catch (const ctxpar::Error& e) {
      return std::string(e.what()).find(needle) != std::string::npos;
    }
    return false;
  };
  ok = throws("the head dimension must be even",
              [](Inputs& x) {
                const auto t = x.chunk.length();
                x.chunk.q = resized(x.chunk.q, t, 4, 7);
                x.chunk.k = resized(x.chunk.k, t, 2, 7);
                x.chunk.v = resized(x.chunk.v, t, 2, 7);
              }) &&
       ok;
  ok = throws("the cache must not be longer than W - 1", [](Inputs& x) { x.options.window = 1; }) &&
       ok;
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE(ranks_disagreeing_on_the_key_value_layout_throw_everywhere) {
  // The agreement compares with rank 0, so the odd rank out is any other one; at np 1 nobody can
  // disagree and the whole-axis call must succeed.
  const auto& g = world();
  bool ok = true;
  for (int bad = 1; bad < std::max(2, g.size()); ++bad) {
    Inputs in = good_inputs();
    auto call = [&] {
      if (g.size() == 1 || g.rank() == bad)
        ctxpar::swa::forward<ctxpar::swa::RopeBeforeGather, ctxpar::swa::WholeAxisChunks>(
            Exec(), g, in.chunk, in.chunk_length, in.cache, in.options);
      else
        ctxpar::swa::forward(Exec(), g, in.chunk, in.chunk_length, in.cache, in.options);
    };
    if (g.size() > 1)
      ok = ctxpar::test::throws_everywhere(g, call, "every rank must agree on the key/value layout",
                                           bad) &&
           ok;
    else
      call();
  }
  CTXPAR_TEST_ALL(g, ok);
}

// Parameters that turn every output into NaN (a RoPE base of 0, a negative or NaN base, a NaN or
// infinite scale) are refused on every rank when one rank (or every rank) passes them; a base and
// a scale just inside the bounds still run.
BOOST_AUTO_TEST_CASE(non_finite_or_non_positive_parameters_on_one_rank_or_all) {
  const auto& g = world();
  const int last = g.size() - 1;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  bool ok = true;
  for (int bad : {0, last}) {
    for (double base : {0.0, -2.0, nan, inf}) {
      ok = expect_error("options.rope_base must be finite and positive", bad,
                        [base](Inputs& in) { in.options.rope_base = base; }) &&
           ok;
    }
    for (double scale : {nan, inf, -inf}) {
      ok = expect_error("options.scale must be finite", bad,
                        [scale](Inputs& in) { in.options.scale = scale; }) &&
           ok;
    }
  }
  // Every rank passes the same bad base or scale: the lowest rank (0) is named.
  for (int fault = 0; fault < 3; ++fault) {
    Inputs in = good_inputs();
    if (fault == 0) in.options.rope_base = nan;
    if (fault == 1) in.options.rope_base = 0.0;
    if (fault == 2) in.options.scale = inf;
    auto call = [&] {
      ctxpar::swa::forward(Exec(), g, in.chunk, in.chunk_length, in.cache, in.options);
    };
    ok = ctxpar::test::throws_everywhere(
             g, call, fault == 2 ? "options.scale must be finite" : "options.rope_base", 0) &&
         ok;
  }
  // Just inside the bounds: a small positive base and a negative (finite) scale are valid and give
  // finite outputs.
  Inputs in = good_inputs();
  in.options.rope_base = 1e-3;
  in.options.scale = -0.5;
  bool good = true;
  try {
    auto r = ctxpar::swa::forward(Exec(), g, in.chunk, in.chunk_length, in.cache, in.options);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), r.out);
    for (std::size_t i = 0; i < h.span(); ++i) good = good && std::isfinite(h.data()[i]);
  } catch (const std::exception& e) {
    std::cerr << "[rank " << g.rank() << "] valid edge refused: " << e.what() << "\n";
    good = false;
  }
  CTXPAR_TEST_ALL(g, ok && good);
}

// The single-rank RoPE refuses a base that would make every angle NaN or infinite.
BOOST_AUTO_TEST_CASE(rope_refuses_non_positive_or_non_finite_base) {
  ctxpar::swa::Tensor<Scalar, Mem> x("x", 3, 2, 4), y("y", 3, 2, 4);
  ctxpar::swa::Positions<Mem> pos("pos", 3);
  bool ok = true;
  for (double base : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN()}) {
    bool refused = false;
    try {
      ctxpar::swa::rope_forward(Exec(), x, pos, base, y);
    } catch (const ctxpar::Error& e) {
      refused = std::string(e.what()).find("the RoPE base must be finite and positive") !=
                std::string::npos;
    }
    ok = ok && refused;
  }
  bool edge = true;
  try {
    ctxpar::swa::rope_forward(Exec(), x, pos, 1e-3, y);
  } catch (const std::exception&) {
    edge = false;
  }
  CTXPAR_TEST_ALL(world(), ok && edge);
}
