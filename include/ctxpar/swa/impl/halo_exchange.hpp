/// \file
/// The exchange of the `HaloKV` policy: only the `W - 1` records before each rank's first query
/// travel, point to point from whichever ranks own them, rotated on the way; backward, the halo
/// keys' gradients go back to their owners, who add them up. `HaloExchange` owns the tables of
/// one step layout and does both moves.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <utility>
#include <vector>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/sendrecv.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/core/workspace.hpp"
#include "ctxpar/swa/impl/layout.hpp"
#include "ctxpar/swa/impl/records.hpp"
#include "ctxpar/swa/impl/step_staging.hpp"
#include "ctxpar/swa/tensors.hpp"

namespace ctxpar::swa::impl {

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

/// The halo exchange of one step layout on one rank.
template <class MemorySpace>
struct HaloExchange {
  /// Which own records go to which rank; where each halo ++ own-chunk token comes from.
  ExchangePlan plan;
  /// `plan.send_records` on the device.
  Index<MemorySpace> send_records;
  /// Axis token (from `plan.lo`) -> halo receive slot, or own record `-(j + 1)`.
  Index<MemorySpace> axis_source;

  /// The tables of `layout` on rank `me` for the window `range`.
  void build(const AxisLayout& layout, int me, const WindowRange& range) {
    plan = make_plan(layout, me, [&](int r) { return halo_range(layout, range, r); });
    ctxpar::impl::upload(plan.send_records, send_records, "ctxpar::swa::halo_send_records");
    ctxpar::impl::upload(plan.source, axis_source, "ctxpar::swa::axis_source");
  }

  /// Forward: the halo records of this rank's queries arrive (rotated on the way) and join its
  /// own records `own` (rotated as they join) as `axis`, which starts at axis index `key_origin`.
  /// Returns no raw axis (the halo never holds the whole axis).
  template <bool RotateAfterGather, class ExecutionSpace, class Scalar>
  KvBlock<Scalar, MemorySpace> forward(
      const ExchangeContext<ExecutionSpace, Scalar, MemorySpace>& cx,
      const TokenSource<Scalar, MemorySpace>& own, const AxisLayout& layout, bool with_ids,
      double rope_base, KvBlock<Scalar, MemorySpace>& axis, std::int64_t& key_origin) const {
    static_assert(!RotateAfterGather, "the halo exchange rotates keys before they travel");
    const std::int64_t bytes = cx.records.template bytes<Scalar>();
    const auto [send, recv] = cx.staging.byte_buffers(plan.send_total(), plan.recv_total(), bytes);
    pack_records(cx.space, own, send_records, plan.send_total(), send, rope_base);
    exchange_pairwise(cx.space, cx.group, send, scaled(plan.send_counts, bytes), recv,
                      scaled(plan.recv_counts, bytes));
    key_origin = layout.chunk_split().size(cx.group.rank()) > 0 ? plan.lo : 0;
    ensure_block(axis, static_cast<std::int64_t>(plan.source.size()), cx.records.kv_heads,
                 cx.records.dim, with_ids, "ctxpar::swa::halo_axis");
    unpack_records(cx.space, recv, own, axis_source, axis, rope_base);
    return {};
  }

  /// Backward: own keys' gradients accumulate locally into `own_dk`/`own_dv`; halo keys' go back
  /// to their owners, who add them up.
  template <class ExecutionSpace, class Scalar>
  void gradients_back(const ExchangeContext<ExecutionSpace, Scalar, MemorySpace>& cx,
                      const AxisLayout& /*layout*/,
                      const Tensor<compute_t<Scalar>, MemorySpace>& dk_axis,
                      const Tensor<compute_t<Scalar>, MemorySpace>& dv_axis,
                      const Tensor<compute_t<Scalar>, MemorySpace>& own_dk,
                      const Tensor<compute_t<Scalar>, MemorySpace>& own_dv) const {
    using gradient = compute_t<Scalar>;
    const std::int64_t per = 2 * cx.records.per_token();
    Kokkos::deep_copy(cx.space, own_dk, gradient(0));
    Kokkos::deep_copy(cx.space, own_dv, gradient(0));
    const auto [back, got] =
        cx.staging.gradient_buffers(plan.recv_total(), plan.send_total(), cx.records);
    route_gradients(cx.space, dk_axis, dv_axis, axis_source, back, own_dk, own_dv);
    using flat = Kokkos::View<gradient*, MemorySpace, Kokkos::MemoryUnmanaged>;
    exchange_pairwise(cx.space, cx.group, flat(back.data(), back.span()),
                      scaled(plan.recv_counts, per), flat(got.data(), got.span()),
                      scaled(plan.send_counts, per));
    add_gradient_blocks(cx.space, got, send_records, plan.send_counts, nullptr, own_dk, own_dv);
  }

  /// Bytes of its device tables.
  std::size_t bytes() const { return index_bytes(send_records, axis_source); }
};

}  // namespace ctxpar::swa::impl
