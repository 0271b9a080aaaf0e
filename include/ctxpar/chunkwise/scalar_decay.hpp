/// \file
/// Scalar-decay chunkwise backend (RetNet / Mamba2-SSD / Lightning style): per head and token,
/// `S_t = exp(g_t)·S_{t-1} + k_t v_tᵀ`, `o_t = scale·S_tᵀ q_t`, log-gates `g [T, H]`.
/// The reference implementation of the backend contract (`backend.hpp`).
#pragma once

#include <Kokkos_Core.hpp>

#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar/chunkwise/impl/decay_backend.hpp"

namespace ctxpar::chunkwise {

/// Inputs of the scalar-decay family.
template <class Scalar, class MemorySpace>
struct ScalarDecayInputs {
  const_token_view<Scalar, MemorySpace> q;  ///< queries `[T, H, K]`
  const_token_view<Scalar, MemorySpace> k;  ///< keys `[T, H, K]`
  const_token_view<Scalar, MemorySpace> v;  ///< values `[T, H, V]`
  const_head_view<Scalar, MemorySpace> g;   ///< log-gates `[T, H]` (`a_t = exp(g_t)`)

  /// Every view mapped through `f` (a view to one of the same rank and extents on `To`), in
  /// member order: the 16-bit plan's widened inputs and fp32 gradient buffers.
  template <class To, class F>
  ScalarDecayInputs<To, MemorySpace> map_views(F&& f) const {
    return {f(q), f(k), f(v), f(g)};
  }
};

/// Gradients of the scalar-decay family (same shapes as the inputs).
template <class Scalar, class MemorySpace>
struct ScalarDecayGradients {
  token_view<Scalar, MemorySpace> dq;  ///< `[T, H, K]`
  token_view<Scalar, MemorySpace> dk;  ///< `[T, H, K]`
  token_view<Scalar, MemorySpace> dv;  ///< `[T, H, V]`
  head_view<Scalar, MemorySpace> dg;   ///< `[T, H]`

  /// Every view mapped through `f` (a view to one of the same rank and extents on `To`), in
  /// member order: the 16-bit plan's widened inputs and fp32 gradient buffers.
  template <class To, class F>
  ScalarDecayGradients<To, MemorySpace> map_views(F&& f) const {
    return {f(dq), f(dk), f(dv), f(dg)};
  }
};

/// Chunkwise backend for `A_t = exp(g_t)·I` (transition structure: scalar). Construct with
/// `BackendOptions{chunk_size, scale}`; satisfies the contract of `backend.hpp`.
template <class Scalar, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class ScalarDecayBackend
    : public impl::DecayBackend<Scalar, MemorySpace, false, ScalarDecayInputs<Scalar, MemorySpace>,
                                ScalarDecayGradients<Scalar, MemorySpace>> {
  using base =
      impl::DecayBackend<Scalar, MemorySpace, false, ScalarDecayInputs<Scalar, MemorySpace>,
                         ScalarDecayGradients<Scalar, MemorySpace>>;

 public:
  using base::base;

  /// The same family on scalar type `To` (how the 16-bit plan names its fp32 backend).
  template <class To>
  using rebind_scalar = ScalarDecayBackend<To, MemorySpace>;
  /// This backend on scalar type `To`, with the same options.
  template <class To>
  rebind_scalar<To> rebind() const {
    return rebind<To>(this->options());
  }
  /// This backend on scalar type `To` with `options` (a 16-bit plan's, its products resolved).
  template <class To>
  rebind_scalar<To> rebind(const BackendOptions& options) const {
    return rebind_scalar<To>(options);
  }
};

}  // namespace ctxpar::chunkwise
