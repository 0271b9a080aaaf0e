/// \file
/// Chunkwise kernels of the gated delta rule (and, with `n_h` sub-steps per token, of the gated
/// delta product): the per-chunk WY/UT pass, the sequential state passes (forward and reverse)
/// and the per-chunk gradients. The math is derived in docs (21-chunkwise-kernels.md); in short,
/// per chunk of sub-steps `i` with in-chunk cumulative log-gate `γ_i`, `Γ_i = exp(γ_i)`:
///   A_ij = β_i exp(γ_i−γ_j) k_i·k_j (j<i),  X = (I + A)⁻¹,
///   W̃ = X diag(βΓ) K,  Ũ = X diag(β) V,  U = Ũ − W̃ S,  P = (Q̂ Kᵀ) ⊙ exp(γ_i−γ_j) (j≤i),
///   O = diag(Γ) Q̂ S + P U,  S' = Γ_last S + K̃ᵀ U with k̃_j = exp(γ_last−γ_j) k_j,
/// where Q̂ holds scale·q at the last sub-step of each token and zero rows elsewhere.
/// Everything below works on raw row-major pointers; the sub-step row `r` of a rank has its key
/// at `k + (r·H + h)·K` for both GDN `[T, H, K]` and GDP `[T, n_h, H, K]` layouts.
#pragma once

#include <Kokkos_Core.hpp>

#include <type_traits>

#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar/chunkwise/impl/chunk_product.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/impl/fast_exp.hpp"
#include "ctxpar/core/impl/gates.hpp"
#include "ctxpar/core/impl/isa_dispatch.hpp"
#include "ctxpar/core/impl/team_mma_product.hpp"
#include "ctxpar/core/impl/tile_product.hpp"
#include "ctxpar/core/team_size.hpp"

// The host team kernels run through `with_host_isa` at the vector width of the instruction set
// their launch chose (`Bytes`); every helper below that names a vector takes that width.
CTXPAR_WIDE_VECTORS_BEGIN
namespace ctxpar::impl::gated_delta {

/// Shapes and raw inputs of one local (rank) problem, copied into every kernel functor.
template <class Scalar>
struct Problem {
  const Scalar* q = nullptr;     ///< [T, H, K]
  const Scalar* k = nullptr;     ///< [T·n_h, H, K]
  const Scalar* v = nullptr;     ///< [T·n_h, H, V]
  const Scalar* g = nullptr;     ///< [T, H]
  const Scalar* beta = nullptr;  ///< [T·n_h, H]
  int n_h = 1, heads = 0, key_dim = 0, value_dim = 0, chunk = 64;
  Scalar scale = 1;
  /// How the intra-chunk products multiply (`exact` unless the plan's options ask otherwise;
  /// others only for float).
  ctxpar::chunkwise::ChunkProducts products = ctxpar::chunkwise::ChunkProducts::exact;

  KOKKOS_INLINE_FUNCTION bool has_query(int row) const { return row % n_h == n_h - 1; }
  KOKKOS_INLINE_FUNCTION int token(int row) const { return row / n_h; }
  KOKKOS_INLINE_FUNCTION Scalar gate(int row, int h) const {
    return row % n_h == 0 ? g[static_cast<long>(row / n_h) * heads + h] : Scalar(0);
  }
};

/// Saved per-chunk quantities (flat views, one block per (chunk, head)).
template <class Scalar, class MemorySpace>
struct ChunkData {
  using view = Kokkos::View<Scalar*, MemorySpace>;
  /// (first sub-step row, number of rows, sequence) of every chunk.
  Kokkos::View<int* [3], MemorySpace> chunks;
  view gamma;  ///< [nc, H, C] in-chunk cumulative log-gate (padding rows repeat the last)
  /// [nc, H, C] row of the last hard reset (log-gate −∞) at or before each row, or -1; `gamma`
  /// restarts from 0 there, so no decay is ever formed as −∞ − (−∞).
  Kokkos::View<int*, MemorySpace> reset;
  /// [nc, H, C] rounding error of `gamma` (compensated summation): decays are formed from both
  /// parts, so their error is u·|γ_i − γ_j| as in the recurrence, not u·(|γ_i| + |γ_j|).
  view gamma_lo;
  view x, p;        ///< [nc, H, C, C] (I + A)⁻¹ and the decayed causal scores
  view wt, kt, qh;  ///< [nc, H, C, K] W̃, K̃, diag(Γ) Q̂
  view ut, u, du;   ///< [nc, H, C, V] Ũ, U (forward), dU (backward)
  view s0, dse;     ///< [nc, H, K, V] chunk-start state (forward), end-state gradient (backward)
};

/// Decay exp(γ_i − γ_j) between rows j ≤ i of one chunk block (γ = gam + lo, compensated): 0
/// across a hard reset. The library's `fast_exp`, whose vector form (`decay_rows`) gives the
/// same bits on the host fast path.
template <class Scalar>
KOKKOS_INLINE_FUNCTION Scalar decay_ratio(const Scalar* gam, const Scalar* lo, const int* rs, int i,
                                          int j) {
  return gated_decay<FastExp>(rs[i] <= j, compensated_difference(gam[i], lo[i], gam[j], lo[j]));
}

/// Decay Γ_i = exp(γ_i) from the chunk's incoming state to row i: 0 after a hard reset.
template <class Scalar>
KOKKOS_INLINE_FUNCTION Scalar decay_from_start(const Scalar* gam, const Scalar* lo, const int* rs,
                                               int i) {
  return gated_decay<FastExp>(rs[i] < 0, gam[i] + lo[i]);
}

#if CTXPAR_HOST_SIMD
/// `decay_ratio(i, j)` on whole vectors of `j` (float, `Bytes` wide): the same operations lane by
/// lane (`simd_exp` is `fast_exp` on every lane), so the same bits as one pair at a time.
template <int Bytes>
struct RowDecays {
  using simd = simd_t<float, Bytes>;
  static constexpr int lanes = Simd<float, Bytes>::lanes;
  const simd zero = simd_zero<float, Bytes>();
  float row, live, reset, gam_i, lo_i;
  const float *gam, *lo;
  RowDecays(int i, int n, const float* gam_, const float* lo_, const int* rs)
      : row(static_cast<float>(i)),
        live(static_cast<float>(i < n ? n : 0)),
        reset(static_cast<float>(rs[i])),
        gam_i(gam_[i]),
        lo_i(lo_[i]),
        gam(gam_),
        lo(lo_) {}
  /// The columns `j, j + 1, …` of the lanes.
  simd columns(int j) const { return simd_lane_index<float, Bytes>() + static_cast<float>(j); }
  /// Lanes with `j ≤ i` and both rows live (`j < n`, the row itself live).
  auto seen(const simd& jv) const { return (jv <= row) & (jv < live); }
  /// The decays of the lanes: those `seen` past the row's last hard reset, 0 elsewhere.
  template <class Mask>
  simd decay(int j, const simd& jv, const Mask& seen) const {
    const simd x = compensated_difference(gam_i, lo_i, simd_load<float, Bytes>(gam + j),
                                          simd_load<float, Bytes>(lo + j));
    return (seen & (jv >= reset)) ? simd_exp(x) : zero;
  }
  /// Calls `f(j, jv, seen, decay)` on every whole vector of columns `j` below `C`; returns the
  /// first column left to the scalar loop.
  template <class F>
  int sweep(int C, const F& f) const {
    int j = 0;
    for (; j + lanes <= C; j += lanes) {
      const simd jv = columns(j);
      const auto in = seen(jv);
      f(j, jv, in, decay(j, jv, in));
    }
    return j;
  }
};
#endif

/// Row `i` of the decayed Gram matrix and causal scores of a chunk of `n` live rows, in place:
/// `A_ij ← β_i · d_ij · A_ij` (j < i), `P_ij ← P_ij · d_ij` (j ≤ i), zero elsewhere, with
/// `d_ij = decay_ratio(i, j)`. The portable loop evaluates one pair at a time; on the host fast
/// path (float, vector extensions) whole vectors of `j` take the same operations lane by lane
/// (`simd_exp` is `fast_exp` on every lane), so both give the same bits.
template <bool Vector, int Bytes = CTXPAR_SIMD_BYTES, class Scalar>
KOKKOS_INLINE_FUNCTION void decay_rows(int i, int n, int C, Scalar bi, const Scalar* gam,
                                       const Scalar* lo, const int* rs, Scalar* A, Scalar* P) {
  int j = 0;
#if CTXPAR_HOST_SIMD
  if constexpr (Vector && std::is_same_v<Scalar, float>) {
    const RowDecays<Bytes> decays(i, n, gam, lo, rs);
    j = decays.sweep(C, [&](int jj, const auto& jv, const auto& seen, const auto& d) {
      const auto a = bi * d * simd_load<float, Bytes>(A + jj);
      simd_store(A + jj, (seen & (jv < decays.row)) ? a : decays.zero);
      const auto p = simd_load<float, Bytes>(P + jj) * d;
      simd_store(P + jj, seen ? p : decays.zero);
    });
  }
#endif
  for (; j < C; ++j) {
    const bool in = i < n && j < n;
    const Scalar decay = (in && j <= i) ? decay_ratio(gam, lo, rs, i, j) : Scalar(0);
    A[j] = (in && j < i) ? bi * decay * A[j] : Scalar(0);
    P[j] = (in && j <= i) ? P[j] * decay : Scalar(0);
  }
}

#if CTXPAR_HOST_SIMD
/// `unit_lower_inverse_row` on `NV` whole vectors (`C = NV·lanes`) held in registers across `m`:
/// each update is the scalar loop's `x_j − a·X_mj` on the lanes `j < m` (the scalar loop's range)
/// and leaves the other lanes as they are, so the bits are the same.
template <int NV, int Bytes>
inline void unit_lower_inverse_row_vectors(int i, const float* ai, const float* X, float* xi) {
  using simd = simd_t<float, Bytes>;
  constexpr int lanes = Simd<float, Bytes>::lanes, C = NV * lanes;
  const simd index = simd_lane_index<float, Bytes>(), zero = simd_zero<float, Bytes>();
  const simd one = simd_broadcast<float, Bytes>(1.0f);
  const simd row = simd_broadcast<float, Bytes>(static_cast<float>(i));
  simd x[NV];
  for (int v = 0; v < NV; ++v) {
    const simd jv = index + static_cast<float>(v * lanes);
    const simd neg = -simd_load<float, Bytes>(ai + v * lanes);
    x[v] = jv < row ? neg : (jv == row ? one : zero);
  }
  for (int m = 1; m < i; ++m) {
    const float a = ai[m];
    const float* xm = X + static_cast<long>(m) * C;
    const simd bound = simd_broadcast<float, Bytes>(static_cast<float>(m));
    // A vector whose first column is at or past m has no lane j < m.
    for (int v = 0; v < NV && v * lanes < m; ++v) {
      const simd jv = index + static_cast<float>(v * lanes);
      const simd updated = x[v] - a * simd_load<float, Bytes>(xm + v * lanes);
      x[v] = jv < bound ? updated : x[v];
    }
  }
  for (int v = 0; v < NV; ++v) simd_store(xi + v * lanes, x[v]);
}
/// `unit_lower_inverse_row_vectors<vectors, Bytes>` for 1 to 8 vectors (false, nothing done,
/// above).
template <int Bytes, int NV = 1>
inline bool unit_lower_inverse_row_vectors_of(int vectors, int i, const float* ai, const float* X,
                                              float* xi) {
  if (vectors == NV) {
    unit_lower_inverse_row_vectors<NV, Bytes>(i, ai, X, xi);
    return true;
  }
  if constexpr (NV < 8) {
    return unit_lower_inverse_row_vectors_of<Bytes, NV + 1>(vectors, i, ai, X, xi);
  } else {
    return false;
  }
}
#endif

/// Row `i` of `X = (I + A)⁻¹` for a strictly lower `A` (`[C, C]`, row-major; `ai` is its row
/// `i`) over the columns `[j0, j1)`, from the rows `m < i` of `X` already written: `X_ij = −A_ij
/// − Σ_{j<m<i} A_im X_mj`, 1 on the diagonal, 0 above, the sum in increasing `m`. The scalar loop
/// keeps the row in memory (a contiguous axpy per `m`, which the compiler vectorises, but each
/// `m` loads and stores the row again). With `Vector` (the host fast path: float, the whole row
/// as one block, `C` a multiple of the vector width, up to 8 vectors) the row stays in registers
/// across `m`, with the same bits.
template <bool Vector, int Bytes = CTXPAR_SIMD_BYTES, class Scalar>
KOKKOS_INLINE_FUNCTION void unit_lower_inverse_row(int i, int C, int j0, int j1, const Scalar* ai,
                                                   const Scalar* X, Scalar* xi) {
#if CTXPAR_HOST_SIMD
  if constexpr (Vector && std::is_same_v<Scalar, float>) {
    constexpr int lanes = Simd<float, Bytes>::lanes;
    if (j0 == 0 && j1 == C && C % lanes == 0) {
      if (unit_lower_inverse_row_vectors_of<Bytes>(C / lanes, i, ai, X, xi)) return;
    }
  }
#endif
  for (int j = j0; j < j1; ++j) xi[j] = j < i ? -ai[j] : (j == i ? Scalar(1) : Scalar(0));
  for (int m = j0 + 1; m < i; ++m) {
    const Scalar a = ai[m];
    const Scalar* xm = X + static_cast<long>(m) * C;
    const int jm = m < j1 ? m : j1;  // X_mj = 0 for j >= m
    for (int j = j0; j < jm; ++j) xi[j] -= a * xm[j];
  }
}

/// Row `i` of the decays alone, `L_ij = decay_ratio(i, j)` for `j ≤ i` with both rows live (`n`
/// of them), 0 elsewhere, into `L`: whole vectors of `j` on the host fast path (float, vector
/// extensions), one pair at a time otherwise, with the same bits (as `decay_rows`).
template <bool Vector, int Bytes = CTXPAR_SIMD_BYTES, class Scalar>
KOKKOS_INLINE_FUNCTION void decay_row(int i, int n, int C, const Scalar* gam, const Scalar* lo,
                                      const int* rs, Scalar* L) {
  int j = 0;
#if CTXPAR_HOST_SIMD
  if constexpr (Vector && std::is_same_v<Scalar, float>) {
    j = RowDecays<Bytes>(i, n, gam, lo, rs)
            .sweep(C,
                   [&](int jj, const auto&, const auto&, const auto& d) { simd_store(L + jj, d); });
  }
#endif
  for (; j < C; ++j) L[j] = (i < n && j < n && j <= i) ? decay_ratio(gam, lo, rs, i, j) : Scalar(0);
}

template <class Scalar, class ExecutionSpace>
using scratch_view =
    Kokkos::View<Scalar*, typename ExecutionSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;

/// Where one team of a per-chunk kernel works: chunk `c`, head `h`, the `n` live sub-step rows from
/// row `r0`, the block `blk` of (chunk, head) in the saved arrays and its log-gate rows: γ, its
/// rounding error and the last hard reset.
template <class Scalar>
struct ChunkBlock {
  int c = 0, h = 0, r0 = 0, n = 0;
  long blk = 0;
  Scalar* gam = nullptr;
  Scalar* glo = nullptr;
  int* rs = nullptr;
};

/// The chunk block of league rank `rank` (one team per (chunk, head)).
template <class Scalar, class MemorySpace>
KOKKOS_INLINE_FUNCTION ChunkBlock<Scalar> chunk_block_of(int rank, const Problem<Scalar>& pb,
                                                         const ChunkData<Scalar, MemorySpace>& cd) {
  const int H = pb.heads, C = pb.chunk;
  ChunkBlock<Scalar> cb;
  cb.c = rank / H;
  cb.h = rank % H;
  cb.r0 = cd.chunks(cb.c, 0);
  cb.n = cd.chunks(cb.c, 1);
  cb.blk = static_cast<long>(cb.c) * H + cb.h;
  cb.gam = cd.gamma.data() + cb.blk * C;
  cb.glo = cd.gamma_lo.data() + cb.blk * C;
  cb.rs = cd.reset.data() + cb.blk * C;
  return cb;
}

/// Phase 1, independent per (chunk, head): γ, X, W̃, Ũ, K̃, Q̂Γ and P.
template <class Scalar, class ExecutionSpace, class MemorySpace>
struct IntraChunk {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  using scratch = scratch_view<Scalar, ExecutionSpace>;
  Problem<Scalar> pb;
  ChunkData<Scalar, MemorySpace> cd;
  /// The instruction set of the host fast path, chosen on the launching thread.
  HostIsa isa = active_host_isa();
  /// Team-scratch level of the launch (`scratch_level`: 0 where the scratch fits, set there).
  int level = 1;

  static std::size_t scratch_bytes(int C, int K, int V) {
    return scratch::shmem_size(std::size_t(K) * C) + scratch::shmem_size(std::size_t(C) * K) +
           scratch::shmem_size(std::size_t(C) * C) + scratch::shmem_size(std::size_t(C) * K) +
           scratch::shmem_size(std::size_t(C) * V);
  }

  /// X = (I + A)⁻¹ for the strictly lower `A` (`[C, C]`, row-major), by forward substitution one
  /// row at a time: `X_ij = −A_ij − Σ_{j<m<i} A_im X_mj` (1 on the diagonal, 0 above), the sum
  /// in increasing `m` on every path. The portable path gives each thread one `j` and keeps the
  /// sum in a register (consecutive threads read consecutive `X_mj`); the host fast path gives each
  /// thread a block of `j` and runs `m` outside (`unit_lower_inverse_row`), so that the update
  /// of the block is whole vectors.
  template <int Bytes>
  static KOKKOS_INLINE_FUNCTION void invert_unit_lower(const member_type& team, const Scalar* A,
                                                       Scalar* X, int C) {
    if constexpr (uses_host_fast_path_v<ExecutionSpace>) {
      const int threads = team.team_size();
      const int block = threads > 1 ? ((C + threads - 1) / threads + 15) / 16 * 16 : C;
      const int blocks = (C + block - 1) / block;
      for (int i = 0; i < C; ++i) {
        const Scalar* ai = A + static_cast<long>(i) * C;
        Scalar* xi = X + static_cast<long>(i) * C;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, blocks), [&](int b) {
          const int j0 = b * block, j1 = j0 + block < C ? j0 + block : C;
          unit_lower_inverse_row<true, Bytes>(i, C, j0, j1, ai, X, xi);
        });
        team.team_barrier();
      }
    } else {
      for (int i = 0; i < C; ++i) {
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](int j) {
          Scalar x = Scalar(0);
          if (j == i) {
            x = Scalar(1);
          } else if (j < i) {
            x = -A[static_cast<long>(i) * C + j];
            for (int m = j + 1; m < i; ++m)
              x -= A[static_cast<long>(i) * C + m] * X[static_cast<long>(m) * C + j];
          }
          X[static_cast<long>(i) * C + j] = x;
        });
        team.team_barrier();
      }
    }
  }

  /// γ, its rounding error and the last hard reset of every row of the chunk, on one thread.
  KOKKOS_INLINE_FUNCTION void cumulative_gates(const member_type& team,
                                               const ChunkBlock<Scalar>& cb) const {
    const int C = pb.chunk, r0 = cb.r0, n = cb.n, h = cb.h;
    Scalar* gam = cb.gam;
    Scalar* glo = cb.glo;
    int* rs = cb.rs;
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      CompensatedLogGate<Scalar> gamma;
      int last_reset = -1;
      for (int i = 0; i < C; ++i) {
        // A hard reset (−∞) forgets the state before row i.
        if (gamma.add(i < n ? pb.gate(r0 + i, h) : Scalar(0))) last_reset = i;
        gam[i] = gamma.sum;
        glo[i] = gamma.lo;
        rs[i] = last_reset;
      }
    });
  }

  KOKKOS_FUNCTION void operator()(const member_type& team) const {
    ctxpar::impl::run_kernel<uses_host_fast_path_v<ExecutionSpace>>(isa, *this, team);
  }

  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(const member_type& team) const {
    const int H = pb.heads, K = pb.key_dim, V = pb.value_dim, C = pb.chunk;
    const ChunkBlock<Scalar> cb = chunk_block_of(team.league_rank(), pb, cd);
    const int h = cb.h, r0 = cb.r0, n = cb.n;
    const long blk = cb.blk;
    const Scalar* gam = cb.gam;
    const Scalar* glo = cb.glo;
    const int* rs = cb.rs;
    Scalar* X = cd.x.data() + blk * C * C;
    Scalar* P = cd.p.data() + blk * C * C;
    Scalar* Wt = cd.wt.data() + blk * C * K;
    Scalar* Kt = cd.kt.data() + blk * C * K;
    Scalar* Qh = cd.qh.data() + blk * C * K;
    Scalar* Ut = cd.ut.data() + blk * C * V;
    scratch kT(team.team_scratch(level), std::size_t(K) * C),
        qs(team.team_scratch(level), std::size_t(C) * K),
        A(team.team_scratch(level), std::size_t(C) * C),
        bk(team.team_scratch(level), std::size_t(C) * K),
        bv(team.team_scratch(level), std::size_t(C) * V);

    cumulative_gates(team, cb);
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](int i) {
      const bool live = i < n;
      const int row = r0 + i;
      const Scalar G = decay_from_start(gam, glo, rs, i);
      const Scalar lam = decay_ratio(gam, glo, rs, C - 1, i);
      const Scalar b = live ? pb.beta[static_cast<long>(row) * H + h] : Scalar(0);
      const bool query = live && pb.has_query(row);
      const Scalar* krow = live ? pb.k + (static_cast<long>(row) * H + h) * K : nullptr;
      const Scalar* qrow = query ? pb.q + (static_cast<long>(pb.token(row)) * H + h) * K : nullptr;
      const Scalar* vrow = live ? pb.v + (static_cast<long>(row) * H + h) * V : nullptr;
      // One loop per output: the row-wise ones are contiguous (they vectorise on a host) and
      // only the transposed copy into kT scatters.
      Scalar* kt_row = Kt + static_cast<long>(i) * K;
      Scalar* bk_row = bk.data() + static_cast<long>(i) * K;
      Scalar* qs_row = qs.data() + static_cast<long>(i) * K;
      Scalar* qh_row = Qh + static_cast<long>(i) * K;
      Scalar* bv_row = bv.data() + static_cast<long>(i) * V;
      const Scalar bG = b * G;
      if (live) {
        for (int d = 0; d < K; ++d) kT[static_cast<long>(d) * C + i] = krow[d];
        for (int d = 0; d < K; ++d) {
          kt_row[d] = lam * krow[d];
          bk_row[d] = bG * krow[d];
        }
        for (int d = 0; d < V; ++d) bv_row[d] = b * vrow[d];
      } else {
        for (int d = 0; d < K; ++d) kT[static_cast<long>(d) * C + i] = Scalar(0);
        for (int d = 0; d < K; ++d) kt_row[d] = bk_row[d] = Scalar(0);
        for (int d = 0; d < V; ++d) bv_row[d] = Scalar(0);
      }
      if (query) {
        for (int d = 0; d < K; ++d) {
          const Scalar qd = pb.scale * qrow[d];
          qs_row[d] = qd;
          qh_row[d] = G * qd;
        }
      } else {
        for (int d = 0; d < K; ++d) qs_row[d] = qh_row[d] = Scalar(0);
      }
    });
    team.team_barrier();
    // Gram K Kᵀ (lower part) and Q̂ Kᵀ: both read Kᵀ as the contiguous right operand.
    chunk_product<Bytes>(pb.products, team, C, C, K, Scalar(1), transposed(kT.data(), C), kT.data(),
                         C, A.data(), C, false, true);
    chunk_product<Bytes>(pb.products, team, C, C, K, Scalar(1), rows(qs.data(), K), kT.data(), C, P,
                         C, false, true);
    team.team_barrier();
    // Decays as exp(γ_i − γ_j): never a ratio of two cumulative products (under/overflow).
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](int i) {
      const Scalar bi = i < n ? pb.beta[static_cast<long>(r0 + i) * H + h] : Scalar(0);
      const long row = static_cast<long>(i) * C;
      decay_rows<uses_host_fast_path_v<ExecutionSpace>, Bytes>(i, n, C, bi, gam, glo, rs,
                                                               A.data() + row, P + row);
    });
    team.team_barrier();
    invert_unit_lower<Bytes>(team, A.data(), X, C);
    chunk_product<Bytes>(pb.products, team, C, K, C, Scalar(1), rows<Scalar>(X, C, Band::lower),
                         bk.data(), K, Wt, K, false);
    chunk_product<Bytes>(pb.products, team, C, V, C, Scalar(1), rows<Scalar>(X, C, Band::lower),
                         bv.data(), V, Ut, V, false);
  }
};

/// Which sequences a state pass runs over and what it reads and writes. Pointers may be null:
/// `init` null starts from zero; `final_state`, `out`, `m_out` null are not written.
template <class Scalar>
struct PassTargets {
  const int* first_chunk = nullptr;  ///< [N + 1] chunk range of every local sequence
  int seq_begin = 0;                 ///< first sequence of the pass
  int row_base = 0;                  ///< sequence `s` uses row `s - row_base` of init/final_state
  const Scalar* init = nullptr;      ///< [N, H, K, V] per-sequence start (forward) / end (reverse)
  Scalar* final_state = nullptr;     ///< [N, H, K, V] per-sequence end (forward) / start (reverse)
  float* m_out = nullptr;            ///< [H, K, K] M (forward) or Mᵀ (reverse) of `seq_begin`
  Scalar* out = nullptr;             ///< forward: o [T, H, V]; unused in reverse
  const Scalar* dout = nullptr;      ///< reverse: dO [T, H, V]
  bool save = false;                 ///< forward: S0 and U per chunk; reverse: dSend and dU
};

/// Widest column block one team of a state pass owns. On a host one team should sweep a chunk's
/// saved matrices once for all its columns (they are read from cache once per block); on a device
/// narrower blocks give more teams.
template <class ExecutionSpace>
int pass_block() {
  return Kokkos::SpaceAccessibility<ExecutionSpace, Kokkos::HostSpace>::accessible ? 256 : 32;
}

/// Where one team of a state pass works: head `h` of sequence `s`, columns `[j0, j0 + width)` of
/// `[S | M]`, the first `state_w` of them state columns (none: an `M`-only block).
struct PassBlock {
  int h = 0, s = 0, j0 = 0, width = 0, state_w = 0;
  long sh = 0;  ///< offset of (s, h) in the `[N, H, K, V]` init / final_state arrays
  KOKKOS_INLINE_FUNCTION bool m_cols() const { return state_w == 0; }
};

/// Where a state pass block works in one chunk: the chunk's block of (chunk, head) in the saved
/// arrays and its `n` live sub-step rows from row `r0`.
struct PassChunk {
  long blk = 0;
  int r0 = 0, n = 0;
};

/// The block of league rank `rank` (blocks of `nb` columns, `blocks` per (sequence, head)).
template <class Scalar>
KOKKOS_INLINE_FUNCTION PassBlock pass_block_of(int rank, const Problem<Scalar>& pb,
                                               const PassTargets<Scalar>& tg, int blocks, int nb) {
  const int K = pb.key_dim, V = pb.value_dim;
  PassBlock pk;
  pk.h = (rank / blocks) % pb.heads;
  pk.s = tg.seq_begin + rank / (blocks * pb.heads);
  const int total = V + (tg.m_out ? K : 0);
  pk.j0 = (rank % blocks) * nb;
  pk.width = total - pk.j0 < nb ? total - pk.j0 : nb;
  pk.state_w = V - pk.j0 <= 0 ? 0 : (V - pk.j0 < pk.width ? V - pk.j0 : pk.width);
  pk.sh = (static_cast<long>(pk.s - tg.row_base) * pb.heads + pk.h) * K * V;
  return pk;
}

/// Loads a pass block's start into `z` (`K × nb`): the identity for `M` columns, `init` (or zero)
/// for state columns.
template <class Scalar, class Member>
KOKKOS_INLINE_FUNCTION void load_pass_start(const Member& team, const PassBlock& pk,
                                            const PassTargets<Scalar>& tg, Scalar* z, int K, int V,
                                            int nb) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, K), [&](int p) {
    for (int j = 0; j < pk.width; ++j) {
      Scalar x;
      if (j >= pk.state_w)
        x = p == pk.j0 + j - V ? Scalar(1) : Scalar(0);
      else
        x = tg.init ? tg.init[pk.sh + static_cast<long>(p) * V + pk.j0 + j] : Scalar(0);
      z[p * nb + j] = x;
    }
  });
}

/// Stores a pass block's end from `z`: `M` columns to `m_out` (fp32), state to `final_state`.
template <class Scalar, class Member>
KOKKOS_INLINE_FUNCTION void store_pass_end(const Member& team, const PassBlock& pk,
                                           const PassTargets<Scalar>& tg, const Scalar* z, int K,
                                           int V, int nb) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, K), [&](int p) {
    for (int j = 0; j < pk.width; ++j) {
      if (j >= pk.state_w) {
        if (tg.m_out)
          tg.m_out[(static_cast<long>(pk.h) * K + p) * K + pk.j0 + j - V] =
              static_cast<float>(z[p * nb + j]);
      } else if (tg.final_state) {
        tg.final_state[pk.sh + static_cast<long>(p) * V + pk.j0 + j] = z[p * nb + j];
      }
    }
  });
}

/// Copies the state columns of a pass block (`rows × nb` in `z`) into the saved `[rows, V]` block
/// `dst` of its chunk.
template <class Scalar, class Member>
KOKKOS_INLINE_FUNCTION void save_pass_columns(const Member& team, const PassBlock& pk, int rows,
                                              const Scalar* z, Scalar* dst, int V, int nb) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int p) {
    for (int j = 0; j < pk.state_w; ++j) dst[static_cast<long>(p) * V + pk.j0 + j] = z[p * nb + j];
  });
}

/// Scales a pass block (`K × nb` in `z`) by the whole decay Γ_last of chunk block `blk`.
template <class Scalar, class MemorySpace, class Member>
KOKKOS_INLINE_FUNCTION void decay_pass_block(const Member& team, const PassBlock& pk,
                                             const ChunkData<Scalar, MemorySpace>& cd, long blk,
                                             int C, int K, Scalar* z, int nb) {
  const Scalar last = decay_from_start(cd.gamma.data() + blk * C, cd.gamma_lo.data() + blk * C,
                                       cd.reset.data() + blk * C, C - 1);
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, K), [&](int p) {
    for (int j = 0; j < pk.width; ++j) z[p * nb + j] *= last;
  });
}

/// The state passes, sequential over the chunks of each sequence, independent per (sequence,
/// head, block of state columns); `Reverse` picks the direction. Both load the block's start,
/// carry it chunk by chunk through three scratch blocks (`K × NB` carried columns and two
/// `C × NB` row blocks) and store its end. Every product goes through `chunk_product` with the
/// plan's products: on tensor cores the carried block stays fp32 in scratch and is rounded only
/// where it is read as an operand, so each chunk adds the products' rounding once (the bound:
/// `products_roundoff_factor`).
template <class Scalar, class ExecutionSpace, class MemorySpace, bool Reverse>
struct StatePass {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  using scratch = scratch_view<Scalar, ExecutionSpace>;
  Problem<Scalar> pb;
  ChunkData<Scalar, MemorySpace> cd;
  PassTargets<Scalar> tg;
  int blocks = 0, block = 32;
  /// The instruction set of the host fast path, chosen on the launching thread.
  HostIsa isa = active_host_isa();
  /// Team-scratch level of the launch (`scratch_level`: 0 where the scratch fits, set there).
  int level = 1;

  static std::size_t scratch_bytes(int C, int K, int NB) {
    return scratch::shmem_size(std::size_t(K) * NB) + 2 * scratch::shmem_size(std::size_t(C) * NB);
  }

  KOKKOS_FUNCTION void operator()(const member_type& team) const {
    ctxpar::impl::run_kernel<uses_host_fast_path_v<ExecutionSpace>>(isa, *this, team);
  }

  /// Chunk `c` of the block `pk` works on.
  KOKKOS_INLINE_FUNCTION PassChunk pass_chunk(const PassBlock& pk, int c) const {
    return {static_cast<long>(c) * pb.heads + pk.h, cd.chunks(c, 0), cd.chunks(c, 1)};
  }

  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(const member_type& team) const {
    const int K = pb.key_dim, V = pb.value_dim, C = pb.chunk, NB = block;
    const PassBlock pk = pass_block_of(team.league_rank(), pb, tg, blocks, NB);
    scratch carried(team.team_scratch(level), std::size_t(K) * NB),
        first(team.team_scratch(level), std::size_t(C) * NB),
        second(team.team_scratch(level), std::size_t(C) * NB);
    load_pass_start(team, pk, tg, carried.data(), K, V, NB);
    team.team_barrier();
    if constexpr (Reverse) {
      for (int c = tg.first_chunk[pk.s + 1] - 1; c >= tg.first_chunk[pk.s]; --c)
        reverse_chunk<Bytes>(team, pk, pass_chunk(pk, c), carried.data(), first.data(),
                             second.data());
    } else {
      for (int c = tg.first_chunk[pk.s]; c < tg.first_chunk[pk.s + 1]; ++c)
        forward_chunk<Bytes>(team, pk, pass_chunk(pk, c), carried.data(), first.data(),
                             second.data());
    }
    store_pass_end(team, pk, tg, carried.data(), K, V, NB);
  }

  /// Forward, chunk `c`: columns `[0, V)` are the state `S`; with `m_out`, columns `[V, V+K)`
  /// carry `M` started from the identity (same update with Ũ = 0 and no output), so the
  /// transition is chained at the cost of `4CK²` per chunk without ever forming `M_c`.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void forward_chunk(const member_type& team, const PassBlock& pk,
                                            const PassChunk& at, Scalar* Z, Scalar* U,
                                            Scalar* O) const {
    const int H = pb.heads, K = pb.key_dim, V = pb.value_dim, C = pb.chunk, NB = block;
    const Scalar* Ut = cd.ut.data() + at.blk * C * V;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](int i) {
      for (int j = 0; j < pk.width; ++j)
        U[i * NB + j] = j >= pk.state_w ? Scalar(0) : Ut[static_cast<long>(i) * V + pk.j0 + j];
    });
    if (tg.save && !pk.m_cols())
      save_pass_columns(team, pk, K, Z, cd.s0.data() + at.blk * K * V, V, NB);
    team.team_barrier();
    chunk_product<Bytes>(pb.products, team, C, pk.width, K, Scalar(-1),
                         rows(cd.wt.data() + at.blk * C * K, K), Z, NB, U, NB, true);
    team.team_barrier();
    if (tg.out && !pk.m_cols()) {
      chunk_product<Bytes>(pb.products, team, C, pk.width, K, Scalar(1),
                           rows(cd.qh.data() + at.blk * C * K, K), Z, NB, O, NB, false);
      team.team_barrier();
      chunk_product<Bytes>(pb.products, team, C, pk.width, C, Scalar(1),
                           rows(cd.p.data() + at.blk * C * C, C, Band::lower), U, NB, O, NB, true);
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, at.n), [&](int i) {
        if (!pb.has_query(at.r0 + i)) return;
        Scalar* orow = tg.out + (static_cast<long>(pb.token(at.r0 + i)) * H + pk.h) * V + pk.j0;
        for (int j = 0; j < pk.state_w; ++j) orow[j] = O[i * NB + j];
      });
    }
    if (tg.save && !pk.m_cols())
      save_pass_columns(team, pk, C, U, cd.u.data() + at.blk * C * V, V, NB);
    decay_pass_block(team, pk, cd, at.blk, C, K, Z, NB);
    team.team_barrier();
    chunk_product<Bytes>(pb.products, team, K, pk.width, C, Scalar(1),
                         transposed(cd.kt.data() + at.blk * C * K, K), U, NB, Z, NB, true);
    team.team_barrier();
  }

  /// Reverse, chunk `c` (the adjoint of `forward_chunk`): D_{c−1} = Γ_last D_c + Q̂Γᵀ dO_c −
  /// W̃ᵀ dU_c with dU_c = K̃ D_c + Pᵀ dO_c. With `m_out`, columns `[V, V+K)` chain `Mᵀ` from the
  /// identity.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void reverse_chunk(const member_type& team, const PassBlock& pk,
                                            const PassChunk& at, Scalar* D, Scalar* dU,
                                            Scalar* dO) const {
    const int H = pb.heads, K = pb.key_dim, V = pb.value_dim, C = pb.chunk, NB = block;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](int i) {
      const bool read = !pk.m_cols() && tg.dout && i < at.n && pb.has_query(at.r0 + i);
      const Scalar* drow =
          read ? tg.dout + (static_cast<long>(pb.token(at.r0 + i)) * H + pk.h) * V + pk.j0
               : nullptr;
      for (int j = 0; j < pk.width; ++j)
        dO[i * NB + j] = (read && j < pk.state_w) ? drow[j] : Scalar(0);
    });
    if (tg.save && !pk.m_cols())
      save_pass_columns(team, pk, K, D, cd.dse.data() + at.blk * K * V, V, NB);
    team.team_barrier();
    chunk_product<Bytes>(pb.products, team, C, pk.width, K, Scalar(1),
                         rows(cd.kt.data() + at.blk * C * K, K), D, NB, dU, NB, false);
    team.team_barrier();
    if (!pk.m_cols()) {
      chunk_product<Bytes>(pb.products, team, C, pk.width, C, Scalar(1),
                           transposed(cd.p.data() + at.blk * C * C, C, Band::upper), dO, NB, dU, NB,
                           true);
      team.team_barrier();
    }
    if (tg.save && !pk.m_cols())
      save_pass_columns(team, pk, C, dU, cd.du.data() + at.blk * C * V, V, NB);
    decay_pass_block(team, pk, cd, at.blk, C, K, D, NB);
    team.team_barrier();
    if (!pk.m_cols()) {
      chunk_product<Bytes>(pb.products, team, K, pk.width, C, Scalar(1),
                           transposed(cd.qh.data() + at.blk * C * K, K), dO, NB, D, NB, true);
      team.team_barrier();
    }
    chunk_product<Bytes>(pb.products, team, K, pk.width, C, Scalar(-1),
                         transposed(cd.wt.data() + at.blk * C * K, K), dU, NB, D, NB, true);
    team.team_barrier();
  }
};

/// Forward state pass (see `StatePass::forward_chunk`).
template <class Scalar, class ExecutionSpace, class MemorySpace>
using ForwardPass = StatePass<Scalar, ExecutionSpace, MemorySpace, false>;

/// Reverse state pass (see `StatePass::reverse_chunk`).
template <class Scalar, class ExecutionSpace, class MemorySpace>
using ReversePass = StatePass<Scalar, ExecutionSpace, MemorySpace, true>;

/// Raw gradient outputs of the per-chunk backward.
template <class Scalar>
struct GradTargets {
  Scalar* dq = nullptr;          ///< [T, H, K]
  Scalar* dk = nullptr;          ///< [T·n_h, H, K]
  Scalar* dv = nullptr;          ///< [T·n_h, H, V]
  Scalar* dg = nullptr;          ///< [T, H]
  Scalar* dbeta = nullptr;       ///< [T·n_h, H]
  const Scalar* dout = nullptr;  ///< [T, H, V]
};

/// Per-(chunk, head) gradients from the saved chunk data, the chunk-start state S0, the
/// end-state gradient dS' and dU = Pᵀ dO + K̃ dS' (both from the reverse pass):
///   dY = Xᵀ dU, dR = diag(β) dY, dA = −dY Uᵀ (strictly lower), dP = dO Uᵀ (lower),
///   dQ̂ = diag(Γ) dO S0ᵀ + (dP⊙L) K,  dK = (dP⊙L)ᵀ Q̂ + (H + Hᵀ) K + diag(λ) U dS'ᵀ − diag(βΓ) dY
///   S0ᵀ with H = dA ⊙ β_i L, dV = dR, dβ_i = (v_i − Γ_i S0ᵀk_i)·dY_i + Σ_j dA_ij L_ij k_i·k_j, and
///   the log-gate gradient of sub-step t as the sum of the exp(γ) factors whose span contains t:
///   pairs j < t ≤ i (E_ij = dP_ij P_ij + dA_ij A_ij, a row prefix and a column suffix), the
///   incoming state reaching i ≥ t (Γ_i terms), key j < t reaching the end state (λ_j terms) and
///   the incoming state reaching the end. No undecayed term enters, so nothing cancels
///   catastrophically under strong decay (the reverse cumulative sum of dγ_i = Σ_j E_ij − Σ_m E_mi
///   does: its E_ii cancel exactly).
template <class Scalar, class ExecutionSpace, class MemorySpace>
struct ChunkGradients {
  Problem<Scalar> pb;
  ChunkData<Scalar, MemorySpace> cd;
  GradTargets<Scalar> gt;
  /// The instruction set of the host fast path, chosen on the launching thread.
  HostIsa isa = active_host_isa();
  /// Team-scratch level of the launch (`scratch_level`: 0 where the scratch fits, set there).
  int level = 1;
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  using scratch = scratch_view<Scalar, ExecutionSpace>;

  static std::size_t scratch_bytes(int C, int K, int V) {
    const std::size_t ck = scratch::shmem_size(std::size_t(C) * K),
                      cv = scratch::shmem_size(std::size_t(C) * V),
                      vk = scratch::shmem_size(std::size_t(V) * K),
                      cc = scratch::shmem_size(std::size_t(C) * C),
                      c1 = scratch::shmem_size(std::size_t(C));
    // kr krT qs F Eb Tm dQ dK | dO dY UT | S0T dSeT | G dP dA L | 4 row vectors
    return 8 * ck + 3 * cv + 2 * vk + 4 * cc + 4 * c1;
  }

  /// The team's level-1 scratch, taken in the order `scratch_bytes` counts it.
  struct Work {
    scratch kr, krT, qs, F, Eb, Tm, dQ, dK, dO, dY, UT, S0T, dSeT, G, dP, dA, L, rowsum, dbA, dgam,
        e;
    KOKKOS_INLINE_FUNCTION Work(const typename ExecutionSpace::scratch_memory_space& sp, int C,
                                int K, int V)
        : kr(sp, std::size_t(C) * K),
          krT(sp, std::size_t(K) * C),
          qs(sp, std::size_t(C) * K),
          F(sp, std::size_t(C) * K),
          Eb(sp, std::size_t(C) * K),
          Tm(sp, std::size_t(C) * K),
          dQ(sp, std::size_t(C) * K),
          dK(sp, std::size_t(C) * K),
          dO(sp, std::size_t(C) * V),
          dY(sp, std::size_t(C) * V),
          UT(sp, std::size_t(V) * C),
          S0T(sp, std::size_t(V) * K),
          dSeT(sp, std::size_t(V) * K),
          G(sp, std::size_t(C) * C),
          dP(sp, std::size_t(C) * C),
          dA(sp, std::size_t(C) * C),
          L(sp, std::size_t(C) * C),
          rowsum(sp, std::size_t(C)),
          dbA(sp, std::size_t(C)),
          dgam(sp, std::size_t(C)),
          e(sp, std::size_t(C)) {}
  };

  KOKKOS_FUNCTION void operator()(const member_type& team) const {
    ctxpar::impl::run_kernel<uses_host_fast_path_v<ExecutionSpace>>(isa, *this, team);
  }

  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(const member_type& team) const {
    const int K = pb.key_dim, V = pb.value_dim, C = pb.chunk;
    const ChunkBlock<Scalar> cb = chunk_block_of(team.league_rank(), pb, cd);
    const long blk = cb.blk;
    const Scalar* X = cd.x.data() + blk * C * C;
    const Scalar* U = cd.u.data() + blk * C * V;
    const Scalar* dU = cd.du.data() + blk * C * V;
    const Scalar* S0 = cd.s0.data() + blk * K * V;
    const Scalar* dSe = cd.dse.data() + blk * K * V;
    const Work w(team.team_scratch(level), C, K, V);
    load_rows(team, cb, w);
    team.team_barrier();
    chunk_product<Bytes>(pb.products, team, C, K, V, Scalar(1), rows(w.dO.data(), V), w.S0T.data(),
                         K, w.F.data(), K, false);
    chunk_product<Bytes>(pb.products, team, C, C, V, Scalar(1), rows(w.dO.data(), V), w.UT.data(),
                         C, w.dP.data(), C, false, true);
    chunk_product<Bytes>(pb.products, team, C, C, K, Scalar(1), rows(w.kr.data(), K), w.krT.data(),
                         C, w.G.data(), C, false, true);
    chunk_product<Bytes>(pb.products, team, C, V, C, Scalar(1), transposed(X, C, Band::upper), dU,
                         V, w.dY.data(), V, false);
    chunk_product<Bytes>(pb.products, team, C, K, V, Scalar(1), rows(U, V), w.dSeT.data(), K,
                         w.Tm.data(), K, false);
    team.team_barrier();
    chunk_product<Bytes>(pb.products, team, C, C, V, Scalar(1), rows(w.dY.data(), V), w.UT.data(),
                         C, w.dA.data(), C, false, true);
    chunk_product<Bytes>(pb.products, team, C, K, V, Scalar(1), rows(w.dY.data(), V), w.S0T.data(),
                         K, w.Eb.data(), K, false);
    team.team_barrier();
    pair_terms<Bytes>(team, cb, w);
    team.team_barrier();
    chunk_product<Bytes>(pb.products, team, C, K, C, Scalar(1), rows(w.dP.data(), C, Band::lower),
                         w.kr.data(), K, w.dQ.data(), K, false);
    chunk_product<Bytes>(pb.products, team, C, K, C, Scalar(1),
                         transposed(w.dP.data(), C, Band::upper), w.qs.data(), K, w.dK.data(), K,
                         false);
    team.team_barrier();
    chunk_product<Bytes>(pb.products, team, C, K, C, Scalar(1), rows(w.dA.data(), C, Band::lower),
                         w.kr.data(), K, w.dK.data(), K, true);
    team.team_barrier();
    chunk_product<Bytes>(pb.products, team, C, K, C, Scalar(1),
                         transposed(w.dA.data(), C, Band::upper), w.kr.data(), K, w.dK.data(), K,
                         true);
    team.team_barrier();
    row_gradients(team, cb, w);
    Scalar sdot = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, K * V), [&](int i, Scalar& acc) { acc += S0[i] * dSe[i]; },
        sdot);
    team.team_barrier();
    gate_gradients(team, cb, w, sdot);
  }

  /// The chunk's rows into scratch: K (and Kᵀ), scale·Q̂ and dO (zero rows where absent), Uᵀ, S0ᵀ
  /// and dS'ᵀ.
  KOKKOS_INLINE_FUNCTION void load_rows(const member_type& team, const ChunkBlock<Scalar>& cb,
                                        const Work& w) const {
    const int H = pb.heads, K = pb.key_dim, V = pb.value_dim, C = pb.chunk;
    const int r0 = cb.r0, n = cb.n, h = cb.h;
    const Scalar* U = cd.u.data() + cb.blk * C * V;
    const Scalar* S0 = cd.s0.data() + cb.blk * K * V;
    const Scalar* dSe = cd.dse.data() + cb.blk * K * V;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](int i) {
      const bool live = i < n;
      const int row = r0 + i;
      const bool query = live && pb.has_query(row);
      const Scalar* krow = live ? pb.k + (static_cast<long>(row) * H + h) * K : nullptr;
      const Scalar* qrow = query ? pb.q + (static_cast<long>(pb.token(row)) * H + h) * K : nullptr;
      const Scalar* drow =
          query ? gt.dout + (static_cast<long>(pb.token(row)) * H + h) * V : nullptr;
      // As in IntraChunk: one loop per output, the transposed copies scattering on their own.
      Scalar* kr_row = w.kr.data() + static_cast<long>(i) * K;
      Scalar* qs_row = w.qs.data() + static_cast<long>(i) * K;
      Scalar* do_row = w.dO.data() + static_cast<long>(i) * V;
      if (live) {
        for (int d = 0; d < K; ++d) w.krT[static_cast<long>(d) * C + i] = krow[d];
        for (int d = 0; d < K; ++d) kr_row[d] = krow[d];
      } else {
        for (int d = 0; d < K; ++d) w.krT[static_cast<long>(d) * C + i] = Scalar(0);
        for (int d = 0; d < K; ++d) kr_row[d] = Scalar(0);
      }
      if (query) {
        for (int d = 0; d < K; ++d) qs_row[d] = pb.scale * qrow[d];
        for (int d = 0; d < V; ++d) do_row[d] = drow[d];
      } else {
        for (int d = 0; d < K; ++d) qs_row[d] = Scalar(0);
        for (int d = 0; d < V; ++d) do_row[d] = Scalar(0);
      }
      for (int d = 0; d < V; ++d)
        w.UT[static_cast<long>(d) * C + i] = U[static_cast<long>(i) * V + d];
    });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, K), [&](int p) {
      for (int d = 0; d < V; ++d) {
        w.S0T[static_cast<long>(d) * K + p] = S0[static_cast<long>(p) * V + d];
        w.dSeT[static_cast<long>(d) * K + p] = dSe[static_cast<long>(p) * V + d];
      }
    });
  }

  /// The pair terms of every row, on `dP`, `dA` and `G` in place, and `dbA`, their part of dβ.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void pair_terms(const member_type& team, const ChunkBlock<Scalar>& cb,
                                         const Work& w) const {
    const int H = pb.heads, C = pb.chunk;
    const int r0 = cb.r0, n = cb.n, h = cb.h;
    const Scalar* gam = cb.gam;
    const Scalar* glo = cb.glo;
    const int* rs = cb.rs;
    const Scalar* P = cd.p.data() + cb.blk * C * C;
    // dP → dP⊙L, dA → H, G → the exclusive row prefix Σ_{j<t} E_ij of the pair terms
    // E = dP⊙P + dA⊙A (j < i: the pairs that a log-gate between them touches).
    // The decays of the row first, on whole vectors on a host (the loop below carries a prefix
    // sum from one j to the next, so it stays scalar).
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](int i) {
      const Scalar bi = i < n ? pb.beta[static_cast<long>(r0 + i) * H + h] : Scalar(0);
      Scalar* const Li = w.L.data() + static_cast<long>(i) * C;
      decay_row<uses_host_fast_path_v<ExecutionSpace>, Bytes>(i, n, C, gam, glo, rs, Li);
      Scalar run = 0, db = 0;
      for (int j = 0; j < C; ++j) {
        const long ij = static_cast<long>(i) * C + j;
        const bool in = i < n && j < n && j <= i;
        const Scalar Lij = Li[j];
        const Scalar dp = in ? w.dP[ij] : Scalar(0);
        Scalar E = 0;
        Scalar hij = 0;
        if (in && j < i) {
          const Scalar da = -w.dA[ij];
          const Scalar a = bi * Lij * w.G[ij];
          E = dp * P[ij] + da * a;
          db += da * Lij * w.G[ij];
          hij = da * bi * Lij;
        }
        w.dP[ij] = dp * Lij;
        w.dA[ij] = hij;
        w.G[ij] = run;
        run += E;
      }
      w.dbA[i] = db;
    });
  }

  /// Per live row: dq, dk, dv, dβ, and the Γ_i, λ_i and straddling-pair terms of the log-gate
  /// gradient (`dgam`, `e`, `rowsum`; zero on padding rows).
  KOKKOS_INLINE_FUNCTION void row_gradients(const member_type& team, const ChunkBlock<Scalar>& cb,
                                            const Work& w) const {
    const int H = pb.heads, K = pb.key_dim, V = pb.value_dim, C = pb.chunk;
    const int r0 = cb.r0, n = cb.n, h = cb.h;
    const Scalar* gam = cb.gam;
    const Scalar* glo = cb.glo;
    const int* rs = cb.rs;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](int i) {
      if (i >= n) {
        w.dgam[i] = 0;
        w.e[i] = 0;
        w.rowsum[i] = 0;
        return;
      }
      const int row = r0 + i;
      const Scalar Gi = decay_from_start(gam, glo, rs, i),
                   lam = decay_ratio(gam, glo, rs, C - 1, i);
      const Scalar bi = pb.beta[static_cast<long>(row) * H + h];
      Scalar straddle = 0;  // Σ_{m≥i} Σ_{j<i} E_mj
      for (int m = i; m < n; ++m) straddle += w.G[static_cast<long>(m) * C + i];
      w.rowsum[i] = straddle;
      Scalar qF = 0, kT = 0, kE = 0;
      const long ik = static_cast<long>(i) * K;
      for (int d = 0; d < K; ++d) {
        qF += w.qs[ik + d] * w.F[ik + d];
        kT += w.kr[ik + d] * w.Tm[ik + d];
        kE += w.kr[ik + d] * w.Eb[ik + d];
      }
      w.e[i] = lam * kT;
      w.dgam[i] = Gi * qF - bi * Gi * kE;
      if (pb.has_query(row)) {
        Scalar* dq = gt.dq + (static_cast<long>(pb.token(row)) * H + h) * K;
        for (int d = 0; d < K; ++d) dq[d] = pb.scale * (Gi * w.F[ik + d] + w.dQ[ik + d]);
      }
      Scalar* dk = gt.dk + (static_cast<long>(row) * H + h) * K;
      for (int d = 0; d < K; ++d)
        dk[d] = w.dK[ik + d] + lam * w.Tm[ik + d] - bi * Gi * w.Eb[ik + d];
      const Scalar* vrow = pb.v + (static_cast<long>(row) * H + h) * V;
      Scalar* dv = gt.dv + (static_cast<long>(row) * H + h) * V;
      Scalar vY = 0;
      for (int d = 0; d < V; ++d) {
        const Scalar y = w.dY[static_cast<long>(i) * V + d];
        vY += vrow[d] * y;
        dv[d] = bi * y;
      }
      gt.dbeta[static_cast<long>(row) * H + h] = vY - Gi * kE + w.dbA[i];
    });
  }

  /// dg of the chunk's tokens from the row terms and `sdot` = ⟨S0, dS'⟩, on one thread.
  KOKKOS_INLINE_FUNCTION void gate_gradients(const member_type& team, const ChunkBlock<Scalar>& cb,
                                             const Work& w, Scalar sdot) const {
    const int H = pb.heads, C = pb.chunk;
    const int r0 = cb.r0, n = cb.n, h = cb.h;
    const Scalar* gam = cb.gam;
    const Scalar* glo = cb.glo;
    const int* rs = cb.rs;
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      if (n == 0) return;
      // The suffix sums of the Γ_i terms first, then the prefix sums of the λ_j terms.
      Scalar acc = 0;
      for (int i = n - 1; i >= 0; --i) {
        acc += w.dgam[i];
        w.dgam[i] = acc;
      }
      const Scalar whole = decay_from_start(gam, glo, rs, C - 1) * sdot;
      Scalar before = 0;
      for (int i = 0; i < n; ++i) {
        const int row = r0 + i;
        if (row % pb.n_h == 0)
          gt.dg[static_cast<long>(pb.token(row)) * H + h] =
              w.rowsum[i] + w.dgam[i] + before + whole;
        before += w.e[i];
      }
    });
  }
};

}  // namespace ctxpar::impl::gated_delta
CTXPAR_WIDE_VECTORS_END
