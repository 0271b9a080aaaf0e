/// \file
/// `GdpContextParallel`: head-partitioned context parallelism for a Gated Delta Product layer —
/// the input transpose of `[z | V | K | Q | b | a]` (`pre_conv_ssm`), the output transposes of `y`
/// and `z` (`post_conv_ssm`), the per-rank slices of the full (`P = 1`) parameters with their
/// gradients summed back, and the layer core run on the rank's heads in between.
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "ctxpar/comm/host_isa_agreement.hpp"
#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar/comm/reduce.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/core/workspace.hpp"
#include "ctxpar/heads/channel_layout.hpp"
#include "ctxpar/heads/impl/gdp_layer_core.hpp"
#include "ctxpar/heads/transpose_plan.hpp"

namespace ctxpar::heads {

/// Numerical options of the layer.
struct GdpOptions {
  double l2_eps = 1e-6;  ///< added to the squared norm of q and k before the square root
  int chunk_size = 64;   ///< tokens per chunk of the chunkwise recurrence kernel
};

/// The full (`P = 1`) parameters of the layer, or their gradients: `conv_weight [C_conv, w]`,
/// `conv_bias [C_conv]` over `[V | K | Q]`, `dt_bias [H]`, `a_log [H]`, and the skip term `d`
/// (`[H]`, `[d_inner]` or empty, per `GdpShape::skip`).
template <class Scalar, class MemorySpace>
struct GdpParameters {
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> conv_weight;  ///< `[C_conv, w]`
  Kokkos::View<Scalar*, MemorySpace> conv_bias;                          ///< `[C_conv]`
  Kokkos::View<Scalar*, MemorySpace> dt_bias;                            ///< `[H]`
  Kokkos::View<Scalar*, MemorySpace> a_log;                              ///< `[H]`
  Kokkos::View<Scalar*, MemorySpace> d;  ///< `D`: `[H]`, `[d_inner]`, or empty (no skip term)

  /// Zero-initialised parameters of `shape` (labels `ctxpar::heads::<what>`).
  static GdpParameters allocate(const GdpShape& shape, const std::string& what = "parameters") {
    GdpParameters p;
    p.conv_weight = decltype(p.conv_weight)("ctxpar::heads::" + what + "::conv_weight",
                                            shape.conv_channels(), shape.conv_width);
    p.conv_bias =
        decltype(p.conv_bias)("ctxpar::heads::" + what + "::conv_bias", shape.conv_channels());
    p.dt_bias = decltype(p.dt_bias)("ctxpar::heads::" + what + "::dt_bias", shape.nheads);
    p.a_log = decltype(p.a_log)("ctxpar::heads::" + what + "::a_log", shape.nheads);
    p.d = decltype(p.d)("ctxpar::heads::" + what + "::d", shape.skip_size());
    return p;
  }
};

/// What `GdpContextParallel::backward` needs from one `forward`: the head-parallel input, this
/// rank's parameter slices and the layer core's activations. Caller-owned and
/// default-constructible (empty): the first `forward` into it sizes its buffers, later forwards
/// of the same plan reuse them, and each `backward` reads the forward that last filled it.
template <class Scalar, class MemorySpace>
struct GdpSaved {
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> u;  ///< `[T, C_local]` head-parallel x
  GdpParameters<Scalar, MemorySpace> local;  ///< this rank's slices of the forward's parameters
  impl::GdpLayerSaved<Scalar, MemorySpace> core;  ///< the layer core's activations
  /// Whether a `forward` completed into this object.
  bool filled() const { return core.filled; }
};

namespace impl {
/// dst(i, k) = src(map(i), k): the rows of a full parameter a rank uses.
template <class Src, class Dst, class Map>
struct GatherRows {
  Src src;
  Dst dst;
  Map map;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t k) const {
    dst(i, k) = src(map(i), k);
  }
};
/// dst(map(i), k) = src(i, k) (rows not in `map` untouched; `map` is injective on a rank).
template <class Src, class Dst, class Map>
struct ScatterRows {
  Src src;
  Dst dst;
  Map map;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t k) const {
    dst(map(i), k) = src(i, k);
  }
};
/// dst(i) = src(map(i)).
template <class Src, class Dst, class Map>
struct Gather1 {
  Src src;
  Dst dst;
  Map map;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { dst(i) = src(map(i)); }
};
/// dst(map(i)) = src(i).
template <class Src, class Dst, class Map>
struct Scatter1 {
  Src src;
  Dst dst;
  Map map;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { dst(map(i)) = src(i); }
};
}  // namespace impl

/// Head-parallel GDP for one layer shape, one sequence layout and one communicator. Construction
/// is collective (see `TransposePlan`). `Scalar` is the activations' storage type: `float`,
/// `double`, or a 16-bit type (`ctxpar::bfloat16`, `ctxpar::float16`), whose activations `x`,
/// `y`, `z` and their gradients are stored and moved between ranks in 16 bits while the layer
/// core computes in fp32 (`core/storage.hpp`); parameters, their gradients and what `saved`
/// holds are in the compute type, and the adjoint transpose sums the gradients of repeated key
/// groups in it. It follows the plan contract (`core/plan.hpp`): what the
/// backward reads lives in a caller-owned `GdpSaved` (`saved_type`); the plan keeps only its
/// transposes, index tables and work buffers. The policies are `EvenHeads`/`UnevenHeads` and
/// `Contiguous`/`ZigzagPerSequence`; every call runs on the `ExecutionSpace` instance the plan is
/// built with.
template <class HeadPolicy, class TokenOrder, class ExecutionSpace, class Scalar,
          class MemorySpace = typename ExecutionSpace::memory_space>
class GdpContextParallel {
 public:
  using execution_space = ExecutionSpace;  ///< where every kernel and collective runs
  using scalar_type = Scalar;              ///< activation type
  using value_type = Scalar;               ///< activation type
  using compute_type = compute_t<Scalar>;  ///< arithmetic, parameter and saved type
  using memory_space = MemorySpace;        ///< where everything lives
  /// Activations `[rows, channels]`.
  using matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>;
  /// `[rows, channels]` in the compute type (the core's activations and gradients).
  using compute_matrix = Kokkos::View<compute_type**, Kokkos::LayoutRight, MemorySpace>;
  using vector = Kokkos::View<compute_type*, MemorySpace>;  ///< parameters
  using plan_type =
      TransposePlan<HeadPolicy, TokenOrder, ExecutionSpace, Scalar, MemorySpace>;  ///< transposes
  using parameters = GdpParameters<compute_type, MemorySpace>;  ///< full parameters
  using saved_type = GdpSaved<compute_type, MemorySpace>;       ///< what the backward reads

  /// Collective. `space` runs every call of the plan; `tokens` = `T`; `cu_seqlens` (global,
  /// identical on every rank) for packed input.
  GdpContextParallel(const ExecutionSpace& space, const Group& group, const GdpShape& shape,
                     std::int64_t tokens, std::vector<std::int64_t> cu_seqlens = {},
                     const GdpOptions& options = {})
      : shape_(shape),
        pre_(space, group, shape.input_layout(), tokens, cu_seqlens),
        post_(space, group, shape.output_layout(), tokens, cu_seqlens) {
    Preconditions chk(group, "ctxpar::heads::GdpContextParallel");
    chk.require(shape.conv_width >= 1, "the conv width must be positive", ">= 1", shape.conv_width);
    chk.require(shape.householder >= 1 && shape.d_state >= 1 && shape.headdim >= 1,
                "householder, d_state and headdim must be positive", ">= 1",
                "M " + std::to_string(shape.householder) + ", N " + std::to_string(shape.d_state) +
                    ", d " + std::to_string(shape.headdim));
    chunkwise::impl::require_chunk_size(chk, options.chunk_size, "options.chunk_size");
    // eps keeps the L2 normalisation of an all-zero q or k finite; 0, a negative or a NaN eps
    // turns such tokens (and the state after them) into NaN.
    chk.require(std::isfinite(options.l2_eps) && options.l2_eps > 0.0,
                "options.l2_eps must be finite and positive", "a finite eps > 0", options.l2_eps);
    int isa = 0;
    ctxpar::impl::agree_host_isa(chk, isa);
    chk.agree();
    host_isa_ = static_cast<HostIsa>(isa);
    const int me = group.rank();
    const KeyGroupPartition& b = pre_.blocks();
    const ChannelLayout in = shape.input_layout();
    dims_.heads = b.heads.size(me);
    dims_.groups = b.size(me);
    dims_.headdim = shape.headdim;
    dims_.d_state = shape.d_state;
    dims_.copies = shape.householder;
    dims_.width = shape.conv_width;
    dims_.skip = shape.skip;
    dims_.head_begin = b.heads.begin(me);
    dims_.group_begin = b.begin(me);
    dims_.heads_per_group = b.heads_per_group();
    dims_.off_v = in.local_offset(in.find("V"), b, me);
    dims_.off_b = in.local_offset(in.find("b"), b, me);
    dims_.off_a = in.local_offset(in.find("a"), b, me);
    core_ = impl::GdpLayerCore<compute_type, MemorySpace>(dims_, pre_.cu_seqlens(), options.l2_eps,
                                                          options.chunk_size);

    ctxpar::impl::upload(shape.conv_layout().channel_map(b, me), conv_map_,
                         "ctxpar::heads::conv_map");
    std::vector<std::int64_t> heads(dims_.heads), channels(dims_.d_inner());
    for (int h = 0; h < dims_.heads; ++h) heads[h] = dims_.head_begin + h;
    for (std::int64_t c = 0; c < dims_.d_inner(); ++c)
      channels[c] = std::int64_t(dims_.head_begin) * shape.headdim + c;
    ctxpar::impl::upload(heads, head_map_, "ctxpar::heads::head_map");
    ctxpar::impl::upload(channels, channel_map_, "ctxpar::heads::d_inner_map");
    local_grad_ = allocate_local("local_gradients");
    du_ = compute_matrix("ctxpar::heads::du", tokens, pre_.local_channels());
    y_ = compute_matrix("ctxpar::heads::y", tokens, dims_.d_inner());
    z_ = compute_matrix("ctxpar::heads::z", tokens, dims_.d_inner());
    dy_ = compute_matrix("ctxpar::heads::dy", tokens, dims_.d_inner());
    dz_ = compute_matrix("ctxpar::heads::dz", tokens, dims_.d_inner());
    if constexpr (sixteen_bit) {
      // The 16-bit sides of the transposes; the adjoint's output is fp32, rounded into dx.
      u16_ = matrix("ctxpar::heads::u16", tokens, pre_.local_channels());
      y16_ = matrix("ctxpar::heads::y16", tokens, dims_.d_inner());
      z16_ = matrix("ctxpar::heads::z16", tokens, dims_.d_inner());
      dx_ = compute_matrix("ctxpar::heads::dx", pre_.local_rows(), pre_.channels());
    }
  }

  /// Plans own their buffers: movable, not copyable (a copy would share them).
  GdpContextParallel(const GdpContextParallel&) = delete;
  GdpContextParallel& operator=(const GdpContextParallel&) = delete;
  GdpContextParallel(GdpContextParallel&&) = default;             ///< moves the buffers
  GdpContextParallel& operator=(GdpContextParallel&&) = default;  ///< moves the buffers

  /// The execution space instance the plan runs on.
  const execution_space& space() const { return pre_.space(); }
  /// The ranks of the plan.
  const Group& group() const { return pre_.group(); }
  /// Bytes of the buffers the plan owns now: its transposes', its index tables, its work buffers
  /// and the layer core's (`saved_type` objects are the caller's and not counted).
  std::size_t workspace_bytes() const {
    std::size_t n = du_.span() + y_.span() + z_.span() + dy_.span() + dz_.span() + dx_.span() +
                    local_grad_.conv_weight.span() + local_grad_.conv_bias.span() +
                    local_grad_.dt_bias.span() + local_grad_.a_log.span() + local_grad_.d.span();
    n *= sizeof(compute_type);
    n += (u16_.span() + y16_.span() + z16_.span()) * sizeof(Scalar);
    n += (conv_map_.span() + head_map_.span() + channel_map_.span()) * sizeof(std::int64_t);
    return n + pre_.workspace_bytes() + post_.workspace_bytes() + core_.workspace_bytes();
  }

  /// The layer shape at `P = 1`.
  const GdpShape& shape() const { return shape_; }
  /// The instruction set of the host kernels, agreed by the ranks at construction
  /// (`core/host_isa.hpp`).
  HostIsa host_isa() const { return host_isa_; }
  /// This rank's heads, groups and section offsets.
  const impl::LocalDims& local_dims() const { return dims_; }
  /// The input transpose plan (`[z | V | K | Q | b | a]`).
  const plan_type& input_plan() const { return pre_; }
  /// The output transpose plan (`y` or `z`, `d_inner` channels).
  const plan_type& output_plan() const { return post_; }
  /// Conv channels on this rank: `d_inner/P·M + ngroups_local·d_state·(M + 1)`.
  std::int64_t conv1d_channels() const { return dims_.conv_channels(); }

  /// Collective. `x [T/P, C]` (sequence-parallel) → `u [T, C_local]` (head-parallel, natural
  /// order).
  template <class X, class U>
  void pre_conv_ssm(const X& x, const U& u) const {
    pre_.to_head_parallel(x, u);
  }
  /// Collective. As above, for a batch that comes with its packed metadata `cu_seqlens` (the
  /// reference's `packed_seq_params`): refused on every rank when it is not the plan's, in
  /// particular a packed batch on a plan built dense under `ZigzagPerSequence`.
  template <class X, class U>
  void pre_conv_ssm(const X& x, const U& u, const std::vector<std::int64_t>& cu_seqlens) const {
    agree_batch("ctxpar::heads::GdpContextParallel::pre_conv_ssm", cu_seqlens);
    pre_conv_ssm(x, u);
  }
  /// Collective. Backward of `pre_conv_ssm`: sums the gradients of repeated key groups.
  template <class U, class X>
  void pre_conv_ssm_backward(const U& du, const X& dx) const {
    pre_.adjoint_to_head_parallel(du, dx);
  }
  /// Collective. `y [T, d_inner_local]` (head-parallel) → `[T/P, d_inner]`; use for `y` and `z`.
  template <class Y, class X>
  void post_conv_ssm(const Y& y, const X& out) const {
    post_.to_sequence_parallel(y, out);
  }
  /// Collective. As above, with the batch's packed metadata checked like `pre_conv_ssm`'s.
  template <class Y, class X>
  void post_conv_ssm(const Y& y, const X& out, const std::vector<std::int64_t>& cu_seqlens) const {
    agree_batch("ctxpar::heads::GdpContextParallel::post_conv_ssm", cu_seqlens);
    post_conv_ssm(y, out);
  }
  /// Collective. Backward of `post_conv_ssm`.
  template <class X, class Y>
  void post_conv_ssm_backward(const X& dout, const Y& dy) const {
    post_.to_head_parallel(dout, dy);
  }

  /// This rank's slices of the full parameters (conv rows per householder copy: V by head block,
  /// K and Q by key group with the repeat; `dt_bias`, `a_log` by head block; `d` by head block or
  /// by the block's channels).
  void slice_parameters(const parameters& full, const parameters& local) const {
    const ExecutionSpace& space = pre_.space();
    using p2 =
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>;
    const std::int64_t cc = conv1d_channels();
    if (cc > 0) {
      Kokkos::parallel_for(
          "ctxpar::heads::slice_conv_weight", p2(space, {0, 0}, {cc, shape_.conv_width}),
          impl::GatherRows<decltype(full.conv_weight), decltype(local.conv_weight), index_view>{
              full.conv_weight, local.conv_weight, conv_map_});
      gather1(space, "ctxpar::heads::slice_conv_bias", full.conv_bias, local.conv_bias, conv_map_);
    }
    gather1(space, "ctxpar::heads::slice_dt_bias", full.dt_bias, local.dt_bias, head_map_);
    gather1(space, "ctxpar::heads::slice_a_log", full.a_log, local.a_log, head_map_);
    if (shape_.skip != SkipTerm::none)
      slice_vector(full.d, local.d, shape_.skip == SkipTerm::per_channel);
  }
  /// Slice of a per-head (`has_hdim == false`, `[H]`) or per-channel (`[d_inner]`) vector such as
  /// `D`.
  void slice_vector(const vector& full, const vector& local, bool has_hdim) const {
    gather1(pre_.space(), "ctxpar::heads::slice_vector", full, local,
            has_hdim ? channel_map_ : head_map_);
  }
  /// Collective. Folds this rank's slice gradients into full-size gradients (zero elsewhere) and
  /// sums them over ranks: every rank ends with the gradient of the full parameters.
  void accumulate_gradients(const parameters& local, const parameters& full) const {
    const ExecutionSpace& space = pre_.space();
    using p2 =
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>;
    Kokkos::deep_copy(space, full.conv_weight, compute_type(0));
    Kokkos::deep_copy(space, full.conv_bias, compute_type(0));
    Kokkos::deep_copy(space, full.dt_bias, compute_type(0));
    Kokkos::deep_copy(space, full.a_log, compute_type(0));
    if (full.d.extent(0) > 0) Kokkos::deep_copy(space, full.d, compute_type(0));
    const std::int64_t cc = conv1d_channels();
    if (cc > 0) {
      Kokkos::parallel_for(
          "ctxpar::heads::fold_conv_weight", p2(space, {0, 0}, {cc, shape_.conv_width}),
          impl::ScatterRows<decltype(local.conv_weight), decltype(full.conv_weight), index_view>{
              local.conv_weight, full.conv_weight, conv_map_});
      scatter1(space, "ctxpar::heads::fold_conv_bias", local.conv_bias, full.conv_bias, conv_map_);
    }
    scatter1(space, "ctxpar::heads::fold_dt_bias", local.dt_bias, full.dt_bias, head_map_);
    scatter1(space, "ctxpar::heads::fold_a_log", local.a_log, full.a_log, head_map_);
    if (shape_.skip != SkipTerm::none)
      scatter1(space, "ctxpar::heads::fold_d", local.d, full.d,
               shape_.skip == SkipTerm::per_channel ? channel_map_ : head_map_);
    const Group& g = pre_.group();
    allreduce_sum(space, g, full.conv_weight, unchecked);
    allreduce_sum(space, g, full.conv_bias, unchecked);
    allreduce_sum(space, g, full.dt_bias, unchecked);
    allreduce_sum(space, g, full.a_log, unchecked);
    if (shape_.skip != SkipTerm::none) allreduce_sum(space, g, full.d, unchecked);
  }

  /// Collective. The layer forward: `x [T/P, C]` sequence-parallel and the full parameters →
  /// `y [T/P, d_inner]` and `z [T/P, d_inner]` sequence-parallel (same token order as `x`); what
  /// the backward needs goes into `saved` (sized on its first forward, reused after).
  /// `cu_seqlens` is the packed metadata of this batch (empty for a dense batch); it must be the
  /// plan's. Packed input under `ZigzagPerSequence` on a plan built without its metadata is
  /// refused: the dense zigzag pattern would scramble tokens across documents.
  void forward(const matrix& x, const parameters& full, const matrix& y, const matrix& z,
               saved_type& saved, const std::vector<std::int64_t>& cu_seqlens = {}) {
    const ExecutionSpace& space = pre_.space();
    compat::ScopedRegion region("ctxpar::heads::gdp_forward");
    const ctxpar::impl::HostIsaScope isa_scope(host_isa_);
    check_parameters(full, cu_seqlens);
    // Empty until the core completes: a call refused below leaves no half-written state a
    // backward could read.
    saved.core.filled = false;
    if (!fits(saved)) size_saved(saved);
    slice_parameters(full, saved.local);
    if constexpr (sixteen_bit) {
      // 16 bits on the wire both ways; the core reads and writes fp32.
      pre_conv_ssm(x, u16_);
      convert_storage(space, u16_, saved.u);
      const parameters& local = saved.local;
      core_.forward(space, saved.u, local.conv_weight, local.conv_bias, local.dt_bias, local.a_log,
                    local.d, y_, z_, saved.core);
      convert_storage(space, y_, y16_);
      convert_storage(space, z_, z16_);
      post_conv_ssm(y16_, y);
      post_conv_ssm(z16_, z);
    } else {
      pre_conv_ssm(x, saved.u);
      // Where the output transpose is the identity (one rank), the core writes y and z in place.
      const bool direct = post_.identity();
      if (direct) {
        post_.require_views("ctxpar::heads::GdpContextParallel::forward (y)", y, y);
        post_.require_views("ctxpar::heads::GdpContextParallel::forward (z)", z, z);
      }
      const parameters& local = saved.local;
      core_.forward(space, saved.u, local.conv_weight, local.conv_bias, local.dt_bias, local.a_log,
                    local.d, direct ? y : y_, direct ? z : z_, saved.core);
      if (!direct) {
        post_conv_ssm(y_, y);
        post_conv_ssm(z_, z);
      }
    }
  }

  /// Collective. Backward of the `forward` that filled `saved`: `dy`, `dz` (sequence-parallel) →
  /// `dx` and the gradients of the full parameters, summed over ranks. A `saved` no forward of
  /// this plan filled is refused on every rank. Not `const`: the recurrence keeps its backward
  /// scratch in `saved`.
  void backward(saved_type& saved, const matrix& dy, const matrix& dz, const matrix& dx,
                const parameters& grads) {
    const ExecutionSpace& space = pre_.space();
    compat::ScopedRegion region("ctxpar::heads::gdp_backward");
    const ctxpar::impl::HostIsaScope isa_scope(host_isa_);
    check_parameters(grads, {}, &saved);
    if constexpr (sixteen_bit) {
      // The output gradients arrive in 16 bits (y16_, z16_ are free again); everything after the
      // widening is fp32, the adjoint's sums included, and dx is rounded once.
      pre_.require_views("ctxpar::heads::GdpContextParallel::backward (dx)", dx, u16_);
      post_conv_ssm_backward(dy, y16_);
      post_conv_ssm_backward(dz, z16_);
      convert_storage(space, y16_, dy_);
      convert_storage(space, z16_, dz_);
      core_.backward(space, saved.core, dy_, dz_, du_, local_grad_.conv_weight,
                     local_grad_.conv_bias, local_grad_.dt_bias, local_grad_.a_log, local_grad_.d);
      pre_conv_ssm_backward(du_, dx_);
      convert_storage(space, dx_, dx);
      accumulate_gradients(local_grad_, grads);
    } else {
      // As in `forward`: identity transposes (one rank) read dy, dz and write dx in place. x itself
      // is still copied into saved.u, which the backward reads: the caller's x may change.
      const bool direct_out = post_.identity(), direct_in = pre_.identity();
      if (direct_out) {
        post_.require_views("ctxpar::heads::GdpContextParallel::backward (dy)", dy, dy);
        post_.require_views("ctxpar::heads::GdpContextParallel::backward (dz)", dz, dz);
      } else {
        post_conv_ssm_backward(dy, dy_);
        post_conv_ssm_backward(dz, dz_);
      }
      if (direct_in) pre_.require_views("ctxpar::heads::GdpContextParallel::backward (dx)", dx, dx);
      core_.backward(space, saved.core, direct_out ? dy : dy_, direct_out ? dz : dz_,
                     direct_in ? dx : du_, local_grad_.conv_weight, local_grad_.conv_bias,
                     local_grad_.dt_bias, local_grad_.a_log, local_grad_.d);
      if (!direct_in) pre_conv_ssm_backward(du_, dx);
      accumulate_gradients(local_grad_, grads);
    }
  }

 private:
  using index_view = Kokkos::View<std::int64_t*, MemorySpace>;

  // The packed metadata a batch comes with, against the plan's. What cannot be seen here: a
  // packed batch handed over with no metadata at all (`batch_cu` empty) is, to the library, a
  // dense batch; only the plan's own cu_seqlens can describe it then.
  void require_batch(Preconditions& chk, const std::vector<std::int64_t>& batch_cu) const {
    if (batch_cu.empty()) return;
    const bool plan_dense = pre_.cu_seqlens().size() == 2;
    const bool batch_packed = batch_cu.size() > 2;
    chk.require(
        !(plan_dense && batch_packed && std::is_same_v<TokenOrder, ZigzagPerSequence>),
        "packed input under ZigzagPerSequence needs its sequence metadata in the plan (the dense "
        "zigzag pattern would scramble tokens across sequence boundaries)",
        "a plan built with cu_seqlens",
        "a dense plan and " + std::to_string(batch_cu.size() - 1) + " sequences");
    chk.require(batch_cu == pre_.cu_seqlens() || (plan_dense && !batch_packed),
                "the batch's cu_seqlens must be the plan's", pre_.cu_seqlens().size() - 1,
                std::to_string(batch_cu.size() - 1) + " sequences");
  }

  // Collective: `require_batch` alone, agreed by every rank under the operation name `op`.
  void agree_batch(const char* op, const std::vector<std::int64_t>& batch_cu) const {
    Preconditions chk(pre_.group(), op);
    require_batch(chk, batch_cu);
    chk.agree();
  }

  // Whether the activations are 16-bit (computed in fp32 between the transposes).
  static constexpr bool sixteen_bit = is_narrow_storage_v<Scalar>;

  // Whether the buffers of `saved` have this plan's sizes on this rank.
  bool fits(const saved_type& saved) const {
    const parameters& l = saved.local;
    return static_cast<std::int64_t>(saved.u.extent(0)) == pre_.tokens() &&
           static_cast<std::int64_t>(saved.u.extent(1)) == pre_.local_channels() &&
           static_cast<std::int64_t>(l.conv_weight.extent(0)) == dims_.conv_channels() &&
           static_cast<int>(l.conv_weight.extent(1)) == shape_.conv_width &&
           static_cast<std::int64_t>(l.conv_bias.extent(0)) == dims_.conv_channels() &&
           static_cast<int>(l.dt_bias.extent(0)) == dims_.heads &&
           static_cast<int>(l.a_log.extent(0)) == dims_.heads &&
           static_cast<std::int64_t>(l.d.extent(0)) ==
               skip_size(shape_.skip, dims_.heads, shape_.headdim) &&
           core_.fits(saved.core);
  }

  // The buffers of `saved` at this plan's sizes (labelled; the core's sized by the core).
  void size_saved(saved_type& saved) const {
    saved.u = compute_matrix("ctxpar::heads::u", pre_.tokens(), pre_.local_channels());
    saved.local = allocate_local("local_parameters");
  }

  // `saved` (the backward's) must come from a forward of this plan.
  void check_parameters(const parameters& p, const std::vector<std::int64_t>& batch_cu,
                        const saved_type* saved = nullptr) const {
    Preconditions chk(pre_.group(), "ctxpar::heads::GdpContextParallel");
    require_batch(chk, batch_cu);
    if (saved)
      chk.require(saved->filled() && fits(*saved),
                  "saved must hold a forward of this plan (call forward with it first)",
                  "a saved state a forward filled",
                  saved->filled() ? "one sized for another plan" : "an empty saved state");
    chk.require(
        static_cast<std::int64_t>(p.conv_weight.extent(0)) == shape_.conv_channels() &&
            static_cast<std::int64_t>(p.conv_weight.extent(1)) == shape_.conv_width,
        "conv_weight must be [C_conv, w]",
        std::to_string(shape_.conv_channels()) + " x " + std::to_string(shape_.conv_width),
        std::to_string(p.conv_weight.extent(0)) + " x " + std::to_string(p.conv_weight.extent(1)));
    chk.require(static_cast<std::int64_t>(p.conv_bias.extent(0)) == shape_.conv_channels(),
                "conv_bias must be [C_conv]", shape_.conv_channels(), p.conv_bias.extent(0));
    chk.require(static_cast<int>(p.dt_bias.extent(0)) == shape_.nheads &&
                    static_cast<int>(p.a_log.extent(0)) == shape_.nheads,
                "dt_bias and A_log must be [nheads]", shape_.nheads,
                std::to_string(p.dt_bias.extent(0)) + " and " + std::to_string(p.a_log.extent(0)));
    chk.require(static_cast<std::int64_t>(p.d.extent(0)) == shape_.skip_size(),
                std::string("D must have the skip term's size (") + skip_name(shape_.skip) + ")",
                shape_.skip_size(), p.d.extent(0));
    // Every rank must apply (or not) the same skip term: a rank-local choice would silently give
    // a different layer on some heads.
    chk.require_same("the skip term D", static_cast<std::int64_t>(shape_.skip));
    chk.agree();
  }

  parameters allocate_local(const std::string& what) const {
    parameters p;
    p.conv_weight = decltype(p.conv_weight)("ctxpar::heads::" + what + "::conv_weight",
                                            dims_.conv_channels(), shape_.conv_width);
    p.conv_bias = vector("ctxpar::heads::" + what + "::conv_bias", dims_.conv_channels());
    p.dt_bias = vector("ctxpar::heads::" + what + "::dt_bias", dims_.heads);
    p.a_log = vector("ctxpar::heads::" + what + "::a_log", dims_.heads);
    p.d = vector("ctxpar::heads::" + what + "::d",
                 skip_size(shape_.skip, dims_.heads, shape_.headdim));
    return p;
  }

  template <class Src, class Dst>
  static void gather1(const ExecutionSpace& space, const char* label, const Src& src,
                      const Dst& dst, const index_view& map) {
    const std::int64_t n = map.extent(0);
    Kokkos::parallel_for(
        label, Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n),
        impl::Gather1<Src, Dst, index_view>{src, dst, map});
  }
  template <class Src, class Dst>
  static void scatter1(const ExecutionSpace& space, const char* label, const Src& src,
                       const Dst& dst, const index_view& map) {
    const std::int64_t n = map.extent(0);
    Kokkos::parallel_for(
        label, Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n),
        impl::Scatter1<Src, Dst, index_view>{src, dst, map});
  }

  GdpShape shape_;
  HostIsa host_isa_ = HostIsa::baseline;
  plan_type pre_, post_;
  impl::LocalDims dims_;
  impl::GdpLayerCore<compute_type, MemorySpace> core_;
  index_view conv_map_, head_map_, channel_map_;
  parameters local_grad_;
  compute_matrix du_, y_, z_, dy_, dz_;
  // 16-bit activations only: the head-parallel x, y, z (also dy, dz on their way back) and dx
  // in fp32 before its rounding; empty otherwise.
  matrix u16_, y16_, z16_;
  compute_matrix dx_;
};

}  // namespace ctxpar::heads
