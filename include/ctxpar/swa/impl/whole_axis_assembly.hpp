/// \file
/// The whole-axis layout's step in front of the exchange: under `WholeAxisChunks` rank `r` owns
/// axis tokens `BalancedChunks(L, P)`, so the caller's per-segment shards first move onto those
/// owners (one all-to-all, fused with the next-cache re-shard when the policy needs it), and the
/// gradients return the same way. `WholeAxisAssembly` owns the tables of that move.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "ctxpar/comm/alltoall.hpp"
#include "ctxpar/comm/group.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/core/workspace.hpp"
#include "ctxpar/swa/cache.hpp"
#include "ctxpar/swa/impl/layout.hpp"
#include "ctxpar/swa/impl/records.hpp"
#include "ctxpar/swa/impl/step_staging.hpp"

namespace ctxpar::swa::impl {

/// A fused exchange's tables on the device.
template <class MemorySpace>
struct DeviceFused {
  Index<MemorySpace> send_records, source_a, source_b;
};

/// A plan that moves nothing (the missing half of a fused exchange).
inline ExchangePlan empty_plan(int ranks) {
  ExchangePlan plan;
  plan.send_counts.assign(static_cast<std::size_t>(ranks), 0);
  plan.recv_counts.assign(static_cast<std::size_t>(ranks), 0);
  return plan;
}

/// The move onto the whole-axis owners of one step layout, fused with the next-cache re-shard
/// (`with_reshard`) or alone, on the host and on the device.
template <class MemorySpace>
struct WholeAxisAssembly {
  FusedPlan with_reshard, alone;
  DeviceFused<MemorySpace> with_reshard_d, alone_d;

  /// The tables of `layout` on rank `me`; `reshard` is the step's next-cache exchange.
  void build(const AxisLayout& layout, int me, const ExchangePlan& reshard) {
    const ExchangePlan assembly =
        make_plan(layout.per_segment(), me, [&](int r) { return layout.axis_range(r); });
    with_reshard = fuse(assembly, reshard);
    alone = fuse(assembly, empty_plan(layout.ranks));
    auto device = [](const FusedPlan& f, DeviceFused<MemorySpace>& d) {
      ctxpar::impl::upload(f.send_records, d.send_records, "ctxpar::swa::assembly_send_records");
      ctxpar::impl::upload(f.source_a, d.source_a, "ctxpar::swa::assembly_source");
      ctxpar::impl::upload(f.source_b, d.source_b, "ctxpar::swa::assembly_reshard_source");
    };
    device(with_reshard, with_reshard_d);
    device(alone, alone_d);
  }

  /// Moves the caller's records `input` onto their whole-axis owners and returns the `n_r` records
  /// this rank owns (carved from the staging). With `carry_next_cache`, the same all-to-all also
  /// delivers this rank's next-cache shard (raw) into `next_cache`.
  template <class ExecutionSpace, class Scalar>
  TokenSource<Scalar, MemorySpace> forward(
      const ExchangeContext<ExecutionSpace, Scalar, MemorySpace>& cx,
      const TokenSource<Scalar, MemorySpace>& input, std::int64_t n_r, bool with_ids,
      bool carry_next_cache, Cache<Scalar, MemorySpace>& next_cache) const {
    const std::int64_t bytes = cx.records.template bytes<Scalar>();
    const FusedPlan& f = carry_next_cache ? with_reshard : alone;
    const DeviceFused<MemorySpace>& fd = carry_next_cache ? with_reshard_d : alone_d;
    const auto [send, recv] = cx.staging.byte_buffers(f.send_total(), f.recv_total(), bytes);
    pack_records(cx.space, input, fd.send_records, f.send_total(), send);
    alltoallv(cx.space, cx.group, send, scaled(f.send_counts, bytes), recv,
              scaled(f.recv_counts, bytes), unchecked);
    const KvBlock<Scalar, MemorySpace> owned =
        cx.staging.own.carve(n_r, cx.records.kv_heads, cx.records.dim, with_ids);
    unpack_records(cx.space, recv, input, fd.source_a, owned);
    if (carry_next_cache) unpack_records(cx.space, recv, input, fd.source_b, next_cache);
    return source_of(owned);
  }

  /// Backward: the owned records' gradients `owned_dk`/`owned_dv` (raw keys) and, when given, the
  /// next cache's `(dk_next, dv_next)` go back to the caller's shards in one all-to-all. Returns
  /// the gradients of this rank's cache ++ chunk shard (`n_in` tokens, carved from the staging).
  template <class ExecutionSpace, class Scalar>
  std::pair<Tensor<compute_t<Scalar>, MemorySpace>, Tensor<compute_t<Scalar>, MemorySpace>>
  return_gradients(const ExchangeContext<ExecutionSpace, Scalar, MemorySpace>& cx,
                   const Tensor<compute_t<Scalar>, MemorySpace>& owned_dk,
                   const Tensor<compute_t<Scalar>, MemorySpace>& owned_dv, bool has_next,
                   const Tensor<Scalar, MemorySpace>& dk_next,
                   const Tensor<Scalar, MemorySpace>& dv_next, std::int64_t n_in) const {
    using gradient = compute_t<Scalar>;
    using tensor_type = Tensor<gradient, MemorySpace>;
    const RecordShape& shape = cx.records;
    const std::int64_t per = 2 * shape.per_token();
    const auto in_dk =
                   ctxpar::carve<tensor_type>(cx.staging.in_dk, n_in, shape.kv_heads, shape.dim),
               in_dv =
                   ctxpar::carve<tensor_type>(cx.staging.in_dv, n_in, shape.kv_heads, shape.dim);
    Kokkos::deep_copy(cx.space, in_dk, gradient(0));
    Kokkos::deep_copy(cx.space, in_dv, gradient(0));
    const FusedPlan& f = has_next ? with_reshard : alone;
    const DeviceFused<MemorySpace>& fd = has_next ? with_reshard_d : alone_d;
    const auto [back, got] = cx.staging.gradient_buffers(f.recv_total(), f.send_total(), shape);
    route_gradients(cx.space, owned_dk, owned_dv, fd.source_a, back, in_dk, in_dv);
    if (has_next) route_gradients(cx.space, dk_next, dv_next, fd.source_b, back, in_dk, in_dv);
    alltoallv(cx.space, cx.group, back, scaled(f.recv_counts, per), got, scaled(f.send_counts, per),
              unchecked);
    // A record may be in both halves of one peer's block: add them in two passes.
    add_gradient_blocks(cx.space, got, fd.send_records, f.send_counts, &f.send_a, in_dk, in_dv);
    return {in_dk, in_dv};
  }

  /// Bytes of its device tables.
  std::size_t bytes() const {
    return index_bytes(with_reshard_d.send_records, with_reshard_d.source_a,
                       with_reshard_d.source_b, alone_d.send_records, alone_d.source_a,
                       alone_d.source_b);
  }
};

}  // namespace ctxpar::swa::impl
