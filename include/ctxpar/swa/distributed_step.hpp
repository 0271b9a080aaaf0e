/// \file
/// The context-parallel sliding-window attention step as a plan: `StepPlan` is built once,
/// collectively, for a shape, options, a policy tag (how keys reach the queries that need them:
/// `RopeBeforeGather`, `RopeAfterGather`, `HaloKV`) and a key/value layout tag; its `forward` and
/// `backward` take the caller's views and write into them. The plan owns its staging buffers and
/// kernel scratch; what one step's backward needs from its forward (`DistributedState`, with the
/// exchange tables of the step's layout) is an object the caller owns, one per step in flight.
/// After the first call with given shapes, a forward + backward allocates nothing.
#pragma once

#include <Kokkos_Core.hpp>

#include <climits>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/host_isa_agreement.hpp"
#include "ctxpar/comm/posted_allgather.hpp"
#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar/comm/rank_facts.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/view_checks.hpp"
#include "ctxpar/core/workspace.hpp"
#include "ctxpar/partition/balanced_chunks.hpp"
#include "ctxpar/swa/attention_kernel.hpp"
#include "ctxpar/swa/attention_record.hpp"
#include "ctxpar/swa/attention_workspace.hpp"
#include "ctxpar/swa/cache.hpp"
#include "ctxpar/swa/document_mask.hpp"
#include "ctxpar/swa/gradients.hpp"
#include "ctxpar/swa/impl/axis.hpp"
#include "ctxpar/swa/impl/kernel_inputs.hpp"
#include "ctxpar/swa/impl/layout.hpp"
#include "ctxpar/swa/impl/records.hpp"
#include "ctxpar/swa/impl/step_staging.hpp"
#include "ctxpar/swa/impl/step_tables.hpp"
#include "ctxpar/swa/impl/validate.hpp"
#include "ctxpar/swa/options.hpp"
#include "ctxpar/swa/policies.hpp"
#include "ctxpar/swa/rope.hpp"
#include "ctxpar/swa/tensors.hpp"

namespace ctxpar::swa {

/// The sizes a `StepPlan` is built for; every rank passes the same. The chunk and cache lengths
/// are those of each call's shards (a stream's first steps carry a shorter cache, its last chunk
/// may be short); each `DistributedState` keeps the exchange tables of its step's lengths.
struct StepShape {
  /// Query heads `Hq`.
  std::int64_t query_heads = 0;
  /// Key/value heads `Hkv` (`Hq % Hkv == 0`).
  std::int64_t kv_heads = 0;
  /// Head dimension `D` (even).
  std::int64_t head_dim = 0;
};

/// What the backward of one distributed step needs from its forward, on one rank. The caller owns
/// one per step in flight (a streaming chain keeps one per step until that step's backward); a
/// forward reuses its memory while the step's shapes stay the same. Filled by `StepPlan::forward`.
/// Its `AttentionRecord` holds this rank's queries (`[t_r, Hq, D]`, the caller's chunk positions
/// and ids), the keys its kernel saw (the whole gathered axis under the all-gather policies, its
/// halo plus its own chunk keys under `HaloKV`), the caller's `out` and the log-sum-exp.
template <class Scalar, class MemorySpace>
struct DistributedState : AttentionRecord<Scalar, MemorySpace> {
  /// Index of `axis` token 0 on the whole axis.
  std::int64_t key_origin = 0;
  /// Positions of this rank's key/value records under the layout in use, for the RoPE backward.
  Positions<MemorySpace> own_pos;
  /// Exchange tables of this step's layout.
  impl::StepTables<MemorySpace> tables;
  /// Keys in this rank's cache shard at the forward (the rows of `dk_cache`/`dv_cache`).
  std::int64_t cache_tokens = 0;
  /// Fingerprint of the plan whose forward filled it (0: never filled).
  std::int64_t plan = 0;

  /// Bytes of device memory held (saved activations and tables).
  std::size_t bytes() const {
    return this->own_bytes() + own_pos.span() * sizeof(std::int64_t) + tables.bytes();
  }
};

/// A caller-owned output for a rank's chunk shard of `tokens` queries: `[tokens, Hq, D]`,
/// uninitialised (the forward writes every element). Allocate once per shard length and reuse.
template <class Scalar, class MemorySpace>
Tensor<Scalar, MemorySpace> allocate_output(const StepShape& shape, std::int64_t tokens) {
  return Tensor<Scalar, MemorySpace>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::out")), tokens,
      shape.query_heads, shape.head_dim);
}

/// Caller-owned gradient views for a rank's chunk shard of `chunk_tokens` and cache shard of
/// `cache_tokens`, uninitialised (the backward writes every element). Allocate once and reuse.
template <class Scalar, class MemorySpace>
StepGradients<Scalar, MemorySpace> allocate_gradients(const StepShape& shape,
                                                      std::int64_t chunk_tokens,
                                                      std::int64_t cache_tokens) {
  auto tensor = [&](const char* label, std::int64_t n, std::int64_t heads) {
    return Tensor<Scalar, MemorySpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n, heads,
        shape.head_dim);
  };
  StepGradients<Scalar, MemorySpace> g;
  g.dq = tensor("ctxpar::swa::dq", chunk_tokens, shape.query_heads);
  g.dk = tensor("ctxpar::swa::dk", chunk_tokens, shape.kv_heads);
  g.dv = tensor("ctxpar::swa::dv", chunk_tokens, shape.kv_heads);
  g.dk_cache = tensor("ctxpar::swa::dk_cache", cache_tokens, shape.kv_heads);
  g.dv_cache = tensor("ctxpar::swa::dv_cache", cache_tokens, shape.kv_heads);
  return g;
}

/// Caller-owned gradient views for the shards of the step whose forward filled `saved`.
template <class Scalar, class MemorySpace>
StepGradients<Scalar, MemorySpace> allocate_gradients(
    const StepShape& shape, const DistributedState<Scalar, MemorySpace>& saved) {
  return allocate_gradients<Scalar, MemorySpace>(shape, saved.q_rot.extent(0), saved.cache_tokens);
}

namespace impl {

/// What one rank tells the others about its shards at each call, for the checks that span ranks.
struct ShardFacts {
  std::int64_t cache_length = 0;  ///< keys in this rank's cache shard
  std::int64_t cache_first = 0;   ///< its first position (0 when empty)
  std::int64_t cache_last = 0;    ///< its last position (0 when empty)
  std::int64_t chunk_length = 0;  ///< tokens in this rank's chunk shard
  std::int64_t chunk_first = 0;   ///< its first position (0 when empty)
  std::int64_t chunk_last = 0;    ///< its last position (0 when empty)
  std::int64_t has_ids = 0;       ///< 1 when the chunk or the cache shard carries ids
};

/// This rank's `ShardFacts` (two position reads per shard from where the positions live).
template <class Scalar, class MemorySpace>
ShardFacts shard_facts(const Chunk<Scalar, MemorySpace>& chunk,
                       const Cache<Scalar, MemorySpace>& cache) {
  auto at = [](const Positions<MemorySpace>& pos, bool last) -> std::int64_t {
    if (pos.extent(0) == 0) return 0;
    std::int64_t v = 0;
    Kokkos::deep_copy(Kokkos::View<std::int64_t, Kokkos::HostSpace>(&v),
                      Kokkos::subview(pos, last ? pos.extent(0) - 1 : 0));
    return v;
  };
  ShardFacts f;
  f.cache_length = static_cast<std::int64_t>(cache.pos.extent(0));
  f.cache_first = at(cache.pos, false);
  f.cache_last = at(cache.pos, true);
  f.chunk_length = static_cast<std::int64_t>(chunk.pos.extent(0));
  f.chunk_first = at(chunk.pos, false);
  f.chunk_last = at(chunk.pos, true);
  f.has_ids = chunk.ids.extent(0) > 0 || cache.ids.extent(0) > 0 ? 1 : 0;
  return f;
}

/// Positions increase across shard borders: this rank's first cache key after the last key of the
/// nearest earlier rank's cache shard, its first chunk token after the nearest earlier chunk shard
/// (or, on the first rank with chunk tokens, after the last cache key of any rank).
inline void check_shard_borders(Preconditions& chk, const std::vector<ShardFacts>& all, int me) {
  // The nearest rank at or before `from` whose shard (cache or chunk: `length`) is not empty.
  const auto last_holding = [&all](int from, std::int64_t ShardFacts::*length) {
    for (int q = from; q >= 0; --q)
      if (all[static_cast<std::size_t>(q)].*length > 0) return q;
    return -1;
  };
  const ShardFacts& mine = all[static_cast<std::size_t>(me)];
  const std::string what =
      "positions must be strictly increasing along the key/value axis across shard borders";
  // This rank's first position of one shard kind (cache or chunk) must follow the last position
  // of the nearest earlier rank holding that kind; returns whether there is one.
  const auto follows_earlier = [&](std::int64_t first, std::int64_t ShardFacts::*length,
                                   std::int64_t ShardFacts::*last_of, const char* kind) {
    const int q = last_holding(me - 1, length);
    if (q < 0) return false;
    const std::int64_t last = all[static_cast<std::size_t>(q)].*last_of;
    chk.require(first > last, what,
                std::string("first ") + kind + " position > " + std::to_string(last) + " (rank " +
                    std::to_string(q) + ")",
                std::to_string(first));
    return true;
  };
  if (mine.cache_length > 0)
    follows_earlier(mine.cache_first, &ShardFacts::cache_length, &ShardFacts::cache_last, "cache");
  if (mine.chunk_length == 0 || follows_earlier(mine.chunk_first, &ShardFacts::chunk_length,
                                                &ShardFacts::chunk_last, "chunk"))
    return;
  const int q = last_holding(static_cast<int>(all.size()) - 1, &ShardFacts::cache_length);
  if (q < 0) return;
  const std::int64_t last = all[static_cast<std::size_t>(q)].cache_last;
  chk.require(mine.chunk_first > last,
              "positions must be strictly increasing along the key/value axis (cache before chunk)",
              "first chunk position > last cache position " + std::to_string(last),
              std::to_string(mine.chunk_first));
}

/// The per-call checks of a distributed forward (the plan's constructor agreed on the shape and
/// options), recorded into `chk`: this rank's inputs, the shard sizes, the order of positions
/// across shard borders, ids on every rank or none, and message sizes that fit an MPI count.
/// Returns the layout of the step; `facts` is the plan's host buffer for every rank's
/// `ShardFacts` and `cell` its device word for the position-order check.
template <class Scalar, class MemorySpace>
AxisLayout check_call(Preconditions& chk, const Group& group,
                      const Chunk<Scalar, MemorySpace>& chunk,
                      const Cache<Scalar, MemorySpace>& cache, const Options& options,
                      bool whole_axis, std::int64_t record_bytes, std::vector<ShardFacts>& facts,
                      const Kokkos::View<std::int64_t, MemorySpace>& cell, bool& with_ids) {
  impl::check_inputs(chk, chunk, cache, options, cell);
  const int p = group.size(), me = group.rank();
  ctxpar::impl::gather_rank_facts(group, shard_facts(chunk, cache), facts);
  const ShardFacts& mine = facts[static_cast<std::size_t>(me)];
  std::int64_t c = 0, chunk_length = 0, any_ids = 0;
  for (const ShardFacts& f : facts) {
    c += f.cache_length;
    chunk_length += f.chunk_length;
    if (f.cache_length + f.chunk_length > 0) any_ids = any_ids || f.has_ids;
  }
  chk.require(
      options.window == 0 || c <= options.window - 1, "the cache must not be longer than W - 1",
      "at most " + std::to_string(options.window - 1), std::to_string(c) + " keys over all ranks");
  const BalancedChunks chunks{chunk_length, p}, caches{c, p};
  chk.require(
      mine.chunk_length == chunks.size(me),
      "this rank's chunk shard must hold its BalancedChunks(t, P) share",
      std::to_string(chunks.size(me)) + " tokens (t = " + std::to_string(chunk_length) + ")",
      std::to_string(mine.chunk_length));
  chk.require(mine.cache_length == caches.size(me),
              "this rank's cache shard must hold its BalancedChunks(c, P) share",
              std::to_string(caches.size(me)) + " keys (c = " + std::to_string(c) + ")",
              std::to_string(mine.cache_length));
  check_shard_borders(chk, facts, me);
  chk.require(cache.length() == 0 || chunk.length() == 0 ||
                  (cache.ids.extent(0) > 0) == (chunk.ids.extent(0) > 0),
              "ids must be given for both the cache and the chunk shard, or for neither",
              chunk.ids.extent(0) > 0 ? "cache ids" : "no cache ids",
              cache.ids.extent(0) > 0 ? "cache ids" : "none");
  if (mine.cache_length + mine.chunk_length > 0)
    chk.require(mine.has_ids == any_ids, "ids must be given on every rank or on none",
                any_ids ? "ids" : "no ids", mine.has_ids ? "ids" : "no ids");
  // Every message of the step moves at most the whole axis of records (or of dK | dV gradient
  // records) and its size is an MPI `int`.
  const std::int64_t grad_record =
      2 * static_cast<std::int64_t>(chunk.k.extent(1) * chunk.k.extent(2));
  const std::int64_t per_token = record_bytes > grad_record ? record_bytes : grad_record;
  chk.require(per_token == 0 || c + chunk_length <= INT_MAX / per_token,
              "the key/value axis of one step must fit one MPI message (cache + chunk tokens)",
              "at most " + std::to_string(per_token == 0 ? 0 : INT_MAX / per_token) + " tokens",
              std::to_string(c + chunk_length));
  with_ids = any_ids != 0;
  AxisLayout layout;
  layout.cache = c;
  layout.chunk = chunk_length;
  layout.ranks = p;
  layout.whole_axis = whole_axis;
  return layout;
}

}  // namespace impl

/// One context-parallel streaming step of sliding-window attention, planned once and executed many
/// times. Collective: build it, and call `forward` / `backward`, on every rank of `group`.
///
/// Every rank passes its shard of the chunk — tokens `BalancedChunks(t, P)` of the `t` chunk
/// tokens of the call: raw q, k, v, positions, ids — and its shard of the
/// carried cache (`BalancedChunks(c, P)` of the `c` cached keys, raw). The key/value axis is
/// `cache ++ chunk`; each rank computes the outputs of its own queries. The next cache is sharded
/// by `BalancedChunks(n, P)` over the last `n = min(W-1, c+t)` axis tokens, so the persistent
/// state of a rank is `O((W + t) / P)`. Communication per call (besides the checks' agreement):
/// - `RopeBeforeGather`: one all-gather of rotated K | V | pos | id records, and one all-to-all of
///   the raw records of the next cache's shards (at most `W - 1` tokens in all);
/// - `RopeAfterGather`: one all-gather of raw records, nothing else (the next cache is cut
///   locally);
/// - `HaloKV`: point-to-point messages of the `W - 1` rotated records before each rank's first
///   query (from whichever ranks own them), and the next-cache all-to-all.
/// Under `WholeAxisChunks` the key/value records first move onto the owners of
/// `BalancedChunks(L, P)` (one all-to-all, fused with the next-cache re-shard), and the all-gather
/// or halo above moves those records. The backward reduce-scatters the partial key/value
/// gradients to their owners (all-gather policies) or sends them back point to point (`HaloKV`);
/// RoPE's backward runs per shard on the owners.
///
/// Forward outputs are bitwise identical for every rank count, policy and layout (same key tiles
/// and summation order per query). Bad input on any rank makes every rank throw the same
/// `ctxpar::Error` before any data moves.
///
/// A stream whose next chunk is known (training over a long sequence cut into steps) can pass it
/// to `forward` as `upcoming` (all-gather policies, `SegmentChunks`): the forward then posts the
/// next step's all-gather before its own attention, so the records travel while the attention
/// computes, and the next `forward` only waits for them. The results are the same bits.
///
/// Memory: the plan owns grow-only staging buffers and kernel scratch (`workspace_bytes()`); each
/// `DistributedState` owns the saved activations and exchange tables of its step. Outputs and
/// gradients are the caller's views of its shards' shapes (`allocate_output`,
/// `StepGradients::allocate`); only the next cache, whose shard length the plan decides, is sized
/// by the plan (and reallocated only when that length changes).
template <class Policy, class Layout, class ExecutionSpace, class Scalar,
          class MemorySpace = typename ExecutionSpace::memory_space>
class StepPlan {
  static_assert(is_policy_v<Policy>,
                "ctxpar::swa::StepPlan: the policy must be RopeBeforeGather, RopeAfterGather or "
                "HaloKV");
  static_assert(is_kv_layout_v<Layout>,
                "ctxpar::swa::StepPlan: the layout must be SegmentChunks or WholeAxisChunks");
  static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, MemorySpace>::accessible,
                "ctxpar::swa::StepPlan: the memory space must be accessible from the execution "
                "space");
  static constexpr bool rope_after_gather = std::is_same_v<Policy, RopeAfterGather>;
  static constexpr bool halo = std::is_same_v<Policy, HaloKV>;
  static constexpr bool whole_axis = std::is_same_v<Layout, WholeAxisChunks>;

 public:
  /// Where the plan runs.
  using execution_space = ExecutionSpace;
  /// The element type of every tensor.
  using scalar_type = Scalar;
  /// Where every tensor lives.
  using memory_space = MemorySpace;
  /// `[tokens, heads, D]` tensors of the step.
  using tensor_type = Tensor<Scalar, MemorySpace>;
  /// A rank's chunk shard.
  using chunk_type = Chunk<Scalar, MemorySpace>;
  /// A rank's cache shard.
  using cache_type = Cache<Scalar, MemorySpace>;
  /// What one step's backward needs from its forward.
  using state_type = DistributedState<Scalar, MemorySpace>;
  /// The contract's name for `state_type` (`core/plan.hpp`).
  using saved_type = state_type;
  /// Gradients of a rank's shards.
  using gradients_type = StepGradients<Scalar, MemorySpace>;
  /// Gradient arriving at a rank's next-cache shard.
  using cache_gradient_type = CacheGradient<Scalar, MemorySpace>;

  /// Builds the plan. Collective: every rank must pass the same shape and options (checked, with
  /// the policy and layout tags); bad values make every rank throw the same `ctxpar::Error`.
  StepPlan(const ExecutionSpace& space, const Group& group, const StepShape& shape,
           const Options& options)
      : space_(space), group_(group), shape_(shape), options_(options) {
    Preconditions chk(group, "ctxpar::swa::StepPlan");
    chk.require(
        shape.query_heads > 0 && shape.kv_heads > 0 && shape.query_heads % shape.kv_heads == 0,
        "shape.query_heads must be a positive multiple of shape.kv_heads (GQA)",
        "Hq % Hkv == 0, both > 0",
        std::to_string(shape.query_heads) + " and " + std::to_string(shape.kv_heads));
    chk.require(shape.head_dim > 0 && shape.head_dim % 2 == 0,
                "shape.head_dim must be positive and even (RoPE rotates pairs)", "an even D > 0",
                shape.head_dim);
    impl::check_options(chk, options);
    impl::check_tensor_core_choice<ExecutionSpace, Scalar>(chk, options.kernels, shape.head_dim);
    fingerprint_ =
        fingerprint({shape.query_heads, shape.kv_heads, shape.head_dim, options.window,
                     bits_of(options.rope_base), bits_of(options.scale), fingerprint(Policy::name),
                     fingerprint(Layout::name), group.size()});
    chk.require_same("the query head count", shape.query_heads)
        .require_same("the key/value head count", shape.kv_heads)
        .require_same("the head dimension", shape.head_dim)
        .require_same("the window", options.window)
        .require_same("the RoPE base", bits_of(options.rope_base))
        .require_same("the softmax scale", bits_of(options.scale))
        .require_same("the kernel choice", static_cast<int>(options.kernels))
        .require_same(std::string("the policy (") + Policy::name + " here)",
                      fingerprint(Policy::name))
        .require_same(std::string("the key/value layout (") + Layout::name + " here)",
                      fingerprint(Layout::name));
    int isa = 0;
    ctxpar::impl::agree_host_isa(chk, isa);
    chk.agree();
    host_isa_ = static_cast<HostIsa>(isa);
    scale_ = impl::effective_scale(options, shape.head_dim);
    window_ = impl::WindowRange{options.window};
    records_ = impl::RecordShape{shape.kv_heads, shape.head_dim};
    facts_.reserve(static_cast<std::size_t>(group.size()));
  }

  StepPlan(const StepPlan&) = delete;             ///< not copyable: the plan owns its memory
  StepPlan& operator=(const StepPlan&) = delete;  ///< not copyable
  StepPlan(StepPlan&&) = default;                 ///< movable
  StepPlan& operator=(StepPlan&&) = default;      ///< movable

  /// Forward of one step. `chunk` and `cache` are this rank's shards; `out [t_r, Hq, D]` receives
  /// this rank's outputs (a caller's view of that shape), `next_cache` becomes this rank's shard of
  /// the next cache (its views are reallocated only when its length changes; it must not share
  /// memory with `cache`), and `saved` receives what `backward` needs. `out` and the chunk's
  /// positions and ids are read again by the backward: keep them unchanged until then.
  void forward(const chunk_type& chunk, const cache_type& cache, const tensor_type& out,
               cache_type& next_cache, state_type& saved) {
    forward_step(chunk, cache, out, next_cache, saved, nullptr);
  }

  /// `forward`, posting the next step's all-gather before this step's attention so that it travels
  /// while the attention computes. `upcoming` is this rank's shard of the next step's chunk (its
  /// `BalancedChunks` share, positions after this step's); the next step's cache is `next_cache`
  /// as this call leaves it. Both are checked here, on every rank, as the next forward would.
  ///
  /// The next `forward` (or `forward` with its own `upcoming`) on this plan must be that step:
  /// `chunk` the same views as `upcoming` and `cache` the same views as this `next_cache`, their
  /// contents unchanged (the posted records were packed from them); it then waits for the gather
  /// instead of gathering. Any other call is refused on every rank with a `ctxpar::Error`, after
  /// the posted gather has completed (and is dropped). Other plans' and this plan's backward calls
  /// may run in between. Outputs and states are the same bits as without posting.
  void forward(const chunk_type& chunk, const cache_type& cache, const tensor_type& out,
               cache_type& next_cache, state_type& saved, const chunk_type& upcoming) {
    static_assert(!halo && !whole_axis,
                  "ctxpar::swa::StepPlan::forward(..., upcoming): posting the next step's "
                  "all-gather needs an all-gather policy (RopeBeforeGather, RopeAfterGather) and "
                  "the SegmentChunks layout");
    forward_step(chunk, cache, out, next_cache, saved, &upcoming);
  }

 private:
  // The forward of one step; with `upcoming`, the next step's gather is posted before the
  // attention.
  void forward_step(const chunk_type& chunk, const cache_type& cache, const tensor_type& out,
                    cache_type& next_cache, state_type& saved, const chunk_type* upcoming) {
    compat::ScopedRegion region("ctxpar::swa::StepPlan::forward");
    const ctxpar::impl::HostIsaScope isa_scope(host_isa_);
    const int me = group_.rank();
    const std::int64_t hq = shape_.query_heads, hkv = shape_.kv_heads, dim = shape_.head_dim;
    const std::int64_t t_r = chunk.length(), c_r = cache.length();
    bool with_ids = false;
    impl::AxisLayout layout;
    try {
      layout = check_forward(chunk, cache, out, next_cache, with_ids);
    } catch (...) {
      // Refused on every rank: a posted gather is completed (every rank has it in flight) and
      // dropped, so that no request outlives the call that should have used it.
      drop_posted();
      throw;
    }
    impl::StepTables<MemorySpace>& tb = saved.tables;
    // Tables are reused only when this plan built them for this layout (another policy's tables
    // for the same lengths would move the wrong records).
    if (saved.plan != fingerprint_ || !tb.matches(layout, window_))
      tb.template build<exchange_type>(layout, me, window_);
    saved.plan = fingerprint_;
    saved.cache_tokens = c_r;
    const std::int64_t n_r = layout.records(me);

    // The caller's records, read in place: its cache shard then its chunk shard, raw. The next
    // cache is always cut from them, so both layouts carry the same state between steps.
    const source_type input{
        cache, KvBlock<Scalar, MemorySpace>{chunk.k, chunk.v, chunk.pos, chunk.ids}, c_r};
    impl::ensure_block(next_cache, tb.reshard.length(), hkv, dim, with_ids,
                       "ctxpar::swa::next_cache");
    // This rank's key/value records under the layout in use.
    source_type own = input;
    if constexpr (whole_axis)
      own = tb.assembly->forward(exchange_context(), input, n_r, with_ids, !rope_after_gather,
                                 next_cache);
    // The records' positions stay with the step (for the RoPE backward).
    ctxpar::impl::ensure_extents(saved.own_pos, "ctxpar::swa::own_pos", n_r);
    impl::copy_tokens(space_, saved.own_pos, 0, own.first.pos, 0, own.split);
    impl::copy_tokens(space_, saved.own_pos, own.split, own.second.pos, 0, n_r - own.split);

    ctxpar::impl::ensure_extents(saved.q_rot, "ctxpar::swa::q_rot", t_r, hq, dim);
    rope_forward(space_, chunk.q, chunk.pos, options_.rope_base, saved.q_rot);
    saved.q_pos = chunk.pos;
    saved.q_ids = with_ids ? chunk.ids : Ids<MemorySpace>();
    // A gather the previous step posted for this one has the whole axis's records: wait for it.
    impl::Bytes<MemorySpace> gathered;
    const bool was_posted = posted_step_.has_value() && group_.size() > 1;
    posted_step_.reset();
    if (was_posted) {
      posted_gather_.wait();
      gathered = carve<impl::Bytes<MemorySpace>>(
          posted_records_, layout.length() * records_.template bytes<Scalar>());
    }
    const exchange_type& exchange = std::get<exchange_type>(tb.exchange);
    KvBlock<Scalar, MemorySpace> raw_axis;
    if constexpr (halo)
      raw_axis = exchange.template forward<rope_after_gather>(exchange_context(), own, layout,
                                                              with_ids, options_.rope_base,
                                                              saved.axis, saved.key_origin);
    else
      raw_axis = exchange.template forward<rope_after_gather>(
          exchange_context(), own, layout, with_ids, options_.rope_base, saved.axis,
          saved.key_origin, was_posted ? &gathered : nullptr);
    // The next cache's raw records onto their owners, before the attention (a posted gather of
    // the next step packs them): cut from the raw axis when the policy gathered raw keys; moved
    // by one all-to-all for the chunk layout (the whole-axis layout moved them with its assembly
    // already).
    if constexpr (rope_after_gather)
      tb.reshard.cut(space_, raw_axis, with_ids, next_cache);
    else if constexpr (!whole_axis)
      tb.reshard.move(exchange_context(), input, next_cache);
    if (upcoming != nullptr) {
      try {
        post_next(*upcoming, next_cache);
      } catch (...) {
        saved.plan = 0;  // this step's attention did not run: its backward must refuse it
        throw;
      }
    }

    saved.out = out;
    ctxpar::impl::ensure_extents(saved.lse, "ctxpar::swa::lse", t_r, hq);
    const auto in = impl::attention_inputs(saved.q_rot, saved.q_pos, saved.q_ids, saved.axis,
                                           saved.key_origin, options_.window, scale_);
    attention_forward(space_, document_mask(), in, out, saved.lse, attention_, options_.kernels);
  }

  // Checks the next step's shards (`upcoming`, `next_cache`) as its forward will, on every rank,
  // then packs this rank's records of that step and posts its all-gather (one rank alone has
  // nothing to gather: only the step is remembered).
  void post_next(const chunk_type& upcoming, const cache_type& next_cache) {
    bool with_ids = false;
    impl::AxisLayout layout;
    {
      Preconditions chk(group_, "ctxpar::swa::StepPlan::forward (upcoming)");
      require_plan_shape(chk, upcoming, "upcoming");
      layout = impl::check_call(chk, group_, upcoming, next_cache, options_, whole_axis,
                                impl::record_bytes<Scalar>(shape_.kv_heads, shape_.head_dim),
                                facts_, disorder_cell_, with_ids);
      chk.agree();
    }
    posted_step_ = PostedStep{layout, upcoming, next_cache};
    if (group_.size() == 1) return;
    const std::int64_t bytes = records_.template bytes<Scalar>();
    const impl::Bytes<MemorySpace> recv =
        carve<impl::Bytes<MemorySpace>>(posted_records_, layout.length() * bytes);
    const source_type own{
        next_cache,
        KvBlock<Scalar, MemorySpace>{upcoming.k, upcoming.v, upcoming.pos, upcoming.ids},
        next_cache.length()};
    const std::vector<int> block =
        impl::GatherExchange<MemorySpace>::template pack_own<rope_after_gather>(
            space_, records_, group_.rank(), own, layout, options_.rope_base, recv);
    posted_gather_.post(space_, group_, recv, block);
  }

  // Completes and forgets a posted gather (a refused call, or the plan's end).
  void drop_posted() noexcept {
    try {
      posted_gather_.wait();
    } catch (...) {
    }
    posted_step_.reset();
  }

 public:
  /// Backward of the `forward` that filled `saved`. From this rank's `dout [t_r, Hq, D]` and the
  /// gradient of this rank's next-cache shard (empty on every rank for the last step) writes dq,
  /// dk, dv of this rank's chunk shard and dk_cache, dv_cache of its cache shard into `grads`
  /// (the caller's views, each of its shard's shape: `StepGradients::allocate`).
  void backward(const state_type& saved, const tensor_type& dout,
                const cache_gradient_type& d_next_cache, const gradients_type& grads) {
    compat::ScopedRegion region("ctxpar::swa::StepPlan::backward");
    const ctxpar::impl::HostIsaScope isa_scope(host_isa_);
    const impl::StepTables<MemorySpace>& tb = saved.tables;
    const int me = group_.rank();
    const std::int64_t hq = shape_.query_heads, hkv = shape_.kv_heads, dim = shape_.head_dim;
    const std::int64_t t_r = saved.q_rot.extent(0);
    const std::int64_t c_r = tb.layout.cache_split().size(me);
    const std::int64_t n_r = tb.layout.records(me);
    const bool has_next = d_next_cache.dk.data() != nullptr || d_next_cache.dv.data() != nullptr;
    check_backward(saved, dout, d_next_cache, grads, has_next);

    const auto dq_rot = carve<gradient_tensor>(dq_rot_, t_r, hq, dim);
    const auto dk_axis = carve<gradient_tensor>(dk_axis_, saved.axis.length(), hkv, dim);
    const auto dv_axis = carve<gradient_tensor>(dv_axis_, saved.axis.length(), hkv, dim);
    const auto in = impl::attention_inputs(saved.q_rot, saved.q_pos, saved.q_ids, saved.axis,
                                           saved.key_origin, options_.window, scale_);
    attention_backward(
        space_, document_mask(), in,
        Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace>(saved.out),
        Kokkos::View<const accumulator_t<Scalar>**, Kokkos::LayoutRight, MemorySpace>(saved.lse),
        Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace>(dout), dq_rot, dk_axis,
        dv_axis, attention_, options_.kernels);

    // The axis gradients onto the records this rank owns, RoPE's backward there, then back to
    // the caller's shards with the next cache's gradient (the next cache holds raw keys, so its
    // gradient joins after the RoPE backward).
    gradient_tensor own_dk = carve<gradient_tensor>(own_dk_, n_r, hkv, dim),
                    own_dv = carve<gradient_tensor>(own_dv_, n_r, hkv, dim);
    std::get<exchange_type>(tb.exchange)
        .gradients_back(exchange_context(), tb.layout, dk_axis, dv_axis, own_dk, own_dv);
    rope_backward(space_, own_dk, saved.own_pos, options_.rope_base, own_dk);
    if constexpr (whole_axis) {
      const std::int64_t n_in = c_r + tb.layout.chunk_split().size(me);
      std::tie(own_dk, own_dv) = tb.assembly->return_gradients(
          exchange_context(), own_dk, own_dv, has_next, d_next_cache.dk, d_next_cache.dv, n_in);
    } else if (has_next) {
      tb.reshard.return_gradients(exchange_context(), d_next_cache.dk, d_next_cache.dv, own_dk,
                                  own_dv);
    }

    rope_backward(space_, dq_rot, saved.q_pos, options_.rope_base, grads.dq);
    impl::copy_tokens(space_, grads.dk_cache, 0, own_dk, 0, c_r);
    impl::copy_tokens(space_, grads.dv_cache, 0, own_dv, 0, c_r);
    impl::copy_tokens(space_, grads.dk, 0, own_dk, c_r, t_r);
    impl::copy_tokens(space_, grads.dv, 0, own_dv, c_r, t_r);
  }

  /// The shape the plan was built for.
  const StepShape& shape() const { return shape_; }
  /// The options the plan was built with.
  const Options& options() const { return options_; }
  /// The ranks of the plan.
  const Group& group() const { return group_; }
  /// The execution space every call runs on.
  const execution_space& space() const { return space_; }
  /// The instruction set of the host kernels, agreed by the ranks at construction
  /// (`core/host_isa.hpp`).
  HostIsa host_isa() const { return host_isa_; }
  /// Bytes of staging buffers and kernel scratch the plan holds now (they grow to the largest
  /// step seen and never shrink).
  std::size_t workspace_bytes() const {
    return staging_.bytes() + dq_rot_.capacity_bytes() + dk_axis_.capacity_bytes() +
           dv_axis_.capacity_bytes() + own_dk_.capacity_bytes() + own_dv_.capacity_bytes() +
           attention_.bytes() + posted_records_.capacity_bytes() + posted_gather_.staging_bytes();
  }

  /// Whether a forward posted the next step's all-gather and that step's forward has not run.
  bool has_posted_step() const { return posted_step_.has_value(); }

 private:
  using source_type = impl::TokenSource<Scalar, MemorySpace>;
  // Gradients between the kernels and the caller's views stay in the compute type (fp32 for the
  // 16-bit types): partial sums from several ranks and the next cache's gradient are added there,
  // and each is rounded to the storage type once, on its way out.
  using gradient_tensor = Tensor<accumulator_t<Scalar>, MemorySpace>;
  // The policy's exchange (its tables live in each `DistributedState`).
  using exchange_type =
      std::conditional_t<halo, impl::HaloExchange<MemorySpace>, impl::GatherExchange<MemorySpace>>;

  // The agreed checks of a forward call: the chunk against the plan's shape, `out`, the aliasing
  // of the two caches, then the checks across ranks (`check_call`). Returns the step's layout.
  impl::AxisLayout check_forward(const chunk_type& chunk, const cache_type& cache,
                                 const tensor_type& out, const cache_type& next_cache,
                                 bool& with_ids) {
    const std::int64_t hq = shape_.query_heads, dim = shape_.head_dim;
    const std::int64_t t_r = chunk.length();
    Preconditions chk(group_, "ctxpar::swa::StepPlan::forward");
    require_plan_shape(chk, chunk, "chunk");
    chk.require(!posted_step_ || posted_step_->is(chunk, cache),
                "after a forward that posted the next step's gather, the next forward must be that "
                "step: chunk the views passed as upcoming, cache the views it left in next_cache",
                "the posted step's views", "other views");
    chk.require(ctxpar::impl::has_extents(out, t_r, hq, dim),
                "out must have the shape of this rank's output",
                ctxpar::impl::shape_text({t_r, hq, dim}), ctxpar::impl::shape_text(out));
    auto same = [](const auto& a, const auto& b) {
      return a.data() != nullptr && a.data() == b.data();
    };
    const bool aliased = same(next_cache.k, cache.k) || same(next_cache.v, cache.v) ||
                         same(next_cache.pos, cache.pos) || same(next_cache.ids, cache.ids);
    chk.require(!aliased, "next_cache must not share memory with cache", "separate cache objects",
                "the same views");
    const impl::AxisLayout layout = impl::check_call(
        chk, group_, chunk, cache, options_, whole_axis,
        impl::record_bytes<Scalar>(shape_.kv_heads, dim), facts_, disorder_cell_, with_ids);
    chk.require(
        !posted_step_ || (posted_step_->layout.cache == layout.cache &&
                          posted_step_->layout.chunk == layout.chunk),
        "the posted step's shard lengths must not change before its forward",
        "cache " + std::to_string(posted_step_ ? posted_step_->layout.cache : 0) + " and chunk " +
            std::to_string(posted_step_ ? posted_step_->layout.chunk : 0) + " tokens",
        "cache " + std::to_string(layout.cache) + " and chunk " + std::to_string(layout.chunk));
    chk.agree();
    return layout;
  }

  // A chunk shard (`what`: the argument's name) must have the plan's heads and head dimension.
  void require_plan_shape(Preconditions& chk, const chunk_type& chunk, const char* what) const {
    const std::int64_t hq = shape_.query_heads, hkv = shape_.kv_heads, dim = shape_.head_dim;
    chk.require(chunk.q.extent(1) == static_cast<std::size_t>(hq) &&
                    chunk.q.extent(2) == static_cast<std::size_t>(dim) &&
                    chunk.k.extent(1) == static_cast<std::size_t>(hkv),
                std::string("the ") + what + " shard must have the plan's heads and head dimension",
                "q [t_r, " + std::to_string(hq) + ", " + std::to_string(dim) + "], k [t_r, " +
                    std::to_string(hkv) + ", " + std::to_string(dim) + "]",
                "q " + ctxpar::impl::shape_text(chunk.q) + ", k heads " +
                    std::to_string(chunk.k.extent(1)));
  }

  // The agreed checks of a backward call: `saved` from this plan, `dout`, the next-cache gradient
  // and the given gradient views against this rank's shards.
  void check_backward(const state_type& saved, const tensor_type& dout,
                      const cache_gradient_type& d_next_cache, const gradients_type& grads,
                      bool has_next) {
    const impl::StepTables<MemorySpace>& tb = saved.tables;
    const int me = group_.rank();
    const std::int64_t hq = shape_.query_heads, hkv = shape_.kv_heads, dim = shape_.head_dim;
    const std::int64_t t_r = saved.q_rot.extent(0);
    const std::int64_t c_r = tb.layout.cache_split().size(me);
    const std::int64_t n_next = tb.reshard.length();
    Preconditions chk(group_, "ctxpar::swa::StepPlan::backward");
    const bool from_here = saved.plan == fingerprint_ && tb.ready;
    chk.require(from_here, "saved must come from a forward of this plan",
                "a state filled by this plan's forward",
                saved.plan == 0 ? "a state no forward filled" : "a state of another plan");
    using ctxpar::impl::shape_text;
    if (from_here) {
      chk.require(ctxpar::impl::has_extents(dout, t_r, hq, dim),
                  "dout must have the shape of this rank's output", shape_text({t_r, hq, dim}),
                  shape_text(dout));
      chk.require(!has_next || (ctxpar::impl::has_extents(d_next_cache.dk, n_next, hkv, dim) &&
                                ctxpar::impl::has_extents(d_next_cache.dv, n_next, hkv, dim)),
                  "the next-cache gradient must match this rank's next-cache shard",
                  shape_text({n_next, hkv, dim}), shape_text(d_next_cache.dk));
      auto output = [&](const tensor_type& v, const char* name, std::int64_t n, std::int64_t h) {
        chk.require(ctxpar::impl::has_extents(v, n, h, dim),
                    std::string("grads.") + name + " must have its shard's shape",
                    shape_text({n, h, dim}), shape_text(v));
      };
      output(grads.dq, "dq", t_r, hq);
      output(grads.dk, "dk", t_r, hkv);
      output(grads.dv, "dv", t_r, hkv);
      output(grads.dk_cache, "dk_cache", c_r, hkv);
      output(grads.dv_cache, "dv_cache", c_r, hkv);
    }
    chk.require_same("whether a next-cache gradient is given", has_next ? 1 : 0);
    chk.agree();
  }

  impl::ExchangeContext<ExecutionSpace, Scalar, MemorySpace> exchange_context() {
    return {space_, group_, staging_, records_};
  }

  static std::int64_t bits_of(double x) {
    std::int64_t b;
    std::memcpy(&b, &x, sizeof b);
    return b;
  }

  ExecutionSpace space_;
  Group group_;
  StepShape shape_;
  Options options_;
  HostIsa host_isa_ = HostIsa::baseline;
  double scale_ = 1.0;
  // The window as the tables and kernels read it (the plan's one conversion of `options.window`).
  impl::WindowRange window_;
  std::int64_t fingerprint_ = 0;
  // Every rank's `ShardFacts` of the current call (reserved once: the checks allocate nothing).
  std::vector<impl::ShardFacts> facts_;
  // The device word of the per-call position-order check.
  Kokkos::View<std::int64_t, MemorySpace> disorder_cell_{"ctxpar::swa::check_positions"};
  // The records of the step's exchanges.
  impl::RecordShape records_;
  // The exchanges' staging. The caller's shards are read in place and keys are rotated inside
  // the packing, so neither is copied.
  impl::StepStaging<Scalar, MemorySpace> staging_;
  // Backward scratch: the rotated queries' and the axis's gradients, and the owned records'.
  GrowingBuffer<MemorySpace> dq_rot_{"ctxpar::swa::dq_rot"}, dk_axis_{"ctxpar::swa::dk_axis"},
      dv_axis_{"ctxpar::swa::dv_axis"}, own_dk_{"ctxpar::swa::own_dk"},
      own_dv_{"ctxpar::swa::own_dv"};
  AttentionWorkspace<MemorySpace> attention_;
  // The step a forward posted the gather of (`forward(..., upcoming)`): its layout and the views
  // its records were packed from, which its forward must pass again.
  struct PostedStep {
    impl::AxisLayout layout;
    chunk_type chunk;
    cache_type cache;
    bool is(const chunk_type& c, const cache_type& k) const {
      const auto same = [](const auto& a, const auto& b) {
        return a.data() == b.data() && a.span() == b.span();
      };
      return same(c.q, chunk.q) && same(c.k, chunk.k) && same(c.v, chunk.v) &&
             same(c.pos, chunk.pos) && same(c.ids, chunk.ids) && same(k.k, cache.k) &&
             same(k.v, cache.v) && same(k.pos, cache.pos) && same(k.ids, cache.ids);
    }
  };
  std::optional<PostedStep> posted_step_;
  // The posted gather and its records (apart from the step's staging, which the calls in
  // between use).
  GrowingBuffer<MemorySpace> posted_records_{"ctxpar::swa::posted_records"};
  PostedAllgatherv<impl::Bytes<MemorySpace>> posted_gather_;
};

}  // namespace ctxpar::swa
