/// \file
/// The backend class shared by the scalar-decay and diagonal-gate families: plan queries, checks
/// and the four contract methods on top of `decay_kernels.hpp`.
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar/chunkwise/impl/decay_kernels.hpp"
#include "ctxpar/core/view_checks.hpp"

namespace ctxpar::chunkwise::impl {

/// Scalar (`Diagonal = false`, gates `[T, H]`) or diagonal (`Diagonal = true`, gates `[T, H, K]`)
/// decay backend; `Inputs`/`Gradients` are the public structs of the family.
template <class Scalar, class MemorySpace, bool Diagonal, class Inputs, class Gradients>
class DecayBackend {
 public:
  using scalar_type = Scalar;                          ///< activation type
  using memory_space = MemorySpace;                    ///< where the views live
  using inputs_type = Inputs;                          ///< q, k, v, g
  using gradients_type = Gradients;                    ///< dq, dk, dv, dg
  using saved_type = DecaySaved<Scalar, MemorySpace>;  ///< kept between the four methods
  using table_type = NoTable;  ///< no per-slot facts: the kernels read the sequences directly
  /// `M` is a scalar or a `K`-vector per head.
  using transition_type = std::conditional_t<Diagonal, DiagonalTransition, ScalarTransition>;
  /// Plan fingerprint family name.
  static constexpr const char* family_name = Diagonal ? "diagonal" : "scalar";
  /// Plan fingerprint family id.
  static constexpr int family_id = Diagonal ? 2 : 1;
  /// The chunk products can run on tensor cores (`BackendOptions::products`).
  static constexpr bool has_tensor_core_products = true;

  /// A backend with the given chunk size and scale.
  explicit DecayBackend(BackendOptions options = {}) : options_(options) {}

  /// Tokens per chunk.
  int chunk_size() const noexcept { return options_.chunk_size; }
  /// The options it was built with.
  const BackendOptions& options() const noexcept { return options_; }
  /// The output scale for key dimension `k` (`K^(-1/2)` unless set).
  double scale(std::int64_t k) const { return resolve_scale(options_.scale, k); }

  /// `T, H, K, V` of `in`.
  ChunkwiseShape shape(const inputs_type& in) const {
    return {static_cast<std::int64_t>(in.q.extent(0)), static_cast<std::int64_t>(in.q.extent(1)),
            static_cast<std::int64_t>(in.q.extent(2)), static_cast<std::int64_t>(in.v.extent(2))};
  }

  /// Records shape violations of `in` (local; no communication).
  void check(Preconditions& chk, const inputs_type& in) const {
    const auto s = shape(in);
    // A NaN or infinite scale makes every output NaN while the run still "succeeds".
    chk.require(std::isfinite(options_.scale), "the scale must be finite (0 = K^(-1/2))",
                "a finite scale", options_.scale);
    require_products_for_data<Scalar>(chk, options_.products);
    chk.require(s.key_dim > 0, "the key dimension K must be positive", "K > 0", s.key_dim);
    chk.require(s.value_dim > 0, "the value dimension V must be positive", "V > 0", s.value_dim);
    chk.require(s.heads > 0, "the head count H must be positive", "H > 0", s.heads);
    chk.require(ctxpar::impl::has_extents(in.k, s.tokens, s.heads, s.key_dim),
                "k must have the shape of q [T, H, K]",
                ctxpar::impl::shape_text({s.tokens, s.heads, s.key_dim}),
                ctxpar::impl::shape_text(in.k));
    chk.require(in.v.extent(0) == in.q.extent(0) && in.v.extent(1) == in.q.extent(1),
                "v must be [T, H, V] with the T and H of q",
                ctxpar::impl::shape_text({s.tokens, s.heads, s.value_dim}),
                ctxpar::impl::shape_text(in.v));
    const auto gate_ok = gate_shape_ok(in.g, s);
    chk.require(gate_ok.first, Diagonal ? "g must be [T, H, K]" : "g must be [T, H]",
                gate_ok.second, ctxpar::impl::shape_text(in.g));
    chk.require(in.q.span_is_contiguous() && in.k.span_is_contiguous() &&
                    in.v.span_is_contiguous() && in.g.span_is_contiguous(),
                "q, k, v and g must be contiguous", "contiguous views", "a strided view");
  }

  /// Records shape violations of `grads` against `in`.
  void check_gradients(Preconditions& chk, const inputs_type& in,
                       const gradients_type& grads) const {
    using ctxpar::impl::same_extents;
    chk.require(same_extents(grads.dq, in.q) && same_extents(grads.dk, in.k) &&
                    same_extents(grads.dv, in.v) && same_extents(grads.dg, in.g),
                "dq, dk, dv and dg must have the shapes of q, k, v and g",
                ctxpar::impl::shape_text(in.q), ctxpar::impl::shape_text(grads.dq));
    chk.require(grads.dg.span_is_contiguous(), "dg must be contiguous", "a contiguous view",
                "a strided view");
  }

  /// Tokens `[begin, end)` of `in`.
  inputs_type slice(const inputs_type& in, std::int64_t begin, std::int64_t end) const {
    const auto r = std::make_pair(begin, end);
    return {token_rows(in.q, r), token_rows(in.k, r), token_rows(in.v, r), token_rows(in.g, r)};
  }

  /// Tokens `[begin, end)` of `grads`.
  gradients_type slice(const gradients_type& grads, std::int64_t begin, std::int64_t end) const {
    const auto r = std::make_pair(begin, end);
    return {token_rows(grads.dq, r), token_rows(grads.dk, r), token_rows(grads.dv, r),
            token_rows(grads.dg, r)};
  }

  /// Whether any input holds NaN or Inf.
  template <class ExecutionSpace>
  bool has_non_finite(const ExecutionSpace& space, const inputs_type& in) const {
    return count_non_finite(space, in.q) + count_non_finite(space, in.k) +
               count_non_finite(space, in.v) + count_non_finite(space, in.g) >
           0;
  }

  /// The (empty) per-slot table.
  table_type make_table(const LocalSequences& /*seqs*/, const ChunkwiseShape& /*shape*/) const {
    return {};
  }

  /// Contract method 1: summary `(M, dS)` of the trailing local sequence, zero incoming state.
  template <class ExecutionSpace>
  void forward_prepare(const ExecutionSpace& space, const inputs_type& in,
                       const LocalSequences& seqs, const table_type& /*table*/,
                       const SummaryViews<memory_space>& summary, saved_type& saved) const {
    const auto s = shape(in);
    saved.q = in.q;
    saved.k = in.k;
    saved.v = in.v;
    saved.g =
        typename saved_type::input_view(in.g.data(), s.tokens, s.heads, Diagonal ? s.key_dim : 1);
    saved.scale = scale(s.key_dim);
    // This backend computes in Scalar (fp32 or fp64), where `automatic` is exact; a 16-bit plan
    // resolved its own `automatic` before it built this backend.
    saved.products = chunkwise::resolve_chunk_products<Scalar>(options_.products, false);
    decay_forward_prepare<Diagonal>(space, saved, seqs,
                                    chunkwise::effective_chunk(options_.chunk_size, seqs.length()),
                                    summary);
  }

  /// Contract method 2: outputs (and final states) from the composed `s_in`.
  template <class ExecutionSpace>
  void forward_apply(const ExecutionSpace& space, const inputs_type& /*in*/,
                     const LocalSequences& seqs, const table_type& /*table*/,
                     const const_state_view<memory_space>& s_in,
                     const const_sequence_states_view<Scalar, memory_space>& initial_states,
                     const token_view<Scalar, memory_space>& output,
                     const sequence_states_view<Scalar, memory_space>& final_states,
                     saved_type& saved) const {
    decay_forward_apply<Diagonal>(space, saved, seqs, s_in, initial_states, output, final_states);
  }

  /// Contract method 3: summary `(Mᵀ, γ)` of the leading local sequence, zero outgoing gradient.
  template <class ExecutionSpace>
  void backward_prepare(const ExecutionSpace& space, saved_type& saved,
                        const const_token_view<Scalar, memory_space>& output_grad,
                        const LocalSequences& seqs, const table_type& /*table*/,
                        const SummaryViews<memory_space>& summary) const {
    decay_backward_prepare<Diagonal>(space, saved, output_grad, seqs, summary);
  }

  /// Contract method 4: every gradient from the composed `ds_out`.
  template <class ExecutionSpace>
  void backward_apply(const ExecutionSpace& space, saved_type& saved,
                      const const_token_view<Scalar, memory_space>& output_grad,
                      const LocalSequences& seqs, const table_type& /*table*/,
                      const const_state_view<memory_space>& ds_out,
                      const const_sequence_states_view<Scalar, memory_space>& final_state_grads,
                      const gradients_type& grads,
                      const sequence_states_view<Scalar, memory_space>& initial_state_grads,
                      const state_view<memory_space>& ds_in) const {
    decay_backward_apply<Diagonal>(space, saved, output_grad, seqs, ds_out, final_state_grads,
                                   grads.dq, grads.dk, grads.dv, grads.dg.data(),
                                   initial_state_grads, ds_in);
  }

 private:
  template <class View>
  static std::pair<bool, std::string> gate_shape_ok(const View& g, const ChunkwiseShape& s) {
    if constexpr (Diagonal) {
      return {ctxpar::impl::has_extents(g, s.tokens, s.heads, s.key_dim),
              ctxpar::impl::shape_text({s.tokens, s.heads, s.key_dim})};
    } else {
      return {ctxpar::impl::has_extents(g, s.tokens, s.heads),
              ctxpar::impl::shape_text({s.tokens, s.heads})};
    }
  }
  // Tokens `r` of a `[T, H]` or `[T, H, D]` view (the gates are either).
  template <class View>
  static auto token_rows(const View& view, std::pair<std::int64_t, std::int64_t> r) {
    if constexpr (compat::view_rank<View> == 3) {
      return Kokkos::subview(view, r, Kokkos::ALL, Kokkos::ALL);
    } else {
      return Kokkos::subview(view, r, Kokkos::ALL);
    }
  }

  BackendOptions options_;
};

}  // namespace ctxpar::chunkwise::impl
