/// \file
/// The tile pieces every tensor-core attention kernel is composed of (`tensor_core_forward.hpp`,
/// `tensor_core_backward.hpp`), written over `WarpLanes` so that the host spaces run them with the
/// warp emulated: a warp's 16 rows as product fragments, a team's staged tile of 32 rows in
/// scratch, and the two products of attention, "rows against the tile's rows" (`Q·Kᵀ`, `dO·Vᵀ`,
/// `K·Qᵀ`, `V·dOᵀ`) and "weights times the tile's rows" (`P·V`, `dS·K`, `Pᵀ·dO`, `dSᵀ·Q`), each
/// summing the head dimension or the tile in a fixed order.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ctxpar/core/impl/mma_fragment.hpp"
#include "ctxpar/core/impl/tile_pipeline.hpp"
#include "ctxpar/core/impl/warp_lanes.hpp"
#include "ctxpar/swa/attention_inputs.hpp"
#include "ctxpar/swa/impl/team_kernels.hpp"
#include "ctxpar/swa/impl/tensor_core_support.hpp"

/// Keeps a loop rolled in device code: one whose iterations each load operands that, unrolled,
/// would all be loaded ahead of the products and live at once.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define CTXPAR_ROLLED_LOOP _Pragma("unroll 1")
#else
#define CTXPAR_ROLLED_LOOP
#endif

namespace ctxpar::swa::impl {

/// Warps per team of the tensor-core kernels.
inline constexpr int tensor_core_warps = 4;

/// The most team scratch a tensor-core kernel that reads it by `ldmatrix` may take: level 0 on
/// every CUDA device (48 KiB per team, less what Kokkos reserves for its team reductions).
inline constexpr std::size_t tensor_core_ldmatrix_scratch = 40 * 1024;

/// The head dimension a tensor-core kernel is compiled for: `dim` rounded up to 64, 128 or 256.
inline constexpr int tensor_core_padded_dim(std::int64_t dim) {
  return dim <= 64 ? 64 : (dim <= 128 ? 128 : 256);
}

/// Calls `f(std::integral_constant<int, DP>{})` with `DP = tensor_core_padded_dim(dim)`: the
/// kernels are instantiated once for each padded dimension.
template <class F>
void with_padded_dim(std::int64_t dim, const F& f) {
  switch (tensor_core_padded_dim(dim)) {
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    default:
      return f(std::integral_constant<int, 256>{});
  }
}

/// Where a kernel keeps a warp's 16 rows of a row operand (Q and dO in the forward and dQ
/// kernels, K and V in the dK/dV kernel) between the products that read them. The fragments in
/// registers are the fastest, until the registers run out and the kernel spills. Staged in
/// level-0 scratch, read by `ldmatrix` per product, where the scratch has room beside the tiles.
/// Past both, read from the tensor itself per product (its fragments loaded from global memory,
/// which the kernel's other warps and the caches share) rather than spilled: a spill stores and
/// reloads the same values through local memory, and costs the rest of the kernel's registers
/// their allocation.
enum class RowsKept { in_registers, in_scratch, in_memory };

/// Tiles of the tensor-core kernels on storage type `Scalar` with head dimensions up to `DP`.
template <class Scalar, int DP>
struct TensorCoreTiles {
  using Operands = TensorCoreOperands<Scalar>;
  using Op = typename Operands::type;
  using L = typename Operands::layout;
  using Lanes = ctxpar::impl::WarpLanes;
  static constexpr int count = Lanes::count;
  static constexpr int warps = tensor_core_warps;
  /// Rows of a warp (the products' M).
  static constexpr int rows = L::m;
  /// Rows of a staged tile: the kernels' key tile (the query tile of the dK/dV kernel too).
  static constexpr int width = key_tile;
  /// Product blocks of the head dimension (depth `L::k`) and of the output columns (width 8).
  static constexpr int depth_blocks = DP / L::k, column_blocks = DP / L::n;
  /// Score blocks of a tile (8 of its rows each) and weight steps (`L::k` of its rows each).
  static constexpr int tile_blocks = width / L::n, tile_steps = width / L::k;
  /// Row stride of a staged tile: 16 bytes past `DP`, so that the 8 rows one fragment load
  /// touches fall in different shared-memory banks.
  static constexpr int ld = DP + 16 / static_cast<int>(sizeof(Op));
  static_assert(DP % L::k == 0 && width % L::k == 0, "whole products");
  static_assert(tile_blocks % 2 == 0 && column_blocks % 2 == 0, "B fragments loaded in pairs");
  /// Whether the kernels read the staged tiles by `ldmatrix` (16-bit operands), which on a device
  /// needs them in shared memory: level-0 scratch.
  static constexpr bool reads_by_ldmatrix = L::k == 16;
  /// Whether a backward kernel stages one of its row operands (16 rows per warp: the dQ kernel its
  /// dO rows, the dK/dV kernel its V rows) in scratch and reads their A fragments from there by
  /// `ldmatrix` per product, rather than holding them in registers: at D = 128 with 16-bit
  /// operands, where the registers ran out (each kernel says why) and the 64 rows (17 KiB) fit
  /// beside two staged tiles in the 40 KiB of level-0 scratch a CUDA team gets. Elsewhere they
  /// do not fit (TF32 and D = 256 take twice the bytes) or are not needed (D = 64).
  static constexpr bool stages_row_operand = DP == 128 && reads_by_ldmatrix;

  /// Whether a backward warp's row operands and accumulators outgrow the 255 registers of a
  /// thread: at D = 256 (one accumulator alone takes 128 of them), and at D = 128 with TF32
  /// operands (a register per element, twice the 16-bit pairs). The backward kernels then keep
  /// the row operands they do not stage `RowsKept::in_memory`, and at D = 256 the dK/dV kernel
  /// sums dV and dK in two passes (`KeyGradientPass`).
  static constexpr bool registers_short = DP == 256 || (DP == 128 && !reads_by_ldmatrix);

  /// A lane's A and B fragments.
  using A = ctxpar::impl::Fragment<Op, L::a_per_lane>;
  using B = ctxpar::impl::Fragment<Op, L::b_per_lane>;
  /// A warp's 16 rows of the head dimension as A fragments.
  using Rows = A[depth_blocks][count];
  /// A warp's 16 rows read where they lie (`RowsKept::in_memory`): the first row's first element,
  /// the stride between rows, and how many of the 16 there are (the rest read as zeros).
  struct RowsInMemory {
    const Scalar* first;
    std::int64_t stride;
    int n;
  };
  /// What a kernel holds for a warp's rows kept `where`: their fragments, the first of them in
  /// scratch, or where they lie.
  template <RowsKept where>
  using RowsAt = std::conditional_t<
      where == RowsKept::in_registers, Rows,
      std::conditional_t<where == RowsKept::in_scratch, const Op*, RowsInMemory>>;
  /// A warp's 16 rows against a tile's 32 rows (scores, weights), in accumulator layout.
  using Scores = float[tile_blocks][count][4];
  /// A warp's 16 rows of the head dimension in fp32, in accumulator layout.
  using Accumulator = float[column_blocks][count][4];

  /// Scratch bytes of one staged tile.
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t tile_bytes() {
    return scratch_piece<Op>(std::size_t(width) * ld);
  }

  /// Loads `a` from `value(r, d)` for rows `r < n` and `d < dim`, zeros elsewhere.
  template <class Value>
  KOKKOS_FORCEINLINE_FUNCTION static void load_rows(const Lanes& lanes, int n, int dim,
                                                    const Value& value, Rows& a) {
    CTXPAR_FRAGMENT_UNROLL
    for (int kb = 0; kb < depth_blocks; ++kb)
      for (int s = 0; s < count; ++s)
        ctxpar::impl::fill_fragment(a[kb][s], [&](int e) {
          const int r = L::a_row(lanes.lane(s), e), d = kb * L::k + L::a_col(lanes.lane(s), e);
          return r < n && d < dim ? Operands::operand(value(r, d)) : Operands::zero();
        });
  }

  /// Keeps the `n` rows of head `h` of `v` (a (tokens, heads, head dimension) tensor) from token
  /// `i` in `out`, as `where` says: loaded into fragments, taken from `staged` (the warp's rows
  /// in scratch, staged by the kernel), or pointed at.
  template <RowsKept where, class View>
  KOKKOS_FORCEINLINE_FUNCTION static void keep_rows(const Lanes& lanes, const View& v,
                                                    std::int64_t i, int h, int n, int dim,
                                                    const Op* staged, RowsAt<where>& out) {
    if constexpr (where == RowsKept::in_registers)
      load_rows(
          lanes, n, dim, [&](int r, int d) { return v(i + r, h, d); }, out);
    else if constexpr (where == RowsKept::in_scratch)
      out = staged;
    else
      out = RowsInMemory{row_of(v, i, h), std::int64_t(v.stride(0)), n};
  }

  /// Key tiles (or query tiles) a kernel stages ahead (`pipelined_tiles`), whose pieces take
  /// `two_stage_bytes` of scratch with two stages: 2, the next tile's copies in flight while the
  /// warps compute on the current one, where the tiles are copied (`stages_by_copies`) and two
  /// of them fit the level-0 scratch; else 1.
  KOKKOS_INLINE_FUNCTION static constexpr int stages_fitting(std::size_t two_stage_bytes) {
    return stages_by_copies &&
                   ScratchCursor::aligned_bytes(two_stage_bytes) <= tensor_core_ldmatrix_scratch
               ? 2
               : 1;
  }

  /// Whether the kernels stage tiles by 16-byte asynchronous copies (`core/impl/tile_pipeline.hpp`)
  /// where the rows allow it: for 16-bit operands, which are the stored values themselves (TF32
  /// operands are rounded on the way in, element by element).
  static constexpr bool stages_by_copies = reads_by_ldmatrix;
  /// Elements of one copy, and copies of a staged row.
  static constexpr int piece = ctxpar::impl::async_copy_bytes / static_cast<int>(sizeof(Op));
  static constexpr int row_pieces = DP / piece;
  static_assert(!stages_by_copies || DP % piece == 0, "whole copies per staged row");

  /// The first element of row `(i, h)` of a (tokens, heads, head dimension) view.
  template <class View>
  KOKKOS_FORCEINLINE_FUNCTION static auto row_of(const View& v, std::int64_t i, int h) {
    return v.data() + i * std::int64_t(v.stride(0)) + h * std::int64_t(v.stride(1));
  }

  /// Whether `stage` may copy the rows of `views` (each (tokens, heads, head dimension), of
  /// storage type `Scalar`) by 16-byte copies at head dimension `dim`: `stages_by_copies`, `dim`
  /// whole copies, and every row 16-byte aligned. Elsewhere it stages element by element.
  template <class... Views>
  static bool copies_rows(int dim, const Views&... views) {
    constexpr std::size_t bytes = sizeof(Op);
    const auto aligned = [&](const auto& v) {
      return ctxpar::impl::async_copy_aligned(v.data()) && v.stride(2) == 1 &&
             (v.stride(0) * bytes) % ctxpar::impl::async_copy_bytes == 0 &&
             (v.stride(1) * bytes) % ctxpar::impl::async_copy_bytes == 0;
    };
    return stages_by_copies && dim % piece == 0 && (aligned(views) && ...);
  }

  /// Copies per thread that `stage` issues for `n` rows, the most it holds at once on the host
  /// (where one thread runs the team); 1 where it issues none.
  KOKKOS_INLINE_FUNCTION static constexpr int copies_for(int n) {
    return stages_by_copies ? n * row_pieces : 1;
  }

  /// The most copies a thread of a kernel has in flight (the capacity of its `AsyncCopies`):
  /// `stages` buffers of two tiles, or `once` rows staged and waited for before the first tile.
  KOKKOS_INLINE_FUNCTION static constexpr int copies_in_flight(int stages, int once) {
    const int tiles = stages * 2 * copies_for(width);
    const int rows = once > 0 ? copies_for(once) : 0;
    return tiles > rows ? tiles : rows;
  }

  /// Stages `N` rows (a tile's `width` unless told) into `tile` at row stride `ld`: row `j`'s
  /// elements `row(j)[d]` where `valid(j)` and `d < dim`, zeros elsewhere, cooperatively over the
  /// team. Where `by_copies` (`copies_rows`) the rows go by 16-byte asynchronous copies issued
  /// through `copies`; the caller commits them, waits, and then waits for the team.
  template <int N = width, class Member, class Copies, class Valid, class Row>
  KOKKOS_FORCEINLINE_FUNCTION static void stage(const Member& team, Copies& copies, bool by_copies,
                                                Op* tile, int dim, const Valid& valid,
                                                const Row& row) {
    if constexpr (stages_by_copies) {
      if (by_copies) {
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, N * row_pieces), [&](const int e) {
          const int j = e / row_pieces, d = e % row_pieces * piece;
          Op* to = tile + j * ld + d;
          if (d < dim && valid(j)) {
            copies.copy(to, row(j) + d);
          } else {
            ctxpar::impl::store_zero_piece(to);
          }
        });
        return;
      }
    }
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, N * DP), [&](const int e) {
      const int j = e / DP, d = e % DP;
      tile[j * ld + d] = d < dim && valid(j) ? Operands::operand(row(j)[d]) : Operands::zero();
    });
  }

  /// Clears scores or an accumulator.
  template <int N>
  KOKKOS_FORCEINLINE_FUNCTION static void zero(float (&x)[N][count][4]) {
    CTXPAR_FRAGMENT_UNROLL
    for (int b = 0; b < N; ++b)
      for (int s = 0; s < count; ++s)
        for (int e = 0; e < 4; ++e) x[b][s][e] = 0.0f;
  }

  /// `s = rows·tileᵀ`: the warp's rows (`RowsAt`, kept wherever) against the tile's rows over
  /// the head dimension (depth blocks wholly past `dim` add nothing and are skipped, the same for
  /// every lane). Rows not in registers have each depth block's A fragments read when its
  /// products need them (`load_depth_block`): the same values and sums as from registers.
  template <class Kept>
  KOKKOS_FORCEINLINE_FUNCTION static void row_products(const Lanes& lanes, int dim,
                                                       const Kept& rows, const Op* tile,
                                                       Scores& s) {
    zero(s);
    if constexpr (std::is_same_v<Kept, Rows>) {
      CTXPAR_FRAGMENT_UNROLL
      for (int kb = 0; kb < depth_blocks; ++kb) {
        if (kb * L::k >= dim) break;
        depth_block_products(lanes, kb, rows[kb], tile, s);
      }
    } else {
      // Unrolled, every block's loads were issued first, and the fragments they fill took the
      // registers the rows were moved out of (ptxas counted more spills, not fewer).
      CTXPAR_ROLLED_LOOP
      for (int kb = 0; kb < depth_blocks; ++kb) {
        if (kb * L::k >= dim) break;
        A a[count];
        load_depth_block(lanes, dim, rows, kb, a);
        depth_block_products(lanes, kb, a, tile, s);
      }
    }
  }

  /// Depth block `kb`'s A fragments of a warp's 16 rows staged in level-0 scratch at stride `ld`
  /// (as `stage` writes them, 16-byte aligned): by `ldmatrix` for 16-bit operands.
  KOKKOS_FORCEINLINE_FUNCTION static void load_depth_block(const Lanes& lanes, int, const Op* rows,
                                                           int kb, A (&a)[count]) {
    if constexpr (L::k == 16) {
      ctxpar::impl::warp_ldmatrix_a(lanes, rows + kb * L::k, ld, a);
    } else {
      for (int c = 0; c < count; ++c)
        ctxpar::impl::load_a<L>(lanes.lane(c), rows + kb * L::k, ld, a[c]);
    }
  }

  /// Depth block `kb`'s A fragments of a warp's rows where they lie, as `load_rows` makes them
  /// (operands; zeros past the rows and past `dim`).
  KOKKOS_FORCEINLINE_FUNCTION static void load_depth_block(const Lanes& lanes, int dim,
                                                           const RowsInMemory& rows, int kb,
                                                           A (&a)[count]) {
    const Scalar* const first = reloaded(rows.first);
    for (int c = 0; c < count; ++c)
      ctxpar::impl::fill_fragment(a[c], [&](int e) {
        const int r = L::a_row(lanes.lane(c), e), d = kb * L::k + L::a_col(lanes.lane(c), e);
        return r < rows.n && d < dim ? Operands::operand(first[r * rows.stride + d])
                                     : Operands::zero();
      });
  }

  /// `p`, as a value the device compiler cannot see through: loads from it are then made where
  /// they are written, per product. The rows are read-only for the kernel's whole run, so the
  /// compiler would otherwise hoist every load out of the loop over the tiles and hold the rows
  /// in registers after all, spilling them (ptxas counted more spills than with the fragments
  /// kept in registers).
  template <class T>
  KOKKOS_FORCEINLINE_FUNCTION static const T* reloaded(const T* p) {
#if defined(__CUDA_ARCH__)
    auto bits = reinterpret_cast<std::uintptr_t>(p);
    asm volatile("" : "+l"(bits));
    return reinterpret_cast<const T*>(bits);
#else
    return p;
#endif
  }

  /// `s += a·tileᵀ` over depth block `kb`: the A fragments `a` of the warp's rows against each
  /// score block's 8 tile rows, two blocks per B load.
  KOKKOS_FORCEINLINE_FUNCTION static void depth_block_products(const Lanes& lanes, int kb,
                                                               const A (&a)[count], const Op* tile,
                                                               Scores& s) {
    CTXPAR_FRAGMENT_UNROLL
    for (int nb = 0; nb < tile_blocks; nb += 2) {
      B left[count], right[count];
      load_b_pair<false>(lanes, tile + nb * L::n * ld + kb * L::k, left, right);
      ctxpar::impl::warp_mma<L>(s[nb], a, left);
      ctxpar::impl::warp_mma<L>(s[nb + 1], a, right);
    }
  }

  /// The B fragments of two adjacent 8-column blocks from a staged tile: stored column by column
  /// (`B(p, j) = tile[j·ld + p]`, the rows of K for `Q·Kᵀ`) or, where `rows_stored`, row by row
  /// (`B(p, j) = tile[c·ld + j]`, `c = L::result_column(p)`: the rows of V for `P·V`). 16-bit
  /// operands by one `ldmatrix.x4` (the staged tiles are 16-byte aligned and `ld` keeps every row
  /// so); TF32 ones, 32-bit, element by element.
  template <bool rows_stored>
  KOKKOS_FORCEINLINE_FUNCTION static void load_b_pair(const Lanes& lanes, const Op* tile,
                                                      B (&left)[count], B (&right)[count]) {
    if constexpr (L::k == 16) {
      ctxpar::impl::warp_ldmatrix_b<rows_stored>(lanes, tile, ld, left, right);
    } else {
      for (int c = 0; c < count; ++c) {
        if constexpr (rows_stored) {
          ctxpar::impl::load_b_rows<L>(lanes.lane(c), tile, ld, left[c]);
          ctxpar::impl::load_b_rows<L>(lanes.lane(c), tile + L::n, ld, right[c]);
        } else {
          ctxpar::impl::load_b<L>(lanes.lane(c), tile, ld, left[c]);
          ctxpar::impl::load_b<L>(lanes.lane(c), tile + L::n * ld, ld, right[c]);
        }
      }
    }
  }

  /// `acc += w·tile`: weights over the tile's rows (rounded to operands, fed from the score
  /// registers) times those rows, for the columns below `dim`.
  KOKKOS_FORCEINLINE_FUNCTION static void weighted_rows(const Lanes& lanes, int dim,
                                                        const Scores& w, const Op* tile,
                                                        Accumulator& acc) {
    for (int ks = 0; ks < tile_steps; ++ks) {
      A a[count];
      for (int c = 0; c < count; ++c) {
        if constexpr (L::k == 16)
          ctxpar::impl::results_as_a(w[2 * ks][c], w[2 * ks + 1][c], a[c]);
        else
          ctxpar::impl::results_as_a(w[ks][c], a[c]);
      }
      // Two column blocks per B load; a block past `dim` adds zeros to columns never written.
      CTXPAR_FRAGMENT_UNROLL
      for (int cb = 0; cb < column_blocks; cb += 2) {
        if (cb * L::n >= dim) break;
        B left[count], right[count];
        load_b_pair<true>(lanes, tile + ks * L::k * ld + cb * L::n, left, right);
        ctxpar::impl::warp_mma<L>(acc[cb], a, left);
        ctxpar::impl::warp_mma<L>(acc[cb + 1], a, right);
      }
    }
  }

  /// `f(x, r, j, c, half)` for every element `x` of `s` the thread holds: row `r` of the warp,
  /// row `j` of the tile, lane slot `c`, row half `half` (`r / 8`).
  template <class F>
  KOKKOS_FORCEINLINE_FUNCTION static void for_each_score(const Lanes& lanes, Scores& s,
                                                         const F& f) {
    CTXPAR_FRAGMENT_UNROLL
    for (int nb = 0; nb < tile_blocks; ++nb)
      for (int c = 0; c < count; ++c)
        for (int e = 0; e < 4; ++e) {
          const int lane = lanes.lane(c);
          f(s[nb][c][e], L::c_row(lane, e), nb * L::n + L::c_col(lane, e), c, e / 2);
        }
  }

  /// `f(x, r, d, c, half)` for every element `x` of `acc` the thread holds with `d < dim`: row `r`
  /// of the warp, column `d`, lane slot `c`, row half `half`.
  template <class F>
  KOKKOS_FORCEINLINE_FUNCTION static void for_each_element(const Lanes& lanes, int dim,
                                                           Accumulator& acc, const F& f) {
    CTXPAR_FRAGMENT_UNROLL
    for (int cb = 0; cb < column_blocks; ++cb)
      for (int c = 0; c < count; ++c)
        for (int e = 0; e < 4; ++e) {
          const int lane = lanes.lane(c);
          const int d = cb * L::n + L::c_col(lane, e);
          if (d < dim) f(acc[cb][c][e], L::c_row(lane, e), d, c, e / 2);
        }
  }
};

}  // namespace ctxpar::swa::impl

#undef CTXPAR_ROLLED_LOOP
