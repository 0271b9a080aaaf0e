// The context-parallel sliding-window attention step on every rank, forward and backward, for the
// three policies under both key/value layouts (per-segment and whole-axis torch.chunk), on every
// enabled execution space and scalar type: against the fp64 oracle, bitwise against the
// single-rank step where the design claims it, over edge cases and a 22-step stream with the
// chained backward; the gathered rotated keys against whole-axis rotation; the records each rank
// owns under each layout.
#include <Kokkos_Core.hpp>

#include <tuple>
#include <vector>

#include "ctxpar/swa/distributed_step.hpp"
#include "ctxpar/swa/impl/reference_step.hpp"
#include "ctxpar_test/harness.hpp"
#include "fixtures.hpp"

namespace ts = ctxpar::test::swa;
using ctxpar::BalancedChunks;
using ctxpar::swa::SegmentChunks;
using ctxpar::swa::WholeAxisChunks;
using ctxpar::test::world;

namespace {

/// One rank's shards of a step whose cache is stream tokens [c0, c0 + c) and chunk [c0 + c, c0 + c
/// + t). The caller's shards are the same under both layouts.
template <class Scalar, class Mem>
struct Shards {
  ctxpar::swa::Chunk<Scalar, Mem> chunk;
  ctxpar::swa::Cache<Scalar, Mem> cache;
  std::int64_t chunk_from, cache_from;
};

template <class Scalar, class Mem>
Shards<Scalar, Mem> shards_of(const ts::Problem& p, std::int64_t c0, std::int64_t c, std::int64_t t,
                              int rank, int ranks) {
  const BalancedChunks cs{c, ranks}, ts_{t, ranks};
  Shards<Scalar, Mem> s;
  s.cache_from = c0 + cs.begin(rank);
  s.chunk_from = c0 + c + ts_.begin(rank);
  s.cache = ts::block_of<Scalar, Mem>(p, s.cache_from, cs.size(rank));
  s.chunk = ts::chunk_of<Scalar, Mem>(p, s.chunk_from, ts_.size(rank));
  return s;
}

template <class Policy>
const char* name_of() {
  if constexpr (std::is_same_v<Policy, ctxpar::swa::RopeBeforeGather>) return "RopeBeforeGather";
  if constexpr (std::is_same_v<Policy, ctxpar::swa::RopeAfterGather>) return "RopeAfterGather";
  return "HaloKV";
}

template <class Layout>
const char* layout_name() {
  return std::is_same_v<Layout, WholeAxisChunks> ? "WholeAxisChunks" : "SegmentChunks";
}

/// What a rank's forward wrote.
template <class Scalar, class Mem>
struct Result {
  ctxpar::swa::Tensor<Scalar, Mem> out;
  ctxpar::swa::Cache<Scalar, Mem> next_cache;
  ctxpar::swa::DistributedState<Scalar, Mem> state;
};

/// The oracle and the single-rank step of one case, shared by every policy and layout.
template <class C>
struct Reference {
  using Scalar = typename C::scalar_type;
  using Mem = typename C::memory_space;
  ts::Stream s;
  ts::Forward f;
  ts::Backward g;
  ts::Bounds b;
  ctxpar::swa::impl::ReferenceResult<Scalar, Mem> single;
  ctxpar::swa::StepGradients<Scalar, Mem> single_g;
};

/// One step on every rank vs the oracle (out, dq, dk, dv, dk_cache, dv_cache) and vs the
/// single-rank step: out and dq bitwise, dk/dv within the oracle bound.
template <class C, class Policy, class Layout>
bool step_case(const ts::StreamSpec& spec, std::int64_t c, const Reference<C>& ref) {
  using Scalar = typename C::scalar_type;
  using Mem = typename C::memory_space;
  const auto& group = world();
  typename C::execution_space space;
  const std::int64_t t = spec.tokens - c;
  ctxpar::swa::Options o;
  o.window = spec.window;
  o.rope_base = spec.base;
  const auto& s = ref.s;
  auto sh = shards_of<Scalar, Mem>(s.problem, 0, c, t, group.rank(), group.size());
  const ctxpar::swa::StepShape plan_shape{spec.hq, spec.hkv, spec.dim};
  ctxpar::swa::StepPlan<Policy, Layout, typename C::execution_space, Scalar, Mem> plan(
      space, group, plan_shape, o);
  Result<Scalar, Mem> r;
  r.out = ctxpar::swa::allocate_output<Scalar, Mem>(plan_shape, sh.chunk.length());
  plan.forward(sh.chunk, sh.cache, r.out, r.next_cache, r.state);
  auto dout = ts::to_view<Scalar, Mem>(s.dout, sh.chunk_from, sh.chunk.length());
  const auto gr = ctxpar::swa::allocate_gradients(plan_shape, r.state);
  plan.backward(r.state, dout, {}, gr);
  const std::int64_t q0 = sh.chunk_from - c, tr = sh.chunk.length();
  auto slice = [&](const auto& v, std::int64_t from, std::int64_t n) {
    return ctxpar::swa::impl::tokens(v, from, n);
  };
  auto bitwise = [&](const char* what, const auto& a, const auto& e) {
    const bool same = ts::bitwise_equal(a, e);
    if (!same)
      std::cerr << "[rank " << group.rank() << "] " << what
                << " differs bitwise from the single-rank step\n";
    return same;
  };
  bool ok = ts::close_to("out", r.out, ref.f.out, ref.b.out, sh.chunk_from);
  ok = bitwise("out", r.out, slice(ref.single.out, q0, tr)) && ok;
  ok = ts::close_to("dq", gr.dq, ref.g.dq, ref.b.dq, sh.chunk_from) && ok;
  ok = bitwise("dq", gr.dq, slice(ref.single_g.dq, q0, tr)) && ok;
  ok = ts::close_to("dk", gr.dk, ref.g.dk, ref.b.dk, sh.chunk_from) && ok;
  ok = ts::close_to("dv", gr.dv, ref.g.dv, ref.b.dv, sh.chunk_from) && ok;
  ok = ts::close_to("dk_cache", gr.dk_cache, ref.g.dk, ref.b.dk, sh.cache_from) && ok;
  ok = ts::close_to("dv_cache", gr.dv_cache, ref.g.dv, ref.b.dv, sh.cache_from) && ok;
  // The next cache shard is the raw tail of the axis, split by BalancedChunks(n, P).
  const std::int64_t n = ctxpar::swa::next_cache_length(spec.window, spec.tokens);
  const BalancedChunks ns{n, group.size()};
  const auto nb = ns.begin(group.rank()), nn = ns.size(group.rank());
  if (r.next_cache.length() != nn) {
    std::cerr << "[rank " << group.rank() << "] next cache shard has " << r.next_cache.length()
              << " keys, expected " << nn << "\n";
    ok = false;
  } else {
    ok = bitwise("next cache k", r.next_cache.k, slice(ref.single.next_cache.k, nb, nn)) && ok;
    ok = bitwise("next cache v", r.next_cache.v, slice(ref.single.next_cache.v, nb, nn)) && ok;
    ok =
        bitwise("next cache pos", r.next_cache.pos, slice(ref.single.next_cache.pos, nb, nn)) && ok;
  }
  // Gathered rotated keys: bit-identical to rotating the whole axis at once.
  const std::int64_t origin = r.state.key_origin, nk = r.state.axis.length();
  ok = bitwise("rotated keys", r.state.axis.k, slice(ref.single.state.axis.k, origin, nk)) && ok;
  // The key/value records this rank owned for the step (rotated there, gradients summed there).
  const std::int64_t length = spec.tokens;
  std::vector<std::int64_t> owned;
  if constexpr (std::is_same_v<Layout, WholeAxisChunks>) {
    const BalancedChunks axis{length, group.size()};
    for (auto a = axis.begin(group.rank()); a < axis.end(group.rank()); ++a)
      owned.push_back(s.problem.pos[a]);
  } else {
    for (std::int64_t i = 0; i < sh.cache.length(); ++i)
      owned.push_back(s.problem.pos[sh.cache_from + i]);
    for (std::int64_t i = 0; i < sh.chunk.length(); ++i)
      owned.push_back(s.problem.pos[sh.chunk_from + i]);
  }
  auto own_pos = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), r.state.own_pos);
  bool owns = own_pos.extent(0) == owned.size();
  for (std::size_t i = 0; owns && i < owned.size(); ++i) owns = own_pos(i) == owned[i];
  if (!owns)
    std::cerr << "[rank " << group.rank() << "] owns " << own_pos.extent(0)
              << " key records, not the layout's " << owned.size() << "\n";
  ok = owns && ok;
  if (!ok)
    std::cerr << "  [rank " << group.rank() << "] " << name_of<Policy>() << " "
              << layout_name<Layout>() << " c=" << c << " t=" << t << " W=" << spec.window
              << " Hq=" << spec.hq << " Hkv=" << spec.hkv << "\n";
  return ok;
}

struct Variant {
  std::int64_t tokens, c, window, hq, hkv, dim, first, step;
  std::vector<std::int64_t> docs;
};

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {37, 0, 8, 4, 1, 16, 0, 1, {}},        // c = 0, Hq = 4 Hkv
      {20, 7, 8, 2, 1, 8, 100, 2, {3, 12}},  // positions from 100 with gaps, documents in cache and
                                             // chunk
      {2, 1, 3, 2, 2, 8, 5, 1, {}},          // L < P
      {10, 9, 10, 2, 1, 8, 0, 1, {}},        // t = 1 (decode)
      {20, 0, 1, 2, 2, 8, 0, 1, {}},         // W = 1
      {35, 10, 100, 2, 1, 8, 0, 1, {}},      // W >= L
      {42, 12, 0, 2, 1, 8, 0, 1, {20}},      // unlimited window
      {101, 31, 32, 4, 2, 16, 3, 1, {40, 41}},  // halos spanning several ranks, several key tiles
      {230, 100, 0, 2, 1, 8, 0, 1, {}},       // key tiles fully visible to query tiles (fast path)
      {230, 100, 140, 2, 1, 8, 0, 1, {170}},  // fast path next to a window edge and a document
      {150, 20, 100, 2, 1, 72, 0, 1, {}},     // D > 64 with a window (the host backward picks
                                              // its kernels by D, W and the vector width)
  };
  return v;
}

/// Every variant under the three policies and both layouts (the oracle computed once per
/// variant).
template <class C>
bool all_variants() {
  using Scalar = typename C::scalar_type;
  using Mem = typename C::memory_space;
  using namespace ctxpar::swa;
  typename C::execution_space space;
  bool ok = true;
  std::uint64_t seed = 100;
  for (const auto& v : variants()) {
    ts::StreamSpec spec;
    spec.tokens = v.tokens;
    spec.window = v.window;
    spec.hq = v.hq;
    spec.hkv = v.hkv;
    spec.dim = v.dim;
    spec.first_position = v.first;
    spec.position_step = v.step;
    spec.document_starts = v.docs;
    spec.seed = seed++;
    Reference<C> ref;
    ref.s = ts::make_stream<Scalar>(spec);
    for (std::int64_t i = 0; i < v.c; ++i)
      for (std::int64_t a = 0; a < spec.hq; ++a)
        for (std::int64_t d = 0; d < spec.dim; ++d) ref.s.dout(i, a, d) = 0;
    ref.f = ts::forward(ref.s.problem);
    ref.g = ts::backward(ref.s.problem, ref.f, ref.s.dout);
    // Under `automatic`, 16-bit tensors on a device with tensor cores take the tensor-core
    // kernels, which round each product operand (the softmax weights too) before multiplying.
    const bool tensor_cores = impl::runs_tensor_core_kernels<typename C::execution_space, Scalar>(
        KernelChoice::automatic, spec.dim);
    ref.b = ts::bounds(ref.s.problem, ref.f, ref.s.dout,
                       tensor_cores ? ctxpar::test::tensor_core_roundoff<Scalar>()
                                    : ctxpar::test::roundoff<Scalar>());
    Options o;
    o.window = spec.window;
    o.rope_base = spec.base;
    const std::int64_t t = v.tokens - v.c;
    ref.single =
        impl::reference_step_forward(space, ts::chunk_of<Scalar, Mem>(ref.s.problem, v.c, t),
                                     ts::block_of<Scalar, Mem>(ref.s.problem, 0, v.c), o);
    ref.single_g = impl::reference_step_backward(space, ref.single.state,
                                                 ts::to_view<Scalar, Mem>(ref.s.dout, v.c, t));
    ok = step_case<C, RopeBeforeGather, SegmentChunks>(spec, v.c, ref) && ok;
    ok = step_case<C, RopeAfterGather, SegmentChunks>(spec, v.c, ref) && ok;
    ok = step_case<C, HaloKV, SegmentChunks>(spec, v.c, ref) && ok;
    ok = step_case<C, RopeBeforeGather, WholeAxisChunks>(spec, v.c, ref) && ok;
    ok = step_case<C, RopeAfterGather, WholeAxisChunks>(spec, v.c, ref) && ok;
    ok = step_case<C, HaloKV, WholeAxisChunks>(spec, v.c, ref) && ok;
  }
  return ok;
}

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(every_policy_and_layout_matches_oracle_and_single_rank, C,
                              ctxpar::test::cases) {
  CTXPAR_TEST_ALL(world(), (all_variants<C>()));
}

// bfloat16 and float16 tensors (stored and exchanged in 16 bits, computed in fp32): within the
// oracle's bound for 16-bit storage and fp32 arithmetic, and the forward and dq bitwise the
// single-rank step's, as in fp32.
BOOST_AUTO_TEST_CASE_TEMPLATE(sixteen_bit_storage_matches_oracle_and_single_rank, C,
                              ctxpar::test::narrow_cases) {
  CTXPAR_TEST_ALL(world(), (all_variants<C>()));
}

namespace {

/// Which key/value layout each streamed step uses: both layouts carry the same cache shards, so
/// a stream may switch between them.
enum class LayoutPlan { segment, whole_axis, alternating };

/// 22 streamed steps with the sharded cache carried between them equal one dense pass over the
/// whole stream (forward, and the whole stream's gradients through the chained backward); the
/// forward is bitwise the single-rank streamed forward.
template <class C, class Policy>
bool stream_case(LayoutPlan plan) {
  using Scalar = typename C::scalar_type;
  using Mem = typename C::memory_space;
  const auto& group = world();
  typename C::execution_space space;
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
  const std::int64_t step = 5;
  using Exec = typename C::execution_space;
  // One plan per layout serves every step; each step keeps its own state. The cache objects
  // alternate (a step's next cache is the following step's input).
  ctxpar::swa::StepPlan<Policy, SegmentChunks, Exec, Scalar, Mem> segment_plan(
      space, group, {spec.hq, spec.hkv, spec.dim}, o);
  ctxpar::swa::StepPlan<Policy, WholeAxisChunks, Exec, Scalar, Mem> whole_plan(
      space, group, {spec.hq, spec.hkv, spec.dim}, o);
  std::vector<ctxpar::swa::DistributedState<Scalar, Mem>> states;
  std::vector<bool> wholes;
  std::vector<std::int64_t> froms;
  ctxpar::swa::Cache<Scalar, Mem> caches[2] = {ts::block_of<Scalar, Mem>(s.problem, 0, 0), {}};
  auto single_cache = caches[0];
  bool ok = true;
  std::int64_t c = 0;
  for (std::int64_t from = 0, k = 0; from < spec.tokens; from += step, ++k) {
    const std::int64_t t = std::min(step, spec.tokens - from);
    auto sh = shards_of<Scalar, Mem>(s.problem, from - c, c, t, group.rank(), group.size());
    const bool whole =
        plan == LayoutPlan::whole_axis || (plan == LayoutPlan::alternating && k % 2 == 1);
    Result<Scalar, Mem> r;
    r.out = ctxpar::swa::allocate_output<Scalar, Mem>(whole_plan.shape(), sh.chunk.length());
    const auto& cache = caches[k % 2];
    auto& next = caches[(k + 1) % 2];
    if (whole)
      whole_plan.forward(sh.chunk, cache, r.out, next, r.state);
    else
      segment_plan.forward(sh.chunk, cache, r.out, next, r.state);
    auto single = ctxpar::swa::impl::reference_step_forward(
        space, ts::chunk_of<Scalar, Mem>(s.problem, from, t), single_cache, o);
    ok = ts::close_to("streamed out", r.out, f.out, b.out, sh.chunk_from) && ok;
    ok = ts::bitwise_equal(r.out, ctxpar::swa::impl::tokens(single.out, sh.chunk_from - from,
                                                            sh.chunk.length())) &&
         ok;
    single_cache = single.next_cache;
    c = ctxpar::swa::next_cache_length(spec.window, c + t);
    states.push_back(r.state);
    wholes.push_back(whole);
    froms.push_back(sh.chunk_from);
  }
  ctxpar::swa::CacheGradient<Scalar, Mem> carried;
  for (std::size_t k = states.size(); k-- > 0;) {
    const auto& st = states[k];
    const auto gr = ctxpar::swa::allocate_gradients(whole_plan.shape(), st);
    const auto dout = ts::to_view<Scalar, Mem>(s.dout, froms[k], st.q_rot.extent(0));
    if (wholes[k])
      whole_plan.backward(st, dout, carried, gr);
    else
      segment_plan.backward(st, dout, carried, gr);
    ok = ts::close_to("streamed dq", gr.dq, g.dq, b.dq, froms[k]) && ok;
    ok = ts::close_to("streamed dk", gr.dk, g.dk, b.dk, froms[k]) && ok;
    ok = ts::close_to("streamed dv", gr.dv, g.dv, b.dv, froms[k]) && ok;
    carried.dk = gr.dk_cache;
    carried.dv = gr.dv_cache;
  }
  ok = ok && states.size() >= 20;
  if (!ok)
    std::cerr << "  [rank " << group.rank() << "] stream " << name_of<Policy>() << " layout plan "
              << static_cast<int>(plan) << "\n";
  return ok;
}

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(streamed_steps_equal_one_dense_pass_on_every_rank, C,
                              ctxpar::test::cases) {
  using namespace ctxpar::swa;
  // Streams dominate the suite's time: the all-whole-axis stream runs on the default execution
  // space only; the alternating one (every other step whole-axis) runs everywhere.
  std::vector<LayoutPlan> plans = {LayoutPlan::segment, LayoutPlan::alternating};
  if (std::is_same_v<typename C::execution_space, Kokkos::DefaultExecutionSpace>)
    plans.push_back(LayoutPlan::whole_axis);
  bool ok = true;
  for (auto plan : plans) {
    ok = stream_case<C, RopeBeforeGather>(plan) && ok;
    ok = stream_case<C, RopeAfterGather>(plan) && ok;
    ok = stream_case<C, HaloKV>(plan) && ok;
  }
  CTXPAR_TEST_ALL(world(), ok);
}
