/// \file
/// `impl::GdpLayerCore`, the layer core inside `GdpContextParallel` (not public API): the Gated
/// Delta Product layer core on head-sharded data — causal depthwise conv (zero initial state per
/// sequence) → SiLU → split V, K, Q, b, a → β = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias)
/// → L2-normalised q, k → the gated delta product recurrence per head over the whole sequence (the
/// chunkwise GDP backend of mechanism B, called on the rank's whole sequence) → y, plus the skip
/// term `D ⊙ x_V` when the layer has one (x_V: householder copy 0 of V after conv and SiLU) —
/// forward and backward. No communication: every rank runs it on the heads it owns.
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ctxpar/chunkwise/gated_delta_product.hpp"
#include "ctxpar/chunkwise/local_sequences.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/host_mirror.hpp"
#include "ctxpar/core/team_size.hpp"
#include "ctxpar/core/view_checks.hpp"
#include "ctxpar/expr/expr.hpp"
#include "ctxpar/heads/impl/layer_kernels.hpp"

namespace ctxpar::heads::impl {

/// What `GdpLayerCore::backward` reads from one `forward`: the activations of the conv, the
/// normalisation and the recurrence, and views of that forward's input and parameter slices.
/// Caller-owned (default-constructible, empty); the first `forward` into it sizes its buffers and
/// later forwards of the same shape reuse them.
template <class Scalar, class MemorySpace>
struct GdpLayerSaved {
  /// `[rows, cols]` activations.
  using matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>;
  /// Per-head (or per-channel) parameters.
  using vector = Kokkos::View<Scalar*, MemorySpace>;
  /// `[rows, H, D]` activations.
  using tensor3 = Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace>;
  /// The recurrence backend's own saved state.
  using recurrence_saved =
      typename chunkwise::GatedDeltaProductBackend<Scalar, MemorySpace>::saved_type;

  matrix u;                     ///< the forward's input `[T, C_local]` (a view of the caller's)
  vector dt_bias;               ///< the forward's `dt_bias` slice (a view of the caller's)
  vector a_log;                 ///< the forward's `A_log` slice (a view of the caller's)
  vector d;                     ///< the forward's `D` slice (a view of the caller's)
  matrix pre;                   ///< conv output before SiLU `[T, C_conv]`
  matrix act;                   ///< conv output after SiLU `[T, C_conv]`
  matrix taps;                  ///< conv weights tap-major `[width, C_conv]`
  tensor3 rnorm;                ///< reciprocal norms of q and k `[T, M + 1, groups]`
  tensor3 q;                    ///< recurrence queries `[T, H, N]`
  tensor3 k;                    ///< recurrence keys `[T·M, H, N]`
  tensor3 v;                    ///< recurrence values `[T·M, H, d]`
  matrix beta;                  ///< write strengths `[T·M, H]`
  matrix g;                     ///< log-decay gates `[T, H]`
  recurrence_saved recurrence;  ///< what the recurrence backend keeps
  bool sized = false;           ///< whether a `forward` sized the buffers (any may be empty)
  bool filled = false;          ///< whether a `forward` completed into this object
};

/// The layer core of one rank. Holds its work buffers (allocated once, labelled); what the
/// backward pass needs from a `forward` goes into a caller-owned `GdpLayerSaved`. Views are
/// token-major, natural order, LayoutRight.
template <class Scalar, class MemorySpace>
class GdpLayerCore {
 public:
  using saved_type = GdpLayerSaved<Scalar, MemorySpace>;  ///< what the backward reads
  using value_type = Scalar;                              ///< activation type
  using memory_space = MemorySpace;                       ///< where buffers live
  using matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>;    ///< `[rows, cols]`
  using vector = Kokkos::View<Scalar*, MemorySpace>;                          ///< per channel/head
  using tensor3 = Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace>;  ///< `[rows, H, D]`

  GdpLayerCore() = default;
  /// `T` of `cu_seqlens` after checking that it starts at 0 and never decreases (local `Error`
  /// otherwise: the per-token tables below are indexed by it). Errors name `GdpContextParallel`,
  /// the operator users call, as does the accessibility check of `forward`.
  static std::int64_t checked_tokens(const std::vector<std::int64_t>& cu) {
    const std::string op = "ctxpar::heads::GdpContextParallel";
    require_local(!cu.empty() && cu.front() == 0, op, "cu_seqlens must start with 0",
                  "cu_seqlens[0] = 0",
                  cu.empty() ? std::string("an empty cu_seqlens")
                             : "cu_seqlens[0] = " + ctxpar::impl::to_text(cu.front()));
    for (std::size_t i = 1; i < cu.size(); ++i) {
      require_local(
          cu[i] >= cu[i - 1], op, "cu_seqlens must be non-decreasing",
          "cu_seqlens[" + ctxpar::impl::to_text(i) + "] >= " + ctxpar::impl::to_text(cu[i - 1]),
          "cu_seqlens[" + ctxpar::impl::to_text(i) + "] = " + ctxpar::impl::to_text(cu[i]));
    }
    return cu.back();
  }
  /// `dims`: this rank's heads and groups; `cu_seqlens`: natural-order sequence boundaries over
  /// `T = cu_seqlens.back()` tokens; `l2_eps`, `chunk_size`: the plan's `GdpOptions`.
  GdpLayerCore(const LocalDims& dims, const std::vector<std::int64_t>& cu_seqlens, double l2_eps,
               int chunk_size)
      : dims_(dims), tokens_(checked_tokens(cu_seqlens)), eps_(l2_eps) {
    const std::int64_t t = tokens_;
    seq_start_ = Kokkos::View<std::int64_t*, MemorySpace>("ctxpar::heads::seq_start", t);
    seq_end_ = Kokkos::View<std::int64_t*, MemorySpace>("ctxpar::heads::seq_end", t);
    auto s = ctxpar::impl::host_mirror(seq_start_);
    auto e = ctxpar::impl::host_mirror(seq_end_);
    for (std::size_t q = 0; q + 1 < cu_seqlens.size(); ++q)
      for (std::int64_t x = cu_seqlens[q]; x < cu_seqlens[q + 1]; ++x) {
        s(x) = cu_seqlens[q];
        e(x) = cu_seqlens[q + 1];
      }
    Kokkos::deep_copy(seq_start_, s);
    Kokkos::deep_copy(seq_end_, e);
    // Whole sequences, empty ones dropped (the backend wants non-empty local sequences); the
    // scale is the backend's default d_state^(-1/2).
    std::vector<std::int64_t> cu{0};
    for (std::size_t q = 1; q < cu_seqlens.size(); ++q)
      if (cu_seqlens[q] > cu.back()) cu.push_back(cu_seqlens[q]);
    if (t > 0) seqs_ = chunkwise::LocalSequences::from_cu_seqlens(cu);
    chunkwise::BackendOptions bo;
    bo.chunk_size = chunk_size;
    backend_ = backend_type(dims.copies, bo);
    // The recurrence's per-shape chunk table, once: every forward and backward reads it.
    if (t > 0 && dims.heads > 0)
      table_ = backend_.make_table(seqs_, {t, dims.heads, dims.d_state, dims.headdim});
  }

  /// Local sizes.
  const LocalDims& dims() const { return dims_; }
  /// Tokens `T`.
  std::int64_t tokens() const { return tokens_; }

  /// Whether the buffers of `saved` have this core's sizes (a forward then reuses them).
  bool fits(const saved_type& saved) const {
    const auto t = static_cast<std::size_t>(tokens_), m = static_cast<std::size_t>(dims_.copies),
               h = static_cast<std::size_t>(dims_.heads);
    const auto cc = static_cast<std::size_t>(dims_.conv_channels());
    return saved.pre.extent(0) == t && saved.pre.extent(1) == cc && saved.act.extent(0) == t &&
           saved.act.extent(1) == cc && saved.taps.extent(0) == std::size_t(dims_.width) &&
           saved.taps.extent(1) == cc && saved.rnorm.extent(0) == t &&
           saved.rnorm.extent(1) == m + 1 && saved.rnorm.extent(2) == std::size_t(dims_.groups) &&
           saved.q.extent(0) == t && saved.q.extent(1) == h &&
           saved.q.extent(2) == std::size_t(dims_.d_state) && saved.k.extent(0) == t * m &&
           saved.v.extent(0) == t * m && saved.v.extent(2) == std::size_t(dims_.headdim) &&
           saved.beta.extent(0) == t * m && saved.g.extent(0) == t && saved.g.extent(1) == h &&
           saved.sized;
  }

  /// Bytes of the work buffers the core holds now (the backward's gradients appear on the first
  /// backward).
  std::size_t workspace_bytes() const {
    return (seq_start_.span() + seq_end_.span()) * sizeof(std::int64_t) +
           (dact_.span() + grads_.q.span() + grads_.k.span() + grads_.v.span() +
            grads_.beta.span() + grads_.g.span() + zero_.span()) *
               sizeof(Scalar);
  }

  /// `u [T, C_local]` (the head-parallel input `[z | V | K | Q | b | a]`), this rank's parameter
  /// slices `conv_w [C_conv, w]`, `conv_b [C_conv]`, `dt_bias [H]`, `a_log [H]` and `d` (`[H]`,
  /// `[H·d]` or empty, per `dims().skip`) → `y [T, H·d]` and `z [T, d_inner]` (the z section,
  /// contiguous). Keeps what `backward` needs in `saved` (sized here on its first forward) and
  /// views of `u`, `dt_bias`, `a_log` and `d`, which must stay unchanged until that backward.
  template <class ExecutionSpace>
  void forward(const ExecutionSpace& space, const matrix& u, const matrix& conv_w,
               const vector& conv_b, const vector& dt_bias, const vector& a_log, const vector& d,
               const matrix& y, const matrix& z, saved_type& saved) {
    CTXPAR_ASSERT_ACCESSIBLE("ctxpar::heads::GdpContextParallel::forward", ExecutionSpace, matrix);
    compat::ScopedRegion region("ctxpar::heads::layer_forward");
    saved.filled = false;
    if (!fits(saved)) size_saved(saved);
    saved.u = u;
    saved.dt_bias = dt_bias;
    saved.a_log = a_log;
    saved.d = d;
    const std::int64_t t = tokens_;
    using p2 =
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>;
    using p1 = Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>;
    if (t == 0) {
      saved.filled = true;
      return;
    }
    const std::int64_t cc = dims_.conv_channels();
    Kokkos::parallel_for("ctxpar::heads::transpose_conv_taps", p1(space, 0, cc),
                         TransposeTaps<matrix, matrix>{conv_w, saved.taps});
    using conv_kernel =
        ConvForward<matrix, matrix, vector, matrix, Kokkos::View<std::int64_t*, MemorySpace>>;
    using split_kernel = SplitNormalize<matrix, tensor3, tensor3, tensor3>;
    const std::int64_t block = conv_channel_block<ExecutionSpace>();
    const conv_kernel conv{u,          saved.taps,  conv_b, saved.pre, saved.act,
                           seq_start_, dims_.off_v, cc,     block,     dims_.width};
    constexpr bool host = ctxpar::impl::uses_host_fast_path_v<ExecutionSpace>;
    const split_kernel split{saved.act, saved.rnorm, saved.k, saved.q, saved.v, dims_, eps_, !host};
    if constexpr (host) {
      // One pass per token over the row in cache (conv, SiLU, norms, q̂, k̂, v, z).
      Kokkos::parallel_for("ctxpar::heads::conv_split_z", p1(space, 0, t),
                           ConvSplitForward<conv_kernel, split_kernel, matrix>{conv, split, z});
    } else {
      Kokkos::parallel_for("ctxpar::heads::conv_silu", p1(space, 0, channel_items(t, cc, block)),
                           conv);
      Kokkos::parallel_for("ctxpar::heads::split_l2norm", p1(space, 0, t), split);
      if (dims_.d_inner() > 0)
        Kokkos::parallel_for("ctxpar::heads::copy_z", p2(space, {0, 0}, {t, dims_.d_inner()}),
                             CopyColumns<matrix, matrix>{u, z, 0});
    }
    gates_forward(space, u, a_log, dt_bias, saved);
    const tensor3 y3(y.data(), t, dims_.heads, dims_.headdim);
    recurrence_forward(space, saved, y3);
    if (dims_.skip != SkipTerm::none && dims_.d_inner() > 0) {
      const auto x3 = value_copy0(saved);
      with_skip_weights(d, [&](const auto& w) {
        ctxpar::assign(space, y3, expr::view(y3) + w * expr::view(x3));
      });
    }
    saved.filled = true;
  }

  /// Backward of the `forward` that filled `saved` (the caller checks that one did): `dy [T, H·d]`,
  /// `dz [T, d_inner]` → `du [T, C_local]` and this rank's parameter-slice gradients (overwritten;
  /// `dd` like `d`, empty without a skip term). The recurrence keeps its backward scratch in
  /// `saved`.
  template <class ExecutionSpace>
  void backward(const ExecutionSpace& space, saved_type& saved, const matrix& dy, const matrix& dz,
                const matrix& du, const matrix& dconv_w, const vector& dconv_b,
                const vector& ddt_bias, const vector& da_log, const vector& dd) {
    compat::ScopedRegion region("ctxpar::heads::layer_backward");
    const std::int64_t t = tokens_, m = dims_.copies, h = dims_.heads;
    using p2 =
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>;
    using p1 = Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>;
    if (grads_.q.extent(0) != static_cast<std::size_t>(t) || t == 0) {
      grads_.q = tensor3("ctxpar::heads::dq", t, h, dims_.d_state);
      grads_.k = tensor3("ctxpar::heads::dk", t * m, h, dims_.d_state);
      grads_.v = tensor3("ctxpar::heads::dv", t * m, h, dims_.headdim);
      grads_.beta = matrix("ctxpar::heads::dbeta", t * m, h);
      grads_.g = matrix("ctxpar::heads::dg", t, h);
      dact_ = matrix("ctxpar::heads::dact", t, dims_.conv_channels());
    }
    if (t == 0) {
      Kokkos::deep_copy(space, dconv_w, Scalar(0));
      Kokkos::deep_copy(space, dconv_b, Scalar(0));
      Kokkos::deep_copy(space, ddt_bias, Scalar(0));
      Kokkos::deep_copy(space, da_log, Scalar(0));
      if (dd.extent(0) > 0) Kokkos::deep_copy(space, dd, Scalar(0));
      return;
    }
    recurrence_backward(space, saved, tensor3(dy.data(), t, h, dims_.headdim));
    // One pass from dq, dk, dv to dpre (in dact_): the L2-norm backward, the skip term's output
    // gradient joining dx_V (the skip term reads x_V) and SiLU's backward, fused at the store.
    Kokkos::parallel_for(
        "ctxpar::heads::l2norm_silu_backward", p1(space, 0, t),
        SplitNormalizeBackward<matrix, tensor3, tensor3, tensor3, matrix, matrix, vector>{
            saved.act, saved.pre, saved.rnorm, grads_.k, grads_.q, grads_.v, dact_, dy, saved.d,
            dims_});
    if (dims_.skip != SkipTerm::none && dims_.d_inner() > 0) {
      // dD sums dy·x_V over this rank's tokens (over ranks in GdpContextParallel).
      const int width = dims_.skip == SkipTerm::per_head ? dims_.headdim : 1;
      Kokkos::parallel_for(
          "ctxpar::heads::skip_grad", p1(space, 0, static_cast<std::int64_t>(dd.extent(0))),
          SkipGrad<matrix, strided_matrix, vector>{dy, values_copy0(saved), dd, t, width});
    }
    const std::int64_t cc = dims_.conv_channels();
    if (cc > 0) {
      Kokkos::parallel_for(
          "ctxpar::heads::conv_backward_input",
          p1(space, 0, channel_items(t, cc, conv_channel_block<ExecutionSpace>())),
          ConvBackwardInput<matrix, matrix, matrix, Kokkos::View<std::int64_t*, MemorySpace>>{
              dact_, saved.taps, du, seq_end_, dims_.off_v, cc,
              conv_channel_block<ExecutionSpace>(), dims_.width});
      using weights_kernel = ConvBackwardWeights<matrix, matrix, matrix, vector,
                                                 Kokkos::View<std::int64_t*, MemorySpace>>;
      const int block =
          ctxpar::impl::uses_host_fast_path_v<ExecutionSpace> ? weights_kernel::max_block : 1;
      Kokkos::parallel_for("ctxpar::heads::conv_backward_weights",
                           p1(space, 0, (cc + block - 1) / block),
                           weights_kernel{dact_, saved.u, dconv_w, dconv_b, seq_start_, dims_.off_v,
                                          t, dims_.width, cc, block});
    }
    gates_backward(space, saved, du);
    Kokkos::parallel_for(
        "ctxpar::heads::gate_param_grads",
        Kokkos::RangePolicy<ExecutionSpace>(space, 0, dims_.heads),
        GateParamGrads<matrix, matrix, vector>{du, grads_.g, saved.g, ddt_bias, da_log, dims_, t});
    if (dims_.d_inner() > 0)
      Kokkos::parallel_for("ctxpar::heads::copy_dz", p2(space, {0, 0}, {t, dims_.d_inner()}),
                           CopyIntoColumns<matrix, matrix>{dz, du, 0});
  }

 private:
  using strided_matrix = Kokkos::View<Scalar**, Kokkos::LayoutStride, MemorySpace>;
  using strided_tensor3 = Kokkos::View<Scalar***, Kokkos::LayoutStride, MemorySpace>;

  // Channels per work item of the conv kernels: a token's whole row on the host fast path, one
  // channel where the portable kernels run (GPUs, and every space of a portable build).
  template <class ExecutionSpace>
  static constexpr std::int64_t conv_channel_block() {
    return ctxpar::impl::uses_host_fast_path_v<ExecutionSpace> ? host_channel_block : 1;
  }

  // x_V, householder copy 0 of the values after conv and SiLU, as `[T, H, d]` and `[T, H·d]`:
  // v (`[T·M, H, d]`) read with a row stride of `M·H·d`. `act` holds no V channels where the
  // host prologue writes v directly, so every reader of x_V takes it from here.
  strided_tensor3 value_copy0(const saved_type& saved) const {
    const std::int64_t row = dims_.d_inner() * dims_.copies;
    const Kokkos::LayoutStride layout(tokens_, row, dims_.heads, dims_.headdim, dims_.headdim, 1);
    return strided_tensor3(saved.v.data(), layout);
  }
  strided_matrix values_copy0(const saved_type& saved) const {
    const Kokkos::LayoutStride layout(tokens_, dims_.d_inner() * dims_.copies, dims_.d_inner(), 1);
    return strided_matrix(saved.v.data(), layout);
  }

  // The buffers of `saved` at this core's sizes (zero-filled, labelled).
  void size_saved(saved_type& saved) const {
    const std::int64_t t = tokens_, m = dims_.copies, h = dims_.heads;
    saved.pre = matrix("ctxpar::heads::conv_pre", t, dims_.conv_channels());
    saved.act = matrix("ctxpar::heads::conv_act", t, dims_.conv_channels());
    saved.taps = matrix("ctxpar::heads::conv_taps", dims_.width, dims_.conv_channels());
    saved.rnorm = tensor3("ctxpar::heads::rnorm", t, m + 1, dims_.groups);
    saved.q = tensor3("ctxpar::heads::q", t, h, dims_.d_state);
    saved.k = tensor3("ctxpar::heads::k", t * m, h, dims_.d_state);
    saved.v = tensor3("ctxpar::heads::v", t * m, h, dims_.headdim);
    saved.beta = matrix("ctxpar::heads::beta", t * m, h);
    saved.g = matrix("ctxpar::heads::g", t, h);
    saved.recurrence = {};
    if (table_.chunk_count() > 0) backend_.size_saved(saved.recurrence, table_);
    saved.sized = true;
  }
  // Calls `f` with D read as `[T, H, d]`: the per-channel D viewed as `[H, d]`, or the per-head D
  // repeated over the head's channels (two expression types, hence the callback).
  template <class F>
  void with_skip_weights(const vector& d, F&& f) const {
    using cmatrix = Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace,
                                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    if (dims_.skip == SkipTerm::per_channel)
      f(expr::broadcast<0>(cmatrix(d.data(), dims_.heads, dims_.headdim), tokens_));
    else
      f(expr::broadcast<0>(expr::broadcast<1>(d, dims_.headdim), tokens_));
  }

  // β = sigmoid(b) over all householder copies ([T, M·H] is the [T·M, H] buffer's memory), and
  // g = −exp(A_log)·softplus(a + dt_bias): one fused expression-layer kernel each.
  template <class ExecutionSpace>
  void gates_forward(const ExecutionSpace& space, const matrix& u, const vector& a_log,
                     const vector& dt_bias, const saved_type& saved) {
    const std::int64_t t = tokens_, mh = std::int64_t(dims_.copies) * dims_.heads;
    const matrix beta(saved.beta.data(), t, mh);
    ctxpar::assign(space, beta,
                   gate_sigmoid(expr::view(Kokkos::subview(
                       u, Kokkos::ALL, Kokkos::make_pair(dims_.off_b, dims_.off_b + mh)))));
    const auto ua =
        Kokkos::subview(u, Kokkos::ALL, Kokkos::make_pair(dims_.off_a, dims_.off_a + dims_.heads));
    ctxpar::assign(space, saved.g,
                   -expr::exp(expr::broadcast<0>(a_log, t)) *
                       gate_softplus(expr::view(ua) + expr::broadcast<0>(dt_bias, t)));
  }
  // Backward of `gates_forward` into the b and a sections of `du`.
  template <class ExecutionSpace>
  void gates_backward(const ExecutionSpace& space, const saved_type& saved, const matrix& du) {
    const std::int64_t t = tokens_, mh = std::int64_t(dims_.copies) * dims_.heads;
    const matrix beta(saved.beta.data(), t, mh), dbeta(grads_.beta.data(), t, mh);
    ctxpar::assign(
        space, Kokkos::subview(du, Kokkos::ALL, Kokkos::make_pair(dims_.off_b, dims_.off_b + mh)),
        expr::view(dbeta) * expr::view(beta) * (Scalar(1) - expr::view(beta)));
    const auto ua = Kokkos::subview(saved.u, Kokkos::ALL,
                                    Kokkos::make_pair(dims_.off_a, dims_.off_a + dims_.heads));
    ctxpar::assign(
        space,
        Kokkos::subview(du, Kokkos::ALL, Kokkos::make_pair(dims_.off_a, dims_.off_a + dims_.heads)),
        -expr::view(grads_.g) * expr::exp(expr::broadcast<0>(saved.a_log, t)) *
            gate_sigmoid(expr::view(ua) + expr::broadcast<0>(saved.dt_bias, t)));
  }

  // The recurrence over the whole local sequence for every local head: the chunkwise GDP backend
  // of mechanism B called with one rank's worth of sequence, zero incoming state and zero
  // incoming state gradient, so no communication is involved.
  using backend_type = chunkwise::GatedDeltaProductBackend<Scalar, MemorySpace>;
  using inputs_type = typename backend_type::inputs_type;

  inputs_type recurrence_inputs(const saved_type& saved) const {
    const std::int64_t t = tokens_, m = dims_.copies, h = dims_.heads;
    inputs_type in;
    in.q = saved.q;
    in.k =
        chunkwise::const_substep_view<Scalar, MemorySpace>(saved.k.data(), t, m, h, dims_.d_state);
    in.v =
        chunkwise::const_substep_view<Scalar, MemorySpace>(saved.v.data(), t, m, h, dims_.headdim);
    in.g = saved.g;
    in.beta = chunkwise::const_token_view<Scalar, MemorySpace>(saved.beta.data(), t, m, h);
    return in;
  }

  template <class ExecutionSpace>
  void recurrence_forward(const ExecutionSpace& space, saved_type& saved, const tensor3& out) {
    if (dims_.heads == 0) return;
    const inputs_type in = recurrence_inputs(saved);
    // The same bundle on every forward into one `saved`: its buffers are kept (no allocation),
    // and a forward_apply without a forward_prepare of its own call recomputes everything from
    // these buffers' new values.
    backend_.forward_apply(space, in, seqs_, table_, zero_state(), {}, out, {}, saved.recurrence);
  }
  template <class ExecutionSpace>
  void recurrence_backward(const ExecutionSpace& space, saved_type& saved, const tensor3& dout) {
    if (dims_.heads == 0) return;
    const std::int64_t t = tokens_, m = dims_.copies, h = dims_.heads;
    typename backend_type::gradients_type g;
    g.dq = grads_.q;
    g.dk = chunkwise::substep_view<Scalar, MemorySpace>(grads_.k.data(), t, m, h, dims_.d_state);
    g.dv = chunkwise::substep_view<Scalar, MemorySpace>(grads_.v.data(), t, m, h, dims_.headdim);
    g.dg = grads_.g;
    g.dbeta = chunkwise::token_view<Scalar, MemorySpace>(grads_.beta.data(), t, m, h);
    backend_.backward_apply(space, saved.recurrence, dout, seqs_, table_, zero_state(), {}, g, {},
                            {});
  }
  // The zero state entering (and the zero gradient leaving) the rank's whole sequences: read
  // only, allocated on first use.
  chunkwise::const_state_view<MemorySpace> zero_state() {
    if (zero_.data() == nullptr)
      zero_ = chunkwise::state_view<MemorySpace>("ctxpar::heads::zero_state", dims_.heads,
                                                 dims_.d_state, dims_.headdim);
    return zero_;
  }

  struct Grads {
    tensor3 q, k, v;  // [T, H, N], [T·M, H, N], [T·M, H, d]
    matrix beta, g;   // [T·M, H], [T, H]
  };

  LocalDims dims_;
  std::int64_t tokens_ = 0;
  double eps_ = 1e-6;
  Kokkos::View<std::int64_t*, MemorySpace> seq_start_, seq_end_;
  matrix dact_;
  Grads grads_;
  chunkwise::LocalSequences seqs_;
  backend_type backend_{1};
  typename backend_type::table_type table_;  // the recurrence's chunk table (built once)
  chunkwise::state_view<MemorySpace> zero_;
};

}  // namespace ctxpar::heads::impl
