/// \file
/// Diagonal-gate chunkwise backend (GLA style): per head and token,
/// `S_t = diag(exp(g_t))·S_{t-1} + k_t v_tᵀ`, `o_t = scale·S_tᵀ q_t`, log-gates `g [T, H, K]`.
#pragma once

#include <Kokkos_Core.hpp>

#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar/chunkwise/impl/decay_backend.hpp"

namespace ctxpar::chunkwise {

/// Inputs of the diagonal-gate family.
template <class Scalar, class MemorySpace>
struct DiagonalGateInputs {
  const_token_view<Scalar, MemorySpace> q;  ///< queries `[T, H, K]`
  const_token_view<Scalar, MemorySpace> k;  ///< keys `[T, H, K]`
  const_token_view<Scalar, MemorySpace> v;  ///< values `[T, H, V]`
  const_token_view<Scalar, MemorySpace> g;  ///< log-gates `[T, H, K]` (`α_t = exp(g_t)`)
};

/// Gradients of the diagonal-gate family (same shapes as the inputs).
template <class Scalar, class MemorySpace>
struct DiagonalGateGradients {
  token_view<Scalar, MemorySpace> dq;  ///< `[T, H, K]`
  token_view<Scalar, MemorySpace> dk;  ///< `[T, H, K]`
  token_view<Scalar, MemorySpace> dv;  ///< `[T, H, V]`
  token_view<Scalar, MemorySpace> dg;  ///< `[T, H, K]`
};

/// Chunkwise backend for `A_t = diag(exp(g_t))` (transition structure: diagonal). Construct with
/// `BackendOptions{chunk_size, scale}`; satisfies the contract of `backend.hpp`.
template <class Scalar, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class DiagonalGateBackend
    : public impl::DecayBackend<Scalar, MemorySpace, true, DiagonalGateInputs<Scalar, MemorySpace>,
                                DiagonalGateGradients<Scalar, MemorySpace>> {
  using base =
      impl::DecayBackend<Scalar, MemorySpace, true, DiagonalGateInputs<Scalar, MemorySpace>,
                         DiagonalGateGradients<Scalar, MemorySpace>>;

 public:
  using base::base;
};

}  // namespace ctxpar::chunkwise
