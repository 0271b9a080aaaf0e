/// \file
/// The lanes of a warp that one thread runs, and the warp-level operations the tensor-core kernels
/// perform on them: the tile product `D = A·B + C` and the maximum and the sum over the four lanes
/// that share a row of an accumulator fragment.
///
/// On a CUDA device of compute capability 8.0 or more a thread is one lane and these are the
/// instructions (`mma.sync`, `__shfl_xor_sync`). On the host spaces one thread runs all 32 lanes
/// of a warp, each operation for every lane at once, and these are their emulations. A kernel
/// written over `WarpLanes` is therefore the same source on both: its fragment loads, masking,
/// softmax and stores run, and are tested, in CPU CI with only the instructions replaced.
#pragma once

#include <Kokkos_Core.hpp>

#include <type_traits>

#include "ctxpar/core/impl/mma_fragment.hpp"
#include "ctxpar/core/team_size.hpp"

namespace ctxpar::impl {

/// 1 in device code that has the warp instructions (one thread per lane), 0 elsewhere.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define CTXPAR_WARP_LANES_ARE_THREADS 1
#else
#define CTXPAR_WARP_LANES_ARE_THREADS 0
#endif

/// True when the build's CUDA architecture has the m16n8 tensor-core products (sm_80 and later).
#if defined(KOKKOS_ENABLE_CUDA) && (defined(KOKKOS_ARCH_AMPERE) || defined(KOKKOS_ARCH_ADA89) || \
                                    defined(KOKKOS_ARCH_HOPPER) || defined(KOKKOS_ARCH_BLACKWELL))
inline constexpr bool cuda_has_warp_mma = true;
#else
inline constexpr bool cuda_has_warp_mma = false;
#endif

/// True when the warp-level tensor-core kernels run on `ExecutionSpace`: the host spaces through
/// the emulation, CUDA built for sm_80 or later through the instructions. Other devices (HIP's
/// MFMA, CUDA before sm_80) do not have them yet.
template <class ExecutionSpace>
inline constexpr bool has_warp_mma_v = is_host_space_v<ExecutionSpace>
#if defined(KOKKOS_ENABLE_CUDA)
                                       || (std::is_same_v<ExecutionSpace, Kokkos::Cuda> &&
                                           cuda_has_warp_mma)
#endif
    ;

/// True where an `automatic` choice runs 16-bit data on the warp tensor cores: the devices that
/// have them (CUDA built for sm_80 or later). The host spaces run the emulation only when a caller
/// asks for it by name: it is there to test the device's data movement, not to be fast.
template <class ExecutionSpace>
inline constexpr bool tensor_cores_by_default_v =
    has_warp_mma_v<ExecutionSpace> && !is_host_space_v<ExecutionSpace>;

/// Threads of a team of `warps` warps in a kernel over `WarpLanes`: a thread per lane on a device,
/// one thread running every warp on the host spaces.
template <class ExecutionSpace>
constexpr int warp_team_size(int warps) {
  return is_host_space_v<ExecutionSpace> ? 1 : 32 * warps;
}

/// The lanes of one warp the calling thread runs: `count` of them, slot `s` being lane
/// `lane(s)`. Per-lane values of a kernel are arrays `[count]` (one element on a device).
struct WarpLanes {
  static constexpr int count = CTXPAR_WARP_LANES_ARE_THREADS ? 1 : 32;
  /// The lane of slot 0: the thread's own on a device, 0 on the host.
  int first;
  /// The lanes of a thread of rank `thread` in its team.
  KOKKOS_INLINE_FUNCTION static WarpLanes of_thread(int thread) {
    return WarpLanes{count == 1 ? thread % 32 : 0};
  }
  KOKKOS_INLINE_FUNCTION int lane(int slot) const { return first + slot; }
};

/// The warp's `D = A·B + C` in layout `L` (`MmaM16N8K16` or `MmaM16N8K8Tf32`): `c` holds each
/// lane's C on entry and D on return. Every lane of the warp calls it together.
template <class L, class T>
KOKKOS_INLINE_FUNCTION void warp_mma(float (&c)[WarpLanes::count][4],
                                     const Fragment<T, L::a_per_lane> (&a)[WarpLanes::count],
                                     const Fragment<T, L::b_per_lane> (&b)[WarpLanes::count]) {
#if CTXPAR_WARP_LANES_ARE_THREADS
  mma(c[0], a[0], b[0]);
#elif defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__SYCL_DEVICE_ONLY__)
  (void)c;
  (void)a;
  (void)b;
  Kokkos::abort("ctxpar: warp_mma on a device without tensor-core products");
#else
  emulate_warp_mma<L>(c, a, b);
#endif
}

/// The warp's A fragments (m16n8k16) of the row-major 16×16 tile `tile[r·ld + c]` of 16-bit
/// elements in level-0 team scratch, by one `ldmatrix.x4` where the lanes are threads (each lane
/// supplies the row address `LdMatrixX4` names) and by its emulation on the host, so that the
/// addresses a kernel computes run in CPU CI. `tile` and every row start (`ld` elements apart)
/// must be 16-byte aligned, as the instruction requires.
template <class T>
KOKKOS_INLINE_FUNCTION void warp_ldmatrix_a(const WarpLanes& lanes, const T* tile, int ld,
                                            Fragment<T, 8> (&a)[WarpLanes::count]) {
#if CTXPAR_WARP_LANES_ARE_THREADS
  const int lane = lanes.lane(0);
  ldmatrix_x4(tile + LdMatrixX4::a_row(lane) * ld + LdMatrixX4::a_col(lane), a[0]);
#elif defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__SYCL_DEVICE_ONLY__)
  (void)lanes;
  (void)tile;
  (void)ld;
  (void)a;
  Kokkos::abort("ctxpar: warp_ldmatrix_a on a device without tensor-core products");
#else
  (void)lanes;
  const T* rows[32];
  for (int lane = 0; lane < 32; ++lane)
    rows[lane] = tile + LdMatrixX4::a_row(lane) * ld + LdMatrixX4::a_col(lane);
  emulate_ldmatrix_x4(rows, a);
#endif
}

/// The warp's B fragments (m16n8k16) of two adjacent 8-column blocks of a 16-deep tile of 16-bit
/// elements in level-0 team scratch, `left` of columns 0..7 and `right` of 8..15, by one
/// `ldmatrix.x4` (`.trans` where `rows_stored`) where the lanes are threads and by its emulation
/// on the host. The tile is stored column by column (`B(p, j) = tile[j·ld + p]`: the rows of a K
/// tile for `Q·Kᵀ`), or where `rows_stored`, row by row (`B(p, j) = tile[p·ld + j]`: the rows of a
/// V tile for `P·V`). Alignment as `warp_ldmatrix_a`.
template <bool rows_stored, class T>
KOKKOS_INLINE_FUNCTION void warp_ldmatrix_b(const WarpLanes& lanes, const T* tile, int ld,
                                            Fragment<T, 4> (&left)[WarpLanes::count],
                                            Fragment<T, 4> (&right)[WarpLanes::count]) {
  // Where lane `lane` points: the row of the stored tile and the element within it.
  const auto address = [&](int lane) {
    return rows_stored ? tile + LdMatrixX4::bt_row(lane) * ld + LdMatrixX4::bt_col(lane)
                       : tile + LdMatrixX4::b_col(lane) * ld + LdMatrixX4::b_row(lane);
  };
#if CTXPAR_WARP_LANES_ARE_THREADS
  Fragment<T, 8> both;
  ldmatrix_x4<rows_stored>(address(lanes.lane(0)), both);
  left[0].word[0] = both.word[0];
  left[0].word[1] = both.word[1];
  right[0].word[0] = both.word[2];
  right[0].word[1] = both.word[3];
#elif defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__SYCL_DEVICE_ONLY__)
  (void)lanes;
  (void)address;
  (void)left;
  (void)right;
  Kokkos::abort("ctxpar: warp_ldmatrix_b on a device without tensor-core products");
#else
  (void)lanes;
  const T* rows[32];
  for (int lane = 0; lane < 32; ++lane) rows[lane] = address(lane);
  Fragment<T, 8> both[32];
  if constexpr (rows_stored)
    emulate_ldmatrix_x4_trans(rows, both);
  else
    emulate_ldmatrix_x4(rows, both);
  for (int lane = 0; lane < 32; ++lane) {
    left[lane].word[0] = both[lane].word[0];
    left[lane].word[1] = both[lane].word[1];
    right[lane].word[0] = both[lane].word[2];
    right[lane].word[1] = both[lane].word[3];
  }
#endif
}

/// Each lane's `x` becomes the maximum over the four lanes of its row group (lanes `4g..4g+3`).
KOKKOS_INLINE_FUNCTION void quad_max(float (&x)[WarpLanes::count]) {
#if CTXPAR_WARP_LANES_ARE_THREADS
  for (int offset = 1; offset < 4; offset *= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, x[0], offset);
    x[0] = x[0] > other ? x[0] : other;
  }
#elif defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__SYCL_DEVICE_ONLY__)
  (void)x;
  Kokkos::abort("ctxpar: quad_max on a device without tensor-core products");
#else
  for (int g = 0; g < 32; g += 4) {
    const float a = x[g] > x[g + 1] ? x[g] : x[g + 1];
    const float b = x[g + 2] > x[g + 3] ? x[g + 2] : x[g + 3];
    const float m = a > b ? a : b;
    for (int l = g; l < g + 4; ++l) x[l] = m;
  }
#endif
}

/// Each lane's `x` becomes the sum over the four lanes of its row group, as the butterfly of two
/// exchanges adds: `(x0 + x1) + (x2 + x3)` on every lane of the group (the same bits on each).
KOKKOS_INLINE_FUNCTION void quad_sum(float (&x)[WarpLanes::count]) {
#if CTXPAR_WARP_LANES_ARE_THREADS
  for (int offset = 1; offset < 4; offset *= 2) x[0] += __shfl_xor_sync(0xffffffffu, x[0], offset);
#elif defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__SYCL_DEVICE_ONLY__)
  (void)x;
  Kokkos::abort("ctxpar: quad_sum on a device without tensor-core products");
#else
  for (int g = 0; g < 32; g += 4) {
    const float s = (x[g] + x[g + 1]) + (x[g + 2] + x[g + 3]);
    for (int l = g; l < g + 4; ++l) x[l] = s;
  }
#endif
}

}  // namespace ctxpar::impl
