/// \file
/// How the team kernels of every mechanism choose their team size, and the switch that makes
/// host execution spaces run the portable (GPU-shaped) kernels instead of the host fast paths.
///
/// Device backends take the size Kokkos recommends for the functor (never a literal 1). Host
/// backends default to one thread per team, which is what the host fast paths are written for; the
/// run-time control `set_host_team_size` (or the environment variable `CTXPAR_HOST_TEAM_SIZE`)
/// gives OpenMP and Threads teams 2–4 concurrent threads, so the barriers, scratch sharing and
/// `TeamThreadRange` splits that a GPU relies on are exercised on the CPU. Serial cannot run a team
/// wider than one thread, so it stays at one whatever is asked.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <type_traits>

/// When defined to 1, host execution spaces run the portable kernels that device backends run
/// (no host SIMD fast paths), so a CPU build tests the source a GPU compiles. Set by the CMake
/// option `CTXPAR_PORTABLE_KERNELS`.
#ifndef CTXPAR_PORTABLE_KERNELS
#define CTXPAR_PORTABLE_KERNELS 0
#endif

/// Default threads per team on host execution spaces when neither `set_host_team_size` nor the
/// environment variable `CTXPAR_HOST_TEAM_SIZE` says otherwise. Set by the CMake cache variable
/// `CTXPAR_HOST_TEAM_SIZE`.
#ifndef CTXPAR_HOST_TEAM_SIZE
#define CTXPAR_HOST_TEAM_SIZE 1
#endif

namespace ctxpar {

namespace impl {
inline int& host_team_size_setting() {
  static int value = [] {
    const char* env = std::getenv("CTXPAR_HOST_TEAM_SIZE");
    const int parsed = env ? std::atoi(env) : 0;
    return parsed > 0 ? parsed : CTXPAR_HOST_TEAM_SIZE;
  }();
  return value;
}
}  // namespace impl

/// Threads per team requested on host execution spaces (at least 1). Each kernel clamps it to
/// what its space allows (`team_size_max`; 1 on Serial).
inline int host_team_size() {
  return impl::host_team_size_setting();
}

/// Sets the threads per team requested on host execution spaces (values below 1 become 1).
inline void set_host_team_size(int threads) {
  impl::host_team_size_setting() = threads > 1 ? threads : 1;
}

namespace impl {

/// True for execution spaces whose memory is the host's (Serial, OpenMP, Threads).
template <class ExecutionSpace>
inline constexpr bool is_host_space_v =
    std::is_same_v<typename ExecutionSpace::memory_space, Kokkos::HostSpace>;

/// 1 in a translation unit compiled as CUDA (nvcc): the host kernels are written with GCC/clang
/// vector extensions, which nvcc's front end rejects, so there the host spaces run the portable
/// kernels, the same source the device runs.
#if defined(__CUDACC__)
#define CTXPAR_CUDA_TRANSLATION_UNIT 1
#else
#define CTXPAR_CUDA_TRANSLATION_UNIT 0
#endif

/// True when `ExecutionSpace` takes the host fast paths (host SIMD kernels); false on device
/// backends, on every space in a `CTXPAR_PORTABLE_KERNELS` build and in a CUDA translation unit.
template <class ExecutionSpace>
inline constexpr bool uses_host_fast_path_v =
    is_host_space_v<ExecutionSpace> && !CTXPAR_PORTABLE_KERNELS && !CTXPAR_CUDA_TRANSLATION_UNIT;

/// Team size for launching `functor` with `probe` (a policy of the right league size, scratch
/// sizes and vector length, built with team size 1 only to ask Kokkos what fits): on host spaces
/// the requested `host_team_size()` clamped to `team_size_max`; on device spaces
/// `team_size_recommended`, capped by `preferred` when that is positive (a kernel whose rows map
/// to threads gains nothing from more threads than rows).
template <class Policy, class Functor>
int choose_team_size(const Policy& probe, const Functor& functor, int preferred = 0) {
  using execution_space = typename Policy::execution_space;
  const int most = probe.team_size_max(functor, Kokkos::ParallelForTag());
  if constexpr (is_host_space_v<execution_space>) {
    return std::max(1, std::min(host_team_size(), most));
  } else {
    int size = probe.team_size_recommended(functor, Kokkos::ParallelForTag());
    if (preferred > 0) size = std::min(size, preferred);
    return std::max(1, std::min(size, most));
  }
}

/// The team-scratch level for `bytes` per team on `ExecutionSpace`: 0 where it fits the space's
/// level-0 limit (`scratch_size_max(0)`: on a GPU, shared memory, 40 KiB on a CUDA device under
/// Kokkos 4), else 1 (on a GPU, global memory). A kernel that carries state in scratch from one
/// step to the next runs its reads and writes at shared-memory latency when its scratch fits.
template <class ExecutionSpace>
int scratch_level(std::size_t bytes) {
  using Policy = Kokkos::TeamPolicy<ExecutionSpace>;
  return bytes <= static_cast<std::size_t>(Policy::scratch_size_max(0)) ? 0 : 1;
}

/// A device team size of `size` threads as a team whose products run on warp tensor cores needs
/// it: rounded down to whole warps of `warp` threads (a partial warp would sit idle) and at least
/// one warp, within `most`, the launch's largest; 0 when `most` holds no whole warp.
constexpr int whole_warps(int size, int most, int warp = 32) {
  if (most < warp) return 0;
  return std::min(std::max(warp, size / warp * warp), most / warp * warp);
}

}  // namespace impl
}  // namespace ctxpar
