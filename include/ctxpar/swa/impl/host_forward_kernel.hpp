/// \file
/// The forward attention kernel of the host execution spaces (`HostForwardKernel`):
/// register-blocked tile products on the packed keys with an online softmax per query row.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/host_isa.hpp"
#include "ctxpar/core/impl/isa_dispatch.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/expr/mask.hpp"
#include "ctxpar/swa/attention_inputs.hpp"
#include "ctxpar/swa/impl/attention_tiles.hpp"
#include "ctxpar/swa/impl/host_kernel.hpp"
#include "ctxpar/swa/impl/host_packing.hpp"
#include "ctxpar/swa/impl/host_query_tiles.hpp"
#include "ctxpar/swa/impl/host_tile_mask.hpp"
#include "ctxpar/swa/impl/kernel_math.hpp"
#include "ctxpar/swa/impl/window_range.hpp"

CTXPAR_WIDE_VECTORS_BEGIN
namespace ctxpar::swa::impl {

/// Forward on the host: one team per (query head, query tile), register-blocked tile products
/// on the packed keys; online softmax per row over the globally anchored key tiles, like the
/// portable forward (`impl/team_kernels.hpp`), though not bitwise equal to it.
template <class Scalar, class MemorySpace, class Mask, class Member>
struct HostForwardKernel {
  using acc = accumulator_t<Scalar>;
  HostQueryTiles<Scalar, MemorySpace, Mask> queries;
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace> out;
  Kokkos::View<acc**, Kokkos::LayoutRight, MemorySpace> lse;

  // Per query row: the scaled query, the output accumulator, the running maximum and the running
  // sum of weights, kept lane by lane (one vector per row, sized for the widest) and summed once
  // at the end, so the tile loop makes no horizontal reduction for it.
  static std::size_t scratch_bytes(int dp) {
    return sizeof(acc) * (2 * std::size_t(query_tile) * dp + query_tile) +
           std::size_t(query_tile) * ctxpar::impl::max_simd_bytes + 64;
  }

  void operator()(const Member& team) const {
    ctxpar::impl::run_kernel<true>(queries.isa, *this, team);
  }

  template <int Bytes>
  void run(const Member& team) const {
    using simd = simd_t<acc, Bytes>;
    constexpr int rows = score_rows<acc, Bytes>, nv = tile_vectors<acc, Bytes>,
                  lanes = Simd<acc, Bytes>::lanes;
    const HostQueryTile t = queries.tile(team);
    const int D = queries.shape.dim, dp = queries.packed.dp, nq = t.nq;
    acc* qs = queries.scratch(team, scratch_bytes(dp));
    acc* os = qs + query_tile * dp;
    acc* ms = os + query_tile * dp;
    acc* ls = ms + query_tile;  // [query_tile][lanes]
    for (int r = 0; r < query_tile; ++r) {
      for (int d = 0; d < dp; ++d) os[r * dp + d] = acc(0);
      ms[r] = masked_score<acc>();
      simd_store(ls + r * lanes, simd_zero<acc, Bytes>());
    }
    mask::Token qtok[query_tile];
    queries.load_queries(t, qtok, qs);
    alignas(64) acc p[rows * key_tile];
    queries.for_each_key_tile(
        t, qtok,
        [&](const WindowRange& range, const mask::Token* ktok, const bool* valid, bool full,
            std::size_t off) {
          const acc* kt = queries.packed.kt.data() + off;
          const acc* vr = queries.packed.vr.data() + off;
          for (int r0 = 0; r0 < nq; r0 += rows) {
            simd s[rows][nv];
            host_scores<rows>(qs + r0 * dp, dp, kt, dp, s);
            if (!full)
              host_mask_scores<rows>(queries.mask, range, qtok + r0, query_tile - r0, ktok, valid,
                                     s, p);
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
              simd_store(ls + row * lanes,
                         simd_load<acc, Bytes>(ls + row * lanes) * alpha[r] + sum);
              ms[row] = mnew[r];
              if (alpha[r] != acc(1))
                for (int d = 0; d < dp; d += lanes)
                  simd_store(os + row * dp + d,
                             simd_load<acc, Bytes>(os + row * dp + d) * alpha[r]);
            }
            for (int b = 0; b < rows; b += 4)
              simd_rows_accumulate<4, Bytes>(p + b * key_tile, key_tile, 1, key_tile, vr, dp,
                                             os + (r0 + b) * dp, dp, dp);
          }
        });
    for (int r = 0; r < nq; ++r) {
      const acc l = simd_sum<acc, Bytes>(simd_load<acc, Bytes>(ls + r * lanes));
      const acc inv = l > acc(0) ? acc(1) / l : acc(0);
      Scalar* o = &out(t.i0 + r, t.h, 0);
      for (int d = 0; d < D; ++d) o[d] = ctxpar::narrow<Scalar>(os[r * dp + d] * inv);
      lse(t.i0 + r, t.h) = l > acc(0) ? ms[r] + compat::log(l) : masked_score<acc>();
    }
  }
};

}  // namespace ctxpar::swa::impl
CTXPAR_WIDE_VECTORS_END
