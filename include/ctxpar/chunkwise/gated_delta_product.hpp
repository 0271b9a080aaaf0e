/// \file
/// Gated delta product (GDP) chunkwise backend: each token applies `n_h` householder-style delta
/// sub-steps, `A_t = exp(g_t)·Π_{j=n_h..1}(I − β_{t,j} k_{t,j} k_{t,j}ᵀ)`, the gate once at the
/// first sub-step and the query read after the last, `o_t = scale·S_tᵀ q_t`. Computed as a gated
/// delta rule over the `n_h·T` sub-steps (chunks of `n_h·chunk_size` sub-steps).
#pragma once

#include <Kokkos_Core.hpp>

#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar/chunkwise/impl/gated_delta_backend.hpp"

namespace ctxpar::chunkwise {

/// Read-only `[T, n_h, H, D]` per-sub-step activations.
template <class Scalar, class MemorySpace>
using const_substep_view = Kokkos::View<const Scalar****, Kokkos::LayoutRight, MemorySpace>;
/// `[T, n_h, H, D]` per-sub-step activations.
template <class Scalar, class MemorySpace>
using substep_view = Kokkos::View<Scalar****, Kokkos::LayoutRight, MemorySpace>;

/// Inputs of the gated delta product.
template <class Scalar, class MemorySpace>
struct GatedDeltaProductInputs {
  const_token_view<Scalar, MemorySpace> q;     ///< queries `[T, H, K]`
  const_substep_view<Scalar, MemorySpace> k;   ///< keys `[T, n_h, H, K]` (unit norm expected)
  const_substep_view<Scalar, MemorySpace> v;   ///< values `[T, n_h, H, V]`
  const_head_view<Scalar, MemorySpace> g;      ///< log-gates `[T, H]` (applied at sub-step 1)
  const_token_view<Scalar, MemorySpace> beta;  ///< write strengths `[T, n_h, H]`

  /// Every view mapped through `f` (a view to one of the same rank and extents on `To`), in
  /// member order: the 16-bit plan's widened inputs and fp32 gradient buffers.
  template <class To, class F>
  GatedDeltaProductInputs<To, MemorySpace> map_views(F&& f) const {
    return {f(q), f(k), f(v), f(g), f(beta)};
  }
};

/// Gradients of the gated delta product (same shapes as the inputs).
template <class Scalar, class MemorySpace>
struct GatedDeltaProductGradients {
  token_view<Scalar, MemorySpace> dq;     ///< `[T, H, K]`
  substep_view<Scalar, MemorySpace> dk;   ///< `[T, n_h, H, K]`
  substep_view<Scalar, MemorySpace> dv;   ///< `[T, n_h, H, V]`
  head_view<Scalar, MemorySpace> dg;      ///< `[T, H]`
  token_view<Scalar, MemorySpace> dbeta;  ///< `[T, n_h, H]`

  /// Every view mapped through `f` (a view to one of the same rank and extents on `To`), in
  /// member order: the 16-bit plan's widened inputs and fp32 gradient buffers.
  template <class To, class F>
  GatedDeltaProductGradients<To, MemorySpace> map_views(F&& f) const {
    return {f(dq), f(dk), f(dv), f(dg), f(dbeta)};
  }
};

/// Chunkwise backend of the gated delta product with `n_h` householder steps (dense
/// transitions). `n_h >= 1` is checked collectively with the other preconditions.
template <class Scalar, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class GatedDeltaProductBackend
    : public ctxpar::impl::gated_delta::Backend<Scalar, MemorySpace, true,
                                                GatedDeltaProductInputs<Scalar, MemorySpace>,
                                                GatedDeltaProductGradients<Scalar, MemorySpace>> {
  using base = ctxpar::impl::gated_delta::Backend<Scalar, MemorySpace, true,
                                                  GatedDeltaProductInputs<Scalar, MemorySpace>,
                                                  GatedDeltaProductGradients<Scalar, MemorySpace>>;

 public:
  /// A backend with `householder_steps` sub-steps per token, chunk size (tokens) and scale.
  explicit GatedDeltaProductBackend(int householder_steps, BackendOptions options = {})
      : base(householder_steps, options) {}

  /// The same family on scalar type `To` (how the 16-bit plan names its fp32 backend).
  template <class To>
  using rebind_scalar = GatedDeltaProductBackend<To, MemorySpace>;
  /// This backend on scalar type `To`, with the same options.
  template <class To>
  rebind_scalar<To> rebind() const {
    return rebind<To>(this->options());
  }
  /// This backend on scalar type `To` with `options` (a 16-bit plan's, its products resolved).
  template <class To>
  rebind_scalar<To> rebind(const BackendOptions& options) const {
    return rebind_scalar<To>(this->householder_steps(), options);
  }
};

}  // namespace ctxpar::chunkwise
