/// \file
/// The portable sliding-window attention kernels, shaped like FlashAttention-2 for GPUs with Kokkos
/// hierarchical parallelism: device backends always run them, host spaces when the kernel choice is
/// `KernelChoice::portable` (the default of a `CTXPAR_PORTABLE_KERNELS` build).
///
/// Mapping. Forward and dQ: a team per (query tile, key/value head, group of query heads), so the
/// query heads of a GQA group share each staged key/value tile; threads (`TeamThreadRange`) over
/// the team's query rows (query x head), vector lanes (`ThreadVectorRange`) over the keys of a
/// tile for the scores and over the head dimension for the output rows. dK/dV: a team per (key
/// tile, key/value head), threads over query rows for the weights, then over the tile's keys with
/// lanes over the head dimension for the sums. Key/value tiles (and for dK/dV the query tiles) are
/// loaded once into team scratch by the whole team, then a barrier; the online-softmax state of a
/// row lives in scratch slots owned by the row's thread.
///
/// Determinism. Every output element has one owner (a row's thread, or a key's thread, and one
/// lane per element) that sums its terms sequentially in a fixed order: forward and dQ rows over
/// the key tiles of the global grid in increasing order, keys in order inside a tile, skipping
/// tiles with no key visible to that row; dK/dV over the group's heads, the query tiles and their
/// rows in order. Maxima and integer counts are the only cross-lane reductions (both exact). So
/// every output is bitwise independent of the team size, and forward and dQ are bitwise
/// independent of how queries and keys are split across ranks.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/core/team_size.hpp"
#include "ctxpar/core/workspace.hpp"
#include "ctxpar/expr/mask.hpp"
#include "ctxpar/swa/attention_inputs.hpp"
#include "ctxpar/swa/impl/attention_tiles.hpp"

namespace ctxpar::swa::impl {

/// Bytes of a scratch piece of `n` elements of `T`, rounded up so the next piece stays aligned.
template <class T>
KOKKOS_INLINE_FUNCTION constexpr std::size_t scratch_piece(std::size_t n) {
  return (n * sizeof(T) + 15) / 16 * 16;
}

/// Hands out consecutive aligned pieces of one team-scratch allocation.
struct ScratchCursor {
  char* at;
  template <class T>
  KOKKOS_INLINE_FUNCTION T* take(std::size_t n) {
    T* piece = reinterpret_cast<T*>(at);
    at += scratch_piece<T>(n);
    return piece;
  }

  /// The team-scratch bytes to ask for `piece_bytes` of pieces that start on a 16-byte boundary
  /// (`aligned`): reaching the boundary may skip up to 15 bytes, so 16 more are asked for.
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t aligned_bytes(std::size_t piece_bytes) {
    return 16 + piece_bytes;
  }

  /// A cursor at the first 16-byte boundary of `team`'s level-`level` scratch, for `piece_bytes`
  /// of pieces (asked for with `aligned_bytes`): what `ldmatrix` and 16-byte loads read.
  template <class Member>
  KOKKOS_INLINE_FUNCTION static ScratchCursor aligned(const Member& team, int level,
                                                      std::size_t piece_bytes) {
    return {static_cast<char*>(team.team_scratch(level).get_shmem_aligned(piece_bytes, 16))};
  }
};

/// The tokens in a team's scratch: of its query rows (`query`) and of the key tile it has staged
/// (`key`, with `key_valid` false for a slot past the keys).
struct TileTokens {
  mask::Token* query;
  mask::Token* key;
  bool* key_valid;

  /// Their scratch bytes.
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t bytes() {
    return scratch_piece<mask::Token>(query_tile) + scratch_piece<mask::Token>(key_tile) +
           scratch_piece<bool>(key_tile);
  }
  /// Takes them from `cur`.
  KOKKOS_INLINE_FUNCTION static TileTokens take(ScratchCursor& cur) {
    TileTokens t;
    t.query = cur.take<mask::Token>(query_tile);
    t.key = cur.take<mask::Token>(key_tile);
    t.key_valid = cur.take<bool>(key_tile);
    return t;
  }
  /// Whether every pair of the first `rows` query rows and the key tile is visible.
  template <class Mask>
  KOKKOS_INLINE_FUNCTION bool all_visible(const Mask& mask, const WindowRange& range,
                                          int rows) const {
    return tile_fully_visible(mask, range, query, rows, key, key_valid);
  }
  /// Whether key `j` of the tile is visible to query row `r`.
  template <class Mask>
  KOKKOS_INLINE_FUNCTION bool sees(const Mask& mask, const WindowRange& range, int r, int j) const {
    return key_valid[j] && visible(mask, range, query[r], key[j]);
  }
};

/// Loads keys `[j0, j0 + key_tile)` of head `hk` into scratch, cooperatively (threads over keys,
/// lanes over the head dimension), in the layouts asked for: `kt`/`vt` transposed (`[d][j]`, for
/// lanes over keys), `ks`/`vs` row-major (`[j][d]`, for lanes over `d`). Keys outside `[lo, hi)`
/// become zeros and invalid. Ends with a team barrier.
template <class Member, class Scalar, class MemorySpace, class T>
KOKKOS_INLINE_FUNCTION void stage_key_tile(const Member& team,
                                           const AttentionInputs<Scalar, MemorySpace>& in, int hk,
                                           int dim, std::int64_t j0, std::int64_t lo,
                                           std::int64_t hi, T* kt, T* ks, T* vt, T* vs,
                                           mask::Token* tok, bool* valid) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, key_tile), [&](const int j) {
    const std::int64_t g = j0 + j;
    const bool ok = g >= lo && g < hi;
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, dim), [&](const int d) {
      const T kv = ok ? static_cast<T>(ctxpar::widen(in.k(g, hk, d))) : T(0);
      const T vv = ok ? static_cast<T>(ctxpar::widen(in.v(g, hk, d))) : T(0);
      if (kt) kt[d * key_tile + j] = kv;
      if (ks) ks[j * dim + d] = kv;
      if (vt) vt[d * key_tile + j] = vv;
      if (vs) vs[j * dim + d] = vv;
    });
    Kokkos::single(Kokkos::PerThread(team), [&]() {
      valid[j] = ok;
      tok[j] = ok ? key_token(in, g) : mask::Token{0, 0};
    });
  });
  team.team_barrier();
}

/// One row of a `QueryTeam`: query `i` (row `rr` of the tile) of query head `h` (the team's
/// `hh`-th), whose per-row scratch is slot `slot`.
struct QueryRow {
  int hh, rr, slot, h;
  std::int64_t i;
};

/// Where a team of the forward or dQ kernel works: query tile `[i0, i0 + nq)`, key/value head
/// `hk` and query heads `[h0, h0 + heads)`; its rows are (head, query) pairs, `heads * nq` of them.
struct QueryTeam {
  std::int64_t i0, nq;
  int hk, h0;
  KOKKOS_INLINE_FUNCTION QueryTeam(std::int64_t league_rank, std::int64_t tiles, std::int64_t tq,
                                   int group, int heads) {
    const std::int64_t chunks = group / heads;
    i0 = (league_rank % tiles) * query_tile;
    nq = tq - i0 < query_tile ? tq - i0 : query_tile;
    const std::int64_t rest = league_rank / tiles;
    hk = static_cast<int>(rest / chunks);
    h0 = hk * group + static_cast<int>(rest % chunks) * heads;
  }
  /// Row `r` of the team (head-major).
  KOKKOS_INLINE_FUNCTION QueryRow row(int r) const {
    QueryRow q;
    q.hh = static_cast<int>(r / nq);
    q.rr = static_cast<int>(r % nq);
    q.slot = q.hh * query_tile + q.rr;
    q.i = i0 + q.rr;
    q.h = h0 + q.hh;
    return q;
  }
};

/// What the forward and dQ kernels share: their inputs, the team each league rank is, the scratch
/// layout's common part, the loop over the team's rows and the walk over the key tiles its
/// queries may see (each kernel keeps its outputs and per-row state).
template <class Scalar, class MemorySpace, class Mask>
struct TeamQueryTiles {
  using acc = accumulator_t<Scalar>;
  AttentionInputs<Scalar, MemorySpace> in;
  Mask mask;
  KernelShape<Scalar, MemorySpace> shape;
  std::int64_t tiles;
  int heads;  // query heads per team
  int level;

  /// Scratch of a team with `row_arrays` arrays of `dim` per row slot and `key_arrays` per key of a
  /// tile, besides the scores of every slot, two values per slot, and the query and key tokens.
  KOKKOS_INLINE_FUNCTION static std::size_t scratch_bytes(int dim, int heads, int row_arrays,
                                                          int key_arrays) {
    const std::size_t rows = std::size_t(heads) * query_tile;
    return row_arrays * scratch_piece<acc>(rows * dim) +
           key_arrays * scratch_piece<acc>(std::size_t(key_tile) * dim) +
           scratch_piece<acc>(rows * key_tile) + 2 * scratch_piece<acc>(rows) + TileTokens::bytes();
  }

  template <class Member>
  KOKKOS_INLINE_FUNCTION QueryTeam team_of(const Member& team) const {
    return QueryTeam(team.league_rank(), tiles, shape.tq, shape.group, heads);
  }

  /// A team's scratch, laid out as `scratch_bytes` counts it: `Rows` arrays of `dim` per row slot
  /// (the team's heads × a query tile), `Keys` per key of a tile, the scores of every slot, two
  /// values per slot, and the tile's tokens.
  template <int Rows, int Keys>
  struct Scratch {
    acc* rows[Rows];
    acc* keys[Keys];
    acc* scores;
    acc* per_slot[2];
    TileTokens tok;
  };
  template <int Rows, int Keys, class Member>
  KOKKOS_INLINE_FUNCTION Scratch<Rows, Keys> take_scratch(const Member& team) const {
    const std::size_t bytes = scratch_bytes(shape.dim, heads, Rows, Keys);
    ScratchCursor cur{static_cast<char*>(team.team_scratch(level).get_shmem(bytes))};
    const std::size_t slots = std::size_t(heads) * query_tile, dim = std::size_t(shape.dim);
    Scratch<Rows, Keys> s;
    for (int a = 0; a < Rows; ++a) s.rows[a] = cur.take<acc>(slots * dim);
    for (int a = 0; a < Keys; ++a) s.keys[a] = cur.take<acc>(std::size_t(key_tile) * dim);
    s.scores = cur.take<acc>(slots * key_tile);
    s.per_slot[0] = cur.take<acc>(slots);
    s.per_slot[1] = cur.take<acc>(slots);
    s.tok = TileTokens::take(cur);
    return s;
  }

  /// `body(row)` for every row of `qt`, one thread per row.
  template <class Member, class Body>
  KOKKOS_INLINE_FUNCTION void for_each_row(const Member& team, const QueryTeam& qt,
                                           const Body& body) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, static_cast<int>(heads * qt.nq)),
                         [&](const int r) { body(qt.row(r)); });
  }

  /// Fills the scratch of every row of `qt`: the scaled queries (`qs`), `element(row, d)` for each
  /// element of the row, `state(row)` once, and the query tokens (`qtok`); then waits for the team.
  template <class Member, class Element, class State>
  KOKKOS_INLINE_FUNCTION void load_rows(const Member& team, const QueryTeam& qt, acc* qs,
                                        mask::Token* qtok, const Element& element,
                                        const State& state) const {
    const int D = shape.dim;
    const acc scale = static_cast<acc>(in.scale);
    for_each_row(team, qt, [&](const QueryRow& q) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D), [&](const int d) {
        qs[q.slot * D + d] = ctxpar::widen(in.q(q.i, q.h, d)) * scale;
        element(q, d);
      });
      Kokkos::single(Kokkos::PerThread(team), [&]() {
        state(q);
        if (q.hh == 0) qtok[q.rr] = query_token(in, q.i);
      });
    });
    team.team_barrier();
  }

  /// Stages each key tile that a query of `qt` (its tokens in `tok.query`) may see, in increasing
  /// order, into the layouts given and `tok` (`stage_key_tile`), then calls `body(range, all, row)`
  /// for every row of `qt` (`all`: every pair of the tile is visible) and waits for the team.
  template <class Member, class T, class Body>
  KOKKOS_INLINE_FUNCTION void for_each_key_tile(const Member& team, const QueryTeam& qt,
                                                const TileTokens& tok, T* kt, T* ks, T* vt, T* vs,
                                                const Body& body) const {
    const WindowRange range = window_range(in);
    std::int64_t lo, hi, j0;
    key_range(in, range, shape.nk, tok.query[0].pos, tok.query[qt.nq - 1].pos, lo, hi, j0);
    for (; j0 < hi; j0 += key_tile) {
      stage_key_tile(team, in, qt.hk, shape.dim, j0, lo, hi, kt, ks, vt, vs, tok.key,
                     tok.key_valid);
      const bool all = tok.all_visible(mask, range, static_cast<int>(qt.nq));
      for_each_row(team, qt, [&](const QueryRow& q) { body(range, all, q); });
      team.team_barrier();
    }
  }
};

/// Forward: online softmax per row over the visible key tiles; writes `out` and the row
/// log-sum-exp (`masked_score` and zeros for a row that sees no key).
template <class Scalar, class MemorySpace, class Mask, class Member>
struct TeamForwardKernel {
  using acc = accumulator_t<Scalar>;
  using Tiles = TeamQueryTiles<Scalar, MemorySpace, Mask>;
  Tiles queries;
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace> out;
  Kokkos::View<acc**, Kokkos::LayoutRight, MemorySpace> lse;

  /// Arrays of `D` in the scratch per row slot and per key of a tile.
  static constexpr int row_arrays = 2, key_arrays = 2;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const QueryTeam qt = queries.team_of(team);
    const auto s = queries.template take_scratch<row_arrays, key_arrays>(team);
    const int D = queries.shape.dim;
    acc *qs = s.rows[0], *os = s.rows[1], *kt = s.keys[0], *vs = s.keys[1];
    acc *ps = s.scores, *ms = s.per_slot[0], *ls = s.per_slot[1];
    const TileTokens tok = s.tok;
    const acc masked = masked_score<acc>();
    queries.load_rows(
        team, qt, qs, tok.query,
        [&](const QueryRow& q, const int d) { os[q.slot * D + d] = acc(0); },
        [&](const QueryRow& q) {
          ms[q.slot] = masked;
          ls[q.slot] = acc(0);
        });
    queries.for_each_key_tile(
        team, qt, tok, kt, static_cast<acc*>(nullptr), static_cast<acc*>(nullptr), vs,
        [&](const WindowRange& range, const bool all, const QueryRow& q) {
          const int slot = q.slot;
          const acc* qr = qs + slot * D;
          acc* pr = ps + slot * key_tile;
          acc rowmax = masked;
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(team, key_tile),
              [&](const int j, acc& best) {
                acc s = 0;
                for (int d = 0; d < D; ++d) s += qr[d] * kt[d * key_tile + j];
                if (!all && !tok.sees(queries.mask, range, q.rr, j)) s = masked;
                pr[j] = s;
                best = best > s ? best : s;
              },
              Kokkos::Max<acc>(rowmax));
          // No key of this tile visible to the row: its state stays untouched, so the row's sums
          // do not depend on which other rows share the team.
          if (rowmax == masked) return;
          const acc mold = ms[slot];
          const acc mnew = mold > rowmax ? mold : rowmax;
          const acc alpha = fast_exp(mold - mnew);
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, key_tile), [&](const int j) {
            pr[j] = pr[j] == masked ? acc(0) : fast_exp(pr[j] - mnew);
          });
          // Every lane sums the weights itself, in key order: the same bits on every lane.
          acc sum = 0;
          for (int j = 0; j < key_tile; ++j) sum += pr[j];
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D), [&](const int d) {
            acc o = os[slot * D + d];
            if (alpha != acc(1)) o *= alpha;
            for (int j = 0; j < key_tile; ++j) o += pr[j] * vs[j * D + d];
            os[slot * D + d] = o;
          });
          Kokkos::single(Kokkos::PerThread(team), [&]() {
            ls[slot] = ls[slot] * alpha + sum;
            ms[slot] = mnew;
          });
        });
    queries.for_each_row(team, qt, [&](const QueryRow& q) {
      const acc l = ls[q.slot];
      const acc inv = l > acc(0) ? acc(1) / l : acc(0);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D), [&](const int d) {
        out(q.i, q.h, d) = ctxpar::narrow<Scalar>(os[q.slot * D + d] * inv);
      });
      Kokkos::single(Kokkos::PerThread(team),
                     [&]() { lse(q.i, q.h) = l > acc(0) ? ms[q.slot] + compat::log(l) : masked; });
    });
  }
};

/// `delta_i = sum_d dO_id O_id` per (query, head), the row term of the softmax backward.
template <class Scalar, class MemorySpace>
struct DeltaKernel {
  using acc = accumulator_t<Scalar>;
  Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace> out, dout;
  Kokkos::View<acc**, Kokkos::LayoutRight, MemorySpace> delta;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t flat) const {
    const std::int64_t heads = static_cast<std::int64_t>(out.extent(1));
    const std::int64_t i = flat / heads, h = flat % heads;
    acc s = 0;
    for (std::size_t d = 0; d < out.extent(2); ++d)
      s += ctxpar::widen(dout(i, h, d)) * ctxpar::widen(out(i, h, d));
    delta(i, h) = s;
  }
};

/// The row terms `delta [tq, Hq]` of the softmax backward (used by both kernel families).
template <class ExecutionSpace, class Scalar, class MemorySpace>
Kokkos::View<accumulator_t<Scalar>**, Kokkos::LayoutRight, MemorySpace> row_deltas(
    const ExecutionSpace& space,
    const Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace>& out,
    const Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace>& dout,
    GrowingBuffer<MemorySpace>& storage) {
  using acc = accumulator_t<Scalar>;
  const std::int64_t tq = static_cast<std::int64_t>(out.extent(0)),
                     hq = static_cast<std::int64_t>(out.extent(1));
  const auto delta = carve<Kokkos::View<acc**, Kokkos::LayoutRight, MemorySpace>>(storage, tq, hq);
  if (tq * hq > 0)
    Kokkos::parallel_for(
        "ctxpar::swa::attention_delta",
        Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, tq * hq),
        DeltaKernel<Scalar, MemorySpace>{out, dout, delta});
  return delta;
}

/// Backward for dQ: the forward's teams and key tiles; each row recomputes its weights from the
/// saved lse and sums `dS_ij k_j` over the tiles it sees.
template <class Scalar, class MemorySpace, class Mask, class Member>
struct TeamQueryGradientKernel {
  using acc = accumulator_t<Scalar>;
  using Tiles = TeamQueryTiles<Scalar, MemorySpace, Mask>;
  Tiles queries;
  Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace> dout;
  Kokkos::View<const acc**, Kokkos::LayoutRight, MemorySpace> lse, delta;
  Kokkos::View<accumulator_t<Scalar>***, Kokkos::LayoutRight, MemorySpace> dq;

  /// Arrays of `D` in the scratch per row slot and per key of a tile.
  static constexpr int row_arrays = 3, key_arrays = 3;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const QueryTeam qt = queries.team_of(team);
    const auto s = queries.template take_scratch<row_arrays, key_arrays>(team);
    const int D = queries.shape.dim;
    acc *qs = s.rows[0], *dos = s.rows[1], *dqs = s.rows[2];
    acc *kt = s.keys[0], *ks = s.keys[1], *vt = s.keys[2];
    acc *dss = s.scores, *lses = s.per_slot[0], *deltas = s.per_slot[1];
    const TileTokens tok = s.tok;
    queries.load_rows(
        team, qt, qs, tok.query,
        [&](const QueryRow& q, const int d) {
          dos[q.slot * D + d] = ctxpar::widen(dout(q.i, q.h, d));
          dqs[q.slot * D + d] = acc(0);
        },
        [&](const QueryRow& q) {
          lses[q.slot] = lse(q.i, q.h);
          deltas[q.slot] = delta(q.i, q.h);
        });
    queries.for_each_key_tile(
        team, qt, tok, kt, ks, vt, static_cast<acc*>(nullptr),
        [&](const WindowRange& range, const bool all, const QueryRow& q) {
          const int slot = q.slot;
          const acc* qr = qs + slot * D;
          const acc* dor = dos + slot * D;
          acc* dsr = dss + slot * key_tile;
          const acc l = lses[slot], dl = deltas[slot];
          int seen = 0;
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(team, key_tile),
              [&](const int j, int& n) {
                const bool vis = all || tok.sees(queries.mask, range, q.rr, j);
                acc s = 0, dp = 0;
                for (int d = 0; d < D; ++d) s += qr[d] * kt[d * key_tile + j];
                for (int d = 0; d < D; ++d) dp += dor[d] * vt[d * key_tile + j];
                const acc p = vis ? fast_exp(s - l) : acc(0);
                dsr[j] = p * (dp - dl);
                n += vis ? 1 : 0;
              },
              seen);
          // As in the forward: a tile the row cannot see leaves its sums untouched.
          if (seen == 0) return;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D), [&](const int d) {
            acc x = dqs[slot * D + d];
            for (int j = 0; j < key_tile; ++j) x += dsr[j] * ks[j * D + d];
            dqs[slot * D + d] = x;
          });
        });
    const acc scale = static_cast<acc>(queries.in.scale);
    queries.for_each_row(team, qt, [&](const QueryRow& q) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D),
                           [&](const int d) { dq(q.i, q.h, d) = dqs[q.slot * D + d] * scale; });
    });
  }
};

/// Backward for dK and dV: a team per (key tile, key/value head) walks the group's query heads and
/// the query tiles that can see its keys, so no two teams write the same key and no atomics are
/// needed.
template <class Scalar, class MemorySpace, class Mask, class Member>
struct TeamKeyGradientKernel {
  using acc = accumulator_t<Scalar>;
  AttentionInputs<Scalar, MemorySpace> in;
  Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace> dout;
  Kokkos::View<const acc**, Kokkos::LayoutRight, MemorySpace> lse, delta;
  Kokkos::View<accumulator_t<Scalar>***, Kokkos::LayoutRight, MemorySpace> dk, dv;
  Mask mask;
  KernelShape<Scalar, MemorySpace> shape;
  std::int64_t tiles;
  int level;

  KOKKOS_INLINE_FUNCTION static std::size_t scratch_bytes(int dim) {
    return 4 * scratch_piece<acc>(std::size_t(key_tile) * dim) +
           2 * scratch_piece<acc>(std::size_t(query_tile) * dim) +
           2 * scratch_piece<acc>(std::size_t(query_tile) * key_tile) +
           2 * scratch_piece<acc>(query_tile) + TileTokens::bytes();
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const int D = shape.dim;
    const int hk = static_cast<int>(team.league_rank() / tiles);
    const std::int64_t j0 = (team.league_rank() % tiles) * key_tile;
    const int nkt = static_cast<int>(shape.nk - j0 < key_tile ? shape.nk - j0 : key_tile);
    ScratchCursor cur{static_cast<char*>(team.team_scratch(level).get_shmem(scratch_bytes(D)))};
    acc* kt = cur.take<acc>(std::size_t(key_tile) * D);
    acc* vt = cur.take<acc>(std::size_t(key_tile) * D);
    acc* dks = cur.take<acc>(std::size_t(key_tile) * D);
    acc* dvs = cur.take<acc>(std::size_t(key_tile) * D);
    acc* qs = cur.take<acc>(std::size_t(query_tile) * D);
    acc* dos = cur.take<acc>(std::size_t(query_tile) * D);
    acc* ps = cur.take<acc>(std::size_t(query_tile) * key_tile);
    acc* dss = cur.take<acc>(std::size_t(query_tile) * key_tile);
    acc* lses = cur.take<acc>(query_tile);
    acc* deltas = cur.take<acc>(query_tile);
    const TileTokens tok = TileTokens::take(cur);
    const acc scale = static_cast<acc>(in.scale);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, key_tile), [&](const int j) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D), [&](const int d) {
        dks[j * D + d] = acc(0);
        dvs[j * D + d] = acc(0);
      });
    });
    stage_key_tile(team, in, hk, D, j0, j0, j0 + nkt, kt, static_cast<acc*>(nullptr), vt,
                   static_cast<acc*>(nullptr), tok.key, tok.key_valid);
    // Queries that may see a key of this tile.
    const WindowRange range = window_range(in);
    std::int64_t qlo, qhi;
    range.queries(in.q_pos, shape.tq, in.k_pos(j0), in.k_pos(j0 + nkt - 1), qlo, qhi);
    for (int h = hk * shape.group; h < (hk + 1) * shape.group; ++h) {
      for (std::int64_t i0 = qlo; i0 < qhi; i0 += query_tile) {
        const int nq = static_cast<int>(qhi - i0 < query_tile ? qhi - i0 : query_tile);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nq), [&](const int r) {
          const std::int64_t i = i0 + r;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D), [&](const int d) {
            qs[r * D + d] = ctxpar::widen(in.q(i, h, d)) * scale;
            dos[r * D + d] = ctxpar::widen(dout(i, h, d));
          });
          Kokkos::single(Kokkos::PerThread(team), [&]() {
            tok.query[r] = query_token(in, i);
            lses[r] = lse(i, h);
            deltas[r] = delta(i, h);
          });
        });
        team.team_barrier();
        const bool all = tok.all_visible(mask, range, nq);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nq), [&](const int r) {
          const acc* qr = qs + r * D;
          const acc* dor = dos + r * D;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, key_tile), [&](const int j) {
            const bool vis = all || tok.sees(mask, range, r, j);
            acc s = 0, dp = 0;
            for (int d = 0; d < D; ++d) s += qr[d] * kt[d * key_tile + j];
            for (int d = 0; d < D; ++d) dp += dor[d] * vt[d * key_tile + j];
            const acc p = vis ? fast_exp(s - lses[r]) : acc(0);
            ps[r * key_tile + j] = p;
            dss[r * key_tile + j] = p * (dp - deltas[r]);
          });
        });
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nkt), [&](const int j) {
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D), [&](const int d) {
            acc xv = dvs[j * D + d], xk = dks[j * D + d];
            for (int r = 0; r < nq; ++r) {
              xv += ps[r * key_tile + j] * dos[r * D + d];
              xk += dss[r * key_tile + j] * qs[r * D + d];
            }
            dvs[j * D + d] = xv;
            dks[j * D + d] = xk;
          });
        });
        // The next query tile overwrites qs, dos, ps and dss.
        team.team_barrier();
      }
    }
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nkt), [&](const int j) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D), [&](const int d) {
        dk(j0 + j, hk, d) = dks[j * D + d];
        dv(j0 + j, hk, d) = dvs[j * D + d];
      });
    });
  }
};

/// A team policy for a portable kernel: scratch at level 0 when `bytes` fit there, else level 1
/// (written to `level`, the functor's), vector lanes from the backend (a warp or wavefront slice of
/// at most `key_tile` lanes on devices, 1 on hosts) and the team size of `choose_team_size`, at
/// most `rows` (the rows a team's threads split).
template <class ExecutionSpace, class Functor>
Kokkos::TeamPolicy<ExecutionSpace> team_kernel_policy(const ExecutionSpace& space,
                                                      std::int64_t league, std::size_t bytes,
                                                      int rows, const Functor& functor,
                                                      int& level) {
  using Policy = Kokkos::TeamPolicy<ExecutionSpace>;
  level = ctxpar::impl::scratch_level<ExecutionSpace>(bytes);
  const int lanes = std::max(1, std::min(key_tile, Policy::vector_length_max()));
  Policy probe(space, static_cast<int>(league), 1, lanes);
  probe.set_scratch_size(level, Kokkos::PerTeam(bytes));
  const int size = ctxpar::impl::choose_team_size(probe, functor, rows);
  Policy policy(space, static_cast<int>(league), size, lanes);
  policy.set_scratch_size(level, Kokkos::PerTeam(bytes));
  return policy;
}

/// Query heads per team of the forward and dQ kernels: the largest divisor of the GQA group whose
/// rows (heads x `query_tile`) stay within 128 and whose scratch fits level 0, else 1. Sharing a
/// staged key/value tile between the heads of a group divides its loads by that factor.
template <class ExecutionSpace, class BytesOf>
int heads_per_team(int group, const BytesOf& bytes_of) {
  using Policy = Kokkos::TeamPolicy<ExecutionSpace>;
  const std::size_t level0 = static_cast<std::size_t>(Policy::scratch_size_max(0));
  for (int heads = group; heads > 1; --heads)
    if (group % heads == 0 && heads * query_tile <= 128 && bytes_of(heads) <= level0) return heads;
  return 1;
}

/// Launches a query-tile kernel (the forward or dQ) over every query tile and block of query
/// heads of `shape`; `make(queries)` builds the kernel from its `TeamQueryTiles`.
template <class Kernel, class ExecutionSpace, class Mask, class Scalar, class MemorySpace,
          class Make>
void launch_query_kernel(const char* label, const ExecutionSpace& space, const Mask& mask,
                         const AttentionInputs<Scalar, MemorySpace>& in,
                         const KernelShape<Scalar, MemorySpace>& shape, const Make& make) {
  const std::int64_t tiles = (shape.tq + query_tile - 1) / query_tile;
  const auto bytes = [&](int heads) {
    return Kernel::Tiles::scratch_bytes(shape.dim, heads, Kernel::row_arrays, Kernel::key_arrays);
  };
  const int heads = heads_per_team<ExecutionSpace>(shape.group, bytes);
  Kernel kernel = make(typename Kernel::Tiles{in, mask, shape, tiles, heads, 0});
  const auto policy = team_kernel_policy(space, tiles * (shape.hq / heads), bytes(heads),
                                         heads * query_tile, kernel, kernel.queries.level);
  Kokkos::parallel_for(label, policy, kernel);
}

/// Forward attention with the portable team kernels (see `attention_forward`) on inputs of
/// `shape` with queries (the caller returns early on an empty query axis).
template <class ExecutionSpace, class Mask, class Scalar, class MemorySpace>
void portable_attention_forward(const ExecutionSpace& space, const Mask& mask,
                                const AttentionInputs<Scalar, MemorySpace>& in,
                                const KernelShape<Scalar, MemorySpace>& shape,
                                const ForwardViews<Scalar, MemorySpace>& f) {
  using Member = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  using Kernel = TeamForwardKernel<Scalar, MemorySpace, Mask, Member>;
  launch_query_kernel<Kernel>("ctxpar::swa::attention_forward", space, mask, in, shape,
                              [&](const typename Kernel::Tiles& queries) {
                                return Kernel{queries, f.out, f.lse};
                              });
}

/// Backward attention with the portable team kernels (see `attention_backward`), given the row
/// deltas `delta = row_deltas(out, dout)`.
template <class ExecutionSpace, class Mask, class Scalar, class MemorySpace>
void portable_attention_backward(const ExecutionSpace& space, const Mask& mask,
                                 const AttentionInputs<Scalar, MemorySpace>& in,
                                 const BackwardViews<Scalar, MemorySpace>& g) {
  const KernelShape<Scalar, MemorySpace> shape(in);
  using Member = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  if (shape.tq > 0 && shape.hq > 0) {
    using Kernel = TeamQueryGradientKernel<Scalar, MemorySpace, Mask, Member>;
    launch_query_kernel<Kernel>("ctxpar::swa::attention_backward_dq", space, mask, in, shape,
                                [&](const typename Kernel::Tiles& queries) {
                                  return Kernel{queries, g.dout, g.lse, g.delta, g.dq};
                                });
  }
  if (shape.nk > 0 && shape.hkv > 0) {
    using Kernel = TeamKeyGradientKernel<Scalar, MemorySpace, Mask, Member>;
    const std::int64_t tiles = (shape.nk + key_tile - 1) / key_tile;
    Kernel kernel{in, g.dout, g.lse, g.delta, g.dk, g.dv, mask, shape, tiles, 0};
    const auto policy =
        team_kernel_policy(space, tiles * shape.hkv, Kernel::scratch_bytes(shape.dim), query_tile,
                           kernel, kernel.level);
    Kokkos::parallel_for("ctxpar::swa::attention_backward_dkdv", policy, kernel);
  }
}

}  // namespace ctxpar::swa::impl
