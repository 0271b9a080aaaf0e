/// \file
/// The warp-level tensor-core products `D = A·B + C` of NVIDIA sm_80 and later with fp32
/// accumulation: m16n8k16 with bfloat16 or IEEE half A and B (one layout for both), and m16n8k8
/// with TF32 A and B (fp32 data). For each, which lane of the 32 holds which element of A, B and
/// C (the fragment layouts of PTX's `mma.sync.aligned` instructions), the per-lane loads and
/// stores that follow them, and the instructions themselves.
///
/// Each layout is written once, here, as index functions; the loads, the stores and the host
/// emulations of the instructions (`mma.sync`, and `ldmatrix`, which loads 16-bit fragments from
/// shared memory) all read it. On a CUDA device of compute capability 8.0 or more `mma` is the
/// instruction (inline PTX); everywhere else `emulate_warp_mma` computes what it computes for all
/// 32 lanes at once, so the data movement around it runs, and is tested, in CPU CI through the
/// same source.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ctxpar/core/bfloat16.hpp"
#include "ctxpar/core/float16.hpp"

/// Unrolls a loop over fragment or accumulator elements fully in device code. A register array
/// indexed at run time is placed in local memory, and with it the aggregate that holds it (a
/// warp's whole state, stored back after every key tile); a loop of 64 or more iterations (an
/// accumulator of head dimension 128) is past the compiler's own full-unroll limit.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define CTXPAR_FRAGMENT_UNROLL _Pragma("unroll")
#else
#define CTXPAR_FRAGMENT_UNROLL
#endif

namespace ctxpar::impl {

/// The fp32 16×8 accumulator of the m16n8 products (C and D), the same for every input type.
/// Lane `l` belongs to group `l / 4` (a row) and holds, in group order, the column pair
/// `2·(l % 4)`.
struct MmaAccumulator16x8 {
  static constexpr int m = 16, n = 8;
  static constexpr int lanes = 32;
  static constexpr int c_per_lane = 4;  ///< elements of C each lane holds
  /// Row of C (and D) held by lane `lane` as its element `i` (0..3).
  KOKKOS_INLINE_FUNCTION static constexpr int c_row(int lane, int i) {
    return lane / 4 + (i / 2) * 8;
  }
  /// Column of C (and D) held by lane `lane` as its element `i`.
  KOKKOS_INLINE_FUNCTION static constexpr int c_col(int lane, int i) {
    return (lane % 4) * 2 + i % 2;
  }
};

/// Shape and fragment layout of the m16n8k16 16-bit product (`bfloat16` or `float16`).
struct MmaM16N8K16 : MmaAccumulator16x8 {
  static constexpr int k = 16;
  /// Elements each lane holds: 8 of A (4 registers of two), 4 of B (2 registers).
  static constexpr int a_per_lane = 8, b_per_lane = 4;

  /// Row of A held by lane `lane` as its element `i` (0..7).
  KOKKOS_INLINE_FUNCTION static constexpr int a_row(int lane, int i) {
    return lane / 4 + ((i / 2) % 2) * 8;
  }
  /// Column of A held by lane `lane` as its element `i`.
  KOKKOS_INLINE_FUNCTION static constexpr int a_col(int lane, int i) {
    return (lane % 4) * 2 + i % 2 + (i / 4) * 8;
  }
  /// Row (the inner index) of B held by lane `lane` as its element `i` (0..3).
  KOKKOS_INLINE_FUNCTION static constexpr int b_row(int lane, int i) {
    return (lane % 4) * 2 + i % 2 + (i / 2) * 8;
  }
  /// Column of B held by lane `lane` as its element `i`.
  KOKKOS_INLINE_FUNCTION static constexpr int b_col(int lane, int /*i*/) { return lane / 4; }
  /// In a product whose A came from `results_as_a`, the column of the results that inner index
  /// `p` stands for: `p` itself (the layouts agree).
  KOKKOS_INLINE_FUNCTION static constexpr int result_column(int p) { return p; }
};

/// Shape and fragment layout of the m16n8k8 TF32 product (fp32 inputs read as TF32: 10 fraction
/// bits, the 13 below ignored), one 32-bit register per element.
struct MmaM16N8K8Tf32 : MmaAccumulator16x8 {
  static constexpr int k = 8;
  static constexpr int a_per_lane = 4, b_per_lane = 2;  ///< elements of A and B per lane
  /// Row of A held by lane `lane` as its element `i` (0..3).
  KOKKOS_INLINE_FUNCTION static constexpr int a_row(int lane, int i) {
    return lane / 4 + (i % 2) * 8;
  }
  /// Column of A held by lane `lane` as its element `i`.
  KOKKOS_INLINE_FUNCTION static constexpr int a_col(int lane, int i) {
    return lane % 4 + (i / 2) * 4;
  }
  /// Row (the inner index) of B held by lane `lane` as its element `i` (0..1).
  KOKKOS_INLINE_FUNCTION static constexpr int b_row(int lane, int i) { return lane % 4 + i * 4; }
  /// Column of B held by lane `lane` as its element `i`.
  KOKKOS_INLINE_FUNCTION static constexpr int b_col(int lane, int /*i*/) { return lane / 4; }
  /// In a product whose A came from `results_as_a`, the column of the 16×8 results that inner
  /// index `p` stands for. A lane holds result columns `2·(l % 4)` and `+1` but A columns `l % 4`
  /// and `+4`; rather than exchange values between lanes, the inner index is permuted (a sum over
  /// it does not care), and B's rows are read in the same permuted order (`load_b_rows`).
  KOKKOS_INLINE_FUNCTION static constexpr int result_column(int p) { return 2 * (p % 4) + p / 4; }
};

/// `x` rounded to TF32 as `cvt.rna.tf32.f32` does: to nearest, ties away from zero, kept in a
/// float whose 13 low fraction bits are zero (NaN and ±inf unchanged; past the largest TF32,
/// ±inf).
KOKKOS_INLINE_FUNCTION float to_tf32(float x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & ~0x1fffu;
  float r = 0;
  std::memcpy(&r, &u, sizeof r);
  return r;
}

/// Two 16-bit patterns as one fragment word: `even` in the low half, `odd` in the high half.
KOKKOS_FORCEINLINE_FUNCTION std::uint32_t pair_word(std::uint16_t even, std::uint16_t odd) {
  return static_cast<std::uint32_t>(even) | (static_cast<std::uint32_t>(odd) << 16);
}

/// One lane's `N` elements of a product operand (A or B) as its registers hold them. 16-bit
/// elements are kept in pairs, element `2j` in the low half of word `j` and `2j + 1` in the high
/// half: that is how `mma.sync` takes them and `ldmatrix` delivers them, and a fragment kept one
/// element per 32-bit register would take twice the registers (the backward attention kernels
/// hold four row fragments and two accumulators per warp and spilled so). fp32 (TF32) elements
/// take a register each.
template <class T, int N>
struct Fragment {
  static_assert(sizeof(T) == 2 && N % 2 == 0, "ctxpar::impl::Fragment: pairs of 16-bit elements");
  std::uint32_t word[N / 2];
  KOKKOS_FORCEINLINE_FUNCTION T operator[](int i) const {
    return T{static_cast<std::uint16_t>(word[i / 2] >> (16 * (i % 2)))};
  }
  /// Sets elements `2j` and `2j + 1`.
  KOKKOS_FORCEINLINE_FUNCTION void set_pair(int j, T even, T odd) {
    word[j] = pair_word(even.bits, odd.bits);
  }
};
template <int N>
struct Fragment<float, N> {
  float value[N];
  KOKKOS_FORCEINLINE_FUNCTION float operator[](int i) const { return value[i]; }
  KOKKOS_FORCEINLINE_FUNCTION void set_pair(int j, float even, float odd) {
    value[2 * j] = even;
    value[2 * j + 1] = odd;
  }
};

/// Fills fragment `f` pair by pair from `element(i)`, the value of its element `i`.
template <class T, int N, class Element>
KOKKOS_FORCEINLINE_FUNCTION void fill_fragment(Fragment<T, N>& f, const Element& element) {
  CTXPAR_FRAGMENT_UNROLL
  for (int j = 0; j < N / 2; ++j) f.set_pair(j, element(2 * j), element(2 * j + 1));
}

/// Lane `lane`'s elements of a row-major tile of A (16 × `Layout::k`): `A(r, c) = tile[r·ld + c]`.
template <class Layout = MmaM16N8K16, class T>
KOKKOS_INLINE_FUNCTION void load_a(int lane, const T* tile, int ld,
                                   Fragment<T, Layout::a_per_lane>& a) {
  fill_fragment(a,
                [&](int i) { return tile[Layout::a_row(lane, i) * ld + Layout::a_col(lane, i)]; });
}

/// Lane `lane`'s elements of a `Layout::k`×8 tile of B stored column by column
/// (`B(p, j) = tile[j·ld + p]`: the rows of a K tile are the columns of Kᵀ, so `S = Q·Kᵀ` reads K
/// as it lies).
template <class Layout = MmaM16N8K16, class T>
KOKKOS_INLINE_FUNCTION void load_b(int lane, const T* tile, int ld,
                                   Fragment<T, Layout::b_per_lane>& b) {
  fill_fragment(b,
                [&](int i) { return tile[Layout::b_col(lane, i) * ld + Layout::b_row(lane, i)]; });
}

/// Lane `lane`'s elements of a `Layout::k`×8 tile of B stored row by row, whose rows pair with the
/// columns of results fed to A through `results_as_a`: `B(p, j) = tile[c·ld + j]` with
/// `c = Layout::result_column(p)` (so `P·V` reads the rows of V, one per key, as they lie).
template <class Layout = MmaM16N8K16, class T>
KOKKOS_INLINE_FUNCTION void load_b_rows(int lane, const T* tile, int ld,
                                        Fragment<T, Layout::b_per_lane>& b) {
  fill_fragment(b, [&](int i) {
    return tile[Layout::result_column(Layout::b_row(lane, i)) * ld + Layout::b_col(lane, i)];
  });
}

/// Writes lane `lane`'s elements of a 16×8 tile of D into row-major `tile[r·ld + c]`.
KOKKOS_INLINE_FUNCTION void store_c(int lane, const float (&c)[4], float* tile, int ld) {
  for (int i = 0; i < MmaAccumulator16x8::c_per_lane; ++i)
    tile[MmaAccumulator16x8::c_row(lane, i) * ld + MmaAccumulator16x8::c_col(lane, i)] = c[i];
}

/// `even` and `odd` rounded to the 16-bit `T` (`T::from_float`) as one fragment word, `even` in
/// the low half. On sm_80 and later one `cvt.rn` instruction rounds the pair (the same bits
/// except a NaN's payload, which nothing here produces); `from_float`, exact but a dozen integer
/// operations, and for IEEE half a trip through memory on its subnormal branch, is what every
/// other compilation runs.
template <class T>
KOKKOS_FORCEINLINE_FUNCTION std::uint32_t rounded_pair(float even, float odd) {
  static_assert(std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>,
                "ctxpar::impl::rounded_pair: bfloat16 or float16");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  std::uint32_t word = 0;
  // The instruction puts its first source in the high half.
  if constexpr (std::is_same_v<T, bfloat16>)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(word) : "f"(odd), "f"(even));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(word) : "f"(odd), "f"(even));
  return word;
#else
  return pair_word(T::from_float(even).bits, T::from_float(odd).bits);
#endif
}

/// Fills fragment `f` from fp32 values `element(i)` rounded to its operand type: 16-bit types
/// in pairs (`rounded_pair`), fp32 to TF32 (`to_tf32`), as the products read them.
template <class T, int N, class Element>
KOKKOS_FORCEINLINE_FUNCTION void fill_rounded(Fragment<T, N>& f, const Element& element) {
  CTXPAR_FRAGMENT_UNROLL
  for (int j = 0; j < N / 2; ++j) {
    if constexpr (std::is_same_v<T, float>)
      f.set_pair(j, to_tf32(element(2 * j)), to_tf32(element(2 * j + 1)));
    else
      f.word[j] = rounded_pair<T>(element(2 * j), element(2 * j + 1));
  }
}

/// The m16n8 product layout that takes operands of type `T`: m16n8k8 TF32 for fp32, m16n8k16
/// for the 16-bit types.
template <class T>
using mma_layout_t = std::conditional_t<std::is_same_v<T, float>, MmaM16N8K8Tf32, MmaM16N8K16>;

/// Two adjacent 16×8 results of one lane (`left` holds columns 0..7, `right` columns 8..15) as
/// that lane's A fragment of the 16×16 tile they form, rounded to `T`: the layouts agree
/// element for element, so a product's output (attention scores, after their softmax) feeds the
/// next product (times V) from registers, with no exchange between lanes.
template <class T>
KOKKOS_INLINE_FUNCTION void results_as_a(const float (&left)[4], const float (&right)[4],
                                         Fragment<T, 8>& a) {
  fill_rounded(a, [&](int i) { return i < 4 ? left[i] : right[i - 4]; });
}

/// One 16×8 result of a lane (`c`) as that lane's A fragment of the TF32 product (m16n8k8),
/// rounded to TF32: element `i` of A is the result in row half `i % 2` and column `2·(l % 4) +
/// i / 2`, the inner index being permuted as `MmaM16N8K8Tf32::result_column` says.
KOKKOS_INLINE_FUNCTION void results_as_a(const float (&c)[4], Fragment<float, 4>& a) {
  fill_rounded(a, [&](int i) { return c[(i % 2) * 2 + i / 2]; });
}

/// `ldmatrix.x4` (four 8×8 matrices of 16-bit elements, one row address per lane): lane `l`
/// points at row `l % 8` of matrix `l / 8`, and receives as its pair `j` (elements `2j`, `2j+1`)
/// row `l / 4`, columns `2·(l % 4)` and `+1`, of matrix `j`. These say where each lane points so
/// that the pairs come out as the fragments above.
struct LdMatrixX4 {
  /// (row, column) of a row-major 16×16 A tile lane `lane` points at: its A fragment results.
  KOKKOS_INLINE_FUNCTION static constexpr int a_row(int lane) { return lane % 16; }
  KOKKOS_INLINE_FUNCTION static constexpr int a_col(int lane) { return (lane / 16) * 8; }
  /// (row, column) of a B tile stored column by column (`B(p, j) = tile[j·ld + p]`, 16 deep and
  /// 16 wide) lane `lane` points at: pairs 0, 1 are its B fragment of columns 0..7, pairs 2, 3
  /// of columns 8..15.
  KOKKOS_INLINE_FUNCTION static constexpr int b_col(int lane) { return lane % 8 + (lane / 16) * 8; }
  KOKKOS_INLINE_FUNCTION static constexpr int b_row(int lane) { return ((lane / 8) % 2) * 8; }
  /// With `.trans` (each 8×8 matrix delivered transposed): (row, column) of a B tile stored row by
  /// row (`B(p, j) = tile[p·ld + j]`, 16 deep and 16 wide) lane `lane` points at: pairs 0, 1 are
  /// its B fragment of columns 0..7, pairs 2, 3 of columns 8..15.
  KOKKOS_INLINE_FUNCTION static constexpr int bt_row(int lane) {
    return lane % 8 + ((lane / 8) % 2) * 8;
  }
  KOKKOS_INLINE_FUNCTION static constexpr int bt_col(int lane) { return (lane / 16) * 8; }
};

/// What `ldmatrix.x4` delivers, for the whole warp at once on the host: `rows[l]` is the address
/// lane `l` supplies (8 consecutive elements), `out[l]` the 8 elements lane `l` receives.
template <class T>
void emulate_ldmatrix_x4(const T* const (&rows)[32], Fragment<T, 8> (&out)[32]) {
  for (int lane = 0; lane < 32; ++lane)
    for (int j = 0; j < 4; ++j) {
      const T* row = rows[j * 8 + lane / 4];
      out[lane].set_pair(j, row[2 * (lane % 4)], row[2 * (lane % 4) + 1]);
    }
}

/// What `ldmatrix.x4.trans` delivers, for the whole warp at once on the host: as
/// `emulate_ldmatrix_x4` with each 8×8 matrix transposed, so lane `l` receives as its pair `j`
/// column `l / 4`, rows `2·(l % 4)` and `+1`, of matrix `j` (row `r` of matrix `j` being the 8
/// elements at `rows[8j + r]`).
template <class T>
void emulate_ldmatrix_x4_trans(const T* const (&rows)[32], Fragment<T, 8> (&out)[32]) {
  for (int lane = 0; lane < 32; ++lane)
    for (int j = 0; j < 4; ++j) {
      const int r = 2 * (lane % 4), c = lane / 4;
      out[lane].set_pair(j, rows[j * 8 + r][c], rows[j * 8 + r + 1][c]);
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// The instruction for one element type (`type`: the PTX type name of A and B), on the operands
// of `mma` below. A macro because the instruction's text must be one string literal.
#define CTXPAR_MMA_M16N8K16(type)                                                                \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." type "." type                            \
               ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"          \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                  \
               : "r"(a.word[0]), "r"(a.word[1]), "r"(a.word[2]), "r"(a.word[3]), "r"(b.word[0]), \
                 "r"(b.word[1]))

/// One lane's part of the warp's `D = A·B + C`, `T` being `bfloat16` or `float16` (every lane of
/// the warp calls it together, as `mma.sync` requires; `c` is C on entry and D on return).
template <class T>
__device__ inline void mma(float (&c)[4], const Fragment<T, 8>& a, const Fragment<T, 4>& b) {
  static_assert(std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>,
                "ctxpar::impl::mma: A and B must be bfloat16 or float16");
  if constexpr (std::is_same_v<T, bfloat16>)
    CTXPAR_MMA_M16N8K16("bf16");
  else
    CTXPAR_MMA_M16N8K16("f16");
}
#undef CTXPAR_MMA_M16N8K16

/// One lane's part of the warp's TF32 `D = A·B + C` (m16n8k8; the inputs' 13 low fraction bits
/// are ignored: round them first with `to_tf32`).
__device__ inline void mma(float (&c)[4], const Fragment<float, 4>& a,
                           const Fragment<float, 2>& b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
        "r"(__float_as_uint(a[3])), "r"(__float_as_uint(b[0])), "r"(__float_as_uint(b[1])));
}

// The instruction with its modifier (`""`, or `".trans"`), on the operands of `ldmatrix_x4` below.
#define CTXPAR_LDMATRIX_X4(modifier)                                                            \
  asm volatile("ldmatrix.sync.aligned.m8n8.x4" modifier ".shared.b16 {%0, %1, %2, %3}, [%4];\n" \
               : "=r"(out.word[0]), "=r"(out.word[1]), "=r"(out.word[2]), "=r"(out.word[3])     \
               : "r"(address))

/// One lane's part of the warp's `ldmatrix.x4` from shared memory (every lane calls it together):
/// `row` is this lane's row address (16-byte aligned, in team scratch), `out` what it receives;
/// `transposed`: `ldmatrix.x4.trans`, each 8×8 matrix delivered transposed.
template <bool transposed = false, class T>
__device__ inline void ldmatrix_x4(const T* row, Fragment<T, 8>& out) {
  const auto address = static_cast<std::uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (transposed)
    CTXPAR_LDMATRIX_X4(".trans");
  else
    CTXPAR_LDMATRIX_X4("");
}
#undef CTXPAR_LDMATRIX_X4
#endif

/// What the instruction of layout `L` computes, for the whole warp (or, for AMD's layouts,
/// wavefront: `L::lanes`) at once on the host: every lane's `c` gains `Σ_p A(r, p)·B(p, j)` for
/// each of its elements `(r, j)`, with A and B assembled from the lanes' fragments through `L`.
/// Products of two 16-bit or two TF32 values are exact in fp32; the sum runs over `p` in
/// increasing order in fp32 (the hardware's order and internal width are unspecified, so tests
/// bound the difference rather than compare bits).
template <class L = MmaM16N8K16, class T>
void emulate_warp_mma(float (&c)[L::lanes][L::c_per_lane],
                      const Fragment<T, L::a_per_lane> (&a)[L::lanes],
                      const Fragment<T, L::b_per_lane> (&b)[L::lanes]) {
  // The value the instruction reads: a 16-bit type's, or a float's TF32 part (low bits dropped).
  auto operand = [](const T& x) {
    if constexpr (std::is_same_v<T, float>) {
      std::uint32_t u = 0;
      std::memcpy(&u, &x, sizeof u);
      u &= ~0x1fffu;
      float r = 0;
      std::memcpy(&r, &u, sizeof r);
      return r;
    } else {
      return x.to_float();
    }
  };
  float A[L::m][L::k] = {}, B[L::k][L::n] = {};
  for (int lane = 0; lane < L::lanes; ++lane) {
    for (int i = 0; i < L::a_per_lane; ++i)
      A[L::a_row(lane, i)][L::a_col(lane, i)] = operand(a[lane][i]);
    for (int i = 0; i < L::b_per_lane; ++i)
      B[L::b_row(lane, i)][L::b_col(lane, i)] = operand(b[lane][i]);
  }
  for (int lane = 0; lane < L::lanes; ++lane) {
    for (int i = 0; i < L::c_per_lane; ++i) {
      const int r = L::c_row(lane, i), j = L::c_col(lane, i);
      float sum = 0;
      for (int p = 0; p < L::k; ++p) sum += A[r][p] * B[p][j];
      c[lane][i] += sum;
    }
  }
}

}  // namespace ctxpar::impl
