/// \file
/// Depthwise causal short convolution over sequence shards (the width-`w` conv GDN/GDP layers run
/// before the recurrence), with the halo exchange context parallelism needs:
///
///   `y_t[c] = bias[c] + Σ_{j<w} weight[c, j] · x_{t-(w-1)+j}[c]`  (`weight[c, w-1]` hits token t)
///
/// A shard is one or two *fragments* (runs of consecutive tokens). Each fragment needs the last
/// `w-1` input rows of the fragment holding the tokens just before it (its *halo*), zeros at the
/// sequence start:
///
/// - `Contiguous`: rank `r` is one fragment; its halo comes from rank `r-1` (one shift up the
/// ring).
/// - `Zigzag`: rank `r` holds chunks `r` and `2P-1-r` of `2P` equal chunks, in that order. Chunk
///   `r`'s halo comes from rank `r-1` (its first fragment), chunk `2P-1-r`'s from the holder of
///   chunk `2P-2-r`: rank `r+1` (its second fragment), or rank `P-1` itself (its first fragment).
///   One shift up and one shift down, no message for the local hand-over on rank `P-1`.
///
/// With per-token sequence ids (packed input) every tap whose token belongs to another sequence
/// than token `t` is masked, inside the shard and in the halo. The backward repeats the forward
/// exchange, sends each halo's gradient back to the fragment it came from and sums the weight and
/// bias gradients over the ranks (`allreduce_sum`).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar/chunkwise/impl/short_conv.hpp"
#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/view_checks.hpp"
#include "ctxpar/core/workspace.hpp"
#include "ctxpar/partition/zigzag.hpp"

namespace ctxpar::chunkwise {

/// The sizes a `ShortConvPlan` is built for. `tokens` is this rank's shard length (ranks may
/// differ, within the layout's rules); the rest every rank passes the same.
struct ShortConvShape {
  /// Tokens `T` of this rank's shard (`x [T, C]`).
  std::int64_t tokens = 0;
  /// Channels `C` (e.g. `H·D` of a `[T, H, D]` tensor flattened).
  std::int64_t channels = 0;
  /// Conv width `w` (`weight [C, w]`), at least 1.
  std::int64_t width = 1;
  /// Whether the calls pass a bias `[C]` (and the backward a `dbias [C]`).
  bool bias = false;
  /// Whether the calls pass per-token sequence ids `[T]` (packed input).
  bool seq_ids = false;
};

/// What `ShortConvPlan::backward` needs from the forward, owned by the caller: handles on the
/// forward's `x`, `weight` and `seq_ids` (shallow: the backward reads the caller's views again, so
/// keep them unchanged until then; the backward repeats the forward's halo exchange from them).
/// Default-constructed it holds nothing, and a backward refuses it.
template <class Scalar, class MemorySpace>
struct ShortConvSaved {
  /// The forward's input `x [T, C]`.
  Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace> x;
  /// The forward's `weight [C, w]`.
  Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace> weight;
  /// The forward's sequence ids `[T]` (empty: one sequence).
  Kokkos::View<const std::int32_t*, MemorySpace> seq_ids;
  /// Whether a forward filled it.
  bool filled = false;
};

/// Depthwise causal short conv over sequence shards in `Layout` (`Contiguous` or `Zigzag`), as a
/// plan. Collective: build it, and call `forward` / `backward`, on every rank of `group`.
///
/// Built once for a `ShortConvShape`: the constructor checks the shape on every rank (bad input on
/// any rank makes every rank throw the same `ctxpar::Error`), agrees on `C`, `w` and whether bias
/// and ids are given, and allocates the halo exchange's buffers, so no call allocates, not even
/// the first (`workspace_bytes()` says how much they hold). Per layout:
/// - `Contiguous`: rank `r` holds the tokens after rank `r-1`'s; every shard but the last needs
///   `T >= w - 1`. The halo exchange is one `sendrecv` (two with ids).
/// - `Zigzag`: `x [2C, C_ch]` holds natural chunk `r` then chunk `2P-1-r` of `2P` equal chunks
///   (`ZigzagLayout` order, the whole packed stream when `seq_ids` are given); every chunk needs
///   `C >= w - 1`. The halo exchange is one shift up and one shift down (`(w-1)·C_ch` values to
///   each neighbour that exists, plus `w-1` ids each with `seq_ids`).
///
/// The backward repeats the forward's exchange from the saved inputs, sends each halo's gradient
/// back to the fragment it came from (under `Zigzag` rank `r-1`, rank `r+1`, or rank `P-1`'s own
/// first chunk) and sums `dweight` and `dbias` over the ranks. Not copyable (it owns its
/// buffers); movable.
template <class Layout, class ExecutionSpace, class Scalar,
          class MemorySpace = typename ExecutionSpace::memory_space>
class ShortConvPlan {
  static_assert(is_token_layout_v<Layout>,
                "ctxpar::chunkwise::ShortConvPlan: the layout must be Contiguous or Zigzag");
  static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, MemorySpace>::accessible,
                "ctxpar::chunkwise::ShortConvPlan: the memory space must be accessible from the "
                "execution space");

 public:
  /// The execution space the calls run on.
  using execution_space = ExecutionSpace;
  /// The values' type.
  using scalar_type = Scalar;
  /// Where the views live.
  using memory_space = MemorySpace;
  /// What a backward needs from its forward.
  using saved_type = ShortConvSaved<Scalar, MemorySpace>;
  /// Read-only `[rows, C]` (or `[C, w]`) values the calls take.
  using rows_view = Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>;
  /// Writable `[rows, C]` (or `[C, w]`) values the calls write.
  using out_rows_view = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>;
  /// Read-only per-token sequence ids.
  using ids_view = Kokkos::View<const std::int32_t*, MemorySpace>;

  /// The conv of `shape` on `group`, shards in `layout`. Collective: checks and agrees on the
  /// shape, then allocates the halo buffers.
  ShortConvPlan(const ExecutionSpace& space, const Group& group, const ShortConvShape& shape,
                Layout layout = Layout{})
      : space_(space), group_(group), shape_(shape) {
    Preconditions chk(group, "ctxpar::chunkwise::ShortConvPlan");
    chk.require(shape.width >= 1, "shape.width (the conv width w) must be positive", ">= 1",
                shape.width);
    chk.require(shape.tokens >= 0, "shape.tokens must not be negative", ">= 0", shape.tokens);
    chk.require(shape.channels >= 0, "shape.channels must not be negative", ">= 0", shape.channels);
    impl::conv_layout_checks(layout, group, shape.tokens, shape.width, chk);
    chk.require_same("the channel count C", shape.channels)
        .require_same("the conv width w", shape.width)
        .require_same("whether a bias is given", shape.bias ? 1 : 0)
        .require_same("whether sequence ids are given", shape.seq_ids ? 1 : 0);
    chk.agree();
    links_ = impl::conv_links(layout, group, shape.tokens);
    // Every call carves at most these sizes, so reserving them here is all a call ever needs.
    const std::size_t h = static_cast<std::size_t>(shape.width - 1),
                      c = static_cast<std::size_t>(shape.channels),
                      f = static_cast<std::size_t>(links_.fragments);
    for (auto* rows : {&workspace_.halo, &workspace_.dhalo})
      rows->template reserve<Scalar>(f * h * c);
    for (auto* rows : {&workspace_.send, &workspace_.recv, &workspace_.back, &workspace_.halo_send})
      rows->template reserve<Scalar>(h * c);
    if (shape.seq_ids) {
      workspace_.halo_ids.template reserve<std::int32_t>(f * h);
      for (auto* ids : {&workspace_.send_ids, &workspace_.recv_ids})
        ids->template reserve<std::int32_t>(h);
    }
  }

  ShortConvPlan(const ShortConvPlan&) = delete;             ///< not copyable: it owns its buffers
  ShortConvPlan& operator=(const ShortConvPlan&) = delete;  ///< not copyable: it owns its buffers
  ShortConvPlan(ShortConvPlan&&) = default;                 ///< movable
  ShortConvPlan& operator=(ShortConvPlan&&) = default;      ///< movable

  /// `y [T, C]` from `x [T, C]`, `weight [C, w]`, `bias [C]` and `seq_ids [T]` (each of the last
  /// two an empty view when the shape has none); `saved` keeps handles on `x`, `weight` and
  /// `seq_ids` for the backward. Views that disagree with the plan's shape on any rank make
  /// every rank throw the same `ctxpar::Error`. Collective.
  void forward(const rows_view& x, const rows_view& weight,
               const Kokkos::View<const Scalar*, MemorySpace>& bias, const ids_view& seq_ids,
               const out_rows_view& y, saved_type& saved) {
    CTXPAR_ASSERT_ACCESSIBLE("ctxpar::chunkwise::ShortConvPlan::forward", ExecutionSpace,
                             rows_view);
    compat::ScopedRegion region("ctxpar::chunkwise::ShortConvPlan::forward");
    Preconditions chk(group_, "ctxpar::chunkwise::ShortConvPlan::forward");
    check_inputs(chk, x, weight, seq_ids);
    const std::int64_t t = shape_.tokens, c = shape_.channels;
    chk.require(shape_.bias ? ctxpar::impl::has_extents(bias, c) : !chunkwise::is_given(bias),
                "bias must be [C] when the plan's shape has a bias, an empty view otherwise",
                shape_.bias ? ctxpar::impl::shape_text({c}) : "an empty view",
                ctxpar::impl::shape_text(bias));
    chk.require(ctxpar::impl::has_extents(y, t, c), "y must be [T, C] (the plan's shape)",
                ctxpar::impl::shape_text({t, c}), ctxpar::impl::shape_text(y));
    chk.agree();
    impl::conv_forward(space_, group_, links_, x, weight, bias, seq_ids, shape_.seq_ids, y,
                       workspace_);
    saved.x = x;
    saved.weight = weight;
    saved.seq_ids = seq_ids;
    saved.filled = true;
  }

  /// From the forward that filled `saved` and `dy [T, C]`: `dx [T, C]`, and `dweight [C, w]` and
  /// `dbias [C]` (an empty view when the shape has no bias) summed over the ranks. A `saved` no
  /// forward filled, or views that disagree with the plan's shape, on any rank make every rank
  /// throw the same `ctxpar::Error`. Collective.
  void backward(const saved_type& saved, const rows_view& dy, const out_rows_view& dx,
                const out_rows_view& dweight, const Kokkos::View<Scalar*, MemorySpace>& dbias) {
    compat::ScopedRegion region("ctxpar::chunkwise::ShortConvPlan::backward");
    Preconditions chk(group_, "ctxpar::chunkwise::ShortConvPlan::backward");
    chk.require(saved.filled, "saved must come from a forward (it holds that forward's inputs)",
                "a saved state a forward filled", "a saved state no forward filled");
    check_inputs(chk, saved.x, saved.weight, saved.seq_ids);
    const std::int64_t t = shape_.tokens, c = shape_.channels, w = shape_.width;
    chk.require(ctxpar::impl::has_extents(dy, t, c), "dy must be [T, C] (the plan's shape)",
                ctxpar::impl::shape_text({t, c}), ctxpar::impl::shape_text(dy));
    chk.require(ctxpar::impl::has_extents(dx, t, c), "dx must be [T, C] (the plan's shape)",
                ctxpar::impl::shape_text({t, c}), ctxpar::impl::shape_text(dx));
    chk.require(ctxpar::impl::has_extents(dweight, c, w),
                "dweight must be [C, w] (the plan's shape)", ctxpar::impl::shape_text({c, w}),
                ctxpar::impl::shape_text(dweight));
    chk.require(shape_.bias ? ctxpar::impl::has_extents(dbias, c) : !chunkwise::is_given(dbias),
                "dbias must be [C] when the plan's shape has a bias, an empty view otherwise",
                shape_.bias ? ctxpar::impl::shape_text({c}) : "an empty view",
                ctxpar::impl::shape_text(dbias));
    chk.agree();
    impl::conv_backward(space_, group_, links_, saved.x, saved.weight, saved.seq_ids,
                        shape_.seq_ids, dy, dx, dweight, dbias, workspace_);
  }

  /// The execution space the calls run on.
  const ExecutionSpace& space() const { return space_; }
  /// The ranks the plan spans.
  const Group& group() const { return group_; }
  /// The shape the plan was built for.
  const ShortConvShape& shape() const { return shape_; }
  /// Bytes of halo buffers the plan holds (all allocated by the constructor).
  std::size_t workspace_bytes() const { return workspace_.bytes(); }

 private:
  // x, weight and seq_ids against the plan's shape (in the backward: the saved ones).
  void check_inputs(Preconditions& chk, const rows_view& x, const rows_view& weight,
                    const ids_view& seq_ids) const {
    const std::int64_t t = shape_.tokens, c = shape_.channels, w = shape_.width;
    chk.require(ctxpar::impl::has_extents(x, t, c), "x must be [T, C] (the plan's shape)",
                ctxpar::impl::shape_text({t, c}), ctxpar::impl::shape_text(x));
    chk.require(ctxpar::impl::has_extents(weight, c, w), "weight must be [C, w] (the plan's shape)",
                ctxpar::impl::shape_text({c, w}), ctxpar::impl::shape_text(weight));
    chk.require(
        shape_.seq_ids ? ctxpar::impl::has_extents(seq_ids, t) : !chunkwise::is_given(seq_ids),
        "seq_ids must be [T] when the plan's shape has ids, an empty view otherwise",
        shape_.seq_ids ? ctxpar::impl::shape_text({t}) : "an empty view",
        ctxpar::impl::shape_text(seq_ids));
  }

  ExecutionSpace space_;
  Group group_;
  ShortConvShape shape_;
  impl::ConvLinks links_;
  impl::ConvWorkspace<Scalar, MemorySpace> workspace_;
};

}  // namespace ctxpar::chunkwise
