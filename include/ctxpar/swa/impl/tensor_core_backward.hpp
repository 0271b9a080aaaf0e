/// \file
/// The sliding-window attention backward on tensor-core products, in the FlashAttention-2 split
/// and without atomics: a dQ kernel with the forward's teams (each warp recomputes its rows'
/// weights from the saved log-sum-exp per key tile and adds `dS·K`), and a dK/dV kernel with a
/// team per (64 keys, key/value head) whose warps own 16 keys each and walk the group's query
/// heads and the query tiles that may see them, adding `Pᵀ·dO` and `dSᵀ·Q`. Written over
/// `WarpLanes` like the forward (`tensor_core_forward.hpp`), so the host spaces run them with
/// the warp emulated.
///
/// Precision. `dO` is read as a product operand like Q, K and V (itself for 16-bit tensors, TF32
/// for fp32), and the weights `P` and `dS` are rounded to operands before they multiply; every sum
/// is fp32 and the gradients are written in fp32.
///
/// Determinism. Each gradient element is summed by one lane in a fixed order: dQ over the key
/// tiles of the global grid in increasing order (a tile the row cannot see adds zeros), so dQ is
/// independent of the rank count like the forward; dK and dV over the group's heads, then the
/// query tiles in increasing order.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ctxpar/core/error.hpp"
#include "ctxpar/core/impl/warp_lanes.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/expr/mask.hpp"
#include "ctxpar/swa/attention_inputs.hpp"
#include "ctxpar/swa/impl/attention_tiles.hpp"
#include "ctxpar/swa/impl/team_kernels.hpp"
#include "ctxpar/swa/impl/tensor_core_forward.hpp"
#include "ctxpar/swa/impl/tensor_core_tiles.hpp"

namespace ctxpar::swa::impl {

/// The dQ kernel for head dimensions up to `DP`: per key tile, `S = Q·Kᵀ`, `P = exp(S·scale −
/// lse)`, `dP = dO·Vᵀ`, `dS = P ∘ (dP − delta)`, `dQ += dS·K`; finally `dQ ·= scale`. Its teams
/// and key tiles are the forward's (`TensorCoreQueryWalk`).
template <class Scalar, class MemorySpace, class Mask, class Member, int DP>
struct TensorCoreQueryGradientKernel {
  using acc = accumulator_t<Scalar>;
  using Walk = TensorCoreQueryWalk<Scalar, MemorySpace, Mask, DP>;
  using Tiles = typename Walk::Tiles;
  using Op = typename Tiles::Op;
  using Lanes = typename Tiles::Lanes;
  static constexpr int count = Tiles::count;

  Walk queries;
  Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace> dout;
  Kokkos::View<const acc**, Kokkos::LayoutRight, MemorySpace> lse, delta;
  Kokkos::View<acc***, Kokkos::LayoutRight, MemorySpace> dq;
  /// Whether the staged dO rows go by asynchronous copies (`Tiles::copies_rows` of `dout`).
  bool rows_by_copies;

  /// Whether the warps' dO rows are staged in scratch (`Tiles::stages_row_operand`): at D = 128
  /// with 16-bit operands the Q and dO fragments (64 registers) and the dQ accumulators (64) with
  /// the two score tiles left the products too few registers and the kernel spilled.
  static constexpr bool staged_rows = Tiles::stages_row_operand;
  /// Where the warps keep their Q rows: in registers, except at D = 256, where the dQ
  /// accumulators take 128 of them.
  static constexpr RowsKept queries_kept = DP == 256 ? RowsKept::in_memory : RowsKept::in_registers;
  /// Where they keep their dO rows: staged where `staged_rows`, where they lie where the
  /// registers run short (`Tiles::registers_short`), else in registers.
  static constexpr RowsKept output_gradients_kept =
      staged_rows ? RowsKept::in_scratch
                  : (Tiles::registers_short ? RowsKept::in_memory : RowsKept::in_registers);

  /// One warp's rows and state: Q and dO rows, the dQ accumulators, and per row half each lane's
  /// copy of its rows' lse and delta.
  struct Warp {
    int r0, rows, h;
    typename Tiles::template RowsAt<queries_kept> q;
    typename Tiles::template RowsAt<output_gradients_kept> d_out;
    typename Tiles::Accumulator d_q;
    float lse[2][count], delta[2][count];
  };

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const { queries.walk(team, *this); }

  /// Stages the dO rows of every warp of the team (`staged_rows`), warp `w`'s from
  /// `rows + 16·w·ld`, zeros past the team's rows and past the head dimension; by copies through
  /// `copies` where `rows_by_copies`.
  template <class TeamMember, class Copies>
  KOKKOS_FORCEINLINE_FUNCTION void stage_rows(const TeamMember& team, Copies& copies,
                                              const TensorCoreQueryTeam& qt, Op* rows) const {
    Tiles::template stage<Tiles::warps * Tiles::rows>(
        team, copies, rows_by_copies, rows, queries.shape.dim,
        [&](int j) { return j % Tiles::rows < qt.rows(j / Tiles::rows); },
        [&](int j) {
          const int wi = j / Tiles::rows;
          return Tiles::row_of(dout, qt.i0 + qt.r0(wi) + j % Tiles::rows, qt.h(wi));
        });
  }

  KOKKOS_FORCEINLINE_FUNCTION void start(Warp& w, const Lanes& lanes, std::int64_t i0,
                                         const Op* own) const {
    const int dim = queries.shape.dim;
    Tiles::template keep_rows<queries_kept>(lanes, queries.in.q, i0 + w.r0, w.h, w.rows, dim,
                                            nullptr, w.q);
    Tiles::template keep_rows<output_gradients_kept>(lanes, dout, i0 + w.r0, w.h, w.rows, dim, own,
                                                     w.d_out);
    Tiles::zero(w.d_q);
    for (int c = 0; c < count; ++c)
      for (int half = 0; half < 2; ++half) {
        const int r = Tiles::L::c_row(lanes.lane(c), 2 * half);
        w.lse[half][c] = r < w.rows ? lse(i0 + w.r0 + r, w.h) : 0.0f;
        w.delta[half][c] = r < w.rows ? delta(i0 + w.r0 + r, w.h) : 0.0f;
      }
  }

  /// The warp's rows against one staged key tile (`seen(r, j)`: key `j` visible to row `r`).
  template <class Seen>
  KOKKOS_FORCEINLINE_FUNCTION void visit(Warp& w, const Lanes& lanes,
                                         const typename Walk::Staged& st, const Seen& seen) const {
    const int dim = queries.shape.dim;
    const float scale = static_cast<float>(queries.in.scale);
    typename Tiles::Scores p, dp;
    Tiles::row_products(lanes, dim, w.q, st.k, p);
    Tiles::row_products(lanes, dim, w.d_out, st.v, dp);
    Tiles::for_each_score(lanes, p, [&](float& x, int r, int j, int c, int half) {
      x = seen(r, j) ? ctxpar::impl::fast_exp(x * scale - w.lse[half][c]) : 0.0f;
    });
    // dS, in the place of dP.
    for (int nb = 0; nb < Tiles::tile_blocks; ++nb)
      for (int c = 0; c < count; ++c)
        for (int e = 0; e < 4; ++e) dp[nb][c][e] = p[nb][c][e] * (dp[nb][c][e] - w.delta[e / 2][c]);
    Tiles::weighted_rows(lanes, dim, dp, st.k, w.d_q);
  }

  /// Writes the warp's dQ rows (scaled: the scores were of the scaled queries).
  KOKKOS_FORCEINLINE_FUNCTION void finish(Warp& w, const Lanes& lanes, std::int64_t i0) const {
    const acc scale = static_cast<acc>(queries.in.scale);
    Tiles::for_each_element(lanes, queries.shape.dim, w.d_q, [&](float& g, int r, int d, int, int) {
      if (r < w.rows) dq(i0 + w.r0 + r, w.h, d) = g * scale;
    });
  }
};

/// Which gradients a launch of the dK/dV kernel sums: both in one pass; or, where one warp's two
/// accumulators would take every register (D = 256: 128 each, `Tiles::registers_short`), dV in
/// one pass and dK in another, each recomputing the weights `Pᵀ` (the dK pass also `dPᵀ`).
enum class KeyGradientPass { both, values, keys };

/// The dK/dV kernel for head dimensions up to `DP`: a team per (64 keys, key/value head), warp
/// `w` owning keys `[16w, 16w + 16)` of them; per (query head of the group, query tile that may
/// see the keys), `Sᵀ = K·Qᵀ`, `Pᵀ = exp(Sᵀ·scale − lse)`, `dPᵀ = V·dOᵀ`,
/// `dSᵀ = Pᵀ ∘ (dPᵀ − delta)`, `dV += Pᵀ·dO`, `dK += dSᵀ·Q`; finally `dK ·= scale`. `Pass` says
/// which of dV and dK it sums; each element is summed in the same order in either pass.
template <class Scalar, class MemorySpace, class Mask, class Member, int DP,
          KeyGradientPass Pass = KeyGradientPass::both>
struct TensorCoreKeyGradientKernel {
  using acc = accumulator_t<Scalar>;
  using Tiles = TensorCoreTiles<Scalar, DP>;
  using Op = typename Tiles::Op;
  using Lanes = typename Tiles::Lanes;
  static constexpr int warps = Tiles::warps, count = Tiles::count;
  /// Keys of a team.
  static constexpr int team_keys = warps * Tiles::rows;
  /// Queries of a staged tile.
  static constexpr int query_width = Tiles::width;
  /// Whether the team's V rows are staged in scratch (`Tiles::stages_row_operand`): at D = 128
  /// with 16-bit operands a warp's K and V fragments (64 registers) and its dK and dV
  /// accumulators (128) leave the products too few of the 255 and the kernel spilled.
  static constexpr bool staged_values = Tiles::stages_row_operand;
  /// Where the warps keep their K rows: where they lie where the registers run short
  /// (`Tiles::registers_short`), else in registers.
  static constexpr RowsKept keys_kept =
      Tiles::registers_short ? RowsKept::in_memory : RowsKept::in_registers;
  /// Where they keep their V rows: staged where `staged_values`, else as K.
  static constexpr RowsKept values_kept = staged_values ? RowsKept::in_scratch : keys_kept;
  /// Which gradients this launch sums.
  static constexpr bool sums_values = Pass != KeyGradientPass::keys;
  static constexpr bool sums_keys = Pass != KeyGradientPass::values;
  static_assert(Pass == KeyGradientPass::both || DP == 256,
                "the dK/dV kernel sums in two passes only where one accumulator takes half the "
                "registers");

  AttentionInputs<Scalar, MemorySpace> in;
  Mask mask;
  KernelShape<Scalar, MemorySpace> shape;
  Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace> dout;
  Kokkos::View<const acc**, Kokkos::LayoutRight, MemorySpace> lse, delta;
  Kokkos::View<acc***, Kokkos::LayoutRight, MemorySpace> dk, dv;
  std::int64_t blocks;  ///< key blocks of `team_keys`
  int level;
  /// Whether Q, dO and V go to scratch by asynchronous copies (`Tiles::copies_rows`).
  bool by_copies;

  /// Query tiles staged ahead (`Tiles::stages_fitting`).
  KOKKOS_INLINE_FUNCTION static constexpr int stage_count() {
    return Tiles::stages_fitting(piece_bytes(2));
  }

  /// Team scratch: per stage a query and a dO tile with the tile's tokens, log-sum-exps, deltas
  /// and validity; the staged V rows; the keys' tokens; and 16 bytes to align the first piece
  /// (`ldmatrix` and the copies need 16-byte rows, and every piece keeps a multiple of 16 bytes).
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    return ScratchCursor::aligned_bytes(piece_bytes(stage_count()));
  }
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t piece_bytes(int n) {
    return n * stage_bytes() + (staged_values ? value_bytes() : 0) +
           scratch_piece<mask::Token>(team_keys);
  }
  /// Scratch bytes of one staged query tile (`Staged`).
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t stage_bytes() {
    return 2 * Tiles::tile_bytes() + scratch_piece<mask::Token>(query_width) +
           3 * scratch_piece<float>(query_width);
  }
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t value_bytes() {
    return scratch_piece<Op>(std::size_t(team_keys) * Tiles::ld);
  }

  /// A staged query tile: its Q and dO rows, and its queries' tokens, log-sum-exps, deltas and
  /// validity (1 or 0).
  struct Staged {
    Op* q;
    Op* d_out;
    mask::Token* token;
    float* lse;
    float* delta;
    float* valid;
  };

  /// The staged tile of buffer `b`, whose buffers start at `first`: pointers computed, not
  /// chosen from an array (a register array indexed at run time would go to local memory).
  KOKKOS_FORCEINLINE_FUNCTION static Staged staged_at(char* first, int b) {
    ScratchCursor cur{first + b * stage_bytes()};
    const std::size_t tile = std::size_t(query_width) * Tiles::ld;
    // A braced list evaluates in order: the pieces are taken as `stage_bytes` counts them.
    return Staged{cur.take<Op>(tile),
                  cur.take<Op>(tile),
                  cur.take<mask::Token>(query_width),
                  cur.take<float>(query_width),
                  cur.take<float>(query_width),
                  cur.take<float>(query_width)};
  }

  /// An accumulator this pass does not sum.
  struct NotSummed {};
  using KeyAccumulator = std::conditional_t<sums_keys, typename Tiles::Accumulator, NotSummed>;
  using ValueAccumulator = std::conditional_t<sums_values, typename Tiles::Accumulator, NotSummed>;

  /// One warp's keys and state: K and V rows (`keys_kept`, `values_kept`) and the dK and dV
  /// accumulators of the pass.
  struct Warp {
    int r0, rows;
    typename Tiles::template RowsAt<keys_kept> k;
    typename Tiles::template RowsAt<values_kept> v;
    KeyAccumulator d_k;
    ValueAccumulator d_v;
  };

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    constexpr int per_thread = count == 1 ? 1 : warps;
    const Lanes lanes = Lanes::of_thread(team.team_rank());
    const int first_warp = count == 1 ? team.team_rank() / 32 : 0;
    const int hk = static_cast<int>(team.league_rank() / blocks);
    const std::int64_t j0 = (team.league_rank() % blocks) * team_keys;
    const int nk = static_cast<int>(shape.nk - j0 < team_keys ? shape.nk - j0 : team_keys);
    constexpr int stages = stage_count();
    ScratchCursor cur = ScratchCursor::aligned(team, level, piece_bytes(stages));
    char* const buffers = cur.take<char>(stages * stage_bytes());
    Op* vs = staged_values ? cur.take<Op>(std::size_t(team_keys) * Tiles::ld) : nullptr;
    mask::Token* ktok = cur.take<mask::Token>(team_keys);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nk),
                         [&](const int j) { ktok[j] = key_token(in, j0 + j); });
    ctxpar::impl::AsyncCopies<Tiles::copies_in_flight(stages, staged_values ? team_keys : 0)>
        copies;
    if constexpr (staged_values) {
      Tiles::template stage<team_keys>(
          team, copies, by_copies, vs, shape.dim, [&](int j) { return j < nk; },
          [&](int j) { return Tiles::row_of(in.v, j0 + j, hk); });
      copies.commit();
      copies.template wait<0>();
    }

    Warp w[per_thread];
    for (int k = 0; k < per_thread; ++k) {
      Warp& x = w[k];
      x.r0 = (first_warp + k) * Tiles::rows;
      const int left = nk - x.r0;
      x.rows = left < 0 ? 0 : (left < Tiles::rows ? left : Tiles::rows);
      Tiles::template keep_rows<keys_kept>(lanes, in.k, j0 + x.r0, hk, x.rows, shape.dim, nullptr,
                                           x.k);
      // The values pass never reads V.
      if constexpr (sums_keys)
        Tiles::template keep_rows<values_kept>(lanes, in.v, j0 + x.r0, hk, x.rows, shape.dim,
                                               vs ? vs + std::size_t(x.r0) * Tiles::ld : nullptr,
                                               x.v);
      if constexpr (sums_keys) Tiles::zero(x.d_k);
      if constexpr (sums_values) Tiles::zero(x.d_v);
    }
    team.team_barrier();
    // The query tiles that may see a key of this block, for each query head of the group in
    // turn: tile `t` is head `hk·group + t / per_head`, queries from `qlo + (t % per_head)·32`.
    const WindowRange range = window_range(in);
    std::int64_t qlo, qhi;
    range.queries(in.q_pos, shape.tq, in.k_pos(j0), in.k_pos(j0 + nk - 1), qlo, qhi);
    const std::int64_t per_head = qhi > qlo ? (qhi - qlo + query_width - 1) / query_width : 0;
    const auto stage = [&](std::int64_t t, int b) {
      const int h = hk * shape.group + static_cast<int>(t / per_head);
      const std::int64_t i0 = qlo + (t % per_head) * query_width;
      const auto valid = [&](int i) { return i0 + i < qhi; };
      const Staged st = staged_at(buffers, b);
      Tiles::stage(team, copies, by_copies, st.q, shape.dim, valid,
                   [&](int i) { return Tiles::row_of(in.q, i0 + i, h); });
      Tiles::stage(team, copies, by_copies, st.d_out, shape.dim, valid,
                   [&](int i) { return Tiles::row_of(dout, i0 + i, h); });
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, query_width), [&](const int i) {
        const bool ok = valid(i);
        st.valid[i] = ok ? 1.0f : 0.0f;
        st.token[i] = ok ? query_token(in, i0 + i) : mask::Token{0, 0};
        st.lse[i] = ok ? lse(i0 + i, h) : 0.0f;
        st.delta[i] = ok ? delta(i0 + i, h) : 0.0f;
      });
    };
    const auto use = [&](std::int64_t, int b) {
      const Staged x = staged_at(buffers, b);
      for (int k = 0; k < per_thread; ++k) {
        Warp& y = w[k];
        if (y.rows == 0) continue;
        gradient_step(y, lanes, x.q, x.d_out, x.lse, x.delta, [&](int r, int i) {
          return r < y.rows && x.valid[i] != 0.0f &&
                 visible(mask, range, x.token[i], ktok[y.r0 + r]);
        });
      }
    };
    ctxpar::impl::pipelined_tiles<stages>(team, copies, per_head * shape.group, stage, use);
    const acc scale = static_cast<acc>(in.scale);
    for (int k = 0; k < per_thread; ++k) {
      Warp& x = w[k];
      if (x.rows == 0) continue;
      if constexpr (sums_keys)
        Tiles::for_each_element(lanes, shape.dim, x.d_k, [&](float& g, int r, int d, int, int) {
          if (r < x.rows) dk(j0 + x.r0 + r, hk, d) = g * scale;
        });
      if constexpr (sums_values)
        Tiles::for_each_element(lanes, shape.dim, x.d_v, [&](float& g, int r, int d, int, int) {
          if (r < x.rows) dv(j0 + x.r0 + r, hk, d) = g;
        });
    }
  }

  /// The warp's keys against one staged query tile (`seen(r, i)`: key `r` visible to query `i`).
  template <class Seen>
  KOKKOS_FORCEINLINE_FUNCTION void gradient_step(Warp& w, const Lanes& lanes, const Op* qs,
                                                 const Op* dos, const float* lses,
                                                 const float* deltas, const Seen& seen) const {
    const float scale = static_cast<float>(in.scale);
    typename Tiles::Scores p;
    Tiles::row_products(lanes, shape.dim, w.k, qs, p);
    Tiles::for_each_score(lanes, p, [&](float& x, int r, int i, int, int) {
      x = seen(r, i) ? ctxpar::impl::fast_exp(x * scale - lses[i]) : 0.0f;
    });
    if constexpr (sums_values) Tiles::weighted_rows(lanes, shape.dim, p, dos, w.d_v);
    if constexpr (sums_keys) {
      // dSᵀ, in the place of dPᵀ.
      typename Tiles::Scores dp;
      Tiles::row_products(lanes, shape.dim, w.v, dos, dp);
      Tiles::for_each_score(lanes, dp, [&](float& x, int, int i, int, int) { x -= deltas[i]; });
      for (int nb = 0; nb < Tiles::tile_blocks; ++nb)
        for (int c = 0; c < count; ++c)
          for (int e = 0; e < 4; ++e) dp[nb][c][e] *= p[nb][c][e];
      Tiles::weighted_rows(lanes, shape.dim, dp, qs, w.d_k);
    }
  }
};

/// Launches the dK/dV kernel's pass `Pass` for head dimensions up to `DP`.
template <int DP, KeyGradientPass Pass, class ExecutionSpace, class Mask, class Scalar,
          class MemorySpace>
void launch_key_gradients(const ExecutionSpace& space, const Mask& mask,
                          const AttentionInputs<Scalar, MemorySpace>& in,
                          const KernelShape<Scalar, MemorySpace>& shape,
                          const BackwardViews<Scalar, MemorySpace>& g) {
  using Member = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  using Kernel = TensorCoreKeyGradientKernel<Scalar, MemorySpace, Mask, Member, DP, Pass>;
  const std::int64_t blocks = (shape.nk + Kernel::team_keys - 1) / Kernel::team_keys;
  int level = 0;
  const auto policy = tensor_core_policy(space, blocks * shape.hkv, Kernel::scratch_bytes(), level);
  static_assert(
      !Kernel::Tiles::reads_by_ldmatrix || Kernel::scratch_bytes() <= tensor_core_ldmatrix_scratch,
      "a kernel that reads its scratch by ldmatrix must fit in level 0");
  require_ldmatrix_level<ExecutionSpace>(Kernel::Tiles::reads_by_ldmatrix, level,
                                         "ctxpar::swa::attention_backward (dK/dV kernel)");
  constexpr const char* label =
      Pass == KeyGradientPass::both
          ? "ctxpar::swa::attention_backward_dkdv_tensor_core"
          : (Pass == KeyGradientPass::values ? "ctxpar::swa::attention_backward_dv_tensor_core"
                                             : "ctxpar::swa::attention_backward_dk_tensor_core");
  Kokkos::parallel_for(label, policy,
                       Kernel{in, mask, shape, g.dout, g.lse, g.delta, g.dk, g.dv, blocks, level,
                              Kernel::Tiles::copies_rows(shape.dim, in.q, g.dout, in.v)});
}

/// Launches the backward for head dimensions up to `DP` (see `tensor_core_attention_backward`).
template <int DP, class ExecutionSpace, class Mask, class Scalar, class MemorySpace>
void launch_tensor_core_backward(const ExecutionSpace& space, const Mask& mask,
                                 const AttentionInputs<Scalar, MemorySpace>& in,
                                 const KernelShape<Scalar, MemorySpace>& shape,
                                 const BackwardViews<Scalar, MemorySpace>& g) {
  using Member = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  if (shape.tq > 0 && shape.hq > 0) {
    using Kernel = TensorCoreQueryGradientKernel<Scalar, MemorySpace, Mask, Member, DP>;
    launch_query_walk<Kernel>("ctxpar::swa::attention_backward_dq_tensor_core", space, mask, in,
                              shape, [&](const typename Kernel::Walk& walk) {
                                return Kernel{walk,  g.dout,
                                              g.lse, g.delta,
                                              g.dq,  Kernel::Tiles::copies_rows(shape.dim, g.dout)};
                              });
  }
  if (shape.nk > 0 && shape.hkv > 0) {
    if constexpr (DP == 256) {
      launch_key_gradients<DP, KeyGradientPass::values>(space, mask, in, shape, g);
      launch_key_gradients<DP, KeyGradientPass::keys>(space, mask, in, shape, g);
    } else {
      launch_key_gradients<DP, KeyGradientPass::both>(space, mask, in, shape, g);
    }
  }
}

/// Backward attention on tensor-core products (see `attention_backward`), given the row deltas;
/// the caller has checked that they run here (`runs_tensor_core_kernels`).
template <class ExecutionSpace, class Mask, class Scalar, class MemorySpace>
void tensor_core_attention_backward(const ExecutionSpace& space, const Mask& mask,
                                    const AttentionInputs<Scalar, MemorySpace>& in,
                                    const BackwardViews<Scalar, MemorySpace>& g) {
  const KernelShape<Scalar, MemorySpace> shape(in);
  with_padded_dim(shape.dim, [&](auto padded) {
    launch_tensor_core_backward<decltype(padded)::value>(space, mask, in, shape, g);
  });
}

}  // namespace ctxpar::swa::impl
