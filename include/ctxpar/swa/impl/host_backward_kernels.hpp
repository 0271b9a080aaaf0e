/// \file
/// The backward attention kernels of the host execution spaces: dQ per (query head, query tile)
/// (`HostQueryGradientKernel`), dK and dV per (key head, key segment) (`HostKeyGradientKernel`),
/// which in the fused backward also sums the dQ partial rows that `SumQueryGradientPartsKernel`
/// adds up, and the rule that picks the fused backward (`fused_backward_segments`).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

#include "ctxpar/core/host_isa.hpp"
#include "ctxpar/core/impl/isa_dispatch.hpp"
#include "ctxpar/core/workspace.hpp"
#include "ctxpar/expr/mask.hpp"
#include "ctxpar/swa/attention_inputs.hpp"
#include "ctxpar/swa/impl/attention_tiles.hpp"
#include "ctxpar/swa/impl/host_kernel.hpp"
#include "ctxpar/swa/impl/host_packing.hpp"
#include "ctxpar/swa/impl/host_query_tiles.hpp"
#include "ctxpar/swa/impl/host_tile_mask.hpp"
#include "ctxpar/swa/impl/kernel_math.hpp"
#include "ctxpar/swa/impl/window_range.hpp"
#include "ctxpar/swa/options.hpp"

CTXPAR_WIDE_VECTORS_BEGIN
namespace ctxpar::swa::impl {

/// Softmax weights (into `p`) and score gradients (into `ds`) of `rows` query rows against one
/// packed key tile, for the host backward kernels. The scores stay in registers from the product
/// to the exponential (`host_mask_scores`).
template <int Rows, int Bytes, class Mask, class T>
void host_weights_and_gradients(const Mask& mask, const WindowRange& range, int dp, const T* qs,
                                const T* dos, const T* kt, const T* vt, const T* lses,
                                const T* deltas, const mask::Token* qtok, int valid_rows,
                                const mask::Token* ktok, const bool* kvalid, bool full, T* p,
                                T* ds) {
  using simd = simd_t<T, Bytes>;
  constexpr int nv = tile_vectors<T, Bytes>, lanes = Simd<T, Bytes>::lanes;
  simd s[Rows][nv];
  host_scores<Rows>(qs, dp, kt, dp, s);
  if (!full || valid_rows < Rows)
    host_mask_scores<Rows>(mask, range, qtok, valid_rows, ktok, kvalid, s, p);
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < nv; ++c)
      simd_store(
          p + r * key_tile + c * lanes,
          simd_zero_where<T, Bytes>(s[r][c], masked_score<T>(), simd_exp(s[r][c] - lses[r])));
  host_scores<Rows>(dos, dp, vt, dp, s);
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < nv; ++c)
      simd_store(ds + r * key_tile + c * lanes,
                 simd_load<T, Bytes>(p + r * key_tile + c * lanes) * (s[r][c] - deltas[r]));
}

/// Backward for dQ on the host when the backward is not fused (see `fused_backward_segments`): one
/// team per (query head, query tile).
template <class Scalar, class MemorySpace, class Mask, class Member>
struct HostQueryGradientKernel {
  using acc = accumulator_t<Scalar>;
  HostQueryTiles<Scalar, MemorySpace, Mask> queries;
  Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace> dout;
  Kokkos::View<const acc**, Kokkos::LayoutRight, MemorySpace> lse, delta;
  Kokkos::View<accumulator_t<Scalar>***, Kokkos::LayoutRight, MemorySpace> dq;

  static std::size_t scratch_bytes(int dp) {
    return sizeof(acc) * (3 * std::size_t(query_tile) * dp + 2 * query_tile) + 64;
  }

  void operator()(const Member& team) const {
    ctxpar::impl::run_kernel<true>(queries.isa, *this, team);
  }

  template <int Bytes>
  void run(const Member& team) const {
    constexpr int rows = score_rows<acc, Bytes>;
    const HostQueryTile t = queries.tile(team);
    const int D = queries.shape.dim, dp = queries.packed.dp, nq = t.nq;
    acc* qs = queries.scratch(team, scratch_bytes(dp));
    acc* dos = qs + query_tile * dp;
    acc* dqs = dos + query_tile * dp;
    acc* lses = dqs + query_tile * dp;
    acc* deltas = lses + query_tile;
    const Scalar* drow[query_tile];
    for (int r = 0; r < query_tile; ++r) {
      const std::int64_t i = t.query(r);
      lses[r] = lse(i, t.h);
      deltas[r] = delta(i, t.h);
      drow[r] = r < nq ? &dout(i, t.h, 0) : nullptr;
      for (int d = 0; d < dp; ++d) dqs[r * dp + d] = acc(0);
    }
    mask::Token qtok[query_tile];
    queries.load_queries(t, qtok, qs);
    host_copy_rows(drow, query_tile, D, dp, acc(1), dos);
    alignas(64) acc p[rows * key_tile];
    alignas(64) acc ds[rows * key_tile];
    queries.for_each_key_tile(t, qtok,
                              [&](const WindowRange& range, const mask::Token* ktok,
                                  const bool* kvalid, bool full, std::size_t off) {
                                const PackedKeys<acc, MemorySpace>& packed = queries.packed;
                                for (int r0 = 0; r0 < nq; r0 += rows) {
                                  host_weights_and_gradients<rows, Bytes>(
                                      queries.mask, range, dp, qs + r0 * dp, dos + r0 * dp,
                                      packed.kt.data() + off, packed.vt.data() + off, lses + r0,
                                      deltas + r0, qtok + r0, nq - r0, ktok, kvalid, full, p, ds);
                                  for (int b = 0; b < rows; b += 4)
                                    simd_rows_accumulate<4, Bytes>(ds + b * key_tile, key_tile, 1,
                                                                   key_tile, packed.kr.data() + off,
                                                                   dp, dqs + (r0 + b) * dp, dp, dp);
                                }
                              });
    const acc scale = static_cast<acc>(queries.in.scale);
    for (int r = 0; r < nq; ++r) {
      acc* o = &dq(t.i0 + r, t.h, 0);
      for (int d = 0; d < D; ++d) o[d] = dqs[r * dp + d] * scale;
    }
  }
};

/// Key segments of the fused host backward: runs of `tiles` key tiles on the global tile grid
/// (segment `s` holds global tiles `[s * tiles, (s + 1) * tiles)`), and for each segment present on
/// the local axis the query rows `[lo, hi)` that may see one of its keys. With segments at least a
/// window long, a query sees keys of at most two consecutive segments, so each segment writes its
/// dQ partial sums into the slot of its parity and no two teams write the same row.
struct KeySegments {
  /// Key tiles per segment (1 when dQ has its own kernel).
  std::int64_t tiles = 1;
  /// Global index of the first segment present and the number present.
  std::int64_t first = 0, count = 0;
  /// Global index of the local axis's first packed tile.
  std::int64_t first_tile = 0;
};

/// Offset of segment `s`'s dQ partial row of query `i` and head `h` in `[2][Hq][tq][dp]` (the
/// slot is the segment's parity).
inline std::size_t dq_part_offset(std::int64_t s, int h, std::int64_t i, int hq, std::int64_t tq,
                                  int dp) {
  return static_cast<std::size_t>(((s % 2 * hq + h) * tq + i) * dp);
}

/// Backward for dK and dV on the host: one team per (KV head, key segment), looping over the
/// segment's packed key tiles, the query heads of the group and the query tiles that can see a
/// tile. With `dq_parts` it also sums `dS_ij k_j` into the segment's dQ partial rows (the fused
/// backward: the weights and score gradients are computed once for dQ, dK and dV); without, dQ
/// comes from `HostQueryGradientKernel` and segments are single tiles.
template <class Scalar, class MemorySpace, class Mask, class Member>
struct HostKeyGradientKernel {
  using acc = accumulator_t<Scalar>;
  AttentionInputs<Scalar, MemorySpace> in;
  Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace> dout;
  Kokkos::View<const acc**, Kokkos::LayoutRight, MemorySpace> lse, delta;
  Kokkos::View<accumulator_t<Scalar>***, Kokkos::LayoutRight, MemorySpace> dk, dv;
  PackedKeys<acc, MemorySpace> packed;
  /// `PackRowsKernel`'s output.
  Kokkos::View<const acc*, MemorySpace> qrows, dorows;
  std::int64_t rows_per_head;
  Mask mask;
  KernelShape<Scalar, MemorySpace> shape;
  KeySegments segments;
  /// dQ partial rows `[2][Hq][tq][dp]` (slot = segment parity), or empty.
  Kokkos::View<acc*, MemorySpace> dq_parts;
  /// Query rows `[lo, hi)` of each present segment, `[count][2]` (with `dq_parts`).
  Kokkos::View<const std::int64_t*, MemorySpace> segment_rows;
  int level;
  ctxpar::HostIsa isa;

  static std::size_t scratch_bytes(int dp) {
    return sizeof(acc) * (2 * std::size_t(key_tile) * dp + 2 * std::size_t(query_tile) * key_tile +
                          2 * query_tile) +
           64;
  }

  /// Segment `s`'s dQ partial row of query `i` and head `h`.
  acc* part_row(std::int64_t s, int h, std::int64_t i) const {
    return dq_parts.data() + dq_part_offset(s, h, i, shape.hq, shape.tq, packed.dp);
  }

  void operator()(const Member& team) const { ctxpar::impl::run_kernel<true>(isa, *this, team); }

  template <int Bytes>
  void run(const Member& team) const {
    const int dp = packed.dp;
    const int hk = static_cast<int>(team.league_rank() / segments.count);
    const std::int64_t k = team.league_rank() % segments.count, s = segments.first + k;
    const std::int64_t t_begin = s * segments.tiles - segments.first_tile;
    const std::int64_t t_end = t_begin + segments.tiles;
    acc* dks = static_cast<acc*>(team.team_scratch(level).get_shmem(scratch_bytes(dp)));
    if (dq_parts.extent(0) > 0) {
      const std::int64_t lo = segment_rows(2 * k), hi = segment_rows(2 * k + 1);
      for (int h = hk * shape.group; h < (hk + 1) * shape.group; ++h)
        for (acc *x = part_row(s, h, lo), *end = part_row(s, h, hi); x < end; ++x) *x = acc(0);
    }
    for (std::int64_t t = t_begin > 0 ? t_begin : 0; t < t_end && t < packed.tiles; ++t)
      tile<Bytes>(hk, s, packed.base + t * key_tile, dks);
  }

  /// dK and dV of the key tile starting at local key `j0` (and its dQ partial sums).
  template <int Bytes>
  void tile(int hk, std::int64_t s, std::int64_t j0, acc* dks) const {
    constexpr int rows = score_rows<acc, Bytes>;
    const int D = shape.dim, dp = packed.dp;
    const std::int64_t jlo = j0 > 0 ? j0 : 0;
    const std::int64_t jhi = j0 + key_tile < shape.nk ? j0 + key_tile : shape.nk;
    acc* dvs = dks + key_tile * dp;
    acc* ps = dvs + key_tile * dp;
    acc* dss = ps + query_tile * key_tile;
    acc* lses = dss + query_tile * key_tile;
    acc* deltas = lses + query_tile;
    mask::Token qtok[query_tile], ktok[key_tile];
    bool kvalid[key_tile];
    host_key_tokens(in, j0, jlo, jhi, ktok, kvalid);
    const std::size_t off = packed.offset(j0, hk, shape.hkv);
    const acc* kt = packed.kt.data() + off;
    const acc* vt = packed.vt.data() + off;
    const acc* kr = packed.kr.data() + off;
    for (int x = 0; x < key_tile * dp; ++x) {
      dks[x] = acc(0);
      dvs[x] = acc(0);
    }
    // Queries that may see a key of this tile.
    const WindowRange range = window_range(in);
    std::int64_t qlo, qhi;
    range.queries(in.q_pos, shape.tq, in.k_pos(jlo), in.k_pos(jhi - 1), qlo, qhi);
    for (int h = hk * shape.group; h < (hk + 1) * shape.group; ++h) {
      for (std::int64_t i0 = qlo; i0 < qhi; i0 += query_tile) {
        const int nq = static_cast<int>(qhi - i0 < query_tile ? qhi - i0 : query_tile);
        const int nr = (nq + rows - 1) / rows * rows;
        const acc* qs = qrows.data() + (h * rows_per_head + i0) * dp;
        const acc* dos = dorows.data() + (h * rows_per_head + i0) * dp;
        for (int r = 0; r < nr; ++r) {
          const std::int64_t i = r < nq ? i0 + r : i0 + nq - 1;
          qtok[r] = query_token(in, i);
          lses[r] = lse(i, h);
          deltas[r] = delta(i, h);
        }
        for (int r = nr; r < query_tile; ++r) qtok[r] = qtok[nr - 1];
        const bool full = tile_fully_visible(mask, range, qtok, query_tile, ktok, kvalid);
        acc* dqp = dq_parts.extent(0) > 0 ? part_row(s, h, i0) : nullptr;
        for (int r0 = 0; r0 < nq; r0 += rows) {
          host_weights_and_gradients<rows, Bytes>(
              mask, range, dp, qs + r0 * dp, dos + r0 * dp, kt, vt, lses + r0, deltas + r0,
              qtok + r0, nq - r0, ktok, kvalid, full, ps + r0 * key_tile, dss + r0 * key_tile);
          if (dqp) {
            // Only the rows of queries in range: the rows past them belong to other teams.
            const int end = nq < r0 + rows ? nq : r0 + rows;
            int r = r0;
            for (; r + 4 <= end; r += 4)
              simd_rows_accumulate<4, Bytes>(dss + r * key_tile, key_tile, 1, key_tile, kr, dp,
                                             dqp + r * dp, dp, dp);
            for (; r < end; ++r)
              simd_rows_accumulate<1, Bytes>(dss + r * key_tile, key_tile, 1, key_tile, kr, dp,
                                             dqp + r * dp, dp, dp);
          }
        }
        for (int j = 0; j < key_tile; j += 4) {
          // Only the rows of queries in range: the rows past them may hold other queries.
          simd_rows_accumulate<4, Bytes>(ps + j, 1, key_tile, nq, dos, dp, dvs + j * dp, dp, dp);
          simd_rows_accumulate<4, Bytes>(dss + j, 1, key_tile, nq, qs, dp, dks + j * dp, dp, dp);
        }
      }
    }
    for (std::int64_t g = jlo; g < jhi; ++g) {
      acc* ko = &dk(g, hk, 0);
      acc* vo = &dv(g, hk, 0);
      for (int d = 0; d < D; ++d) {
        ko[d] = dks[(g - j0) * dp + d];
        vo[d] = dvs[(g - j0) * dp + d];
      }
    }
  }
};

/// `dq = scale * sum of the dQ partial rows of the segments that cover the query`, in increasing
/// segment order (at most two), one work item per (query head, query).
template <class Scalar, class MemorySpace>
struct SumQueryGradientPartsKernel {
  using acc = accumulator_t<Scalar>;
  Kokkos::View<const acc*, MemorySpace> dq_parts;
  Kokkos::View<const std::int64_t*, MemorySpace> segment_rows;
  Kokkos::View<accumulator_t<Scalar>***, Kokkos::LayoutRight, MemorySpace> dq;
  KeySegments segments;
  acc scale;
  std::int64_t tq;
  int hq, dim, dp;
  void operator()(const std::int64_t flat) const {
    const int h = static_cast<int>(flat / tq);
    const std::int64_t i = flat % tq;
    // First segment whose rows end past i (the row ends increase with the segment).
    std::int64_t lo = 0, hi = segments.count;
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (segment_rows(2 * mid + 1) <= i)
        lo = mid + 1;
      else
        hi = mid;
    }
    const acc* rows[2] = {nullptr, nullptr};
    int n = 0;
    for (std::int64_t k = lo; k < segments.count && n < 2 && segment_rows(2 * k) <= i; ++k) {
      rows[n++] = dq_parts.data() + dq_part_offset(segments.first + k, h, i, hq, tq, dp);
    }
    acc* o = &dq(i, h, 0);
    for (int d = 0; d < dim; ++d) {
      acc sum = acc(0);
      for (int m = 0; m < n; ++m) sum += rows[m][d];
      o[d] = sum * scale;
    }
  }
};

/// The measured rule of `KernelChoice::automatic` for the host backward: true when the fused
/// backward is the faster one for padded head dimension `dp` and the window of `range` (`W > 0`).
/// Measured with one thread (bench/swa kernel cases, t = 1024, Hq = 4, Hkv = 1; docs/swa.md §4,
/// point 5). On an AVX2 host (16 vector registers), fused, the backward goes from 0.58-0.70 to
/// 0.82-0.89 of SGEMM at D = 64 for every window, and at D = 128 for W >= 2048, but drops from
/// 0.60-0.70 to 0.40-0.56 at D = 128 with W = 512 and 1024; those shapes keep the two-kernel
/// backward there. On an AVX-512 host (Zen 4, 32 registers) fusing wins at D = 128 for every
/// window: W = 512 from 0.77-0.83 to 0.91-0.99, W = 1024 from 0.79-0.82 to 1.01-1.14 (three
/// alternating runs each).
inline bool fused_backward_pays(int dp, const WindowRange& range, ctxpar::HostIsa isa) {
  const bool avx512_registers = CTXPAR_HOST_SIMD && ctxpar::impl::host_isa_bytes(isa) >= 64;
  return !(dp > 64 && range.window < 2048 && !avx512_registers);
}

/// The key segments of the fused host backward and their query rows (into `rows`), or `false`
/// when the fused backward does not run: an unlimited window, `KernelChoice::host_unfused`, the
/// measured rule under `KernelChoice::automatic` (`fused_backward_pays`), or positions under which
/// a query would see keys of more than two segments.
template <class Scalar, class MemorySpace>
bool fused_backward_segments(const AttentionInputs<Scalar, MemorySpace>& in,
                             const KernelShape<Scalar, MemorySpace>& shape,
                             const PackedKeys<accumulator_t<Scalar>, MemorySpace>& packed,
                             GrowingBuffer<MemorySpace>& storage, KeySegments& segments,
                             Kokkos::View<std::int64_t*, MemorySpace>& rows, ctxpar::HostIsa isa,
                             KernelChoice kernels) {
  const WindowRange range = window_range(in);
  if (!range.limited() || kernels == KernelChoice::host_unfused) return false;
  if (kernels == KernelChoice::automatic && !fused_backward_pays(packed.dp, range, isa))
    return false;
  segments.tiles = range.tiles_per_window(key_tile);
  segments.first_tile = in.key_origin / key_tile;
  segments.first = segments.first_tile / segments.tiles;
  segments.count = (segments.first_tile + packed.tiles - 1) / segments.tiles - segments.first + 1;
  rows = carve<Kokkos::View<std::int64_t*, MemorySpace>>(storage, 2 * segments.count);
  for (std::int64_t k = 0; k < segments.count; ++k) {
    const std::int64_t s = segments.first + k;
    const std::int64_t t_begin = s * segments.tiles - segments.first_tile;
    std::int64_t jlo = packed.base + t_begin * key_tile;
    std::int64_t jhi = jlo + segments.tiles * key_tile;
    jlo = jlo > 0 ? jlo : 0;
    jhi = jhi < shape.nk ? jhi : shape.nk;
    std::int64_t qlo, qhi;
    range.queries(in.q_pos, shape.tq, in.k_pos(jlo), in.k_pos(jhi - 1), qlo, qhi);
    rows(2 * k) = qlo;
    rows(2 * k + 1) = qhi;
    // Rows that only grow, and a segment's rows clear of the segment two before (same slot).
    if (k > 0 && (rows(2 * k) < rows(2 * k - 2) || rows(2 * k + 1) < rows(2 * k - 1))) return false;
    if (k > 1 && rows(2 * k) < rows(2 * k - 3)) return false;
  }
  return true;
}

}  // namespace ctxpar::swa::impl
CTXPAR_WIDE_VECTORS_END
