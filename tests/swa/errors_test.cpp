// Bad input on ONE rank only makes every rank throw the same ctxpar::Error naming that rank,
// before any data moves (no hang); the next good call still works. What the plan is built for
// (shape, options, policy, layout) is refused by the StepPlan constructor, each call's inputs and
// outputs by StepPlan::forward and StepPlan::backward.
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ctxpar/swa/distributed_step.hpp"
#include "ctxpar/swa/impl/reference_step.hpp"
#include "ctxpar/swa/rope.hpp"
#include "ctxpar_test/harness.hpp"
#include "fixtures.hpp"

namespace ts = ctxpar::test::swa;
using ctxpar::BalancedChunks;
using ctxpar::swa::KernelChoice;
using ctxpar::test::world;

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Scalar = float;
using Plan = ctxpar::swa::StepPlan<ctxpar::swa::RopeBeforeGather, ctxpar::swa::SegmentChunks, Exec,
                                   Scalar, Mem>;

const std::string plan_op = "ctxpar::swa::StepPlan";
const std::string forward_op = "ctxpar::swa::StepPlan::forward";
const std::string backward_op = "ctxpar::swa::StepPlan::backward";

struct Inputs {
  ctxpar::swa::Chunk<Scalar, Mem> chunk;
  ctxpar::swa::Cache<Scalar, Mem> cache;
  ctxpar::swa::StepShape shape;
  ctxpar::swa::Options options;
  /// The whole stream (one spare token after the step's chunk) and the index of this rank's first
  /// chunk token in it, to cut shards of other sizes.
  ts::Stream stream;
  std::int64_t chunk_from = 0;
};

/// What one forward writes on a rank: the caller's output of this rank's shard shape, the next
/// cache and the saved state.
struct Outputs {
  Outputs() = default;
  explicit Outputs(const struct Inputs& in);
  ctxpar::swa::Tensor<Scalar, Mem> out;
  ctxpar::swa::Cache<Scalar, Mem> next_cache;
  ctxpar::swa::DistributedState<Scalar, Mem> state;
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
  // One spare token after the chunk (the values of the others do not depend on it).
  spec.tokens = c + t + 1;
  if (ids) spec.document_starts = {c + 1};
  auto s = ts::make_stream<Scalar>(spec);
  const BalancedChunks cs{c, p}, tc{t, p};
  Inputs in;
  in.cache = ts::block_of<Scalar, Mem>(s.problem, cs.begin(r), cs.size(r));
  in.chunk = ts::chunk_of<Scalar, Mem>(s.problem, c + tc.begin(r), tc.size(r));
  in.shape = ctxpar::swa::StepShape{hq, hkv, dim};
  in.options.window = spec.window;
  in.stream = s;
  in.chunk_from = c + tc.begin(r);
  return in;
}

Outputs::Outputs(const Inputs& in)
    : out(ctxpar::swa::allocate_output<Scalar, Mem>(in.shape, in.chunk.length())) {}

/// Builds the plan of `in` and runs one forward. Collective.
void plan_and_forward(const Inputs& in) {
  Plan plan(Exec(), world(), in.shape, in.options);
  Outputs o(in);
  plan.forward(in.chunk, in.cache, o.out, o.next_cache, o.state);
}

/// Every rank throws a `ctxpar::Error` of operator `op` whose message holds `needle`, naming rank
/// `bad`. Collective.
bool expect_throw(const std::string& op, const std::string& needle, int bad,
                  const std::function<void()>& call) {
  const auto& g = world();
  std::string seen_op;
  auto checked = [&] {
    try {
      call();
    } catch (const ctxpar::Error& e) {
      seen_op = e.op();
      throw;
    }
  };
  const bool thrown = ctxpar::test::throws_everywhere(g, checked, needle, bad);
  const bool right_op = seen_op == op;
  if (!right_op && !seen_op.empty())
    std::cerr << "[rank " << g.rank() << "] expected the error from " << op << ", saw it from "
              << seen_op << "\n";
  const bool ok = ctxpar::test::all_ranks(g, right_op) && thrown;
  if (!ok && g.rank() == 0)
    std::cerr << "  (expected '" << needle << "' from " << op << " on rank " << bad << ")\n";
  return ok;
}

/// Good inputs everywhere, spoiled on rank `spoiled`; the plan is built from each rank's (possibly
/// spoiled) shape and options, then one forward runs. The error must name rank `named`.
bool expect_error_named(const std::string& op, const std::string& needle, int spoiled, int named,
                        const std::function<void(Inputs&)>& spoil) {
  Inputs in = good_inputs();
  if (world().rank() == spoiled) spoil(in);
  return expect_throw(op, needle, named, [&] { plan_and_forward(in); });
}

/// The same, for an error that names the spoiled rank.
bool expect_error(const std::string& op, const std::string& needle, int bad,
                  const std::function<void(Inputs&)>& spoil) {
  return expect_error_named(op, needle, bad, bad, spoil);
}

template <class View>
View resized(const View& v, std::int64_t tokens, std::int64_t heads, std::int64_t dim) {
  return View("bad", tokens, heads, dim);
}

/// The lowest rank whose chunk shard (`sizes[r]` tokens) is not its `BalancedChunks(t, P)` share
/// of `t = sum(sizes)`, or -1.
int first_wrong_share(const std::vector<std::int64_t>& sizes) {
  std::int64_t t = 0;
  for (auto n : sizes) t += n;
  const BalancedChunks chunks{t, static_cast<int>(sizes.size())};
  for (std::size_t r = 0; r < sizes.size(); ++r)
    if (sizes[r] != chunks.size(static_cast<int>(r))) return static_cast<int>(r);
  return -1;
}

}  // namespace

BOOST_AUTO_TEST_CASE(each_bad_input_on_one_rank_gives_the_same_error_everywhere) {
  const auto& g = world();
  const int last = g.size() - 1;
  bool ok = true;
  for (int bad : {0, last}) {
    // A rank whose inputs have a bad shape and that builds its plan for that shape: refused by the
    // plan's constructor.
    ok = expect_error(plan_op, "shape.query_heads must be a positive multiple of shape.kv_heads",
                      bad,
                      [](Inputs& in) {
                        in.shape.query_heads = 3;
                        in.chunk.q = resized(in.chunk.q, in.chunk.length(), 3, 8);
                      }) &&
         ok;
    ok = expect_error(plan_op, "shape.head_dim must be positive and even", bad,
                      [](Inputs& in) {
                        const auto t = in.chunk.length();
                        in.shape.head_dim = 7;
                        in.chunk.q = resized(in.chunk.q, t, 4, 7);
                        in.chunk.k = resized(in.chunk.k, t, 2, 7);
                        in.chunk.v = resized(in.chunk.v, t, 2, 7);
                      }) &&
         ok;
    ok = expect_error(plan_op, "the window must be non-negative", bad,
                      [](Inputs& in) { in.options.window = -1; }) &&
         ok;
    // The same bad chunks against a plan built for the agreed shape: refused by forward.
    ok = expect_error(
             forward_op, "the chunk shard must have the plan's heads and head dimension", bad,
             [](Inputs& in) { in.chunk.q = resized(in.chunk.q, in.chunk.length(), 3, 8); }) &&
         ok;
    ok = expect_error(forward_op, "the chunk shard must have the plan's heads and head dimension",
                      bad,
                      [](Inputs& in) {
                        const auto t = in.chunk.length();
                        in.chunk.q = resized(in.chunk.q, t, 4, 7);
                        in.chunk.k = resized(in.chunk.k, t, 2, 7);
                        in.chunk.v = resized(in.chunk.v, t, 2, 7);
                      }) &&
         ok;
    ok = expect_error(
             forward_op, "q, k and v must have the same tokens", bad,
             [](Inputs& in) { in.chunk.v = resized(in.chunk.v, in.chunk.length(), 2, 6); }) &&
         ok;
    ok = expect_error(forward_op, "ids must be absent or one per chunk token", bad,
                      [](Inputs& in) {
                        in.chunk.ids = ctxpar::swa::Ids<Mem>("bad", in.chunk.length() + 1);
                      }) &&
         ok;
    ok = expect_error(forward_op, "strictly increasing", bad,
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
    ok = expect_error(forward_op, "inputs must be finite", bad,
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
  ok = expect_error(forward_op, "the cache must not be longer than W - 1", 0,
                    [](Inputs& in) {
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
    // Disagreements on the plan: the odd rank out (the last) is named by the constructor.
    ok = expect_error(plan_op, "every rank must agree on the window", last,
                      [](Inputs& in) { in.options.window += 1; }) &&
         ok;
    ok = expect_error(plan_op, "every rank must agree on the head dimension", last,
                      [](Inputs& in) {
                        const auto t = in.chunk.length(), c = in.cache.length();
                        in.shape.head_dim = 10;
                        in.chunk.q = resized(in.chunk.q, t, 4, 10);
                        in.chunk.k = resized(in.chunk.k, t, 2, 10);
                        in.chunk.v = resized(in.chunk.v, t, 2, 10);
                        in.cache.k = resized(in.cache.k, c, 2, 10);
                        in.cache.v = resized(in.cache.v, c, 2, 10);
                      }) &&
         ok;
    ok = expect_error(plan_op, "every rank must agree on the query head count", last,
                      [](Inputs& in) {
                        in.shape.query_heads = 6;
                        in.chunk.q = resized(in.chunk.q, in.chunk.length(), 6, 8);
                      }) &&
         ok;
    ok = expect_error(plan_op, "every rank must agree on the key/value head count", last,
                      [](Inputs& in) {
                        const auto t = in.chunk.length(), c = in.cache.length();
                        in.shape.kv_heads = 4;
                        in.chunk.k = resized(in.chunk.k, t, 4, 8);
                        in.chunk.v = resized(in.chunk.v, t, 4, 8);
                        in.cache.k = resized(in.cache.k, c, 4, 8);
                        in.cache.v = resized(in.cache.v, c, 4, 8);
                      }) &&
         ok;
    ok = expect_error(plan_op, "every rank must agree on the RoPE base", last,
                      [](Inputs& in) { in.options.rope_base = 500.0; }) &&
         ok;
    ok = expect_error(plan_op, "every rank must agree on the softmax scale", last,
                      [](Inputs& in) { in.options.scale = 0.25; }) &&
         ok;
    // Host and portable kernels sum in different orders: ranks on different kernels would break
    // the bitwise agreement of their outputs with the single-rank step.
    ok = expect_error(plan_op, "every rank must agree on the kernel choice", last,
                      [](Inputs& in) {
                        in.options.kernels = in.options.kernels == KernelChoice::portable
                                                 ? KernelChoice::host_unfused
                                                 : KernelChoice::portable;
                      }) &&
         ok;
    // The chunk length is the sum of the chunk shards, so ranks cannot disagree on it; a shard of
    // the wrong size (one more token on the last rank, one fewer on the first) makes the shards
    // not the BalancedChunks(t, P) split of their sum. Named: the lowest rank whose shard is not
    // its share (with t = 3P + 1 that is rank 0, whose share grew to 4).
    const std::int64_t share = 3;
    std::vector<std::int64_t> longer_last(static_cast<std::size_t>(g.size()), share);
    longer_last.back() += 1;
    std::vector<std::int64_t> shorter_first(static_cast<std::size_t>(g.size()), share);
    shorter_first.front() -= 1;
    const int named_longer = first_wrong_share(longer_last),
              named_shorter = first_wrong_share(shorter_first);
    // Both really are a wrong split, so some rank must be named.
    ok = named_longer >= 0 && named_shorter >= 0 && ok;
    ok = expect_error_named(forward_op,
                            "this rank's chunk shard must hold its BalancedChunks(t, P) share",
                            last, named_longer,
                            [](Inputs& in) {
                              in.chunk = ts::chunk_of<Scalar, Mem>(in.stream.problem, in.chunk_from,
                                                                   in.chunk.length() + 1);
                            }) &&
         ok;
    ok = expect_error_named(forward_op,
                            "this rank's chunk shard must hold its BalancedChunks(t, P) share", 0,
                            named_shorter,
                            [](Inputs& in) {
                              in.chunk = ts::chunk_of<Scalar, Mem>(
                                  in.stream.problem, in.chunk_from + 1, in.chunk.length() - 1);
                            }) &&
         ok;
  }
  // The group is still usable: a good plan, forward and backward succeed on every rank.
  Inputs in = good_inputs();
  bool good = true;
  try {
    Plan plan(Exec(), g, in.shape, in.options);
    Outputs o(in);
    plan.forward(in.chunk, in.cache, o.out, o.next_cache, o.state);
    const auto gr = ctxpar::swa::allocate_gradients(in.shape, o.state);
    plan.backward(o.state,
                  ts::to_view<Scalar, Mem>(in.stream.dout, in.chunk_from, in.chunk.length()), {},
                  gr);
  } catch (const std::exception& e) {
    std::cerr << "[rank " << g.rank() << "] good call refused: " << e.what() << "\n";
    good = false;
  }
  CTXPAR_TEST_ALL(g, ok && good);
}

BOOST_AUTO_TEST_CASE(bad_dout_on_one_rank_gives_the_same_error_everywhere) {
  const auto& g = world();
  Inputs in = good_inputs();
  Plan plan(Exec(), g, in.shape, in.options);
  Outputs r(in);
  plan.forward(in.chunk, in.cache, r.out, r.next_cache, r.state);
  const int bad = g.size() - 1;
  ctxpar::swa::Tensor<Scalar, Mem> dout("dout", r.out.extent(0) + (g.rank() == bad ? 1 : 0), 4, 8);
  const auto gr = ctxpar::swa::allocate_gradients(in.shape, r.state);
  auto call = [&] { plan.backward(r.state, dout, {}, gr); };
  CTXPAR_TEST_ALL(g, expect_throw(backward_op, "dout must have the shape", bad, call));
}

// The outputs and the saved state a caller hands in are checked too: an `out` of the wrong shape
// or none, a next cache that is the input cache, gradients of the wrong shape or none, a next-cache
// gradient of the wrong shape, a state no forward filled or that another plan filled. The plan
// stays usable after each refused call, and a repeated forward into the same views writes the
// same bits.
BOOST_AUTO_TEST_CASE(bad_outputs_or_state_on_one_rank_give_the_same_error_everywhere) {
  using Tensor = ctxpar::swa::Tensor<Scalar, Mem>;
  const auto& g = world();
  const int bad = g.size() - 1;
  const bool here = g.rank() == bad;
  Inputs in = good_inputs();
  Plan plan(Exec(), g, in.shape, in.options);
  Outputs o(in);
  plan.forward(in.chunk, in.cache, o.out, o.next_cache, o.state);
  const std::int64_t t_r = in.chunk.length(), c_r = in.cache.length();
  const std::int64_t n_next = o.next_cache.length();
  Tensor first("first", o.out.extent(0), o.out.extent(1), o.out.extent(2));
  Kokkos::deep_copy(first, o.out);
  const Tensor dout = ts::to_view<Scalar, Mem>(in.stream.dout, in.chunk_from, t_r);
  bool ok = true;

  {
    // A view of the wrong shape, and an empty view (outputs are the caller's, never allocated).
    for (const Tensor& wrong : {Tensor("bad", t_r + 1, 4, 8), Tensor()}) {
      Outputs x(in);
      if (here) x.out = wrong;
      ok = expect_throw(forward_op, "out must have the shape of this rank's output", bad,
                        [&] { plan.forward(in.chunk, in.cache, x.out, x.next_cache, x.state); }) &&
           ok;
    }
  }
  {
    Outputs x(in);
    if (here) x.next_cache = in.cache;
    ok = expect_throw(forward_op, "next_cache must not share memory with cache", bad,
                      [&] { plan.forward(in.chunk, in.cache, x.out, x.next_cache, x.state); }) &&
         ok;
  }
  // Each gradient view, given with the wrong head dimension.
  using Grads = ctxpar::swa::StepGradients<Scalar, Mem>;
  const struct {
    Tensor Grads::*field;
    const char* name;
    std::int64_t tokens, heads;
  } fields[] = {{&Grads::dq, "dq", t_r, 4},
                {&Grads::dk, "dk", t_r, 2},
                {&Grads::dv, "dv", t_r, 2},
                {&Grads::dk_cache, "dk_cache", c_r, 2},
                {&Grads::dv_cache, "dv_cache", c_r, 2}};
  for (const auto& f : fields) {
    for (const Tensor& wrong : {Tensor("bad", f.tokens, f.heads, 6), Tensor()}) {
      Grads gr = ctxpar::swa::allocate_gradients(in.shape, o.state);
      if (here) gr.*f.field = wrong;
      ok =
          expect_throw(backward_op, std::string("grads.") + f.name + " must have its shard's shape",
                       bad, [&] { plan.backward(o.state, dout, {}, gr); }) &&
          ok;
    }
  }
  {
    ctxpar::swa::CacheGradient<Scalar, Mem> d_next;
    d_next.dk = Tensor("dk_next", n_next + (here ? 1 : 0), 2, 8);
    d_next.dv = Tensor("dv_next", n_next + (here ? 1 : 0), 2, 8);
    Grads gr = ctxpar::swa::allocate_gradients(in.shape, o.state);
    ok =
        expect_throw(backward_op, "the next-cache gradient must match this rank's next-cache shard",
                     bad, [&] { plan.backward(o.state, dout, d_next, gr); }) &&
        ok;
  }
  {
    ctxpar::swa::DistributedState<Scalar, Mem> never_filled;
    Grads gr = ctxpar::swa::allocate_gradients(in.shape, o.state);
    ok = expect_throw(backward_op, "got a state no forward filled", bad,
                      [&] { plan.backward(here ? never_filled : o.state, dout, {}, gr); }) &&
         ok;
  }
  {
    // Another plan (another window) fills a state of the same step.
    ctxpar::swa::Options wider = in.options;
    wider.window += 2;
    Plan other(Exec(), g, in.shape, wider);
    Outputs y(in);
    other.forward(in.chunk, in.cache, y.out, y.next_cache, y.state);
    Grads gr = ctxpar::swa::allocate_gradients(in.shape, o.state);
    ok = expect_throw(backward_op, "got a state of another plan", bad,
                      [&] { plan.backward(here ? y.state : o.state, dout, {}, gr); }) &&
         ok;
  }
  // Still usable: a forward into the same views gives the same bits, and its backward runs.
  bool good = true;
  try {
    plan.forward(in.chunk, in.cache, o.out, o.next_cache, o.state);
    good = ts::bitwise_equal(o.out, first);
    if (!good) std::cerr << "[rank " << g.rank() << "] repeated forward differs\n";
    Grads gr = ctxpar::swa::allocate_gradients(in.shape, o.state);
    plan.backward(o.state, dout, {}, gr);
  } catch (const std::exception& e) {
    std::cerr << "[rank " << g.rank() << "] good call refused: " << e.what() << "\n";
    good = false;
  }
  CTXPAR_TEST_ALL(g, ok && good);
}

BOOST_AUTO_TEST_CASE(single_rank_step_rejects_bad_input) {
  Inputs in = good_inputs();
  bool ok = true;
  auto throws = [&](const std::string& needle, const std::function<void(Inputs&)>& spoil) {
    Inputs x = good_inputs();
    spoil(x);
    try {
      ctxpar::swa::impl::reference_step_forward(Exec(), x.chunk, x.cache, x.options);
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
  // disagree and the whole-axis plan and call must succeed.
  const auto& g = world();
  bool ok = true;
  for (int bad = 1; bad < std::max(2, g.size()); ++bad) {
    Inputs in = good_inputs();
    auto call = [&] {
      if (g.size() == 1 || g.rank() == bad) {
        ctxpar::swa::StepPlan<ctxpar::swa::RopeBeforeGather, ctxpar::swa::WholeAxisChunks, Exec,
                              Scalar, Mem>
            plan(Exec(), g, in.shape, in.options);
        Outputs o(in);
        plan.forward(in.chunk, in.cache, o.out, o.next_cache, o.state);
      } else {
        plan_and_forward(in);
      }
    };
    if (g.size() > 1)
      ok = expect_throw(plan_op, "every rank must agree on the key/value layout", bad, call) && ok;
    else
      call();
  }
  CTXPAR_TEST_ALL(g, ok);
}

BOOST_AUTO_TEST_CASE(ranks_disagreeing_on_the_policy_throw_everywhere) {
  const auto& g = world();
  bool ok = true;
  for (int bad = 1; bad < std::max(2, g.size()); ++bad) {
    Inputs in = good_inputs();
    auto call = [&] {
      if (g.size() == 1 || g.rank() == bad) {
        ctxpar::swa::StepPlan<ctxpar::swa::HaloKV, ctxpar::swa::SegmentChunks, Exec, Scalar, Mem>
            plan(Exec(), g, in.shape, in.options);
        Outputs o(in);
        plan.forward(in.chunk, in.cache, o.out, o.next_cache, o.state);
      } else {
        plan_and_forward(in);
      }
    };
    if (g.size() > 1)
      ok = expect_throw(plan_op, "every rank must agree on the policy", bad, call) && ok;
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
      ok = expect_error(plan_op, "options.rope_base must be finite and positive", bad,
                        [base](Inputs& in) { in.options.rope_base = base; }) &&
           ok;
    }
    for (double scale : {nan, inf, -inf}) {
      ok = expect_error(plan_op, "options.scale must be finite", bad,
                        [scale](Inputs& in) { in.options.scale = scale; }) &&
           ok;
    }
    // An integer cast into the enumeration from outside it selects no kernel.
    for (int choice : {-1, static_cast<int>(KernelChoice::tensor_core) + 1}) {
      ok = expect_error(plan_op, "options.kernels must be a KernelChoice", bad,
                        [choice](Inputs& in) { in.options.kernels = KernelChoice(choice); }) &&
           ok;
    }
  }
  // Every rank passes the same bad base or scale: the lowest rank (0) is named.
  for (int fault = 0; fault < 3; ++fault) {
    Inputs in = good_inputs();
    if (fault == 0) in.options.rope_base = nan;
    if (fault == 1) in.options.rope_base = 0.0;
    if (fault == 2) in.options.scale = inf;
    ok = expect_throw(plan_op, fault == 2 ? "options.scale must be finite" : "options.rope_base", 0,
                      [&] { plan_and_forward(in); }) &&
         ok;
  }
  // Just inside the bounds: a small positive base and a negative (finite) scale are valid and give
  // finite outputs.
  Inputs in = good_inputs();
  in.options.rope_base = 1e-3;
  in.options.scale = -0.5;
  bool good = true;
  try {
    Plan plan(Exec(), g, in.shape, in.options);
    Outputs r(in);
    plan.forward(in.chunk, in.cache, r.out, r.next_cache, r.state);
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
