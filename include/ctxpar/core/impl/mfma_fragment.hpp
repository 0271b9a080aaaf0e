/// \file
/// The wavefront-level matrix products `D = A·B + C` of AMD CDNA GPUs (MFMA: gfx908, gfx90a and
/// the gfx94x family) with fp32 accumulation, in the 16×16 shapes the chunkwise team products
/// use: IEEE half and bfloat16 A and B 16 deep (bfloat16 8 deep on gfx908, whose 16-deep
/// bfloat16 instruction came with gfx90a), and fp32 A and B 8 deep as two 4-deep instructions.
/// For each, which lane of the 64 holds which element of A, B and C, as index functions in the
/// shape of the NVIDIA layouts of `mma_fragment.hpp`, so that the same loads, stores and host
/// emulation (`emulate_warp_mma`) read them.
///
/// In every shape lane `l` holds row `l % 16` of A and column `l % 16` of B and of D; the
/// quarter `l / 16` of the wavefront says which inner indices (of A and B) and which four rows
/// (of D) it holds. On HIP device code for those targets `mfma` is the instruction (the
/// compiler's `__builtin_amdgcn_mfma_*`); everywhere else the emulation computes what it
/// computes for all 64 lanes at once, so the data movement around it runs, and is tested, in CPU
/// CI through the same source.
#pragma once

#include <Kokkos_Core.hpp>

#include <type_traits>

#include "ctxpar/core/bfloat16.hpp"
#include "ctxpar/core/float16.hpp"
#include "ctxpar/core/impl/mma_fragment.hpp"

/// 1 in HIP device code for a target with the MFMA instructions (one thread per lane), 0
/// elsewhere.
#if defined(__HIP_DEVICE_COMPILE__) &&                                                           \
    (defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || \
     defined(__gfx942__))
#define CTXPAR_WAVE_LANES_ARE_THREADS 1
#else
#define CTXPAR_WAVE_LANES_ARE_THREADS 0
#endif

/// 1 when the build's HIP target has MFMA, as the host side of the build sees it (the device
/// side reads the compiler's target macros above). Kokkos 4 names the target in its
/// configuration; Kokkos 3.4 does not, and the project's CMake then defines this from
/// `Kokkos_ARCH`. A HIP build for another target (RDNA) keeps the exact products.
#if !defined(CTXPAR_HIP_MFMA)
#if defined(KOKKOS_ENABLE_HIP) &&                                          \
    (defined(KOKKOS_ARCH_VEGA908) || defined(KOKKOS_ARCH_VEGA90A) ||       \
     defined(KOKKOS_ARCH_AMD_GFX908) || defined(KOKKOS_ARCH_AMD_GFX90A) || \
     defined(KOKKOS_ARCH_AMD_GFX940) || defined(KOKKOS_ARCH_AMD_GFX942) || \
     defined(KOKKOS_ARCH_AMD_GFX942_APU))
#define CTXPAR_HIP_MFMA 1
#else
#define CTXPAR_HIP_MFMA 0
#endif
#endif

namespace ctxpar::impl {

/// The fp32 16×16 accumulator of the MFMA products (C and D), the same for every input type:
/// lane `l` holds column `l % 16`, rows `4·(l / 16)` to `+3`.
struct MfmaAccumulator16x16 {
  static constexpr int m = 16, n = 16;
  static constexpr int lanes = 64;
  static constexpr int c_per_lane = 4;  ///< elements of C each lane holds
  /// Row of C (and D) held by lane `lane` as its element `i` (0..3).
  KOKKOS_INLINE_FUNCTION static constexpr int c_row(int lane, int i) { return (lane / 16) * 4 + i; }
  /// Column of C (and D) held by lane `lane` as its element `i`.
  KOKKOS_INLINE_FUNCTION static constexpr int c_col(int lane, int /*i*/) { return lane % 16; }
};

/// Shape and fragment layout of a 16×16 MFMA product whose inner depth `Depth` the wavefront's
/// four quarters split in consecutive runs: quarter `l / 16` holds inner indices
/// `(Depth / 4)·(l / 16)` onwards (`v_mfma_f32_16x16x16f16`, `_16x16x16bf16_1k`: 4 per lane;
/// `_16x16x8bf16`: 2 per lane).
template <int Depth>
struct MfmaM16N16Consecutive : MfmaAccumulator16x16 {
  static constexpr int k = Depth;
  static constexpr int a_per_lane = Depth / 4, b_per_lane = Depth / 4;
  /// Row of A held by lane `lane` as its element `i`.
  KOKKOS_INLINE_FUNCTION static constexpr int a_row(int lane, int /*i*/) { return lane % 16; }
  /// Column of A (the inner index) held by lane `lane` as its element `i`.
  KOKKOS_INLINE_FUNCTION static constexpr int a_col(int lane, int i) {
    return (lane / 16) * a_per_lane + i;
  }
  /// Row (the inner index) of B held by lane `lane` as its element `i`.
  KOKKOS_INLINE_FUNCTION static constexpr int b_row(int lane, int i) { return a_col(lane, i); }
  /// Column of B held by lane `lane` as its element `i`.
  KOKKOS_INLINE_FUNCTION static constexpr int b_col(int lane, int /*i*/) { return lane % 16; }
};

/// IEEE half on every MFMA target, bfloat16 on gfx90a and later: 16 deep, 4 elements per lane.
using MfmaM16N16K16 = MfmaM16N16Consecutive<16>;
/// bfloat16 on gfx908: 8 deep, 2 elements per lane.
using MfmaM16N16K8 = MfmaM16N16Consecutive<8>;

/// fp32 A and B (read as the caller rounded them: TF32 for the `tf32` products, which these
/// instructions then multiply exactly): 8 deep as two `v_mfma_f32_16x16x4f32`, each 4 deep with
/// one element per lane. Element `i` of a lane belongs to instruction `i`, whose quarter `l / 16`
/// holds inner index `l / 16`.
struct MfmaM16N16K8F32 : MfmaAccumulator16x16 {
  static constexpr int k = 8;
  static constexpr int a_per_lane = 2, b_per_lane = 2;
  KOKKOS_INLINE_FUNCTION static constexpr int a_row(int lane, int /*i*/) { return lane % 16; }
  KOKKOS_INLINE_FUNCTION static constexpr int a_col(int lane, int i) { return i * 4 + lane / 16; }
  KOKKOS_INLINE_FUNCTION static constexpr int b_row(int lane, int i) { return a_col(lane, i); }
  KOKKOS_INLINE_FUNCTION static constexpr int b_col(int lane, int /*i*/) { return lane % 16; }
};

/// True for the MFMA layouts (a wavefront of 64 lanes), false for the NVIDIA ones.
template <class Layout>
inline constexpr bool is_mfma_layout_v = std::is_base_of_v<MfmaAccumulator16x16, Layout>;

/// The MFMA layout that takes operands of type `T` on the target being compiled: fp32 as two
/// 4-deep instructions, IEEE half 16 deep, bfloat16 16 deep except on gfx908 (8 deep).
template <class T>
struct MfmaLayoutOf {
  using type = MfmaM16N16K16;
};
template <>
struct MfmaLayoutOf<float> {
  using type = MfmaM16N16K8F32;
};
template <>
struct MfmaLayoutOf<bfloat16> {
#if defined(__gfx908__)
  using type = MfmaM16N16K8;
#else
  using type = MfmaM16N16K16;
#endif
};
template <class T>
using mfma_layout_t = typename MfmaLayoutOf<T>::type;

#if CTXPAR_WAVE_LANES_ARE_THREADS
using mfma_float4 = float __attribute__((ext_vector_type(4)));

/// One lane's part of the wavefront's `D = A·B + C` for 16-bit `T` in the layout
/// `mfma_layout_t<T>` (every lane of the wavefront calls it together; `c` is C on entry and D on
/// return).
template <class T, int N>
__device__ inline void mfma(float (&c)[4], const Fragment<T, N>& a, const Fragment<T, N>& b) {
  static_assert(std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>,
                "ctxpar::impl::mfma: A and B must be bfloat16, float16 or float");
  mfma_float4 d = {c[0], c[1], c[2], c[3]};
  if constexpr (std::is_same_v<T, float16>) {
    using half4 = _Float16 __attribute__((ext_vector_type(4)));
    static_assert(N == 4, "ctxpar::impl::mfma: IEEE half is 16 deep");
    d = __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(half4, a),
                                              __builtin_bit_cast(half4, b), d, 0, 0, 0);
  } else if constexpr (N == 4) {
#if defined(__gfx908__)
    static_assert(N != 4, "ctxpar::impl::mfma: gfx908 multiplies bfloat16 8 deep");
#else
    using short4 = short __attribute__((ext_vector_type(4)));
    d = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(short4, a),
                                                  __builtin_bit_cast(short4, b), d, 0, 0, 0);
#endif
  } else {
#if defined(__gfx908__) || defined(__gfx90a__)
    using short2 = short __attribute__((ext_vector_type(2)));
    d = __builtin_amdgcn_mfma_f32_16x16x8bf16(__builtin_bit_cast(short2, a),
                                              __builtin_bit_cast(short2, b), d, 0, 0, 0);
#else
    static_assert(N != 2, "ctxpar::impl::mfma: the 8-deep bfloat16 product is gfx908/gfx90a only");
#endif
  }
  for (int i = 0; i < 4; ++i) c[i] = d[i];
}

/// One lane's part of the wavefront's fp32 `D = A·B + C`, 8 deep (`MfmaM16N16K8F32`).
__device__ inline void mfma(float (&c)[4], const Fragment<float, 2>& a,
                            const Fragment<float, 2>& b) {
  mfma_float4 d = {c[0], c[1], c[2], c[3]};
  d = __builtin_amdgcn_mfma_f32_16x16x4f32(a.value[0], b.value[0], d, 0, 0, 0);
  d = __builtin_amdgcn_mfma_f32_16x16x4f32(a.value[1], b.value[1], d, 0, 0, 0);
  for (int i = 0; i < 4; ++i) c[i] = d[i];
}
#endif

/// Per-lane values a thread holds in a kernel over MFMA layouts: one on a device with them (a
/// thread per lane), the whole wavefront's 64 where one thread emulates it.
inline constexpr int wave_lane_slots = CTXPAR_WAVE_LANES_ARE_THREADS ? 1 : 64;

/// The wavefront's `D = A·B + C` in MFMA layout `L`: `c` holds each lane's C on entry and D on
/// return. Every lane of the wavefront calls it together.
template <class L, class T>
KOKKOS_INLINE_FUNCTION void wave_mfma(float (&c)[wave_lane_slots][4],
                                      const Fragment<T, L::a_per_lane> (&a)[wave_lane_slots],
                                      const Fragment<T, L::b_per_lane> (&b)[wave_lane_slots]) {
#if CTXPAR_WAVE_LANES_ARE_THREADS
  mfma(c[0], a[0], b[0]);
#elif defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__SYCL_DEVICE_ONLY__)
  (void)c;
  (void)a;
  (void)b;
  Kokkos::abort("ctxpar: wave_mfma on a device without MFMA products");
#else
  emulate_warp_mma<L>(c, a, b);
#endif
}

}  // namespace ctxpar::impl
