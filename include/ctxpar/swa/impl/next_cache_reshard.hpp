/// \file
/// The next cache of a distributed step: the last `min(W - 1, L)` raw tokens of the key/value axis,
/// resharded by `BalancedChunks(n, P)` onto the ranks. `NextCacheReshard` owns that exchange's
/// tables and moves the records (and, backward, their gradients) for the per-segment layout; the
/// whole-axis layout fuses the same move into its assembly, and `RopeAfterGather` cuts the next
/// cache from the raw axis it gathered anyway.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "ctxpar/comm/alltoall.hpp"
#include "ctxpar/comm/group.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/core/workspace.hpp"
#include "ctxpar/swa/cache.hpp"
#include "ctxpar/swa/impl/axis.hpp"
#include "ctxpar/swa/impl/layout.hpp"
#include "ctxpar/swa/impl/records.hpp"
#include "ctxpar/swa/impl/step_staging.hpp"

namespace ctxpar::swa::impl {

/// The next-cache exchange of one step layout: which of this rank's records go to which next-cache
/// owner, and where each of this rank's next-cache tokens comes from.
template <class MemorySpace>
struct NextCacheReshard {
  /// The exchange over the per-segment owners (the caller's cache and chunk shards).
  ExchangePlan plan;
  /// `plan.source` and `plan.send_records` on the device.
  Index<MemorySpace> source, send_records;

  /// The tables of `layout` on rank `me` for the window `range`.
  void build(const AxisLayout& layout, int me, const WindowRange& range) {
    const std::int64_t n = range.carried(layout.length());
    plan =
        make_plan(layout.per_segment(), me, [&](int r) { return next_cache_range(layout, n, r); });
    ctxpar::impl::upload(plan.source, source, "ctxpar::swa::reshard_source");
    ctxpar::impl::upload(plan.send_records, send_records, "ctxpar::swa::reshard_send_records");
  }

  /// Tokens of this rank's next-cache shard.
  std::int64_t length() const { return plan.hi - plan.lo; }
  /// Index of this rank's first next-cache token on the axis.
  std::int64_t first() const { return plan.lo; }

  /// Moves the raw records of `input` (this rank's cache ++ chunk shard) onto the next-cache
  /// owners: one all-to-all.
  template <class ExecutionSpace, class Scalar>
  void move(const ExchangeContext<ExecutionSpace, Scalar, MemorySpace>& cx,
            const TokenSource<Scalar, MemorySpace>& input,
            Cache<Scalar, MemorySpace>& next_cache) const {
    const std::int64_t bytes = cx.records.template bytes<Scalar>();
    const auto [send, recv] = cx.staging.byte_buffers(plan.send_total(), plan.recv_total(), bytes);
    pack_records(cx.space, input, send_records, plan.send_total(), send);
    alltoallv(cx.space, cx.group, send, scaled(plan.send_counts, bytes), recv,
              scaled(plan.recv_counts, bytes), unchecked);
    unpack_records(cx.space, recv, input, source, next_cache);
  }

  /// Cuts this rank's next-cache shard out of the whole raw axis `raw_axis` (nothing moves).
  template <class ExecutionSpace, class Scalar>
  void cut(const ExecutionSpace& space, const KvBlock<Scalar, MemorySpace>& raw_axis, bool with_ids,
           Cache<Scalar, MemorySpace>& next_cache) const {
    const std::int64_t n = length(), lo = first();
    copy_tokens(space, next_cache.k, 0, raw_axis.k, lo, n);
    copy_tokens(space, next_cache.v, 0, raw_axis.v, lo, n);
    copy_tokens(space, next_cache.pos, 0, raw_axis.pos, lo, n);
    if (with_ids) copy_tokens(space, next_cache.ids, 0, raw_axis.ids, lo, n);
  }

  /// Backward of `move`: the next cache's gradient `(dk_next, dv_next)` back to the records it
  /// came from, added into `own_dk`/`own_dv` (this rank's cache ++ chunk shard, raw keys).
  template <class ExecutionSpace, class Scalar>
  void return_gradients(const ExchangeContext<ExecutionSpace, Scalar, MemorySpace>& cx,
                        const Tensor<Scalar, MemorySpace>& dk_next,
                        const Tensor<Scalar, MemorySpace>& dv_next,
                        const Tensor<compute_t<Scalar>, MemorySpace>& own_dk,
                        const Tensor<compute_t<Scalar>, MemorySpace>& own_dv) const {
    const std::int64_t per = 2 * cx.records.per_token();
    const auto [back, got] =
        cx.staging.gradient_buffers(plan.recv_total(), plan.send_total(), cx.records);
    route_gradients(cx.space, dk_next, dv_next, source, back, own_dk, own_dv);
    alltoallv(cx.space, cx.group, back, scaled(plan.recv_counts, per), got,
              scaled(plan.send_counts, per), unchecked);
    add_gradient_blocks(cx.space, got, send_records, plan.send_counts, nullptr, own_dk, own_dv);
  }

  /// Bytes of its device tables.
  std::size_t bytes() const { return index_bytes(source, send_records); }
};

}  // namespace ctxpar::swa::impl
