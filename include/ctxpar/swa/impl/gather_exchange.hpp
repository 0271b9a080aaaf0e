/// \file
/// The exchange of the all-gather policies (`RopeBeforeGather`, `RopeAfterGather`): every rank
/// gathers every rank's key/value records, so each holds the whole axis; backward, a
/// reduce-scatter sums every rank's partial key/value gradients onto the owners.
/// `GatherExchange` owns the tables of one step layout and does both moves.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

#include "ctxpar/comm/allgather.hpp"
#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/reduce.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/core/workspace.hpp"
#include "ctxpar/swa/impl/layout.hpp"
#include "ctxpar/swa/impl/records.hpp"
#include "ctxpar/swa/impl/step_staging.hpp"
#include "ctxpar/swa/rope.hpp"
#include "ctxpar/swa/tensors.hpp"

namespace ctxpar::swa::impl {

/// The all-gather of one step layout on one rank. Keys and values travel in their storage type;
/// their gradients come back in its compute type.
template <class MemorySpace>
struct GatherExchange {
  /// Records of each rank.
  std::vector<int> counts;
  /// Axis token -> its slot in the gathered buffer.
  Index<MemorySpace> axis_source;
  /// As `axis_source`, but this rank's own tokens as own records `-(j + 1)`, read in place
  /// rather than from the gathered buffer (at one rank, nothing is packed or gathered at all).
  /// The backward keeps `axis_source`: every token has its slot there.
  Index<MemorySpace> forward_axis_source;

  /// The tables of `layout` on rank `me` (every rank gathers the whole axis, whatever the window).
  void build(const AxisLayout& layout, int me, const WindowRange& /*range*/) {
    const std::int64_t length = layout.length();
    counts.assign(static_cast<std::size_t>(layout.ranks), 0);
    std::vector<std::int64_t> displ(static_cast<std::size_t>(layout.ranks), 0);
    for (int r = 0; r < layout.ranks; ++r) {
      counts[r] = static_cast<int>(layout.records(r));
      if (r > 0) displ[r] = displ[r - 1] + layout.records(r - 1);
    }
    std::vector<std::int64_t> source(static_cast<std::size_t>(length)),
        forward_source(static_cast<std::size_t>(length));
    for (std::int64_t a = 0; a < length; ++a) {
      source[a] = displ[layout.owner(a)] + layout.record_of(a);
      forward_source[a] = layout.owner(a) == me ? -(layout.record_of(a) + 1) : source[a];
    }
    ctxpar::impl::upload(source, axis_source, "ctxpar::swa::axis_source");
    ctxpar::impl::upload(forward_source, forward_axis_source, "ctxpar::swa::forward_axis_source");
  }

  /// This rank's part of the all-gather of `layout`: its records `own` packed (keys rotated on
  /// the way, unless `RotateAfterGather`) straight into its place in `recv` (the whole axis of
  /// records of `shape`). Returns every rank's block size in bytes, the gather's counts. Needs
  /// only the layout, so a step can prepare the next step's gather before its tables exist.
  template <bool RotateAfterGather, class ExecutionSpace, class Scalar>
  static std::vector<int> pack_own(const ExecutionSpace& space, const RecordShape& shape, int me,
                                   const TokenSource<Scalar, MemorySpace>& own,
                                   const AxisLayout& layout, double rope_base,
                                   const Bytes<MemorySpace>& recv) {
    const std::int64_t bytes = shape.template bytes<Scalar>();
    std::vector<int> block(static_cast<std::size_t>(layout.ranks));
    std::int64_t first = 0;
    for (int r = 0; r < layout.ranks; ++r) {
      block[r] = static_cast<int>(layout.records(r) * bytes);
      if (r < me) first += layout.records(r);
    }
    const std::int64_t n_r = layout.records(me);
    const Bytes<MemorySpace> mine(recv.data() + first * bytes, n_r * bytes);
    pack_records(space, own, Index<MemorySpace>(), n_r, mine, RotateAfterGather ? 0.0 : rope_base);
    return block;
  }

  /// Forward: one all-gather of every rank's records `own` (`pack_own`); the axis is then
  /// reassembled in axis order into `axis`, this rank's own tokens read in place (keys rotated as
  /// they join). One rank alone has no peer: nothing is packed. With `gathered`, the gather of
  /// this layout has already completed into it (a previous step posted it) and is only unpacked.
  /// Returns the raw axis when `RotateAfterGather` (its keys in the staging; the rotated ones in
  /// `axis`).
  template <bool RotateAfterGather, class ExecutionSpace, class Scalar>
  KvBlock<Scalar, MemorySpace> forward(
      const ExchangeContext<ExecutionSpace, Scalar, MemorySpace>& cx,
      const TokenSource<Scalar, MemorySpace>& own, const AxisLayout& layout, bool with_ids,
      double rope_base, KvBlock<Scalar, MemorySpace>& axis, std::int64_t& key_origin,
      const Bytes<MemorySpace>* gathered = nullptr) const {
    const ExecutionSpace& space = cx.space;
    const Group& group = cx.group;
    const RecordShape& shape = cx.records;
    const std::int64_t bytes = shape.template bytes<Scalar>();
    const std::int64_t length = layout.length();
    Bytes<MemorySpace> recv;
    if (group.size() > 1) {
      if (gathered != nullptr) {
        recv = *gathered;
      } else {
        recv = ctxpar::carve<Bytes<MemorySpace>>(cx.staging.recv, length * bytes);
        const std::vector<int> block =
            pack_own<RotateAfterGather>(space, shape, group.rank(), own, layout, rope_base, recv);
        allgatherv_in_place(space, group, recv, block, unchecked);
      }
    }
    ensure_block(axis, length, shape.kv_heads, shape.dim, with_ids, "ctxpar::swa::axis");
    key_origin = 0;
    KvBlock<Scalar, MemorySpace> raw_axis;
    if constexpr (RotateAfterGather) {
      raw_axis = axis;
      raw_axis.k = ctxpar::carve<Tensor<Scalar, MemorySpace>>(cx.staging.raw_k, length,
                                                              shape.kv_heads, shape.dim);
      unpack_records(space, recv, own, forward_axis_source, raw_axis);
      rope_forward(space, raw_axis.k, raw_axis.pos, rope_base, axis.k);
    } else {
      unpack_records(space, recv, own, forward_axis_source, axis, rope_base);
    }
    return raw_axis;
  }

  /// Backward: the axis gradients `dk_axis`/`dv_axis` onto the records this rank owns,
  /// `own_dk`/`own_dv` (rotated keys).
  template <class ExecutionSpace, class Scalar>
  void gradients_back(const ExchangeContext<ExecutionSpace, Scalar, MemorySpace>& cx,
                      const AxisLayout& layout,
                      const Tensor<compute_t<Scalar>, MemorySpace>& dk_axis,
                      const Tensor<compute_t<Scalar>, MemorySpace>& dv_axis,
                      const Tensor<compute_t<Scalar>, MemorySpace>& own_dk,
                      const Tensor<compute_t<Scalar>, MemorySpace>& own_dv) const {
    using gradient = compute_t<Scalar>;
    const ExecutionSpace& space = cx.space;
    const Group& group = cx.group;
    if (group.size() == 1) {
      // One rank: every axis token is its own, once; its gradient goes straight to it.
      Kokkos::deep_copy(space, own_dk, gradient(0));
      Kokkos::deep_copy(space, own_dv, gradient(0));
      route_gradients(space, dk_axis, dv_axis, forward_axis_source,
                      GradientRecords<gradient, MemorySpace>(), own_dk, own_dv);
      return;
    }
    // Every axis token has its own gathered slot, so routing fills `all` completely; the
    // reduce-scatter sums every rank's partial gradient onto the owners.
    const auto [all, mine] =
        cx.staging.gradient_buffers(layout.length(), layout.records(group.rank()), cx.records);
    route_gradients(space, dk_axis, dv_axis, axis_source, all, own_dk, own_dv);
    reduce_scatter(space, group, all, mine, scaled(counts, 2 * cx.records.per_token()));
    split_gradient_records(space, mine, own_dk, own_dv);
  }

  /// Bytes of its device tables.
  std::size_t bytes() const { return index_bytes(axis_source, forward_axis_source); }
};

}  // namespace ctxpar::swa::impl
