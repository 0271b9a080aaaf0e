/// \file
/// Gated delta rule (GDN) chunkwise backend: per head and token,
/// `S_t = exp(g_t)·(I − β_t k_t k_tᵀ)·S_{t−1} + β_t k_t v_tᵀ`, `o_t = scale·S_tᵀ q_t`
/// (`scale` defaults to `K^(-1/2)`; L2-normalising q and k is the caller's job). The local work is
/// the chunkwise WY/UT algorithm with dense `K×K` transitions chained in fp32 per chunk.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar/chunkwise/impl/gated_delta_backend.hpp"
#include "ctxpar/chunkwise/summary.hpp"
#include "ctxpar/core/view_checks.hpp"

namespace ctxpar::chunkwise {

/// Inputs of the gated delta rule.
template <class Scalar, class MemorySpace>
struct GatedDeltaRuleInputs {
  const_token_view<Scalar, MemorySpace> q;    ///< queries `[T, H, K]`
  const_token_view<Scalar, MemorySpace> k;    ///< keys `[T, H, K]` (unit norm expected)
  const_token_view<Scalar, MemorySpace> v;    ///< values `[T, H, V]`
  const_head_view<Scalar, MemorySpace> g;     ///< log-gates `[T, H]` (`α_t = exp(g_t)`)
  const_head_view<Scalar, MemorySpace> beta;  ///< write strengths `[T, H]`

  /// Every view mapped through `f` (a view to one of the same rank and extents on `To`), in
  /// member order: the 16-bit plan's widened inputs and fp32 gradient buffers.
  template <class To, class F>
  GatedDeltaRuleInputs<To, MemorySpace> map_views(F&& f) const {
    return {f(q), f(k), f(v), f(g), f(beta)};
  }
};

/// Gradients of the gated delta rule (same shapes as the inputs).
template <class Scalar, class MemorySpace>
struct GatedDeltaRuleGradients {
  token_view<Scalar, MemorySpace> dq;    ///< `[T, H, K]`
  token_view<Scalar, MemorySpace> dk;    ///< `[T, H, K]`
  token_view<Scalar, MemorySpace> dv;    ///< `[T, H, V]`
  head_view<Scalar, MemorySpace> dg;     ///< `[T, H]`
  head_view<Scalar, MemorySpace> dbeta;  ///< `[T, H]`

  /// Every view mapped through `f` (a view to one of the same rank and extents on `To`), in
  /// member order: the 16-bit plan's widened inputs and fp32 gradient buffers.
  template <class To, class F>
  GatedDeltaRuleGradients<To, MemorySpace> map_views(F&& f) const {
    return {f(dq), f(dk), f(dv), f(dg), f(dbeta)};
  }
};

/// Chunkwise backend of the gated delta rule (dense transitions). Construct with
/// `BackendOptions{chunk_size, scale}`; satisfies the contract of `backend.hpp`.
template <class Scalar, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class GatedDeltaRuleBackend
    : public ctxpar::impl::gated_delta::Backend<Scalar, MemorySpace, false,
                                                GatedDeltaRuleInputs<Scalar, MemorySpace>,
                                                GatedDeltaRuleGradients<Scalar, MemorySpace>> {
  using base = ctxpar::impl::gated_delta::Backend<Scalar, MemorySpace, false,
                                                  GatedDeltaRuleInputs<Scalar, MemorySpace>,
                                                  GatedDeltaRuleGradients<Scalar, MemorySpace>>;

 public:
  /// A backend with the given chunk size and scale.
  explicit GatedDeltaRuleBackend(BackendOptions options = {}) : base(1, options) {}

  /// The same family on scalar type `To` (how the 16-bit plan names its fp32 backend).
  template <class To>
  using rebind_scalar = GatedDeltaRuleBackend<To, MemorySpace>;
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

/// Useful floating-point operations of the chunkwise gated delta forward, per head and per
/// chunk of `c` sub-steps, every product at full size (docs/chunkwise.md §5, "FLOP model"):
/// `A: C²K; T: C³/3; Ũ, W̃: 2C²V + 2C²K; QKᵀ⊙L: 2C²K; U: 2CKV; outputs: 2CKV + 2C²V;
/// dS_c, M_c: 2CKV + 2CK²; chaining M: 2K³`. The benchmarks count the triangular model of its §8.
inline double gated_delta_chunk_flops(double c, double k, double v) {
  return c * c * k + c * c * c / 3 + 2 * c * c * v + 2 * c * c * k + 2 * c * c * k + 2 * c * k * v +
         2 * c * k * v + 2 * c * c * v + 2 * c * k * v + 2 * c * k * k + 2 * k * k * k;
}

/// That model summed over a local forward of `tokens` tokens (`n_h` sub-steps each), `heads`
/// heads, chunks of `chunk` tokens: full chunks at the model's rate plus the ragged last chunk.
inline double gated_delta_forward_flops(std::int64_t tokens, std::int64_t heads,
                                        std::int64_t key_dim, std::int64_t value_dim, int chunk,
                                        int n_h = 1) {
  const std::int64_t rows = tokens * n_h, c = std::int64_t(chunk) * n_h;
  const std::int64_t full = rows / c, rest = rows % c;
  double per_head =
      double(full) * gated_delta_chunk_flops(double(c), double(key_dim), double(value_dim));
  if (rest > 0)
    per_head += gated_delta_chunk_flops(double(rest), double(key_dim), double(value_dim));
  return per_head * double(heads);
}

/// Floating-point operations of the token-by-token recurrence (the benchmark baseline): per head
/// and sub-step `pred = Sᵀk` (2KV), `S = αS + k uᵀ` (3KV), `u` (3V), and `o = scale·Sᵀq` (2KV)
/// once per token.
inline double gated_delta_recurrence_flops(std::int64_t tokens, std::int64_t heads,
                                           std::int64_t key_dim, std::int64_t value_dim,
                                           int n_h = 1) {
  const double kv = double(key_dim) * double(value_dim);
  return double(tokens) * double(heads) * (double(n_h) * (5 * kv + 3 * double(value_dim)) + 2 * kv);
}

}  // namespace ctxpar::chunkwise
