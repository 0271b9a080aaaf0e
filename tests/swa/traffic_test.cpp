// Exact byte counters of each policy under both key/value layouts, forward and backward, against
// formulas computed here from the sharding rules alone (independent owner functions, not the
// library's plans).
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <iostream>

#include "ctxpar/swa/distributed_step.hpp"
#include "ctxpar_test/harness.hpp"
#include "fixtures.hpp"

namespace ts = ctxpar::test::swa;
using ctxpar::BalancedChunks;
using ctxpar::CollectiveKind;
using ctxpar::test::world;

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Scalar = float;

/// The sharding rules in plain words. The caller's shards: cache keys [0, c) split like
/// torch.chunk(c, P), then chunk tokens split like torch.chunk(t, P). The key/value owners of the
/// step: the same (per segment), or the whole axis [0, c + t) split like torch.chunk(c + t, P).
struct Rule {
  std::int64_t c, t;
  int p;
  bool whole;
  static int owner_in(std::int64_t i, std::int64_t n, int p) {
    const std::int64_t s = (n + p - 1) / p;
    return static_cast<int>(i / s);
  }
  int input_owner(std::int64_t a) const {
    return a < c ? owner_in(a, c, p) : owner_in(a - c, t, p);
  }
  int owner(std::int64_t a) const { return whole ? owner_in(a, c + t, p) : input_owner(a); }
  std::int64_t records(int r) const {
    std::int64_t n = 0;
    for (std::int64_t a = 0; a < c + t; ++a) n += owner(a) == r;
    return n;
  }
};

struct Expected {
  std::int64_t sent = 0, received = 0;
};

bool counters_match(const char* what, const ctxpar::Traffic& got, const Expected& e,
                    bool expect_calls) {
  const bool ok = got.bytes_sent == e.sent && got.bytes_received == e.received &&
                  (expect_calls || got.calls == 0);
  if (!ok)
    std::cerr << "[rank " << world().rank() << "] " << what << ": sent " << got.bytes_sent
              << " (formula " << e.sent << "), received " << got.bytes_received << " (formula "
              << e.received << "), calls " << got.calls << "\n";
  return ok;
}

bool expect_calls(const char* what, const ctxpar::Traffic& got, std::int64_t calls) {
  const bool ok = got.calls == calls;
  if (!ok)
    std::cerr << "[rank " << world().rank() << "] " << what << ": " << got.calls << " calls ("
              << calls << " expected)\n";
  return ok;
}

template <class Policy, class Layout>
bool traffic_case(std::int64_t c, std::int64_t t, std::int64_t window) {
  const auto& g = world();
  const int p = g.size(), me = g.rank();
  Exec space;
  ts::StreamSpec spec;
  spec.tokens = c + t;
  spec.window = window;
  spec.hq = 4;
  spec.hkv = 2;
  spec.dim = 8;
  spec.document_starts = {3};
  auto s = ts::make_stream<Scalar>(spec);
  const BalancedChunks cs{c, p}, tc{t, p};
  auto cache = ts::block_of<Scalar, Mem>(s.problem, cs.begin(me), cs.size(me));
  auto chunk = ts::chunk_of<Scalar, Mem>(s.problem, c + tc.begin(me), tc.size(me));
  ctxpar::swa::Options o;
  o.window = window;

  constexpr bool whole = std::is_same_v<Layout, ctxpar::swa::WholeAxisChunks>;
  const Rule rule{c, t, p, whole};
  const std::int64_t length = c + t, hd = spec.hkv * spec.dim;
  const std::int64_t record = 2 * hd * sizeof(Scalar) + 16, grad = 2 * hd * sizeof(Scalar);
  const std::int64_t n = window > 0 ? std::min(window - 1, length) : length;
  const BalancedChunks next{n, p};
  auto new_owner = [&](std::int64_t a) { return Rule::owner_in(a - (length - n), n, p); };
  // Next-cache re-sharding: records that change owner (always from the caller's shards).
  Expected reshard;
  for (std::int64_t a = length - n; a < length; ++a) {
    if (rule.input_owner(a) == me && new_owner(a) != me) reshard.sent += 1;
    if (rule.input_owner(a) != me && new_owner(a) == me) reshard.received += 1;
  }
  // Whole-axis assembly: records whose key/value owner is not the rank that handed them in.
  Expected assembly;
  for (std::int64_t a = 0; whole && a < length; ++a) {
    if (rule.input_owner(a) == me && rule.owner(a) != me) assembly.sent += 1;
    if (rule.input_owner(a) != me && rule.owner(a) == me) assembly.received += 1;
  }
  // Halo: the W - 1 axis tokens before each rank's first query and its queries' own keys, from
  // their key/value owners.
  Expected halo;
  for (int r = 0; r < p; ++r) {
    if (tc.size(r) == 0) continue;
    const std::int64_t first = c + tc.begin(r);
    const std::int64_t lo = window > 0 ? std::max<std::int64_t>(0, first - (window - 1)) : 0;
    for (std::int64_t a = lo; a < first + tc.size(r); ++a) {
      if (r == me && rule.owner(a) != me) halo.received += 1;
      if (r != me && rule.owner(a) == me) halo.sent += 1;
    }
  }
  const std::int64_t own = rule.records(me);
  constexpr bool gather = !std::is_same_v<Policy, ctxpar::swa::HaloKV>;
  constexpr bool after = std::is_same_v<Policy, ctxpar::swa::RopeAfterGather>;
  // One rank alone gathers nothing and reduce-scatters nothing: its axis is its own tokens, read
  // in place, and their gradients go straight to them.
  const bool gathers = gather && p > 1;

  // The plan is built once, before the counted window: its constructor agrees on the shape and
  // options (one broadcast and one all-reduce of verdicts) and moves no data.
  g.reset_traffic();
  ctxpar::swa::StepPlan<Policy, Layout, Exec, Scalar, Mem> plan(
      space, g, ctxpar::swa::StepShape{spec.hq, spec.hkv, spec.dim}, o);
  bool ok = true;
  ok = counters_match("plan data", g.total_data_traffic(), {}, false) && ok;
  ok = expect_calls("plan agreement", g.traffic(CollectiveKind::agreement), 2) && ok;

  const auto out = ctxpar::swa::allocate_output<Scalar, Mem>(plan.shape(), chunk.length());
  ctxpar::swa::Cache<Scalar, Mem> next_cache;
  ctxpar::swa::DistributedState<Scalar, Mem> state;
  const auto grads =
      ctxpar::swa::allocate_gradients<Scalar, Mem>(plan.shape(), chunk.length(), cache.length());
  ctxpar::swa::CacheGradient<Scalar, Mem> d_next;
  d_next.dk = ctxpar::swa::Tensor<Scalar, Mem>("dk_next", next.size(me), spec.hkv, spec.dim);
  d_next.dv = ctxpar::swa::Tensor<Scalar, Mem>("dv_next", next.size(me), spec.hkv, spec.dim);
  const auto dout = ts::to_view<Scalar, Mem>(s.dout, c + tc.begin(me), tc.size(me));
  // The first call builds the state's exchange tables; the repeat reuses them. Both move exactly
  // the same bytes.
  for (int call = 0; call < 2; ++call) {
    g.reset_traffic();
    plan.forward(chunk, cache, out, next_cache, state);
    // Per call, besides the data: the inputs' facts (one all-gather) and the verdict (one
    // all-reduce).
    ok = expect_calls("forward agreement", g.traffic(CollectiveKind::agreement), 2) && ok;
    if (gathers) {
      ok = counters_match("forward allgather", g.traffic(CollectiveKind::allgather),
                          {own * record * (p - 1), (length - own) * record}, true) &&
           ok;
      ok = g.traffic(CollectiveKind::allgather).calls == 1 && ok;
      ok = counters_match("forward sendrecv", g.traffic(CollectiveKind::sendrecv), {}, false) && ok;
    } else {
      ok = counters_match("forward allgather", g.traffic(CollectiveKind::allgather), {}, false) &&
           ok;
      if (gather)
        ok = counters_match("forward sendrecv", g.traffic(CollectiveKind::sendrecv), {}, false) &&
             ok;
      else
        ok = counters_match("forward halo", g.traffic(CollectiveKind::sendrecv),
                            {halo.sent * record, halo.received * record}, true) &&
             ok;
    }
    // One all-to-all: the next cache (not under RopeAfterGather, which cuts it from the gathered
    // raw axis) fused with the whole-axis assembly.
    const Expected forward_moves{(after ? 0 : reshard.sent) + assembly.sent,
                                 (after ? 0 : reshard.received) + assembly.received};
    if (after && !whole) {
      ok = counters_match("forward next cache", g.traffic(CollectiveKind::alltoall), {}, false) &&
           ok;
    } else {
      ok = counters_match("forward next cache + assembly", g.traffic(CollectiveKind::alltoall),
                          {forward_moves.sent * record, forward_moves.received * record}, true) &&
           ok;
      ok = g.traffic(CollectiveKind::alltoall).calls == 1 && ok;
    }

    g.reset_traffic();
    plan.backward(state, dout, d_next, grads);
    // Per call: the agreement on whether a next-cache gradient is given (one broadcast) and the
    // verdict (one all-reduce); under the all-gather policies the reduce-scatter agrees on its
    // counts as well (one broadcast, one all-reduce).
    ok =
        expect_calls("backward agreement", g.traffic(CollectiveKind::agreement), gathers ? 4 : 2) &&
        ok;
    if (gathers) {
      const std::int64_t total = length * grad;
      ok = counters_match("backward reduce_scatter", g.traffic(CollectiveKind::reduce_scatter),
                          {total - own * grad, own * grad * (p - 1)}, true) &&
           ok;
    } else if (gather) {
      ok = counters_match("backward reduce_scatter", g.traffic(CollectiveKind::reduce_scatter), {},
                          false) &&
           ok;
    } else {
      ok = counters_match("backward halo", g.traffic(CollectiveKind::sendrecv),
                          {halo.received * grad, halo.sent * grad}, true) &&
           ok;
    }
    ok = counters_match(
             "backward next cache + assembly", g.traffic(CollectiveKind::alltoall),
             {(reshard.received + assembly.received) * grad, (reshard.sent + assembly.sent) * grad},
             true) &&
         ok;
    ok = g.traffic(CollectiveKind::alltoall).calls == 1 && ok;
    // (No early exit on failure: the other ranks still run the next call's collectives.)
    if (!ok) std::cerr << "  [rank " << me << "] call " << call << "\n";
  }
  if (!ok)
    std::cerr << "  [rank " << me << "] c=" << c << " t=" << t << " W=" << window
              << (whole ? " WholeAxisChunks" : " SegmentChunks") << "\n";
  return ok;
}

template <class Policy, class Layout>
bool traffic_cases() {
  bool ok = true;
  ok = traffic_case<Policy, Layout>(7, 30, 8) && ok;   // small shards: halos span several ranks
  ok = traffic_case<Policy, Layout>(0, 25, 4) && ok;   // first step
  ok = traffic_case<Policy, Layout>(15, 48, 0) && ok;  // unlimited window: everything before
  ok = traffic_case<Policy, Layout>(2, 1, 4) && ok;    // L < P
  ok = traffic_case<Policy, Layout>(8, 5, 9) && ok;    // cache longer than the chunk
  return ok;
}

}  // namespace

BOOST_AUTO_TEST_CASE(byte_counters_equal_their_formulas) {
  using namespace ctxpar::swa;
  bool ok = traffic_cases<RopeBeforeGather, SegmentChunks>();
  ok = traffic_cases<RopeAfterGather, SegmentChunks>() && ok;
  ok = traffic_cases<HaloKV, SegmentChunks>() && ok;
  ok = traffic_cases<RopeBeforeGather, WholeAxisChunks>() && ok;
  ok = traffic_cases<RopeAfterGather, WholeAxisChunks>() && ok;
  ok = traffic_cases<HaloKV, WholeAxisChunks>() && ok;
  CTXPAR_TEST_ALL(world(), ok);
}
