/// \file
/// The token-by-token gated delta recurrence in the activation type, as a Kokkos kernel: the
/// *baseline* the chunkwise kernels are benchmarked against (same data, same threads). No ctxpar
/// operator calls it; the tests' oracle is a separate fp64 implementation.
#pragma once

#include <Kokkos_Core.hpp>

#include "ctxpar/chunkwise/impl/gated_delta_kernels.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/impl/isa_dispatch.hpp"
#include "ctxpar/core/impl/simd.hpp"
#include "ctxpar/core/team_size.hpp"

CTXPAR_WIDE_VECTORS_BEGIN
namespace ctxpar::impl::gated_delta {

/// `y[0:n] = a·y[0:n] + b·x[0:n]`, vectorised (`Bytes`-wide) on hosts with vector extensions.
template <int Bytes = CTXPAR_SIMD_BYTES, class T>
KOKKOS_INLINE_FUNCTION void scale_add(int n, T a, T* y, T b, const T* x) {
  int c = 0;
#if CTXPAR_HOST_SIMD
  constexpr int W = Simd<T, Bytes>::lanes;
  for (; c + W <= n; c += W) {
    simd_t<T, Bytes> vy = simd_load<T, Bytes>(y + c);
    const simd_t<T, Bytes> vx = simd_load<T, Bytes>(x + c);
    vy = a * vy + b * vx;
    simd_store(y + c, vy);
  }
#endif
  for (; c < n; ++c) y[c] = a * y[c] + b * x[c];
}

/// Token-by-token forward, one team per (head, block of value columns), serial over the
/// sub-steps of one sequence `[row_begin, row_end)` (all `n_h·T` rows when called on a whole
/// shard), zero initial state. Per sub-step: `pred = Sᵀk`, `u = β(v − α·pred)`,
/// `S = α·S + k uᵀ`, and `o = scale·Sᵀq` after the last sub-step of a token.
template <class Scalar, class ExecutionSpace>
struct Recurrence {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  using scratch = scratch_view<Scalar, ExecutionSpace>;
  Problem<Scalar> pb;
  Scalar* out = nullptr;
  int rows = 0, block = 32, blocks = 1;
  /// The instruction set of the host fast path, chosen on the launching thread.
  HostIsa isa = active_host_isa();

  static std::size_t scratch_bytes(int K, int NB) {
    return scratch::shmem_size(std::size_t(K) * NB) + 2 * scratch::shmem_size(std::size_t(NB));
  }

  KOKKOS_FUNCTION void operator()(const member_type& team) const {
    ctxpar::impl::run_kernel<uses_host_fast_path_v<ExecutionSpace>>(isa, *this, team);
  }

  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(const member_type& team) const {
    const int H = pb.heads, K = pb.key_dim, V = pb.value_dim, NB = block;
    const int h = team.league_rank() / blocks, j0 = (team.league_rank() % blocks) * NB;
    const int width = V - j0 < NB ? V - j0 : NB;
    scratch S(team.team_scratch(1), std::size_t(K) * NB),
        pred(team.team_scratch(1), std::size_t(NB)), u(team.team_scratch(1), std::size_t(NB));
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      for (long i = 0; i < static_cast<long>(K) * NB; ++i) S[i] = Scalar(0);
      for (int r = 0; r < rows; ++r) {
        const Scalar alpha = compat::exp(pb.gate(r, h));
        const Scalar b = pb.beta[static_cast<long>(r) * H + h];
        const Scalar* k = pb.k + (static_cast<long>(r) * H + h) * K;
        const Scalar* v = pb.v + (static_cast<long>(r) * H + h) * V + j0;
        for (int c = 0; c < width; ++c) pred[c] = Scalar(0);
        for (int a = 0; a < K; ++a)
          scale_add<Bytes>(width, Scalar(1), pred.data(), k[a], &S[a * NB]);
        for (int c = 0; c < width; ++c) u[c] = b * (v[c] - alpha * pred[c]);
        for (int a = 0; a < K; ++a) scale_add<Bytes>(width, alpha, &S[a * NB], k[a], u.data());
        if (pb.has_query(r)) {
          const Scalar* q = pb.q + (static_cast<long>(pb.token(r)) * H + h) * K;
          Scalar* o = out + (static_cast<long>(pb.token(r)) * H + h) * V + j0;
          for (int c = 0; c < width; ++c) o[c] = Scalar(0);
          for (int a = 0; a < K; ++a)
            scale_add<Bytes>(width, Scalar(1), o, pb.scale * q[a], &S[a * NB]);
        }
      }
    });
  }
};

/// Runs the recurrence baseline over the `rows` sub-steps of `pb` (one sequence, zero state)
/// into `out [T, H, V]`.
template <class ExecutionSpace, class Scalar>
void recurrence_forward(const ExecutionSpace& space, const Problem<Scalar>& pb, int rows,
                        Scalar* out) {
  const int nb =
      pass_block<ExecutionSpace>() < pb.value_dim ? pass_block<ExecutionSpace>() : pb.value_dim;
  const int blocks = (pb.value_dim + nb - 1) / nb;
  Recurrence<Scalar, ExecutionSpace> functor{pb, out, rows, nb, blocks};
  const auto scratch = Kokkos::PerTeam(functor.scratch_bytes(pb.key_dim, nb));
  const auto probe =
      Kokkos::TeamPolicy<ExecutionSpace>(space, pb.heads * blocks, 1).set_scratch_size(1, scratch);
  Kokkos::TeamPolicy<ExecutionSpace> policy(space, pb.heads * blocks,
                                            choose_team_size(probe, functor));
  Kokkos::parallel_for("ctxpar::chunkwise::gated_delta::recurrence_baseline",
                       policy.set_scratch_size(1, scratch), functor);
}

}  // namespace ctxpar::impl::gated_delta
CTXPAR_WIDE_VECTORS_END
