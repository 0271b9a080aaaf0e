/// \file
/// The backend class shared by the gated delta rule (`n_h = 1`, `k [T, H, K]`) and the gated
/// delta product (`k [T, n_h, H, K]`): plan queries, checks and the four contract methods on top
/// of `gated_delta_engine.hpp`. Both families are one kernel set: a product token is `n_h`
/// delta sub-steps whose sub-step rows are contiguous in memory in both layouts.
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar/chunkwise/impl/gated_delta_engine.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/view_checks.hpp"

namespace ctxpar::impl::gated_delta {

/// Counts the non-finite entries of a contiguous view (the NaN/Inf check flag).
template <class ExecutionSpace, class View>
std::int64_t count_non_finite(const ExecutionSpace& space, const View& view) {
  const auto* data = view.data();
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "ctxpar::chunkwise::gated_delta::non_finite",
      Kokkos::RangePolicy<ExecutionSpace>(space, 0, static_cast<std::int64_t>(view.span())),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t & acc) {
        acc += compat::isfinite(data[i]) ? 0 : 1;
      },
      bad);
  return bad;
}

template <class View>
auto slice_tokens(const View& v, std::pair<std::int64_t, std::int64_t> r) {
  if constexpr (compat::view_rank<View> == 2)
    return Kokkos::subview(v, r, Kokkos::ALL);
  else if constexpr (compat::view_rank<View> == 3)
    return Kokkos::subview(v, r, Kokkos::ALL, Kokkos::ALL);
  else
    return Kokkos::subview(v, r, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL);
}

/// `bundle` with each of the token-major view `members` sliced to the tokens `r`.
template <class Bundle, class... Members>
Bundle slice_members(const Bundle& bundle, std::pair<std::int64_t, std::int64_t> r,
                     Members Bundle::*... members) {
  Bundle out;
  ((out.*members = slice_tokens(bundle.*members, r)), ...);
  return out;
}

/// Gated delta backend. `Product = false`: `k, v [T, H, ·]`, `β [T, H]` and `n_h = 1`;
/// `Product = true`: `k, v [T, n_h, H, ·]`, `β [T, n_h, H]`.
template <class Scalar, class MemorySpace, bool Product, class Inputs, class Gradients>
class Backend {
 public:
  using scalar_type = Scalar;                             ///< activation type
  using memory_space = MemorySpace;                       ///< where the views live
  using inputs_type = Inputs;                             ///< q, k, v, g, β
  using gradients_type = Gradients;                       ///< dq, dk, dv, dg, dβ
  using saved_type = Saved<Scalar, MemorySpace, Inputs>;  ///< kept between the methods
  using table_type = ChunkTable<MemorySpace>;             ///< per slot, the plan's
  using transition_type = chunkwise::DenseTransition;     ///< `M` is `K×K` per head
  /// Plan fingerprint family name.
  static constexpr const char* family_name = Product ? "gated_delta_product" : "gated_delta_rule";
  /// Plan fingerprint family id.
  static constexpr int family_id = Product ? 4 : 3;
  /// The intra-chunk products can run on tensor cores (`BackendOptions::products`).
  static constexpr bool has_tensor_core_products = true;

  explicit Backend(int householder_steps, chunkwise::BackendOptions options)
      : n_h_(householder_steps), options_(options) {}

  /// Tokens per chunk (a product chunk holds `n_h` times as many delta sub-steps).
  int chunk_size() const noexcept { return options_.chunk_size; }
  /// The options it was built with.
  const chunkwise::BackendOptions& options() const noexcept { return options_; }
  /// Householder sub-steps per token.
  int householder_steps() const noexcept { return n_h_; }
  /// The output scale for key dimension `k` (`K^(-1/2)` unless set).
  double scale(std::int64_t k) const { return chunkwise::resolve_scale(options_.scale, k); }

  /// `T, H, K, V` of `in`.
  chunkwise::ChunkwiseShape shape(const inputs_type& in) const {
    return {static_cast<std::int64_t>(in.q.extent(0)), static_cast<std::int64_t>(in.q.extent(1)),
            static_cast<std::int64_t>(in.q.extent(2)),
            static_cast<std::int64_t>(in.v.extent(compat::view_rank<decltype(in.v)> - 1))};
  }

  /// Records input violations (local; no communication).
  void check(Preconditions& chk, const inputs_type& in) const {
    const auto s = shape(in);
    const std::int64_t T = s.tokens, H = s.heads, K = s.key_dim, V = s.value_dim, n = n_h_;
    // A NaN or infinite scale makes every output NaN while the run still "succeeds".
    chk.require(std::isfinite(options_.scale), "the scale must be finite (0 = K^(-1/2))",
                "a finite scale", options_.scale);
    chk.require(n_h_ >= 1, "the number of householder steps n_h must be at least 1", "n_h >= 1",
                n_h_);
    chunkwise::impl::require_products_for_data<Scalar>(chk, options_.products);
    chk.require(K > 0, "the key dimension K must be positive", "K > 0", K);
    chk.require(V > 0, "the value dimension V must be positive", "V > 0", V);
    chk.require(H > 0, "the head count H must be positive", "H > 0", H);
    if constexpr (Product) {
      chk.require(has_extents(in.k, T, n, H, K), "k must be [T, n_h, H, K]",
                  shape_text({T, n, H, K}), shape_text(in.k));
      chk.require(in.v.extent(0) == in.q.extent(0) &&
                      static_cast<std::int64_t>(in.v.extent(1)) == n &&
                      in.v.extent(2) == in.q.extent(1),
                  "v must be [T, n_h, H, V]", shape_text({T, n, H, V}), shape_text(in.v));
      chk.require(has_extents(in.beta, T, n, H), "beta must be [T, n_h, H]", shape_text({T, n, H}),
                  shape_text(in.beta));
    } else {
      chk.require(has_extents(in.k, T, H, K), "k must be [T, H, K] like q", shape_text({T, H, K}),
                  shape_text(in.k));
      chk.require(in.v.extent(0) == in.q.extent(0) && in.v.extent(1) == in.q.extent(1),
                  "v must be [T, H, V]", shape_text({T, H, V}), shape_text(in.v));
      chk.require(has_extents(in.beta, T, H), "beta must be [T, H]", shape_text({T, H}),
                  shape_text(in.beta));
    }
    chk.require(has_extents(in.g, T, H), "g must be [T, H]", shape_text({T, H}), shape_text(in.g));
    chk.require(in.q.span_is_contiguous() && in.k.span_is_contiguous() &&
                    in.v.span_is_contiguous() && in.g.span_is_contiguous() &&
                    in.beta.span_is_contiguous(),
                "q, k, v, g and beta must be contiguous", "contiguous views", "a strided view");
  }

  /// Records violations of `grads` against `in`.
  void check_gradients(Preconditions& chk, const inputs_type& in, const gradients_type& gr) const {
    chk.require(same_extents(gr.dq, in.q) && same_extents(gr.dk, in.k) &&
                    same_extents(gr.dv, in.v) && same_extents(gr.dg, in.g) &&
                    same_extents(gr.dbeta, in.beta),
                "dq, dk, dv, dg and dbeta must have the shapes of q, k, v, g and beta",
                shape_text(in.k) + " for dk", shape_text(gr.dk));
    chk.require(gr.dq.span_is_contiguous() && gr.dk.span_is_contiguous() &&
                    gr.dv.span_is_contiguous() && gr.dg.span_is_contiguous() &&
                    gr.dbeta.span_is_contiguous(),
                "the gradient views must be contiguous", "contiguous views", "a strided view");
  }

  /// Tokens `[begin, end)` of `in`.
  inputs_type slice(const inputs_type& in, std::int64_t begin, std::int64_t end) const {
    return slice_members(in, std::make_pair(begin, end), &inputs_type::q, &inputs_type::k,
                         &inputs_type::v, &inputs_type::g, &inputs_type::beta);
  }

  /// Tokens `[begin, end)` of `grads`.
  gradients_type slice(const gradients_type& gr, std::int64_t begin, std::int64_t end) const {
    return slice_members(gr, std::make_pair(begin, end), &gradients_type::dq, &gradients_type::dk,
                         &gradients_type::dv, &gradients_type::dg, &gradients_type::dbeta);
  }

  /// Whether any input holds NaN or Inf.
  template <class ExecutionSpace>
  bool has_non_finite(const ExecutionSpace& space, const inputs_type& in) const {
    return count_non_finite(space, in.q) + count_non_finite(space, in.k) +
               count_non_finite(space, in.v) + count_non_finite(space, in.g) +
               count_non_finite(space, in.beta) >
           0;
  }

  /// The chunk table of a slot holding the local sequences `seqs` of inputs of shape `s`
  /// (allocates; built once per slot, before the calls, by whoever owns the slot).
  table_type make_table(const chunkwise::LocalSequences& seqs,
                        const chunkwise::ChunkwiseShape& s) const {
    return make_chunk_table<MemorySpace>(problem_of(s), seqs);
  }

  /// Sizes the per-chunk buffers of `saved` for `table` up front, so that not even the first
  /// forward into it allocates them (a forward sizes them itself otherwise).
  void size_saved(saved_type& saved, const table_type& table) const {
    size_buffers(saved.buffers, table);
  }

  /// Contract method 1: summary `(M, dS)` of the trailing local sequence with zero incoming
  /// state. Runs the per-chunk (WY/UT) phase for every local chunk and keeps it in `saved`.
  /// `needs` (from the driver) drops what no composition reads: no state pass when the summary
  /// is unread, no dense `M` chain when the incoming state is zero, and with `zero_boundary` the
  /// apply's own pass runs here (outputs kept in `saved` for `forward_apply` to copy).
  template <class ExecutionSpace>
  void forward_prepare(const ExecutionSpace& space, const inputs_type& in,
                       const chunkwise::LocalSequences& seqs, const table_type& table,
                       const chunkwise::SummaryViews<memory_space>& summary, saved_type& saved,
                       const chunkwise::SummaryNeeds& needs = {}) const {
    compat::ScopedRegion region("ctxpar::chunkwise::gated_delta::forward_prepare");
    engine::forward_prepare(space, saved, in, problem(in), seqs, table, summary, needs,
                            shape(in).tokens);
  }

  /// Contract method 2: outputs and final states from the composed `s_in`.
  template <class ExecutionSpace>
  void forward_apply(
      const ExecutionSpace& space, const inputs_type& in, const chunkwise::LocalSequences& seqs,
      const table_type& table, const chunkwise::const_state_view<memory_space>& s_in,
      const chunkwise::const_sequence_states_view<Scalar, memory_space>& initial_states,
      const chunkwise::token_view<Scalar, memory_space>& output,
      const chunkwise::sequence_states_view<Scalar, memory_space>& final_states,
      saved_type& saved) const {
    compat::ScopedRegion region("ctxpar::chunkwise::gated_delta::forward_apply");
    // The per-chunk phase of forward_prepare is reused only right after it (same call), on the
    // same views; any other call recomputes it (the caller may have written new values into old
    // buffers), so a bundle kept across calls needs no reset.
    engine::forward_apply(space, saved, in, problem(in), seqs, table, s_in, initial_states, output,
                          final_states);
  }

  /// Contract method 3: summary `(Mᵀ, γ)` of the leading local sequence, zero outgoing gradient.
  /// `needs` as in `forward_prepare`; with `zero_boundary` the apply's reverse pass runs here.
  template <class ExecutionSpace>
  void backward_prepare(const ExecutionSpace& space, saved_type& saved,
                        const chunkwise::const_token_view<Scalar, memory_space>& output_grad,
                        const chunkwise::LocalSequences& seqs, const table_type& table,
                        const chunkwise::SummaryViews<memory_space>& summary,
                        const chunkwise::SummaryNeeds& needs = {}) const {
    compat::ScopedRegion region("ctxpar::chunkwise::gated_delta::backward_prepare");
    engine::backward_prepare(space, saved, recorded_problem(saved), output_grad, seqs, table,
                             summary, needs);
  }

  /// Contract method 4: every gradient from the composed `ds_out`.
  template <class ExecutionSpace>
  void backward_apply(
      const ExecutionSpace& space, saved_type& saved,
      const chunkwise::const_token_view<Scalar, memory_space>& output_grad,
      const chunkwise::LocalSequences& seqs, const table_type& table,
      const chunkwise::const_state_view<memory_space>& ds_out,
      const chunkwise::const_sequence_states_view<Scalar, memory_space>& final_state_grads,
      const gradients_type& grads,
      const chunkwise::sequence_states_view<Scalar, memory_space>& initial_state_grads,
      const chunkwise::state_view<memory_space>& ds_in) const {
    compat::ScopedRegion region("ctxpar::chunkwise::gated_delta::backward_apply");
    GradTargets<Scalar> gt;
    gt.dq = grads.dq.data();
    gt.dk = grads.dk.data();
    gt.dv = grads.dv.data();
    gt.dg = grads.dg.data();
    gt.dbeta = grads.dbeta.data();
    engine::backward_apply(space, saved, recorded_problem(saved), output_grad, seqs, table, ds_out,
                           final_state_grads, gt, initial_state_grads, ds_in);
  }

  /// The raw problem the kernels see (chunk measured in delta sub-steps).
  Problem<Scalar> problem(const inputs_type& in) const {
    Problem<Scalar> pb = problem_of(shape(in));
    pb.q = in.q.data();
    pb.k = in.k.data();
    pb.v = in.v.data();
    pb.g = in.g.data();
    pb.beta = in.beta.data();
    return pb;
  }

  /// The sizes of the raw problem of inputs of shape `s` (no data).
  Problem<Scalar> problem_of(const chunkwise::ChunkwiseShape& s) const {
    Problem<Scalar> pb;
    pb.n_h = n_h_;
    pb.heads = static_cast<int>(s.heads);
    pb.key_dim = static_cast<int>(s.key_dim);
    pb.value_dim = static_cast<int>(s.value_dim);
    pb.chunk = chunkwise::effective_chunk(options_.chunk_size, s.tokens) * n_h_;
    pb.scale = static_cast<Scalar>(scale(s.key_dim));
    // This backend computes in Scalar (fp32 or fp64), where `automatic` is exact; a 16-bit plan
    // resolved its own `automatic` before it built this backend.
    pb.products = chunkwise::resolve_chunk_products<Scalar>(options_.products, false);
    return pb;
  }

 private:
  using engine = Engine<Scalar, MemorySpace, Inputs>;

  // The problem of the forward that `saved` records (of empty inputs without one: the engine then
  // refuses the bundle).
  Problem<Scalar> recorded_problem(const saved_type& saved) const {
    return problem(saved.forward ? saved.forward->inputs : inputs_type{});
  }

  int n_h_ = 1;
  chunkwise::BackendOptions options_;
};

}  // namespace ctxpar::impl::gated_delta
