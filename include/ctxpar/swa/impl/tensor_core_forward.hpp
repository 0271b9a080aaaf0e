/// \file
/// The sliding-window attention forward on tensor-core products (`KernelChoice::tensor_core`, and
/// `automatic` for 16-bit tensors on a CUDA device of sm_80 or later), shaped like
/// FlashAttention-2 and written over `WarpLanes` (`core/impl/warp_lanes.hpp`), so that the host
/// spaces run the same source with the warp emulated.
///
/// Mapping. A team of 4 warps per (block of query rows, key/value head, group of query heads):
/// each warp owns 16 query rows of one query head, so the heads of a GQA group (up to 4) share
/// every staged key/value tile; with fewer heads per team the warps split more rows. Per key tile
/// (the kernels' `key_tile` keys, on the global tile grid, only the tiles the team's queries may
/// see), the team stages K and V into scratch as product operands, then each warp computes its
/// scores `S = Q·Kᵀ` (m16n8 products over the head dimension, Q's fragments held in registers),
/// masks and scales them, updates its rows' online softmax, and adds `P·V` with `P` fed from the
/// score registers (`results_as_a`). 16-bit operands' B fragments are read from the staged tiles
/// by `ldmatrix.x4`, two 8-column blocks per instruction (`.trans` for V, whose rows are the
/// product's inner index). The head dimension is padded to 64, 128 or 256 with zeros.
///
/// Precision. 16-bit Q, K, V multiply exactly; the scores and output accumulate in fp32 and `P`
/// is rounded to the storage type before `P·V`. fp32 tensors are read as TF32 (Q, K, V and `P`
/// rounded to 10 fraction bits). The bounds against the fp64 oracle count these roundings.
///
/// Determinism. A row's state is touched only by its own lanes' fragments: its scores, its maxima
/// (exact) and its per-lane partial sums, over the key tiles in increasing order of the global
/// grid, each key at a fixed place in its tile; a tile the row cannot see leaves its state
/// unchanged bit for bit. So the output and the log-sum-exp are independent of how queries and
/// keys are split across ranks, within each device (the emulation sums a product's terms in
/// increasing order; the hardware's order is its own).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/impl/mma_fragment.hpp"
#include "ctxpar/core/impl/warp_lanes.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/expr/mask.hpp"
#include "ctxpar/swa/attention_inputs.hpp"
#include "ctxpar/swa/impl/attention_tiles.hpp"
#include "ctxpar/swa/impl/team_kernels.hpp"
#include "ctxpar/swa/impl/tensor_core_support.hpp"
#include "ctxpar/swa/impl/tensor_core_tiles.hpp"

namespace ctxpar::swa::impl {

/// Query heads per team: the largest of 4, 2, 1 that divides the GQA group.
inline constexpr int tensor_core_heads_per_team(int group) {
  return group % 4 == 0 ? 4 : (group % 2 == 0 ? 2 : 1);
}

/// Where a team of the forward or dQ kernel works: `nq` query rows from `i0` of the query heads
/// `[h0, h0 + heads)` of key/value head `hk`; warp `w` owns 16 rows (from team row `r0(w)`) of
/// head `h(w)`.
struct TensorCoreQueryTeam {
  std::int64_t i0;
  int nq, hk, h0, row_blocks;
  /// The team of `league_rank` for `tiles` blocks of `4 / heads` warps' rows per head group.
  KOKKOS_INLINE_FUNCTION TensorCoreQueryTeam(std::int64_t league_rank, std::int64_t tiles,
                                             std::int64_t tq, int group, int heads) {
    row_blocks = tensor_core_warps / heads;
    const int team_rows = 16 * row_blocks;
    i0 = (league_rank % tiles) * team_rows;
    nq = static_cast<int>(tq - i0 < team_rows ? tq - i0 : team_rows);
    const std::int64_t rest = league_rank / tiles, chunks = group / heads;
    hk = static_cast<int>(rest / chunks);
    h0 = hk * group + static_cast<int>(rest % chunks) * heads;
  }
  KOKKOS_INLINE_FUNCTION int h(int warp) const { return h0 + warp / row_blocks; }
  KOKKOS_INLINE_FUNCTION int r0(int warp) const { return (warp % row_blocks) * 16; }
  /// Rows of warp `warp` (0 for a warp past the team's last row).
  KOKKOS_INLINE_FUNCTION int rows(int warp) const {
    const int left = nq - r0(warp);
    return left < 0 ? 0 : (left < 16 ? left : 16);
  }
  /// Teams of a launch: query blocks per head group times head groups.
  static std::int64_t league(std::int64_t tiles, int hq, int heads) { return tiles * (hq / heads); }
};

/// What the forward and dQ kernels share: their inputs, the team of a league rank, the staged key
/// and value tiles with their tokens, and the walk over the key tiles the team's queries may see.
template <class Scalar, class MemorySpace, class Mask, int DP>
struct TensorCoreQueryWalk {
  using Tiles = TensorCoreTiles<Scalar, DP>;
  using Op = typename Tiles::Op;
  using Lanes = typename Tiles::Lanes;
  static constexpr int warps = Tiles::warps, count = Tiles::count;
  /// Warps each thread runs: on a device every thread is a lane of one warp; on the host one
  /// thread runs every warp.
  static constexpr int per_thread = count == 1 ? 1 : warps;

  AttentionInputs<Scalar, MemorySpace> in;
  Mask mask;
  KernelShape<Scalar, MemorySpace> shape;
  std::int64_t tiles;  ///< query blocks per head group
  int heads;           ///< query heads per team
  int level;           ///< scratch level
  /// Whether K and V go to scratch by asynchronous copies (`Tiles::copies_rows`).
  bool by_copies;

  /// A staged key tile in scratch: its K and V rows, and its keys' tokens and flags; with the
  /// team's query tokens.
  struct Staged {
    Op* k;
    Op* v;
    mask::Token* query;
    mask::Token* key;
    bool* key_valid;
  };

  /// Key tiles `Kernel`'s walk stages ahead (`Tiles::stages_fitting`).
  template <class Kernel>
  KOKKOS_INLINE_FUNCTION static constexpr int stages() {
    return Tiles::stages_fitting(piece_bytes<Kernel>(2));
  }

  /// Team scratch of `Kernel`'s walk: per stage a K and a V tile with the tile's key tokens and
  /// flags; the rows `Kernel` stages for its warps (`Kernel::staged_rows`: 16 per warp of one of
  /// its row operands, or none); the team's query tokens; and 16 bytes to align the first piece
  /// (`ldmatrix` and the copies need 16-byte rows, and every piece keeps a multiple of 16 bytes).
  template <class Kernel>
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_bytes() {
    return ScratchCursor::aligned_bytes(piece_bytes<Kernel>(stages<Kernel>()));
  }
  template <class Kernel>
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t piece_bytes(int stages) {
    return stages * stage_bytes() + (Kernel::staged_rows ? staged_row_bytes() : 0) +
           scratch_piece<mask::Token>(warps * Tiles::rows);
  }
  /// Scratch bytes of one staged key tile (`Staged`, less the query tokens).
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t stage_bytes() {
    return 2 * Tiles::tile_bytes() + scratch_piece<mask::Token>(key_tile) +
           scratch_piece<bool>(key_tile);
  }
  /// The staged tile of buffer `b`, whose buffers start at `first`: pointers computed, not
  /// chosen from an array (a register array indexed at run time would go to local memory).
  KOKKOS_FORCEINLINE_FUNCTION static Staged staged_at(char* first, int b, mask::Token* query) {
    ScratchCursor cur{first + b * stage_bytes()};
    const std::size_t tile = std::size_t(key_tile) * Tiles::ld;
    // A braced list evaluates in order: the pieces are taken as `stage_bytes` counts them.
    return Staged{cur.take<Op>(tile), cur.take<Op>(tile), query, cur.take<mask::Token>(key_tile),
                  cur.take<bool>(key_tile)};
  }
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t staged_row_bytes() {
    return scratch_piece<Op>(std::size_t(warps) * Tiles::rows * Tiles::ld);
  }

  /// Runs the team of `team` for `kernel` on the warps the thread runs (its `Warp`s, each with
  /// members `r0`, `rows` and `h`, set here): where `Kernel::staged_rows`,
  /// `kernel.stage_rows(team, copies, qt, rows)` stages 16 rows per warp into `rows` (warp `w`'s
  /// from `rows + 16·w·ld`); `kernel.start(warp, lanes, i0, own)` once (`own`: the warp's staged
  /// rows, or null), then per key tile `kernel.visit(warp, lanes, staged, seen)` for each warp
  /// that has rows (`seen(r, j)`: key `j` of the tile visible to its row `r`), and last
  /// `kernel.finish(warp, lanes, i0)` for each warp that has rows.
  template <class Member, class Kernel>
  KOKKOS_FORCEINLINE_FUNCTION void walk(const Member& team, const Kernel& kernel) const {
    constexpr int stages_ahead = stages<Kernel>();
    const Lanes lanes = Lanes::of_thread(team.team_rank());
    typename Kernel::Warp w[per_thread];
    const int first_warp = count == 1 ? team.team_rank() / 32 : 0;
    const TensorCoreQueryTeam qt(team.league_rank(), tiles, shape.tq, shape.group, heads);
    ScratchCursor cur = ScratchCursor::aligned(team, level, piece_bytes<Kernel>(stages_ahead));
    char* const buffers = cur.take<char>(stages_ahead * stage_bytes());
    Op* staged =
        Kernel::staged_rows ? cur.take<Op>(std::size_t(warps) * Tiles::rows * Tiles::ld) : nullptr;
    mask::Token* query = cur.take<mask::Token>(warps * Tiles::rows);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, qt.nq),
                         [&](const int r) { query[r] = query_token(in, qt.i0 + r); });
    ctxpar::impl::AsyncCopies<Tiles::copies_in_flight(
        stages_ahead, Kernel::staged_rows ? warps * Tiles::rows : 0)>
        copies;
    if constexpr (Kernel::staged_rows) {
      kernel.stage_rows(team, copies, qt, staged);
      copies.commit();
      copies.template wait<0>();
    }
    team.team_barrier();
    for (int k = 0; k < per_thread; ++k) {
      const int wi = first_warp + k;
      w[k].h = qt.h(wi);
      w[k].r0 = qt.r0(wi);
      w[k].rows = qt.rows(wi);
      kernel.start(w[k], lanes, qt.i0,
                   staged ? staged + std::size_t(wi) * Tiles::rows * Tiles::ld : nullptr);
    }
    const WindowRange range = window_range(in);
    std::int64_t lo, hi, first;
    key_range(in, range, shape.nk, query[0].pos, query[qt.nq - 1].pos, lo, hi, first);
    const std::int64_t n = hi > first ? (hi - first + key_tile - 1) / key_tile : 0;
    const auto stage = [&](std::int64_t t, int b) {
      const Staged st = staged_at(buffers, b, query);
      const std::int64_t j0 = first + t * key_tile;
      const auto valid = [&](int j) { return j0 + j >= lo && j0 + j < hi; };
      Tiles::stage(team, copies, by_copies, st.k, shape.dim, valid,
                   [&](int j) { return Tiles::row_of(in.k, j0 + j, qt.hk); });
      Tiles::stage(team, copies, by_copies, st.v, shape.dim, valid,
                   [&](int j) { return Tiles::row_of(in.v, j0 + j, qt.hk); });
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, key_tile), [&](const int j) {
        st.key_valid[j] = valid(j);
        st.key[j] = valid(j) ? key_token(in, j0 + j) : mask::Token{0, 0};
      });
    };
    const auto use = [&](std::int64_t, int b) {
      const Staged st = staged_at(buffers, b, query);
      for (int k = 0; k < per_thread; ++k)
        if (w[k].rows > 0) kernel.visit(w[k], lanes, st, visibility(st, range, w[k].r0, w[k].rows));
    };
    ctxpar::impl::pipelined_tiles<stages_ahead>(team, copies, n, stage, use);
    for (int k = 0; k < per_thread; ++k)
      if (w[k].rows > 0) kernel.finish(w[k], lanes, qt.i0);
  }

  /// Whether key `j` of the staged tile is visible to row `r` of the warp rows `[r0, r0 + rows)`
  /// (rows past `rows` see nothing; the per-pair test is skipped where the whole tile is visible).
  struct Visibility {
    const Staged* st;
    const Mask* mask;
    WindowRange range;
    int r0, rows;
    bool all;
    KOKKOS_FORCEINLINE_FUNCTION bool operator()(int r, int j) const {
      return r < rows &&
             (all || (st->key_valid[j] && visible(*mask, range, st->query[r0 + r], st->key[j])));
    }
  };
  KOKKOS_FORCEINLINE_FUNCTION Visibility visibility(const Staged& st, const WindowRange& range,
                                                    int r0, int rows) const {
    return {&st, &mask, range,
            r0,  rows,  tile_fully_visible(mask, range, st.query + r0, rows, st.key, st.key_valid)};
  }
};

/// The forward kernel for head dimensions up to `DP`.
template <class Scalar, class MemorySpace, class Mask, class Member, int DP>
struct TensorCoreForwardKernel {
  using Walk = TensorCoreQueryWalk<Scalar, MemorySpace, Mask, DP>;
  using Tiles = typename Walk::Tiles;
  using Lanes = typename Tiles::Lanes;
  static constexpr int count = Tiles::count;

  Walk queries;
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace> out;
  Kokkos::View<accumulator_t<Scalar>**, Kokkos::LayoutRight, MemorySpace> lse;
  /// The forward stages no rows.
  static constexpr bool staged_rows = false;
  /// Where the warps keep their Q rows: in registers, except at D = 256, where the output
  /// accumulators (128 registers) and Q's fragments (64 or more) spilled.
  static constexpr RowsKept queries_kept = DP == 256 ? RowsKept::in_memory : RowsKept::in_registers;

  /// One warp's rows (`rows` of them from team row `r0`, of query head `h`) and their state, for
  /// every lane the calling thread runs: its Q rows (`queries_kept`), the output accumulators, and
  /// per row half (fragment rows `0..7` and `8..15`) the running maximum and the lane's partial
  /// weight sum.
  struct Warp {
    int r0, rows, h;
    typename Tiles::template RowsAt<queries_kept> q;
    typename Tiles::Accumulator o;
    float m[2][count], l[2][count];
  };

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const { queries.walk(team, *this); }

  /// Keeps the warp's Q rows and clears its state.
  KOKKOS_FORCEINLINE_FUNCTION void start(Warp& w, const Lanes& lanes, std::int64_t i0,
                                         const typename Tiles::Op*) const {
    Tiles::template keep_rows<queries_kept>(lanes, queries.in.q, i0 + w.r0, w.h, w.rows,
                                            queries.shape.dim, nullptr, w.q);
    Tiles::zero(w.o);
    for (int half = 0; half < 2; ++half)
      for (int c = 0; c < count; ++c) {
        w.m[half][c] = masked_score<float>();
        w.l[half][c] = 0.0f;
      }
  }

  /// One warp's rows against the staged tile (`seen(r, j)`: key `j` visible to row `r`): scores,
  /// mask, online softmax, `P·V`.
  template <class Seen>
  KOKKOS_FORCEINLINE_FUNCTION void visit(Warp& w, const Lanes& lanes,
                                         const typename Walk::Staged& st, const Seen& seen) const {
    const int dim = queries.shape.dim;
    const float masked = masked_score<float>();
    const float scale = static_cast<float>(queries.in.scale);
    typename Tiles::Scores sc;
    Tiles::row_products(lanes, dim, w.q, st.k, sc);
    float best[2][count];
    for (int c = 0; c < count; ++c) best[0][c] = best[1][c] = masked;
    Tiles::for_each_score(lanes, sc, [&](float& x, int r, int j, int c, int half) {
      x = seen(r, j) ? x * scale : masked;
      best[half][c] = best[half][c] > x ? best[half][c] : x;
    });
    ctxpar::impl::quad_max(best[0]);
    ctxpar::impl::quad_max(best[1]);
    // The new maxima and the factors of the old sums; a row that sees no key of the tile keeps
    // its maximum, so its factor is exp(0) = 1 and its weights 0: its state is unchanged.
    float alpha[2][count], sum[2][count];
    for (int half = 0; half < 2; ++half)
      for (int c = 0; c < count; ++c) {
        const float mold = w.m[half][c];
        const float mnew = mold > best[half][c] ? mold : best[half][c];
        alpha[half][c] = ctxpar::impl::fast_exp(mold - mnew);
        w.m[half][c] = mnew;
        sum[half][c] = 0.0f;
      }
    Tiles::for_each_score(lanes, sc, [&](float& x, int, int, int c, int half) {
      x = x == masked ? 0.0f : ctxpar::impl::fast_exp(x - w.m[half][c]);
      sum[half][c] += x;
    });
    for (int half = 0; half < 2; ++half)
      for (int c = 0; c < count; ++c) w.l[half][c] = w.l[half][c] * alpha[half][c] + sum[half][c];
    Tiles::for_each_element(lanes, dim, w.o,
                            [&](float& x, int, int, int c, int half) { x *= alpha[half][c]; });
    Tiles::weighted_rows(lanes, dim, sc, st.v, w.o);
  }

  /// Sums each row's partial weight sums over its four lanes and writes `out` and `lse`.
  KOKKOS_FORCEINLINE_FUNCTION void finish(Warp& w, const Lanes& lanes, std::int64_t i0) const {
    const float masked = masked_score<float>();
    ctxpar::impl::quad_sum(w.l[0]);
    ctxpar::impl::quad_sum(w.l[1]);
    Tiles::for_each_element(
        lanes, queries.shape.dim, w.o, [&](float& x, int r, int d, int c, int half) {
          if (r >= w.rows) return;
          const float l = w.l[half][c];
          out(i0 + w.r0 + r, w.h, d) = ctxpar::narrow<Scalar>(x * (l > 0.0f ? 1.0f / l : 0.0f));
        });
    for (int c = 0; c < count; ++c) {
      const int lane = lanes.lane(c);
      if (lane % 4 != 0) continue;
      for (int half = 0; half < 2; ++half) {
        const int r = lane / 4 + half * 8;
        if (r >= w.rows) continue;
        const float l = w.l[half][c];
        lse(i0 + w.r0 + r, w.h) = l > 0.0f ? w.m[half][c] + compat::log(l) : masked;
      }
    }
  }
};

/// The tensor-core team policy for `teams` teams with `bytes` of scratch: level 0 when it fits,
/// else 1 (written to `level`).
template <class ExecutionSpace>
Kokkos::TeamPolicy<ExecutionSpace> tensor_core_policy(const ExecutionSpace& space,
                                                      std::int64_t teams, std::size_t bytes,
                                                      int& level) {
  using Policy = Kokkos::TeamPolicy<ExecutionSpace>;
  level = ctxpar::impl::scratch_level<ExecutionSpace>(bytes);
  Policy policy(space, static_cast<int>(teams),
                ctxpar::impl::warp_team_size<ExecutionSpace>(tensor_core_warps));
  policy.set_scratch_size(level, Kokkos::PerTeam(bytes));
  return policy;
}

/// Refuses a device launch whose scratch went to level 1 (global memory) though its kernel reads
/// it by `ldmatrix`, which reads shared memory only; the host's emulation reads it anywhere.
template <class ExecutionSpace>
void require_ldmatrix_level(bool reads_by_ldmatrix, int level, const char* op) {
  require_local(!reads_by_ldmatrix || ctxpar::impl::is_host_space_v<ExecutionSpace> || level == 0,
                op, "a tensor-core kernel's ldmatrix scratch is in level 0 (shared memory)",
                "level 0", level);
}

/// Launches a kernel over `TensorCoreQueryWalk` teams (the forward or dQ) on every query block and
/// group of query heads of `shape`; `make(walk)` builds the kernel from its walk.
template <class Kernel, class ExecutionSpace, class Mask, class Scalar, class MemorySpace,
          class Make>
void launch_query_walk(const char* label, const ExecutionSpace& space, const Mask& mask,
                       const AttentionInputs<Scalar, MemorySpace>& in,
                       const KernelShape<Scalar, MemorySpace>& shape, const Make& make) {
  const int heads = tensor_core_heads_per_team(shape.group);
  const int team_rows = 16 * (tensor_core_warps / heads);
  const std::int64_t tiles = (shape.tq + team_rows - 1) / team_rows;
  int level = 0;
  constexpr std::size_t bytes = Kernel::Walk::template scratch_bytes<Kernel>();
  const auto policy =
      tensor_core_policy(space, TensorCoreQueryTeam::league(tiles, shape.hq, heads), bytes, level);
  static_assert(!Kernel::Tiles::reads_by_ldmatrix || bytes <= tensor_core_ldmatrix_scratch,
                "a kernel that reads its scratch by ldmatrix must fit in level 0");
  require_ldmatrix_level<ExecutionSpace>(Kernel::Tiles::reads_by_ldmatrix, level, label);
  Kokkos::parallel_for(label, policy,
                       make(typename Kernel::Walk{
                           in, mask, shape, tiles, heads, level,
                           Kernel::Tiles::copies_rows(static_cast<int>(shape.dim), in.k, in.v)}));
}

/// Forward attention on tensor-core products (see `attention_forward`) on inputs of `shape` with
/// queries; the caller has checked that they run here (`runs_tensor_core_kernels`).
template <class ExecutionSpace, class Mask, class Scalar, class MemorySpace>
void tensor_core_attention_forward(const ExecutionSpace& space, const Mask& mask,
                                   const AttentionInputs<Scalar, MemorySpace>& in,
                                   const KernelShape<Scalar, MemorySpace>& shape,
                                   const ForwardViews<Scalar, MemorySpace>& f) {
  with_padded_dim(shape.dim, [&](auto padded) {
    using Member = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
    using Kernel =
        TensorCoreForwardKernel<Scalar, MemorySpace, Mask, Member, decltype(padded)::value>;
    launch_query_walk<Kernel>("ctxpar::swa::attention_forward_tensor_core", space, mask, in, shape,
                              [&](const typename Kernel::Walk& walk) {
                                return Kernel{walk, f.out, f.lse};
                              });
  });
}

}  // namespace ctxpar::swa::impl
