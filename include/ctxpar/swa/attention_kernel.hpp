/// \file
/// The local sliding-window attention kernels (flash-style, tiled, GQA-aware, mask inlined), used
/// by both the single-rank and the distributed step. They see already-rotated queries and keys.
#pragma once

#include <Kokkos_Core.hpp>

#include <cfloat>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/expr/mask.hpp"
#include "ctxpar/swa/attention_inputs.hpp"
#include "ctxpar/swa/document_mask.hpp"
#include "ctxpar/swa/impl/attention_tiles.hpp"
#include "ctxpar/swa/impl/host_kernel.hpp"
#include "ctxpar/swa/impl/kernel_math.hpp"
#include "ctxpar/swa/impl/team_kernels.hpp"
#include "ctxpar/swa/impl/window_range.hpp"
#include "ctxpar/swa/options.hpp"

CTXPAR_WIDE_VECTORS_BEGIN
namespace ctxpar::swa {

namespace impl {

/// Keys and values of the local axis repacked on the global key-tile grid (host kernels): tile `t`
/// of head `hk` starts at offset `(t * Hkv + hk) * key_tile * dp`, keys outside the axis and
/// columns past `D` are zeros. `kt`/`vt` hold a tile transposed (`[dp][key_tile]`), `kr`/`vr`
/// row-major (`[key_tile][dp]`); only the layouts a kernel asks for are filled.
template <class Acc, class MemorySpace>
struct PackedKeys {
  Kokkos::View<Acc*, MemorySpace> kt, kr, vt, vr;
  /// Local index of the first packed key (`<= 0`: the tile grid is anchored to the whole axis).
  std::int64_t base = 0;
  std::int64_t tiles = 0;
  int dp = 0;
  std::size_t offset(std::int64_t j0, int hk, int hkv) const {
    return static_cast<std::size_t>(((j0 - base) / key_tile * hkv + hk) * key_tile * dp);
  }
};

/// Copies `rows` rows of `dim` scalars (null rows: zeros) into `out` (row stride `dp`, columns
/// past `dim` zero), converting to the accumulator type. Contiguous loops the compiler vectorises:
/// the packing kernels move every key, value and query of a step, so an element-at-a-time loop
/// through 3-d view indexing would cost a few times the memory traffic.
template <class Acc, class Scalar>
inline void host_copy_rows(const Scalar* const* row, int rows, int dim, int dp, Acc scale,
                           Acc* out) {
  for (int j = 0; j < rows; ++j) {
    Acc* dst = out + static_cast<std::size_t>(j) * dp;
    int d = 0;
    if (row[j] != nullptr)
      for (; d < dim; ++d) dst[d] = static_cast<Acc>(row[j][d]) * scale;
    for (; d < dp; ++d) dst[d] = Acc(0);
  }
}

/// The same rows transposed: `out[d * rows + j]` = row `j`, column `d`.
template <class Acc, class Scalar>
inline void host_copy_rows_transposed(const Scalar* const* row, int rows, int dim, int dp,
                                      Acc* out) {
  for (int d = 0; d < dp; ++d) {
    Acc* dst = out + static_cast<std::size_t>(d) * rows;
    for (int j = 0; j < rows; ++j)
      dst[j] = d < dim && row[j] != nullptr ? static_cast<Acc>(row[j][d]) : Acc(0);
  }
}

template <class Scalar, class MemorySpace>
struct PackKeysKernel {
  using acc = accumulator_t<Scalar>;
  AttentionInputs<Scalar, MemorySpace> in;
  PackedKeys<acc, MemorySpace> packed;
  KernelShape<Scalar, MemorySpace> shape;
  void operator()(const std::int64_t flat) const {
    const std::int64_t tile = flat / shape.hkv;
    const int hk = static_cast<int>(flat % shape.hkv);
    const int dp = packed.dp;
    const std::size_t off = static_cast<std::size_t>(flat) * key_tile * dp;
    // The tile's key and value rows; null outside the axis (packed as zeros).
    const Scalar* krow[key_tile];
    const Scalar* vrow[key_tile];
    for (int j = 0; j < key_tile; ++j) {
      const std::int64_t g = packed.base + tile * key_tile + j;
      const bool ok = g >= 0 && g < shape.nk;
      krow[j] = ok ? &in.k(g, hk, 0) : nullptr;
      vrow[j] = ok ? &in.v(g, hk, 0) : nullptr;
    }
    if (packed.kt.extent(0))
      host_copy_rows_transposed(krow, key_tile, shape.dim, dp, packed.kt.data() + off);
    if (packed.kr.extent(0))
      host_copy_rows(krow, key_tile, shape.dim, dp, acc(1), packed.kr.data() + off);
    if (packed.vt.extent(0))
      host_copy_rows_transposed(vrow, key_tile, shape.dim, dp, packed.vt.data() + off);
    if (packed.vr.extent(0))
      host_copy_rows(vrow, key_tile, shape.dim, dp, acc(1), packed.vr.data() + off);
  }
};

template <class ExecutionSpace, class Scalar, class MemorySpace>
PackedKeys<accumulator_t<Scalar>, MemorySpace> pack_keys(
    const ExecutionSpace& space, const AttentionInputs<Scalar, MemorySpace>& in,
    const KernelShape<Scalar, MemorySpace>& shape, AttentionWorkspace<MemorySpace>& workspace,
    bool kt, bool kr, bool vt, bool vr, ctxpar::HostIsa isa) {
  using acc = accumulator_t<Scalar>;
  PackedKeys<acc, MemorySpace> p;
  p.base = -(in.key_origin % key_tile);
  p.tiles = (shape.nk - p.base + key_tile - 1) / key_tile;
  // Rows padded to whole vectors of the width the kernels will run at.
  p.dp = padded_dim(shape.dim, ctxpar::impl::host_isa_bytes(isa) / static_cast<int>(sizeof(acc)));
  const std::size_t n = static_cast<std::size_t>(p.tiles * shape.hkv * key_tile * p.dp);
  const auto alloc = [&](GrowingBuffer<MemorySpace>& storage, bool want) {
    return carve<Kokkos::View<acc*, MemorySpace>>(storage, want ? n : 0);
  };
  p.kt = alloc(workspace.keys_t, kt);
  p.kr = alloc(workspace.keys_r, kr);
  p.vt = alloc(workspace.values_t, vt);
  p.vr = alloc(workspace.values_r, vr);
  if (n > 0)
    Kokkos::parallel_for("ctxpar::swa::pack_keys",
                         Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(
                             space, 0, p.tiles * shape.hkv),
                         PackKeysKernel<Scalar, MemorySpace>{in, p, shape});
  return p;
}

/// Key tokens and validity of the packed tile starting at local key `j0`; keys outside
/// `[lo, hi)` are invalid.
template <class Scalar, class MemorySpace>
void host_key_tokens(const AttentionInputs<Scalar, MemorySpace>& in, std::int64_t j0,
                     std::int64_t lo, std::int64_t hi, mask::Token* tok, bool* valid) {
  for (int j = 0; j < key_tile; ++j) {
    const std::int64_t g = j0 + j;
    valid[j] = g >= lo && g < hi;
    tok[j] = valid[j] ? key_token(in, g) : mask::Token{0, 0};
  }
}

/// Scores of `rows` rows (in `p`, row stride `key_tile`) set to `masked_score` where the pair is
/// not visible (`visible`); rows past `valid_rows` are masked entirely.
template <class Mask, class T>
void host_mask_rows(const Mask& mask, const WindowRange& range, const mask::Token* qtok, int rows,
                    int valid_rows, const mask::Token* ktok, const bool* kvalid, T* p) {
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < key_tile; ++j)
      if (!(r < valid_rows && kvalid[j] && visible(mask, range, qtok[r], ktok[j])))
        p[r * key_tile + j] = masked_score<T>();
}

/// The visible keys of one key tile as a run of lanes per query row, for `DocumentMask` when the
/// tile's valid keys and the rows all belong to one sequence (`window_runs` returns false
/// otherwise, and the caller evaluates the mask pair by pair). Keys are sorted by position, so
/// the keys row `r` sees are the lanes `[lo[r], hi[r])` that `range` gives; rows past
/// `valid_rows` see none. Masking a lane range in registers gives the same `masked_score` bits
/// as `host_mask_rows`, without the per-pair calls or the round trip through memory.
template <class Mask>
bool window_runs(const Mask& mask, const WindowRange& range, const mask::Token* qtok, int rows,
                 int valid_rows, const mask::Token* ktok, const bool* kvalid, int* lo, int* hi) {
  (void)mask;
  if constexpr (std::is_same_v<Mask, DocumentMask>) {
    int first = 0, end = key_tile;  // the valid keys are one run (an interval of the axis)
    while (first < key_tile && !kvalid[first]) ++first;
    while (end > first && !kvalid[end - 1]) --end;
    if (first == end) return false;
    const std::int32_t id = ktok[first].seq;
    for (int j = first; j < end; ++j)
      if (!kvalid[j] || ktok[j].seq != id) return false;
    for (int r = 0; r < rows && r < valid_rows; ++r)
      if (qtok[r].seq != id) return false;
    const auto lane_pos = [&](std::int64_t j) { return ktok[j].pos; };
    for (int r = 0; r < rows; ++r) {
      if (r >= valid_rows) {
        lo[r] = hi[r] = 0;
        continue;
      }
      std::int64_t a, b;
      range.keys(lane_pos, first, end, qtok[r].pos, qtok[r].pos, a, b);
      lo[r] = static_cast<int>(a);
      hi[r] = static_cast<int>(b);
    }
    return true;
  } else {
    (void)range, (void)qtok, (void)rows, (void)valid_rows, (void)ktok, (void)kvalid, (void)lo,
        (void)hi;
    return false;
  }
}

/// Masks the scores `s` of `Rows` query rows against one key tile in registers: a tile the window
/// cuts (`window_runs`) by a lane range per row, any other mask pair by pair through `p` (scratch
/// of `Rows * key_tile`). Rows past `valid_rows` are masked entirely.
template <int Rows, class Mask, class T, class V, int Vectors>
void host_mask_scores(const Mask& mask, const WindowRange& range, const mask::Token* qtok,
                      int valid_rows, const mask::Token* ktok, const bool* kvalid,
                      V (&s)[Rows][Vectors], T* p) {
  constexpr int nv = Vectors, lanes = simd_lanes<V>, bytes = static_cast<int>(sizeof(V));
  int lo[Rows], hi[Rows];
  if (window_runs(mask, range, qtok, Rows, valid_rows, ktok, kvalid, lo, hi)) {
    alignas(64) T lane_index[key_tile];  // 0, 1, ..., key_tile - 1 (exact in any float type)
    for (int j = 0; j < key_tile; ++j) lane_index[j] = static_cast<T>(j);
    for (int r = 0; r < Rows; ++r)
      for (int c = 0; c < nv; ++c) {
        const V j = simd_load<T, bytes>(lane_index + c * lanes);
        s[r][c] = (j >= static_cast<T>(lo[r])) & (j < static_cast<T>(hi[r]))
                      ? s[r][c]
                      : simd_broadcast<T, bytes>(masked_score<T>());
      }
  } else {
    for (int r = 0; r < Rows; ++r)
      for (int c = 0; c < nv; ++c) simd_store(p + r * key_tile + c * lanes, s[r][c]);
    host_mask_rows(mask, range, qtok, Rows, valid_rows, ktok, kvalid, p);
    for (int r = 0; r < Rows; ++r)
      for (int c = 0; c < nv; ++c) s[r][c] = simd_load<T, bytes>(p + r * key_tile + c * lanes);
  }
}

/// Forward on the host: one team per (query head, query tile), register-blocked tile products
/// on the packed keys; online softmax per row over the globally anchored key tiles, like the
/// portable forward (`impl/team_kernels.hpp`), though not bitwise equal to it.
template <class Scalar, class MemorySpace, class Mask, class Member>
struct HostForwardKernel {
  using acc = accumulator_t<Scalar>;
  AttentionInputs<Scalar, MemorySpace> in;
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace> out;
  Kokkos::View<acc**, Kokkos::LayoutRight, MemorySpace> lse;
  PackedKeys<acc, MemorySpace> packed;
  Mask mask;
  KernelShape<Scalar, MemorySpace> shape;
  std::int64_t tiles;
  int level;
  ctxpar::HostIsa isa;

  // Per query row: the scaled query, the output accumulator, the running maximum and the running
  // sum of weights, kept lane by lane (one vector per row, sized for the widest) and summed once
  // at the end, so the tile loop makes no horizontal reduction for it.
  static std::size_t scratch_bytes(int dp) {
    return sizeof(acc) * (2 * std::size_t(query_tile) * dp + query_tile) +
           std::size_t(query_tile) * ctxpar::impl::max_simd_bytes + 64;
  }

  void operator()(const Member& team) const { ctxpar::impl::run_kernel<true>(isa, *this, team); }

  template <int Bytes>
  void run(const Member& team) const {
    using simd = simd_t<acc, Bytes>;
    constexpr int rows = score_rows<acc, Bytes>, nv = tile_vectors<acc, Bytes>,
                  lanes = Simd<acc, Bytes>::lanes;
    const int D = shape.dim, dp = packed.dp;
    const int h = static_cast<int>(team.league_rank() / tiles);
    const std::int64_t i0 = (team.league_rank() % tiles) * query_tile;
    const int nq = static_cast<int>(shape.tq - i0 < query_tile ? shape.tq - i0 : query_tile);
    const int hk = h / shape.group;
    acc* qs = static_cast<acc*>(team.team_scratch(level).get_shmem(scratch_bytes(dp)));
    acc* os = qs + query_tile * dp;
    acc* ms = os + query_tile * dp;
    acc* ls = ms + query_tile;  // [query_tile][lanes]
    mask::Token qtok[query_tile], ktok[key_tile];
    bool valid[key_tile];
    const acc scale = static_cast<acc>(in.scale);
    const Scalar* qrow[query_tile];
    for (int r = 0; r < query_tile; ++r) {
      const std::int64_t i = r < nq ? i0 + r : i0 + nq - 1;
      qtok[r] = query_token(in, i);
      qrow[r] = r < nq ? &in.q(i, h, 0) : nullptr;
      for (int d = 0; d < dp; ++d) os[r * dp + d] = acc(0);
      ms[r] = masked_score<acc>();
      simd_store(ls + r * lanes, simd_zero<acc, Bytes>());
    }
    host_copy_rows(qrow, query_tile, D, dp, scale, qs);
    const WindowRange range = window_range(in);
    std::int64_t lo, hi, j0;
    key_range(in, range, shape.nk, qtok[0].pos, qtok[nq - 1].pos, lo, hi, j0);
    alignas(64) acc p[rows * key_tile];
    for (; j0 < hi; j0 += key_tile) {
      host_key_tokens(in, j0, lo, hi, ktok, valid);
      const bool full = tile_fully_visible(mask, range, qtok, query_tile, ktok, valid);
      const std::size_t off = packed.offset(j0, hk, shape.hkv);
      const acc* kt = packed.kt.data() + off;
      const acc* vr = packed.vr.data() + off;
      for (int r0 = 0; r0 < nq; r0 += rows) {
        simd s[rows][nv];
        host_scores<rows>(qs + r0 * dp, dp, kt, dp, s);
        if (!full)
          host_mask_scores<rows>(mask, range, qtok + r0, query_tile - r0, ktok, valid, s, p);
        // The rows' new maxima, then their rescaling factors in whole vectors (`simd_exp` gives
        // the bits of the scalar `fast_exp`).
        constexpr int alpha_lanes = (rows + lanes - 1) / lanes * lanes;
        alignas(64) acc mnew[alpha_lanes], alpha[alpha_lanes];
        for (int r = 0; r < rows; ++r) {
          simd mx = s[r][0];
          for (int c = 1; c < nv; ++c) mx = simd_max<acc, Bytes>(mx, s[r][c]);
          const acc rowmax = simd_max_lane<acc, Bytes>(mx);
          mnew[r] = ms[r0 + r] > rowmax ? ms[r0 + r] : rowmax;
          alpha[r] = ms[r0 + r] - mnew[r];
        }
        for (int r = rows; r < alpha_lanes; ++r) alpha[r] = acc(0);
        for (int a = 0; a < alpha_lanes; a += lanes)
          simd_store(alpha + a, simd_exp(simd_load<acc, Bytes>(alpha + a)));
        for (int r = 0; r < rows; ++r) {
          const int row = r0 + r;
          simd sum = simd_zero<acc, Bytes>();
          for (int c = 0; c < nv; ++c) {
            const simd e = simd_zero_where<acc, Bytes>(s[r][c], masked_score<acc>(),
                                                       simd_exp(s[r][c] - mnew[r]));
            simd_store(p + r * key_tile + c * lanes, e);
            sum += e;
          }
          simd_store(ls + row * lanes, simd_load<acc, Bytes>(ls + row * lanes) * alpha[r] + sum);
          ms[row] = mnew[r];
          if (alpha[r] != acc(1))
            for (int d = 0; d < dp; d += lanes)
              simd_store(os + row * dp + d, simd_load<acc, Bytes>(os + row * dp + d) * alpha[r]);
        }
        for (int b = 0; b < rows; b += 4)
          simd_rows_accumulate<4, Bytes>(p + b * key_tile, key_tile, 1, key_tile, vr, dp,
                                         os + (r0 + b) * dp, dp, dp);
      }
    }
    for (int r = 0; r < nq; ++r) {
      const acc l = simd_sum<acc, Bytes>(simd_load<acc, Bytes>(ls + r * lanes));
      const acc inv = l > acc(0) ? acc(1) / l : acc(0);
      Scalar* o = &out(i0 + r, h, 0);
      for (int d = 0; d < D; ++d) o[d] = static_cast<Scalar>(os[r * dp + d] * inv);
      lse(i0 + r, h) = l > acc(0) ? ms[r] + compat::log(l) : masked_score<acc>();
    }
  }
};

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
  AttentionInputs<Scalar, MemorySpace> in;
  Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace> dout;
  Kokkos::View<const acc**, Kokkos::LayoutRight, MemorySpace> lse, delta;
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace> dq;
  PackedKeys<acc, MemorySpace> packed;
  Mask mask;
  KernelShape<Scalar, MemorySpace> shape;
  std::int64_t tiles;
  int level;
  ctxpar::HostIsa isa;

  static std::size_t scratch_bytes(int dp) {
    return sizeof(acc) * (3 * std::size_t(query_tile) * dp + 2 * query_tile) + 64;
  }

  void operator()(const Member& team) const { ctxpar::impl::run_kernel<true>(isa, *this, team); }

  template <int Bytes>
  void run(const Member& team) const {
    constexpr int rows = score_rows<acc, Bytes>;
    const int D = shape.dim, dp = packed.dp;
    const int h = static_cast<int>(team.league_rank() / tiles);
    const std::int64_t i0 = (team.league_rank() % tiles) * query_tile;
    const int nq = static_cast<int>(shape.tq - i0 < query_tile ? shape.tq - i0 : query_tile);
    const int hk = h / shape.group;
    acc* qs = static_cast<acc*>(team.team_scratch(level).get_shmem(scratch_bytes(dp)));
    acc* dos = qs + query_tile * dp;
    acc* dqs = dos + query_tile * dp;
    acc* lses = dqs + query_tile * dp;
    acc* deltas = lses + query_tile;
    mask::Token qtok[query_tile], ktok[key_tile];
    bool kvalid[key_tile];
    const acc scale = static_cast<acc>(in.scale);
    const Scalar* qrow[query_tile];
    const Scalar* drow[query_tile];
    for (int r = 0; r < query_tile; ++r) {
      const bool ok = r < nq;
      const std::int64_t i = ok ? i0 + r : i0 + nq - 1;
      qtok[r] = query_token(in, i);
      lses[r] = lse(i, h);
      deltas[r] = delta(i, h);
      qrow[r] = ok ? &in.q(i, h, 0) : nullptr;
      drow[r] = ok ? &dout(i, h, 0) : nullptr;
      for (int d = 0; d < dp; ++d) dqs[r * dp + d] = acc(0);
    }
    host_copy_rows(qrow, query_tile, D, dp, scale, qs);
    host_copy_rows(drow, query_tile, D, dp, acc(1), dos);
    const WindowRange range = window_range(in);
    std::int64_t lo, hi, j0;
    key_range(in, range, shape.nk, qtok[0].pos, qtok[nq - 1].pos, lo, hi, j0);
    alignas(64) acc p[rows * key_tile];
    alignas(64) acc ds[rows * key_tile];
    for (; j0 < hi; j0 += key_tile) {
      host_key_tokens(in, j0, lo, hi, ktok, kvalid);
      const bool full = tile_fully_visible(mask, range, qtok, query_tile, ktok, kvalid);
      const std::size_t off = packed.offset(j0, hk, shape.hkv);
      for (int r0 = 0; r0 < nq; r0 += rows) {
        host_weights_and_gradients<rows, Bytes>(mask, range, dp, qs + r0 * dp, dos + r0 * dp,
                                                packed.kt.data() + off, packed.vt.data() + off,
                                                lses + r0, deltas + r0, qtok + r0, nq - r0, ktok,
                                                kvalid, full, p, ds);
        for (int b = 0; b < rows; b += 4)
          simd_rows_accumulate<4, Bytes>(ds + b * key_tile, key_tile, 1, key_tile,
                                         packed.kr.data() + off, dp, dqs + (r0 + b) * dp, dp, dp);
      }
    }
    for (int r = 0; r < nq; ++r) {
      Scalar* o = &dq(i0 + r, h, 0);
      for (int d = 0; d < D; ++d) o[d] = static_cast<Scalar>(dqs[r * dp + d] * scale);
    }
  }
};

/// Scaled queries and output gradients of every head as contiguous zero-padded rows
/// (`[Hq][tq + query_tile][dp]`), so the dK/dV kernel reads them in place instead of converting
/// every query row once per key tile that sees it.
template <class Scalar, class MemorySpace>
struct PackRowsKernel {
  using acc = accumulator_t<Scalar>;
  Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace> q, dout;
  Kokkos::View<acc*, MemorySpace> qs, dos;
  acc scale;
  std::int64_t tq, rows_per_head;
  int dim, dp;
  void operator()(const std::int64_t flat) const {
    const std::int64_t h = flat / rows_per_head, i = flat % rows_per_head;
    const std::size_t off = static_cast<std::size_t>(flat) * dp;
    const Scalar* qrow = i < tq ? &q(i, h, 0) : nullptr;
    const Scalar* drow = i < tq ? &dout(i, h, 0) : nullptr;
    host_copy_rows(&qrow, 1, dim, dp, scale, qs.data() + off);
    host_copy_rows(&drow, 1, dim, dp, acc(1), dos.data() + off);
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
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace> dk, dv;
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
      Scalar* ko = &dk(g, hk, 0);
      Scalar* vo = &dv(g, hk, 0);
      for (int d = 0; d < D; ++d) {
        ko[d] = static_cast<Scalar>(dks[(g - j0) * dp + d]);
        vo[d] = static_cast<Scalar>(dvs[(g - j0) * dp + d]);
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
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace> dq;
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
    Scalar* o = &dq(i, h, 0);
    for (int d = 0; d < dim; ++d) {
      acc sum = acc(0);
      for (int m = 0; m < n; ++m) sum += rows[m][d];
      o[d] = static_cast<Scalar>(sum * scale);
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

/// True when `kernels` runs the host SIMD kernels on `ExecutionSpace` (a host space in a build
/// that has them, and any choice but `portable`).
template <class ExecutionSpace>
constexpr bool runs_host_kernels(KernelChoice kernels) {
  return uses_host_kernels<ExecutionSpace> && kernels != KernelChoice::portable;
}

/// Policy of the host SIMD kernels, which are written for one thread per team (the portable
/// kernels choose their team size in `team_kernel_policy`).
template <class ExecutionSpace>
Kokkos::TeamPolicy<ExecutionSpace> host_kernel_policy(const ExecutionSpace& space,
                                                      std::int64_t league, std::size_t bytes,
                                                      int& level) {
  level = bytes <= 32768 ? 0 : 1;
  return Kokkos::TeamPolicy<ExecutionSpace>(space, static_cast<int>(league), 1)
      .set_scratch_size(level, Kokkos::PerTeam(bytes));
}

template <class Scalar, class MemorySpace>
void check_kernel_shapes(const AttentionInputs<Scalar, MemorySpace>& in, const std::string& op) {
  require_local(in.k.extent(1) > 0 && in.q.extent(1) % in.k.extent(1) == 0, op,
                "query heads must be a multiple of key/value heads", "Hq % Hkv == 0",
                std::to_string(in.q.extent(1)) + " % " + std::to_string(in.k.extent(1)));
  require_local(in.q.extent(2) == in.k.extent(2) && in.k.extent(2) == in.v.extent(2), op,
                "q, k and v must share the head dimension", in.q.extent(2), in.k.extent(2));
  require_local(in.k.extent(0) == in.v.extent(0) && in.k.extent(1) == in.v.extent(1), op,
                "k and v must have the same shape", in.k.extent(0), in.v.extent(0));
  require_local(in.q_pos.extent(0) == in.q.extent(0) && in.k_pos.extent(0) == in.k.extent(0), op,
                "one position per token", in.q.extent(0), in.q_pos.extent(0));
  require_local(in.key_origin >= 0, op, "the key origin must be non-negative", 0, in.key_origin);
}

}  // namespace impl

/// Forward attention of rotated queries against rotated keys: `out [tq, Hq, D]` and the row
/// log-sum-exp `lse [tq, Hq]` (saved for the backward; a query with no visible key gets zeros and a
/// large negative lse, never NaN). Query head `h` reads key head `h / (Hq / Hkv)`; key `j` is
/// visible to query `i` iff `pos_j` lies in `(pos_i - W, pos_i]` (`W = in.window`, 0: unlimited)
/// and `mask(token_i, token_j)` (`document_mask()` for sliding-window attention: its tiles inside
/// the window and one document skip the per-pair test). `kernels` picks the kernels
/// (`KernelChoice`).
template <class ExecutionSpace, class Mask, class Scalar, class MemorySpace>
void attention_forward(
    const ExecutionSpace& space, const Mask& mask, const AttentionInputs<Scalar, MemorySpace>& in,
    const Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace>& out,
    const Kokkos::View<accumulator_t<Scalar>**, Kokkos::LayoutRight, MemorySpace>& lse,
    AttentionWorkspace<MemorySpace>& workspace, KernelChoice kernels = default_kernel_choice) {
  static_assert(mask::is_mask_v<Mask>,
                "ctxpar::swa::attention_forward: the mask must be a ctxpar::mask expression");
  static_assert(
      Kokkos::SpaceAccessibility<ExecutionSpace, MemorySpace>::accessible,
      "ctxpar::swa::attention_forward: the views must be accessible from the execution space");
  impl::check_kernel_shapes(in, "ctxpar::swa::attention_forward");
  const impl::KernelShape<Scalar, MemorySpace> shape(in);
  if (shape.tq == 0 || shape.hq == 0) return;
  // An empty key axis stays on the portable path.
  if constexpr (impl::uses_host_kernels<ExecutionSpace>) {
    if (shape.nk > 0 && impl::runs_host_kernels<ExecutionSpace>(kernels)) {
      using Member = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
      using Kernel = impl::HostForwardKernel<Scalar, MemorySpace, Mask, Member>;
      const std::int64_t tiles = (shape.tq + query_tile - 1) / query_tile;
      int level = 0;
      const ctxpar::HostIsa isa = ctxpar::impl::active_host_isa();
      const auto packed =
          impl::pack_keys(space, in, shape, workspace, true, false, false, true, isa);
      auto policy = impl::host_kernel_policy(space, tiles * shape.hq,
                                             Kernel::scratch_bytes(packed.dp), level);
      Kokkos::parallel_for("ctxpar::swa::attention_forward", policy,
                           Kernel{in, out, lse, packed, mask, shape, tiles, level, isa});
      return;
    }
  }
  impl::portable_attention_forward(space, mask, in, out, lse);
}

/// Backward of `attention_forward`: from `dout [tq, Hq, D]`, the forward's `out` and `lse`, writes
/// the gradients with respect to the rotated queries `dq [tq, Hq, D]`, the rotated keys
/// `dk [nk, Hkv, D]` and the values `dv [nk, Hkv, D]` (overwritten), with the kernels `kernels`
/// picks.
template <class ExecutionSpace, class Mask, class Scalar, class MemorySpace>
void attention_backward(
    const ExecutionSpace& space, const Mask& mask, const AttentionInputs<Scalar, MemorySpace>& in,
    const Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace>& out,
    const Kokkos::View<const accumulator_t<Scalar>**, Kokkos::LayoutRight, MemorySpace>& lse,
    const Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace>& dout,
    const Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace>& dq,
    const Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace>& dk,
    const Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace>& dv,
    AttentionWorkspace<MemorySpace>& workspace, KernelChoice kernels = default_kernel_choice) {
  static_assert(mask::is_mask_v<Mask>,
                "ctxpar::swa::attention_backward: the mask must be a ctxpar::mask expression");
  static_assert(
      Kokkos::SpaceAccessibility<ExecutionSpace, MemorySpace>::accessible,
      "ctxpar::swa::attention_backward: the views must be accessible from the execution space");
  using acc = accumulator_t<Scalar>;
  impl::check_kernel_shapes(in, "ctxpar::swa::attention_backward");
  const impl::KernelShape<Scalar, MemorySpace> shape(in);
  if constexpr (impl::uses_host_kernels<ExecutionSpace>) {
    if (shape.tq > 0 && shape.hq > 0 && shape.nk > 0 &&
        impl::runs_host_kernels<ExecutionSpace>(kernels)) {
      using Member = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
      const Kokkos::View<const acc**, Kokkos::LayoutRight, MemorySpace> delta =
          impl::row_deltas(space, out, dout, workspace.delta);
      int level = 0;
      const ctxpar::HostIsa isa = ctxpar::impl::active_host_isa();
      const auto packed =
          impl::pack_keys(space, in, shape, workspace, true, true, true, false, isa);
      // The segment rows are read on the host from the positions the caller may have just
      // written on this space.
      space.fence();
      impl::KeySegments segments;
      Kokkos::View<std::int64_t*, MemorySpace> segment_rows;
      const bool fused = impl::fused_backward_segments(in, shape, packed, workspace.segment_rows,
                                                       segments, segment_rows, isa, kernels);
      if (!fused) {
        using Kernel = impl::HostQueryGradientKernel<Scalar, MemorySpace, Mask, Member>;
        const std::int64_t tiles = (shape.tq + query_tile - 1) / query_tile;
        auto policy = impl::host_kernel_policy(space, tiles * shape.hq,
                                               Kernel::scratch_bytes(packed.dp), level);
        Kokkos::parallel_for(
            "ctxpar::swa::attention_backward_dq", policy,
            Kernel{in, dout, lse, delta, dq, packed, mask, shape, tiles, level, isa});
        segments =
            impl::KeySegments{1, in.key_origin / key_tile, packed.tiles, in.key_origin / key_tile};
      }
      const std::int64_t rows_per_head = shape.tq + query_tile;
      const std::size_t n = static_cast<std::size_t>(shape.hq * rows_per_head * packed.dp);
      const auto qrows = carve<Kokkos::View<acc*, MemorySpace>>(workspace.query_rows, n);
      const auto dorows = carve<Kokkos::View<acc*, MemorySpace>>(workspace.grad_rows, n);
      Kokkos::parallel_for("ctxpar::swa::pack_rows",
                           Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(
                               space, 0, shape.hq * rows_per_head),
                           impl::PackRowsKernel<Scalar, MemorySpace>{
                               in.q, dout, qrows, dorows, static_cast<acc>(in.scale), shape.tq,
                               rows_per_head, shape.dim, packed.dp});
      const auto dq_parts = carve<Kokkos::View<acc*, MemorySpace>>(
          workspace.query_grad_parts,
          fused ? static_cast<std::size_t>(2 * shape.hq * shape.tq * packed.dp) : 0);
      using KKernel = impl::HostKeyGradientKernel<Scalar, MemorySpace, Mask, Member>;
      auto kpolicy = impl::host_kernel_policy(space, segments.count * shape.hkv,
                                              KKernel::scratch_bytes(packed.dp), level);
      Kokkos::parallel_for(
          "ctxpar::swa::attention_backward_dkdv", kpolicy,
          KKernel{in, dout, lse, delta, dk, dv, packed, qrows, dorows, rows_per_head, mask, shape,
                  segments, dq_parts, segment_rows, level, isa});
      if (fused)
        Kokkos::parallel_for("ctxpar::swa::attention_backward_dq_sum",
                             Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(
                                 space, 0, shape.hq * shape.tq),
                             impl::SumQueryGradientPartsKernel<Scalar, MemorySpace>{
                                 dq_parts, segment_rows, dq, segments, static_cast<acc>(in.scale),
                                 shape.tq, shape.hq, shape.dim, packed.dp});
      return;
    }
  }
  impl::portable_attention_backward(space, mask, in, out, lse, dout, dq, dk, dv, workspace);
}

/// `attention_forward` with scratch allocated for this call only.
template <class ExecutionSpace, class Mask, class Scalar, class MemorySpace>
void attention_forward(
    const ExecutionSpace& space, const Mask& mask, const AttentionInputs<Scalar, MemorySpace>& in,
    const Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace>& out,
    const Kokkos::View<accumulator_t<Scalar>**, Kokkos::LayoutRight, MemorySpace>& lse,
    KernelChoice kernels = default_kernel_choice) {
  AttentionWorkspace<MemorySpace> workspace;
  attention_forward(space, mask, in, out, lse, workspace, kernels);
}

/// `attention_backward` with scratch allocated for this call only.
template <class ExecutionSpace, class Mask, class Scalar, class MemorySpace>
void attention_backward(
    const ExecutionSpace& space, const Mask& mask, const AttentionInputs<Scalar, MemorySpace>& in,
    const Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace>& out,
    const Kokkos::View<const accumulator_t<Scalar>**, Kokkos::LayoutRight, MemorySpace>& lse,
    const Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace>& dout,
    const Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace>& dq,
    const Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace>& dk,
    const Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace>& dv,
    KernelChoice kernels = default_kernel_choice) {
  AttentionWorkspace<MemorySpace> workspace;
  attention_backward(space, mask, in, out, lse, dout, dq, dk, dv, workspace, kernels);
}

}  // namespace ctxpar::swa
CTXPAR_WIDE_VECTORS_END
