// The portable (GPU-shaped) sliding-window attention kernels run on the host with 1, 2 and 4
// threads per team (registered with OMP_NUM_THREADS=4, so OpenMP teams really run concurrently):
// forward and backward on every rank against the fp64 oracle; forward and dQ bitwise equal to the
// single-rank step (rank-count independence); every output bitwise equal across team sizes; empty
// axes and queries that see no key.
#include <Kokkos_Core.hpp>

#include <array>
#include <cstring>
#include <vector>

#include "ctxpar/core/team_size.hpp"
#include "ctxpar/swa/distributed_step.hpp"
#include "ctxpar/swa/impl/reference_step.hpp"
#include "ctxpar_test/harness.hpp"
#include "fixtures.hpp"

namespace ts = ctxpar::test::swa;
using ctxpar::BalancedChunks;
using ctxpar::test::world;

namespace {

/// Every step and kernel call of these tests asks for the portable kernels.
constexpr auto portable = ctxpar::swa::KernelChoice::portable;

/// The team size is restored after each test.
struct RestoreTeamSize {
  int saved = ctxpar::host_team_size();
  ~RestoreTeamSize() { ctxpar::set_host_team_size(saved); }
};

constexpr std::array<int, 3> team_sizes = {1, 2, 4};

struct Variant {
  std::int64_t tokens, c, window, hq, hkv, dim, first, step;
  std::vector<std::int64_t> docs;
};

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {70, 0, 8, 4, 1, 16, 0, 1, {}},            // c = 0, GQA Hq = 4 Hkv, several query tiles
      {45, 0, 1, 2, 2, 8, 0, 1, {}},             // W = 1 (self only), MHA
      {40, 9, 50, 4, 1, 8, 3, 2, {}},            // W >= L, positions with gaps
      {90, 30, 0, 4, 1, 8, 0, 1, {33, 34, 70}},  // unlimited window, packed ids near tile edges
      {10, 9, 10, 2, 1, 8, 0, 1, {}},            // t = 1 (decode)
      {2, 1, 3, 2, 2, 8, 5, 1, {}},              // L < P
      {230, 100, 140, 2, 2, 8, 0, 1, {170}},     // fully visible tiles next to a window edge
  };
  return v;
}

/// The outputs of one run: single-rank step (whole axis) and this rank's distributed step.
template <class Scalar, class Mem>
struct Run {
  ctxpar::swa::impl::ReferenceResult<Scalar, Mem> single;
  ctxpar::swa::StepGradients<Scalar, Mem> single_g;
  /// What this rank's distributed forward wrote.
  struct {
    ctxpar::swa::Tensor<Scalar, Mem> out;
    ctxpar::swa::Cache<Scalar, Mem> next_cache;
    ctxpar::swa::DistributedState<Scalar, Mem> state;
  } dist;
  ctxpar::swa::StepGradients<Scalar, Mem> dist_g;
};

template <class A, class B>
bool same_bits(const char* what, int team, const A& a, const B& b) {
  const bool same = ts::bitwise_equal(a, b);
  if (!same)
    std::cerr << "[rank " << world().rank() << "] " << what << " at team size " << team
              << " differs bitwise\n";
  return same;
}

template <class C>
bool variant_case(const Variant& v, std::uint64_t seed) {
  using Scalar = typename C::scalar_type;
  using Mem = typename C::memory_space;
  using namespace ctxpar::swa;
  const auto& group = world();
  typename C::execution_space space;
  ts::StreamSpec spec;
  spec.tokens = v.tokens;
  spec.window = v.window;
  spec.hq = v.hq;
  spec.hkv = v.hkv;
  spec.dim = v.dim;
  spec.first_position = v.first;
  spec.position_step = v.step;
  spec.document_starts = v.docs;
  spec.seed = seed;
  auto s = ts::make_stream<Scalar>(spec);
  for (std::int64_t i = 0; i < v.c; ++i)
    for (std::int64_t a = 0; a < spec.hq; ++a)
      for (std::int64_t d = 0; d < spec.dim; ++d) s.dout(i, a, d) = 0;
  const auto f = ts::forward(s.problem);
  const auto g = ts::backward(s.problem, f, s.dout);
  const auto b = ts::bounds(s.problem, f, s.dout, ctxpar::test::unit_roundoff<Scalar>());
  Options o;
  o.window = spec.window;
  o.rope_base = spec.base;
  o.kernels = portable;
  const std::int64_t t = v.tokens - v.c;
  const int rank = group.rank(), ranks = group.size();
  const BalancedChunks cs{v.c, ranks}, qs{t, ranks};
  const std::int64_t cache_from = cs.begin(rank), chunk_from = v.c + qs.begin(rank);
  const std::int64_t q0 = qs.begin(rank), tr = qs.size(rank);
  bool ok = true;
  std::vector<Run<Scalar, Mem>> runs;
  // One plan serves every team size (its scratch is reused); each run has its own outputs and
  // state.
  StepPlan<RopeBeforeGather, SegmentChunks, typename C::execution_space, Scalar, Mem> plan(
      space, group, StepShape{spec.hq, spec.hkv, spec.dim}, o);
  for (const int team : team_sizes) {
    ctxpar::set_host_team_size(team);
    Run<Scalar, Mem> r;
    r.single = impl::reference_step_forward(space, ts::chunk_of<Scalar, Mem>(s.problem, v.c, t),
                                            ts::block_of<Scalar, Mem>(s.problem, 0, v.c), o);
    r.single_g = impl::reference_step_backward(space, r.single.state,
                                               ts::to_view<Scalar, Mem>(s.dout, v.c, t));
    r.dist.out = allocate_output<Scalar, Mem>(plan.shape(), tr);
    plan.forward(ts::chunk_of<Scalar, Mem>(s.problem, chunk_from, tr),
                 ts::block_of<Scalar, Mem>(s.problem, cache_from, cs.size(rank)), r.dist.out,
                 r.dist.next_cache, r.dist.state);
    auto dout = ts::to_view<Scalar, Mem>(s.dout, chunk_from, tr);
    r.dist_g = allocate_gradients(plan.shape(), r.dist.state);
    plan.backward(r.dist.state, dout, {}, r.dist_g);
    // Against the oracle: the single-rank step on the whole chunk, the distributed one on this
    // rank's shards.
    ok = ts::close_to("single out", r.single.out, f.out, b.out, v.c) && ok;
    ok = ts::close_to("single dq", r.single_g.dq, g.dq, b.dq, v.c) && ok;
    ok = ts::close_to("single dk", r.single_g.dk, g.dk, b.dk, v.c) && ok;
    ok = ts::close_to("single dv", r.single_g.dv, g.dv, b.dv, v.c) && ok;
    ok = ts::close_to("single dk_cache", r.single_g.dk_cache, g.dk, b.dk, 0) && ok;
    ok = ts::close_to("single dv_cache", r.single_g.dv_cache, g.dv, b.dv, 0) && ok;
    ok = ts::close_to("out", r.dist.out, f.out, b.out, chunk_from) && ok;
    ok = ts::close_to("dq", r.dist_g.dq, g.dq, b.dq, chunk_from) && ok;
    ok = ts::close_to("dk", r.dist_g.dk, g.dk, b.dk, chunk_from) && ok;
    ok = ts::close_to("dv", r.dist_g.dv, g.dv, b.dv, chunk_from) && ok;
    ok = ts::close_to("dk_cache", r.dist_g.dk_cache, g.dk, b.dk, cache_from) && ok;
    ok = ts::close_to("dv_cache", r.dist_g.dv_cache, g.dv, b.dv, cache_from) && ok;
    // Rank-count independence: forward and dQ bitwise the single-rank step's.
    ok = same_bits("distributed out vs single-rank", team, r.dist.out,
                   impl::tokens(r.single.out, q0, tr)) &&
         ok;
    ok = same_bits("distributed dq vs single-rank", team, r.dist_g.dq,
                   impl::tokens(r.single_g.dq, q0, tr)) &&
         ok;
    runs.push_back(r);
  }
  // Team-size independence: every output bitwise the team-size-1 run's.
  for (std::size_t k = 1; k < runs.size(); ++k) {
    const int team = team_sizes[k];
    const auto &a = runs[k], &r = runs[0];
    ok = same_bits("single out", team, a.single.out, r.single.out) && ok;
    ok = same_bits("single lse", team, a.single.state.lse, r.single.state.lse) && ok;
    ok = same_bits("single dq", team, a.single_g.dq, r.single_g.dq) && ok;
    ok = same_bits("single dk", team, a.single_g.dk, r.single_g.dk) && ok;
    ok = same_bits("single dv", team, a.single_g.dv, r.single_g.dv) && ok;
    ok = same_bits("single dk_cache", team, a.single_g.dk_cache, r.single_g.dk_cache) && ok;
    ok = same_bits("single dv_cache", team, a.single_g.dv_cache, r.single_g.dv_cache) && ok;
    ok = same_bits("out", team, a.dist.out, r.dist.out) && ok;
    ok = same_bits("dq", team, a.dist_g.dq, r.dist_g.dq) && ok;
    ok = same_bits("dk", team, a.dist_g.dk, r.dist_g.dk) && ok;
    ok = same_bits("dv", team, a.dist_g.dv, r.dist_g.dv) && ok;
    ok = same_bits("dk_cache", team, a.dist_g.dk_cache, r.dist_g.dk_cache) && ok;
    ok = same_bits("dv_cache", team, a.dist_g.dv_cache, r.dist_g.dv_cache) && ok;
  }
  if (!ok)
    std::cerr << "  [rank " << rank << "] L=" << v.tokens << " c=" << v.c << " W=" << v.window
              << " Hq=" << v.hq << " Hkv=" << v.hkv << " D=" << v.dim << "\n";
  return ok;
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(portable_team_kernels, RestoreTeamSize)

BOOST_AUTO_TEST_CASE_TEMPLATE(teams_really_have_several_threads, C, ctxpar::test::cases) {
  // On OpenMP with 4 threads, the kernels' teams get the requested size, so the other cases test
  // concurrent threads; Serial keeps 1.
  using Scalar = typename C::scalar_type;
  using Mem = typename C::memory_space;
  using Space = typename C::execution_space;
  using Member = typename Kokkos::TeamPolicy<Space>::member_type;
  using Mask = ctxpar::swa::DocumentMask;
  using Kernel = ctxpar::swa::impl::TeamForwardKernel<Scalar, Mem, Mask, Member>;
  bool ok = true;
  for (const int team : team_sizes) {
    ctxpar::set_host_team_size(team);
    Kernel kernel{{{}, ctxpar::swa::document_mask(), {}, 1, 1, 0}, {}, {}};
    const auto policy = ctxpar::swa::impl::team_kernel_policy(
        Space(), 4, Kernel::Tiles::scratch_bytes(8, 1, Kernel::row_arrays, Kernel::key_arrays),
        ctxpar::swa::query_tile, kernel, kernel.queries.level);
    const int expected =
        std::is_same_v<Space, Kokkos::Serial> ? 1 : std::min(team, Space::concurrency());
    if (policy.team_size() != expected) {
      std::cerr << "team size " << policy.team_size() << ", expected " << expected << "\n";
      ok = false;
    }
    if (!std::is_same_v<Space, Kokkos::Serial> && team > 1 && Space::concurrency() < team)
      std::cerr << "warning: only " << Space::concurrency() << " threads; run with "
                << "OMP_NUM_THREADS=4 to test teams of " << team << "\n";
  }
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(oracle_rank_count_and_team_size_independence, C,
                              ctxpar::test::cases) {
  bool ok = true;
  std::uint64_t seed = 300;
  for (const auto& v : variants()) ok = variant_case<C>(v, seed++) && ok;
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(empty_axes_and_queries_without_keys, C, ctxpar::test::cases) {
  using Scalar = typename C::scalar_type;
  using Mem = typename C::memory_space;
  using Acc = ctxpar::swa::accumulator_t<Scalar>;
  using ConstTensor = Kokkos::View<const Scalar***, Kokkos::LayoutRight, Mem>;
  using ConstLse = Kokkos::View<const Acc**, Kokkos::LayoutRight, Mem>;
  typename C::execution_space space;
  ts::StreamSpec spec;
  spec.tokens = 80;
  spec.hq = 4;
  spec.hkv = 1;
  spec.dim = 8;
  spec.window = 0;
  spec.document_starts = {40};
  auto s = ts::make_stream<Scalar>(spec);
  const auto mask = ctxpar::swa::document_mask();
  const Acc masked = ctxpar::swa::impl::masked_score<Acc>();
  bool ok = true;
  for (const int team : team_sizes) {
    ctxpar::set_host_team_size(team);
    // (queries, keys): no keys at all; queries of document 1 against keys of document 0 only
    // (no query sees a key); no queries (dk, dv must still be written, as zeros).
    const std::array<std::array<std::int64_t, 4>, 3> shapes = {
        {{40, 40, 0, 0}, {40, 40, 0, 40}, {0, 0, 0, 40}}};
    for (const auto& sh : shapes) {
      const auto in = ts::direct_inputs<Scalar, Mem>(s, sh[0], sh[1], sh[2], sh[3]);
      const std::int64_t tq = sh[1], nk = sh[3];
      ctxpar::swa::Tensor<Scalar, Mem> out("out", tq, 4, 8), dq("dq", tq, 4, 8), dk("dk", nk, 1, 8),
          dv("dv", nk, 1, 8);
      Kokkos::View<Acc**, Kokkos::LayoutRight, Mem> lse("lse", tq, 4);
      for (const auto& view : {out, dq, dk, dv}) Kokkos::deep_copy(view, Scalar(7));
      ctxpar::swa::AttentionWorkspace<Mem> workspace;
      ctxpar::swa::attention_forward(space, mask, in, out, lse, workspace, portable);
      auto dout = ts::to_view<Scalar, Mem>(s.dout, sh[0], tq);
      ctxpar::swa::attention_backward(space, mask, in, ConstTensor(out), ConstLse(lse),
                                      ConstTensor(dout), dq, dk, dv, workspace, portable);
      bool here = ts::all_equal(out, 0) && ts::all_equal(dq, 0) && ts::all_equal(dk, 0) &&
                  ts::all_equal(dv, 0);
      here = ts::all_equal(lse, double(masked)) && here;
      if (!here)
        std::cerr << "[rank " << world().rank() << "] tq=" << tq << " nk=" << nk << " team " << team
                  << ": not zeros / masked lse\n";
      ok = here && ok;
    }
  }
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_SUITE_END()
