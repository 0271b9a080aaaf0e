/// \file
/// The context-parallel sliding-window attention step: the key/value axis `cache ++ chunk` and the
/// queries are sharded over the ranks of a `Group`; the policy tag chooses how keys reach the
/// queries that need them (`RopeBeforeGather`, `RopeAfterGather`, `HaloKV`).
#pragma once

#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "ctxpar/comm/allgather.hpp"
#include "ctxpar/comm/alltoall.hpp"
#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar/comm/reduce.hpp"
#include "ctxpar/comm/sendrecv.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/view_checks.hpp"
#include "ctxpar/partition/balanced_chunks.hpp"
#include "ctxpar/swa/attention_kernel.hpp"
#include "ctxpar/swa/cache.hpp"
#include "ctxpar/swa/impl/axis.hpp"
#include "ctxpar/swa/impl/layout.hpp"
#include "ctxpar/swa/impl/records.hpp"
#include "ctxpar/swa/impl/validate.hpp"
#include "ctxpar/swa/options.hpp"
#include "ctxpar/swa/policies.hpp"
#include "ctxpar/swa/rope.hpp"
#include "ctxpar/swa/step.hpp"
#include "ctxpar/swa/tensors.hpp"
#include "ctxpar/swa/window_mask.hpp"

namespace ctxpar::swa {

/// What the distributed backward needs from the distributed forward, on one rank.
template <class Scalar, class MemorySpace>
struct DistributedState {
  /// This rank's rotated queries `[t_r, Hq, D]`, positions and ids.
  Tensor<Scalar, MemorySpace> q_rot;
  /// Positions of this rank's queries.
  Positions<MemorySpace> q_pos;
  /// Ids of this rank's queries (or empty).
  Ids<MemorySpace> q_ids;
  /// The keys this rank's kernel saw: the whole gathered axis (all-gather policies) or its halo
  /// plus its own chunk keys (`HaloKV`); rotated keys, values, positions, ids.
  KvBlock<Scalar, MemorySpace> axis;
  /// Index of `axis` token 0 on the whole axis.
  std::int64_t key_origin = 0;
  /// Forward output of this rank's queries and the row log-sum-exp.
  Tensor<Scalar, MemorySpace> out;
  /// Row log-sum-exp `[t_r, Hq]`.
  Kokkos::View<accumulator_t<Scalar>**, Kokkos::LayoutRight, MemorySpace> lse;
  /// Options of the forward and the scale in use.
  Options options;
  /// Softmax scale in use.
  double scale = 1.0;
  /// Lengths of the whole cache and chunk of this step.
  impl::AxisLayout layout;
  /// Length of the whole next cache.
  std::int64_t next_cache_length = 0;
  /// Positions of this rank's key/value records (its axis tokens under the layout in use), for
  /// the RoPE backward.
  Positions<MemorySpace> own_pos;
  /// Axis token -> gathered record (all-gather) or halo slot / own record (`HaloKV`).
  impl::Index<MemorySpace> axis_source;
  /// The halo exchange (`HaloKV`).
  impl::ExchangePlan halo;
  /// The next-cache exchange (from the caller's per-segment shards).
  impl::ExchangePlan reshard;
  /// `WholeAxisChunks`: the move of the caller's shards onto the whole-axis owners.
  impl::ExchangePlan assembly;
  /// Device copy of the halo plan's records to send.
  impl::Index<MemorySpace> halo_send_records;
  /// Device copy of the next-cache plan's source records.
  impl::Index<MemorySpace> reshard_source;
  /// Device copy of the next-cache plan's records to send.
  impl::Index<MemorySpace> reshard_send_records;
  /// 0: RopeBeforeGather, 1: RopeAfterGather, 2: HaloKV.
  int policy = 0;
  /// True under `WholeAxisChunks` (also recorded in `layout.whole_axis`).
  bool whole_axis = false;
};

/// Result of a distributed forward step on one rank.
template <class Scalar, class MemorySpace>
struct DistributedResult {
  /// Output of this rank's queries `[t_r, Hq, D]`.
  Tensor<Scalar, MemorySpace> out;
  /// This rank's shard of the next cache (raw), split by `BalancedChunks(n, P)`.
  Cache<Scalar, MemorySpace> next_cache;
  /// Saved for the backward.
  DistributedState<Scalar, MemorySpace> state;
};

namespace impl {

template <class Policy>
constexpr int policy_id() {
  if constexpr (std::is_same_v<Policy, RopeBeforeGather>) return 0;
  if constexpr (std::is_same_v<Policy, RopeAfterGather>) return 1;
  return 2;
}

/// A plan that moves nothing (the missing half of a fused exchange).
inline ExchangePlan empty_plan(int ranks) {
  ExchangePlan plan;
  plan.send_counts.assign(static_cast<std::size_t>(ranks), 0);
  plan.recv_counts.assign(static_cast<std::size_t>(ranks), 0);
  return plan;
}

inline std::int64_t bits_of(double x) {
  std::int64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

/// Point-to-point exchange of packed blocks: `send_counts[j]` elements (rank-major in `send`) go to
/// rank `j`, `recv_counts[i]` come from rank `i`. Round `d` pairs each rank with `rank + d`
/// (sending) and `rank - d` (receiving); pairs with nothing to move skip the round.
template <class ExecutionSpace, class SendView, class RecvView>
void exchange_pairwise(const ExecutionSpace& space, const Group& group, const SendView& send,
                       const std::vector<int>& send_counts, const RecvView& recv,
                       const std::vector<int>& recv_counts) {
  const int p = group.size(), me = group.rank();
  std::vector<std::int64_t> sd(p, 0), rd(p, 0);
  for (int i = 1; i < p; ++i) {
    sd[i] = sd[i - 1] + send_counts[i - 1];
    rd[i] = rd[i - 1] + recv_counts[i - 1];
  }
  for (int d = 1; d < p; ++d) {
    const int dest = (me + d) % p, source = (me - d + p) % p;
    const std::int64_t sc = send_counts[dest], rc = recv_counts[source];
    if (sc == 0 && rc == 0) continue;
    auto s = Kokkos::subview(send, std::make_pair(sd[dest], sd[dest] + sc));
    auto r = Kokkos::subview(recv, std::make_pair(rd[source], rd[source] + rc));
    sendrecv(space, group, s, sc > 0 ? dest : no_rank, r, rc > 0 ? source : no_rank, d);
  }
}

inline std::vector<int> scaled(const std::vector<int>& counts, std::int64_t factor) {
  std::vector<int> out(counts.size());
  for (std::size_t i = 0; i < counts.size(); ++i) out[i] = static_cast<int>(counts[i] * factor);
  return out;
}

/// Collective checks of the distributed forward, agreed before any data moves. Returns the
/// layout of the step.
template <class Scalar, class MemorySpace>
AxisLayout agree_on_inputs(const Group& group, const Chunk<Scalar, MemorySpace>& chunk,
                           std::int64_t chunk_length, const Cache<Scalar, MemorySpace>& cache,
                           const Options& options, int policy, bool whole_axis, bool& with_ids) {
  Preconditions chk(group, "ctxpar::swa::forward");
  impl::check_inputs(chk, chunk, cache, options);
  const int p = group.size(), me = group.rank();
  auto first = [](const Positions<MemorySpace>& pos, bool last) -> std::int64_t {
    if (pos.extent(0) == 0) return 0;
    std::int64_t v = 0;
    Kokkos::deep_copy(Kokkos::View<std::int64_t, Kokkos::HostSpace>(&v),
                      Kokkos::subview(pos, last ? pos.extent(0) - 1 : 0));
    return v;
  };
  constexpr int fields = 7;
  std::int64_t mine[fields] = {static_cast<std::int64_t>(cache.pos.extent(0)),
                               first(cache.pos, false),
                               first(cache.pos, true),
                               static_cast<std::int64_t>(chunk.pos.extent(0)),
                               first(chunk.pos, false),
                               first(chunk.pos, true),
                               chunk.ids.extent(0) > 0 || cache.ids.extent(0) > 0 ? 1 : 0};
  std::vector<std::int64_t> all(static_cast<std::size_t>(fields * p));
  MPI_Allgather(mine, fields, MPI_INT64_T, all.data(), fields, MPI_INT64_T, group.mpi_comm());
  group.record(CollectiveKind::agreement, 0, 0);
  auto at = [&](int r, int f) { return all[static_cast<std::size_t>(r * fields + f)]; };
  std::int64_t c = 0, any_ids = 0;
  for (int r = 0; r < p; ++r) {
    c += at(r, 0);
    if (at(r, 0) + at(r, 3) > 0) any_ids = any_ids || at(r, 6);
  }
  chk.require(
      options.window == 0 || c <= options.window - 1, "the cache must not be longer than W - 1",
      "at most " + std::to_string(options.window - 1), std::to_string(c) + " keys over all ranks");
  const BalancedChunks chunks{chunk_length, p}, caches{c, p};
  chk.require(
      at(me, 3) == chunks.size(me),
      "this rank's chunk shard must hold its BalancedChunks(t, P) share",
      std::to_string(chunks.size(me)) + " tokens (t = " + std::to_string(chunk_length) + ")",
      std::to_string(at(me, 3)));
  chk.require(at(me, 0) == caches.size(me),
              "this rank's cache shard must hold its BalancedChunks(c, P) share",
              std::to_string(caches.size(me)) + " keys (c = " + std::to_string(c) + ")",
              std::to_string(at(me, 0)));
  if (at(me, 0) > 0) {
    for (int q = me - 1; q >= 0; --q)
      if (at(q, 0) > 0) {
        chk.require(
            at(me, 1) > at(q, 2),
            "positions must be strictly increasing along the key/value axis across shard borders",
            "first cache position > " + std::to_string(at(q, 2)) + " (rank " + std::to_string(q) +
                ")",
            std::to_string(at(me, 1)));
        break;
      }
  }
  if (at(me, 3) > 0) {
    bool found = false;
    for (int q = me - 1; q >= 0 && !found; --q)
      if (at(q, 3) > 0) {
        chk.require(
            at(me, 4) > at(q, 5),
            "positions must be strictly increasing along the key/value axis across shard borders",
            "first chunk position > " + std::to_string(at(q, 5)) + " (rank " + std::to_string(q) +
                ")",
            std::to_string(at(me, 4)));
        found = true;
      }
    for (int q = p - 1; q >= 0 && !found; --q)
      if (at(q, 0) > 0) {
        chk.require(
            at(me, 4) > at(q, 2),
            "positions must be strictly increasing along the key/value axis (cache before chunk)",
            "first chunk position > last cache position " + std::to_string(at(q, 2)),
            std::to_string(at(me, 4)));
        found = true;
      }
  }
  chk.require(cache.length() == 0 || chunk.length() == 0 ||
                  (cache.ids.extent(0) > 0) == (chunk.ids.extent(0) > 0),
              "ids must be given for both the cache and the chunk shard, or for neither",
              chunk.ids.extent(0) > 0 ? "cache ids" : "no cache ids",
              cache.ids.extent(0) > 0 ? "cache ids" : "none");
  if (at(me, 0) + at(me, 3) > 0)
    chk.require(at(me, 6) == any_ids, "ids must be given on every rank or on none",
                any_ids ? "ids" : "no ids", at(me, 6) ? "ids" : "no ids");
  chk.require_same("the window", options.window)
      .require_same("the head dimension", static_cast<std::int64_t>(chunk.q.extent(2)))
      .require_same("the query head count", static_cast<std::int64_t>(chunk.q.extent(1)))
      .require_same("the key/value head count", static_cast<std::int64_t>(chunk.k.extent(1)))
      .require_same("the chunk length", chunk_length)
      .require_same("the RoPE base", bits_of(options.rope_base))
      .require_same("the softmax scale", bits_of(options.scale))
      .require_same("the policy", policy)
      .require_same("the key/value layout", whole_axis ? 1 : 0);
  chk.agree();
  with_ids = any_ids != 0;
  AxisLayout layout;
  layout.cache = c;
  layout.chunk = chunk_length;
  layout.ranks = p;
  layout.whole_axis = whole_axis;
  return layout;
}

}  // namespace impl

/// Forward of one context-parallel streaming step. Collective over `group`.
///
/// Every rank passes its shard of the chunk — tokens `BalancedChunks(t, P)` of the `t =
/// chunk_length` chunk tokens: raw q, k, v, positions, ids — and its shard of the carried cache
/// (`BalancedChunks(c, P)` of the `c` cached keys, raw). The key/value axis is `cache ++ chunk`;
/// each rank computes the outputs of its own queries. The returned next cache is sharded by
/// `BalancedChunks(n, P)` over the last `n = min(W-1, c+t)` axis tokens, so the persistent state of
/// a rank is `O((W + t) / P)`. Communication per call (besides the precondition agreement):
/// - `RopeBeforeGather`: one all-gather of rotated K | V | pos | id records, and one all-to-all of
///   the raw records of the next cache's shards (at most `W - 1` tokens in all);
/// - `RopeAfterGather`: one all-gather of raw records, nothing else (the next cache is cut
/// locally);
/// - `HaloKV`: point-to-point messages of the `W - 1` rotated records before each rank's first
/// query
///   (from whichever ranks own them), and the next-cache all-to-all.
/// Under the `WholeAxisChunks` layout the key/value records are first moved onto the owners of
/// `BalancedChunks(L, P)` (one all-to-all, fused with the next-cache re-shard, so the forward
/// still has one all-to-all), and the all-gather / halo above move those records.
/// Forward outputs are bitwise identical for every rank count, policy and layout (same key tiles
/// and summation order per query). Bad input on any rank makes every rank throw the same
/// `ctxpar::Error` before any data moves.
template <class Policy = RopeBeforeGather, class Layout = SegmentChunks, class ExecutionSpace,
          class Scalar, class MemorySpace>
DistributedResult<Scalar, MemorySpace> forward(const ExecutionSpace& space, const Group& group,
                                               const Chunk<Scalar, MemorySpace>& chunk,
                                               std::int64_t chunk_length,
                                               const Cache<Scalar, MemorySpace>& cache,
                                               const Options& options, Policy = Policy{},
                                               Layout = Layout{}) {
  static_assert(
      is_policy_v<Policy>,
      "ctxpar::swa::forward: the policy must be RopeBeforeGather, RopeAfterGather or HaloKV");
  static_assert(is_kv_layout_v<Layout>,
                "ctxpar::swa::forward: the layout must be SegmentChunks or WholeAxisChunks");
  constexpr bool whole = std::is_same_v<Layout, WholeAxisChunks>;
  using tensor_type = Tensor<Scalar, MemorySpace>;
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::swa::forward", ExecutionSpace, tensor_type);
  compat::ScopedRegion region("ctxpar::swa::forward");
  constexpr int policy = impl::policy_id<Policy>();
  bool with_ids = false;
  const impl::AxisLayout layout =
      impl::agree_on_inputs(group, chunk, chunk_length, cache, options, policy, whole, with_ids);
  const int me = group.rank();
  const std::int64_t hq = chunk.q.extent(1), hkv = chunk.k.extent(1), dim = chunk.q.extent(2);
  const std::int64_t c_r = cache.length(), t_r = chunk.length(), n_in = c_r + t_r;
  const std::int64_t n_r = layout.records(me);
  const std::int64_t bytes = impl::record_bytes<Scalar>(hkv, dim);

  DistributedResult<Scalar, MemorySpace> result;
  DistributedState<Scalar, MemorySpace>& st = result.state;
  st.options = options;
  st.scale = impl::effective_scale(options, dim);
  st.layout = layout;
  st.policy = policy;
  st.whole_axis = whole;
  st.next_cache_length = next_cache_length(options.window, layout.length());

  // The caller's records: its cache shard then its chunk shard, raw.
  KvBlock<Scalar, MemorySpace> input =
      allocate_block<Scalar, MemorySpace>(n_in, hkv, dim, with_ids, "ctxpar::swa::input");
  impl::copy_tokens(space, input.k, 0, cache.k, 0, c_r);
  impl::copy_tokens(space, input.k, c_r, chunk.k, 0, t_r);
  impl::copy_tokens(space, input.v, 0, cache.v, 0, c_r);
  impl::copy_tokens(space, input.v, c_r, chunk.v, 0, t_r);
  impl::copy_tokens(space, input.pos, 0, cache.pos, 0, c_r);
  impl::copy_tokens(space, input.pos, c_r, chunk.pos, 0, t_r);
  if (with_ids) {
    if (cache.ids.extent(0) > 0) impl::copy_tokens(space, input.ids, 0, cache.ids, 0, c_r);
    if (chunk.ids.extent(0) > 0) impl::copy_tokens(space, input.ids, c_r, chunk.ids, 0, t_r);
  }

  // The next cache, re-sharded by BalancedChunks(n, P) over the last n axis tokens, always from
  // the caller's raw records (so both layouts carry the same state between steps).
  const std::int64_t n = st.next_cache_length;
  const impl::AxisLayout segments = layout.per_segment();
  st.reshard =
      impl::make_plan(segments, me, [&](int r) { return impl::next_cache_range(layout, n, r); });
  st.reshard_source =
      impl::to_device<MemorySpace>(st.reshard.source, "ctxpar::swa::reshard_source");
  st.reshard_send_records =
      impl::to_device<MemorySpace>(st.reshard.send_records, "ctxpar::swa::reshard_send_records");
  const std::int64_t n_next = st.reshard.hi - st.reshard.lo;
  result.next_cache =
      allocate_block<Scalar, MemorySpace>(n_next, hkv, dim, with_ids, "ctxpar::swa::next_cache");

  // This rank's key/value records under the layout in use.
  KvBlock<Scalar, MemorySpace> own = input;
  if constexpr (whole) {
    // One all-to-all: records onto their whole-axis owners, and the next cache's raw records.
    st.assembly = impl::make_plan(segments, me, [&](int r) { return layout.axis_range(r); });
    const impl::FusedPlan fused =
        impl::fuse(st.assembly, policy == 1 ? impl::empty_plan(layout.ranks) : st.reshard);
    impl::Bytes<MemorySpace> send(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::assembly_send")),
        fused.send_total() * bytes);
    impl::Bytes<MemorySpace> recv(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::assembly_recv")),
        fused.recv_total() * bytes);
    impl::pack_records(
        space, input,
        impl::to_device<MemorySpace>(fused.send_records, "ctxpar::swa::assembly_send_records"),
        fused.send_total(), send);
    alltoallv(space, group, send, impl::scaled(fused.send_counts, bytes), recv,
              impl::scaled(fused.recv_counts, bytes), unchecked);
    own = allocate_block<Scalar, MemorySpace>(n_r, hkv, dim, with_ids, "ctxpar::swa::own");
    impl::unpack_records(
        space, recv, input,
        impl::to_device<MemorySpace>(fused.source_a, "ctxpar::swa::assembly_source"), own);
    if constexpr (policy != 1)
      impl::unpack_records(
          space, recv, input,
          impl::to_device<MemorySpace>(fused.source_b, "ctxpar::swa::assembly_reshard_source"),
          result.next_cache);
  }
  st.own_pos = own.pos;
  KvBlock<Scalar, MemorySpace> own_rot = own;
  if constexpr (policy != 1) {
    own_rot.k = tensor_type(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::own_k_rot")), n_r,
        hkv, dim);
    rope_forward(space, own.k, own.pos, options.rope_base, own_rot.k);
  }

  st.q_rot = tensor_type(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::q_rot")), t_r, hq,
      dim);
  rope_forward(space, chunk.q, chunk.pos, options.rope_base, st.q_rot);
  st.q_pos = chunk.pos;
  st.q_ids = with_ids ? chunk.ids : Ids<MemorySpace>("ctxpar::swa::no_ids", 0);

  const std::int64_t length = layout.length();
  KvBlock<Scalar, MemorySpace> raw_axis;
  if constexpr (policy != 2) {
    // One all-gather of every rank's records; the axis is then reassembled in axis order.
    std::vector<int> counts(static_cast<std::size_t>(layout.ranks));
    std::vector<std::int64_t> displ(static_cast<std::size_t>(layout.ranks), 0);
    for (int r = 0; r < layout.ranks; ++r) {
      counts[r] = static_cast<int>(layout.records(r) * bytes);
      if (r > 0) displ[r] = displ[r - 1] + layout.records(r - 1);
    }
    impl::Bytes<MemorySpace> send(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::send")),
        n_r * bytes);
    impl::Bytes<MemorySpace> recv(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::gathered")),
        length * bytes);
    impl::pack_records(space, own_rot, impl::Index<MemorySpace>(), n_r, send);
    allgatherv(space, group, send, recv, counts, unchecked);
    std::vector<std::int64_t> source(static_cast<std::size_t>(length));
    for (std::int64_t a = 0; a < length; ++a)
      source[a] = displ[layout.owner(a)] + layout.record_of(a);
    st.axis_source = impl::to_device<MemorySpace>(source, "ctxpar::swa::axis_source");
    KvBlock<Scalar, MemorySpace> gathered =
        allocate_block<Scalar, MemorySpace>(length, hkv, dim, with_ids, "ctxpar::swa::axis");
    impl::unpack_records(space, recv, own_rot, st.axis_source, gathered);
    st.axis = gathered;
    if constexpr (policy == 1) {
      raw_axis = gathered;
      st.axis.k = tensor_type(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::k_rot")),
          length, hkv, dim);
      rope_forward(space, raw_axis.k, raw_axis.pos, options.rope_base, st.axis.k);
    }
    st.key_origin = 0;
  } else {
    // Only the W - 1 records before this rank's first query travel, point to point.
    st.halo = impl::make_plan(layout, me,
                              [&](int r) { return impl::halo_range(layout, options.window, r); });
    impl::Bytes<MemorySpace> send(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::halo_send")),
        st.halo.send_total() * bytes);
    impl::Bytes<MemorySpace> recv(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::halo_recv")),
        st.halo.recv_total() * bytes);
    st.halo_send_records =
        impl::to_device<MemorySpace>(st.halo.send_records, "ctxpar::swa::halo_send_records");
    impl::pack_records(space, own_rot, st.halo_send_records, st.halo.send_total(), send);
    impl::exchange_pairwise(space, group, send, impl::scaled(st.halo.send_counts, bytes), recv,
                            impl::scaled(st.halo.recv_counts, bytes));
    const std::vector<std::int64_t>& source = st.halo.source;
    st.key_origin = t_r > 0 ? st.halo.lo : 0;
    st.axis_source = impl::to_device<MemorySpace>(source, "ctxpar::swa::axis_source");
    st.axis = allocate_block<Scalar, MemorySpace>(static_cast<std::int64_t>(source.size()), hkv,
                                                  dim, with_ids, "ctxpar::swa::halo_axis");
    impl::unpack_records(space, recv, own_rot, st.axis_source, st.axis);
  }

  st.out = tensor_type("ctxpar::swa::out", t_r, hq, dim);
  st.lse = decltype(st.lse)("ctxpar::swa::lse", t_r, hq);
  const auto in = impl::attention_inputs(st.q_rot, st.q_pos, st.q_ids, st.axis, st.key_origin,
                                         options.window, st.scale);
  attention_forward(space, window_mask(options.window), in, st.out, st.lse);
  result.out = st.out;

  if constexpr (policy == 1) {
    impl::copy_tokens(space, result.next_cache.k, 0, raw_axis.k, st.reshard.lo, n_next);
    impl::copy_tokens(space, result.next_cache.v, 0, raw_axis.v, st.reshard.lo, n_next);
    impl::copy_tokens(space, result.next_cache.pos, 0, raw_axis.pos, st.reshard.lo, n_next);
    if (with_ids)
      impl::copy_tokens(space, result.next_cache.ids, 0, raw_axis.ids, st.reshard.lo, n_next);
  } else if constexpr (!whole) {
    impl::Bytes<MemorySpace> send(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::reshard_send")),
        st.reshard.send_total() * bytes);
    impl::Bytes<MemorySpace> recv(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::reshard_recv")),
        st.reshard.recv_total() * bytes);
    impl::pack_records(space, input, st.reshard_send_records, st.reshard.send_total(), send);
    alltoallv(space, group, send, impl::scaled(st.reshard.send_counts, bytes), recv,
              impl::scaled(st.reshard.recv_counts, bytes), unchecked);
    impl::unpack_records(space, recv, input, st.reshard_source, result.next_cache);
  }
  return result;
}

/// Backward of `forward`. Collective over `group`. From this rank's `dout [t_r, Hq, D]` and the
/// gradient of this rank's shard of the next cache (empty on every rank for the last step) returns
/// dq, dk, dv of this rank's chunk shard and dK, dV of its cache shard. Partial key/value
/// gradients of the gathered axis are reduce-scattered to their owners (all-gather policies) or
/// sent back point to point (`HaloKV`); RoPE's backward runs per shard on the owners.
template <class ExecutionSpace, class Scalar, class MemorySpace>
StepGradients<Scalar, MemorySpace> backward(
    const ExecutionSpace& space, const Group& group,
    const DistributedState<Scalar, MemorySpace>& st, const Tensor<Scalar, MemorySpace>& dout,
    const CacheGradient<Scalar, MemorySpace>& d_next_cache = {}) {
  using tensor_type = Tensor<Scalar, MemorySpace>;
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::swa::backward", ExecutionSpace, tensor_type);
  compat::ScopedRegion region("ctxpar::swa::backward");
  const int me = group.rank();
  const std::int64_t t_r = st.q_rot.extent(0), hq = st.q_rot.extent(1), dim = st.q_rot.extent(2);
  const std::int64_t hkv = st.axis.k.extent(1), per = hkv * dim;
  const std::int64_t c_r = st.layout.cache_split().size(me), n_in = c_r + t_r;
  const std::int64_t n_r = st.layout.records(me);
  const bool has_next = d_next_cache.dk.data() != nullptr || d_next_cache.dv.data() != nullptr;
  const std::int64_t n_next = st.reshard.hi - st.reshard.lo;
  {
    Preconditions chk(group, "ctxpar::swa::backward");
    chk.require(
        dout.extent(0) == static_cast<std::size_t>(t_r) &&
            dout.extent(1) == static_cast<std::size_t>(hq) &&
            dout.extent(2) == static_cast<std::size_t>(dim),
        "dout must have the shape of this rank's output",
        "[" + std::to_string(t_r) + ", " + std::to_string(hq) + ", " + std::to_string(dim) + "]",
        "[" + std::to_string(dout.extent(0)) + ", " + std::to_string(dout.extent(1)) + ", " +
            std::to_string(dout.extent(2)) + "]");
    chk.require(!has_next || (d_next_cache.dk.extent(0) == static_cast<std::size_t>(n_next) &&
                              d_next_cache.dv.extent(0) == static_cast<std::size_t>(n_next)),
                "the next-cache gradient must match this rank's next-cache shard",
                std::to_string(n_next), std::to_string(d_next_cache.dk.extent(0)));
    chk.require_same("whether a next-cache gradient is given", has_next ? 1 : 0);
    chk.agree();
  }

  tensor_type dq_rot("ctxpar::swa::dq_rot", t_r, hq, dim);
  tensor_type dk_axis("ctxpar::swa::dk_axis", st.axis.length(), hkv, dim);
  tensor_type dv_axis("ctxpar::swa::dv_axis", st.axis.length(), hkv, dim);
  const auto in = impl::attention_inputs(st.q_rot, st.q_pos, st.q_ids, st.axis, st.key_origin,
                                         st.options.window, st.scale);
  attention_backward(
      space, window_mask(st.options.window), in,
      Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace>(st.out),
      Kokkos::View<const accumulator_t<Scalar>**, Kokkos::LayoutRight, MemorySpace>(st.lse),
      Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace>(dout), dq_rot, dk_axis,
      dv_axis);

  tensor_type own_dk("ctxpar::swa::own_dk", n_r, hkv, dim),
      own_dv("ctxpar::swa::own_dv", n_r, hkv, dim);
  if (st.policy != 2) {
    // Sum every rank's partial gradient of the gathered axis onto the owners.
    const std::int64_t length = st.layout.length();
    impl::GradientRecords<Scalar, MemorySpace> all("ctxpar::swa::gradient_records", length,
                                                   2 * per);
    impl::route_gradients(space, dk_axis, dv_axis, st.axis_source, all, own_dk, own_dv);
    impl::GradientRecords<Scalar, MemorySpace> mine(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::own_gradients")),
        n_r, 2 * per);
    std::vector<int> counts(static_cast<std::size_t>(st.layout.ranks));
    for (int r = 0; r < st.layout.ranks; ++r)
      counts[r] = static_cast<int>(st.layout.records(r) * 2 * per);
    reduce_scatter(space, group, all, mine, counts);
    impl::split_gradient_records(space, mine, own_dk, own_dv);
  } else {
    // Own keys accumulate locally; halo keys go back to their owners, who add them up.
    impl::GradientRecords<Scalar, MemorySpace> back("ctxpar::swa::halo_gradients",
                                                    st.halo.recv_total(), 2 * per);
    impl::route_gradients(space, dk_axis, dv_axis, st.axis_source, back, own_dk, own_dv);
    impl::GradientRecords<Scalar, MemorySpace> got("ctxpar::swa::halo_gradients_in",
                                                   st.halo.send_total(), 2 * per);
    using flat = Kokkos::View<Scalar*, MemorySpace, Kokkos::MemoryUnmanaged>;
    impl::exchange_pairwise(
        space, group, flat(back.data(), back.span()), impl::scaled(st.halo.recv_counts, 2 * per),
        flat(got.data(), got.span()), impl::scaled(st.halo.send_counts, 2 * per));
    std::int64_t from = 0;
    for (int r = 0; r < st.layout.ranks; ++r) {
      impl::add_gradient_records(space, got, st.halo_send_records, from,
                                 from + st.halo.send_counts[r], own_dk, own_dv);
      from += st.halo.send_counts[r];
    }
  }
  rope_backward(space, own_dk, st.own_pos, st.options.rope_base, own_dk);

  if (st.whole_axis) {
    // One all-to-all back to the caller's shards: the gradients of the records that moved onto
    // their whole-axis owners, and (raw keys, so after the RoPE backward) the next-cache gradient.
    tensor_type in_dk("ctxpar::swa::input_dk", n_in, hkv, dim),
        in_dv("ctxpar::swa::input_dv", n_in, hkv, dim);
    const impl::FusedPlan fused =
        impl::fuse(st.assembly, has_next ? st.reshard : impl::empty_plan(st.layout.ranks));
    impl::GradientRecords<Scalar, MemorySpace> back("ctxpar::swa::returned_gradients",
                                                    fused.recv_total(), 2 * per);
    impl::route_gradients(
        space, own_dk, own_dv,
        impl::to_device<MemorySpace>(fused.source_a, "ctxpar::swa::assembly_source"), back, in_dk,
        in_dv);
    if (has_next)
      impl::route_gradients(
          space, d_next_cache.dk, d_next_cache.dv,
          impl::to_device<MemorySpace>(fused.source_b, "ctxpar::swa::assembly_reshard_source"),
          back, in_dk, in_dv);
    impl::GradientRecords<Scalar, MemorySpace> got("ctxpar::swa::returned_gradients_in",
                                                   fused.send_total(), 2 * per);
    alltoallv(space, group, back, impl::scaled(fused.recv_counts, 2 * per), got,
              impl::scaled(fused.send_counts, 2 * per), unchecked);
    const auto records =
        impl::to_device<MemorySpace>(fused.send_records, "ctxpar::swa::assembly_send_records");
    std::int64_t from = 0;
    for (int r = 0; r < st.layout.ranks; ++r) {
      // A record may be in both halves of one peer's block: add them in two passes.
      impl::add_gradient_records(space, got, records, from, from + fused.send_a[r], in_dk, in_dv);
      impl::add_gradient_records(space, got, records, from + fused.send_a[r],
                                 from + fused.send_counts[r], in_dk, in_dv);
      from += fused.send_counts[r];
    }
    own_dk = in_dk;
    own_dv = in_dv;
  } else if (has_next) {
    // The next cache holds raw keys, so its gradient joins after the RoPE backward.
    impl::GradientRecords<Scalar, MemorySpace> back("ctxpar::swa::cache_gradients",
                                                    st.reshard.recv_total(), 2 * per);
    impl::route_gradients(space, d_next_cache.dk, d_next_cache.dv, st.reshard_source, back, own_dk,
                          own_dv);
    impl::GradientRecords<Scalar, MemorySpace> got("ctxpar::swa::cache_gradients_in",
                                                   st.reshard.send_total(), 2 * per);
    alltoallv(space, group, back, impl::scaled(st.reshard.recv_counts, 2 * per), got,
              impl::scaled(st.reshard.send_counts, 2 * per), unchecked);
    std::int64_t from = 0;
    for (int r = 0; r < st.layout.ranks; ++r) {
      impl::add_gradient_records(space, got, st.reshard_send_records, from,
                                 from + st.reshard.send_counts[r], own_dk, own_dv);
      from += st.reshard.send_counts[r];
    }
  }

  StepGradients<Scalar, MemorySpace> g;
  g.dq =
      tensor_type(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::dq")),
                  t_r, hq, dim);
  rope_backward(space, dq_rot, st.q_pos, st.options.rope_base, g.dq);
  g.dk = tensor_type("ctxpar::swa::dk", t_r, hkv, dim);
  g.dv = tensor_type("ctxpar::swa::dv", t_r, hkv, dim);
  g.dk_cache = tensor_type("ctxpar::swa::dk_cache", c_r, hkv, dim);
  g.dv_cache = tensor_type("ctxpar::swa::dv_cache", c_r, hkv, dim);
  impl::copy_tokens(space, g.dk_cache, 0, own_dk, 0, c_r);
  impl::copy_tokens(space, g.dv_cache, 0, own_dv, 0, c_r);
  impl::copy_tokens(space, g.dk, 0, own_dk, c_r, t_r);
  impl::copy_tokens(space, g.dv, 0, own_dv, c_r, t_r);
  return g;
}

}  // namespace ctxpar::swa
