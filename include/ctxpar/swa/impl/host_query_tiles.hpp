/// \file
/// What the host attention kernels with one team per (query head, query tile) share, the forward
/// and the unfused dQ kernel: their inputs, the tile a team owns, its scaled query rows, and the
/// walk over the packed key tiles its queries may see.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

#include "ctxpar/core/host_isa.hpp"
#include "ctxpar/expr/mask.hpp"
#include "ctxpar/swa/attention_inputs.hpp"
#include "ctxpar/swa/impl/attention_tiles.hpp"
#include "ctxpar/swa/impl/host_packing.hpp"
#include "ctxpar/swa/impl/host_tile_mask.hpp"
#include "ctxpar/swa/impl/window_range.hpp"

namespace ctxpar::swa::impl {

/// The query tile of one team: queries `[i0, i0 + nq)` of query head `h`, which reads key head
/// `hk`.
struct HostQueryTile {
  int h = 0, hk = 0;
  std::int64_t i0 = 0;
  int nq = 0;
  /// The query of row `r`; rows past the tile's queries repeat its last query, so that their
  /// tokens widen neither the key range nor the visibility tests.
  std::int64_t query(int r) const { return r < nq ? i0 + r : i0 + nq - 1; }
};

/// The inputs of a host kernel over query tiles and the steps every such kernel takes with them
/// (the kernel keeps its own outputs and per-row state).
template <class Scalar, class MemorySpace, class Mask>
struct HostQueryTiles {
  using acc = accumulator_t<Scalar>;
  AttentionInputs<Scalar, MemorySpace> in;
  PackedKeys<acc, MemorySpace> packed;
  Mask mask;
  KernelShape<Scalar, MemorySpace> shape;
  /// Query tiles per head (the league is `tiles * Hq`).
  std::int64_t tiles;
  /// Scratch level of the team's scratch (`host_kernel_policy`).
  int level;
  ctxpar::HostIsa isa;

  template <class Member>
  HostQueryTile tile(const Member& team) const {
    HostQueryTile t;
    t.h = static_cast<int>(team.league_rank() / tiles);
    t.i0 = (team.league_rank() % tiles) * query_tile;
    t.nq = static_cast<int>(shape.tq - t.i0 < query_tile ? shape.tq - t.i0 : query_tile);
    t.hk = t.h / shape.group;
    return t;
  }

  /// The team's scratch of `bytes`, as accumulators.
  template <class Member>
  acc* scratch(const Member& team, std::size_t bytes) const {
    return static_cast<acc*>(team.team_scratch(level).get_shmem(bytes));
  }

  /// The tokens of the tile's rows (into `qtok`) and its queries times the softmax scale as
  /// zero-padded rows of `packed.dp` (into `qs`; rows past the queries are zeros).
  void load_queries(const HostQueryTile& t, mask::Token* qtok, acc* qs) const {
    const Scalar* qrow[query_tile];
    for (int r = 0; r < query_tile; ++r) {
      const std::int64_t i = t.query(r);
      qtok[r] = query_token(in, i);
      qrow[r] = r < t.nq ? &in.q(i, t.h, 0) : nullptr;
    }
    host_copy_rows(qrow, query_tile, shape.dim, packed.dp, static_cast<acc>(in.scale), qs);
  }

  /// Calls `body(range, ktok, kvalid, full, off)` for each packed key tile that a query of `t`
  /// (tokens `qtok`) may see, in increasing order: the key tokens and validity of the tile, whether
  /// every pair of the tile is visible, and the tile's offset in `packed`.
  template <class Body>
  void for_each_key_tile(const HostQueryTile& t, const mask::Token* qtok, Body&& body) const {
    mask::Token ktok[key_tile];
    bool kvalid[key_tile];
    const WindowRange range = window_range(in);
    std::int64_t lo, hi, j0;
    key_range(in, range, shape.nk, qtok[0].pos, qtok[t.nq - 1].pos, lo, hi, j0);
    for (; j0 < hi; j0 += key_tile) {
      host_key_tokens(in, j0, lo, hi, ktok, kvalid);
      const bool full = tile_fully_visible(mask, range, qtok, query_tile, ktok, kvalid);
      body(range, static_cast<const mask::Token*>(ktok), static_cast<const bool*>(kvalid), full,
           packed.offset(j0, t.hk, shape.hkv));
    }
  }
};

}  // namespace ctxpar::swa::impl
