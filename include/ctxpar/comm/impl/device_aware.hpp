/// \file
/// Whether the MPI library reads and writes the device memory of the enabled Kokkos device
/// backend, so collectives can hand device buffers to it without staging.
#pragma once

#include <mpi.h>
#include <Kokkos_Core.hpp>

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's extensions: MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#endif

#include "ctxpar/core/config.hpp"

namespace ctxpar::impl {

/// True when device buffers may go to MPI directly: `CTXPAR_DEVICE_AWARE_MPI` forces it (the
/// user vouches for the MPI); otherwise an MPI whose headers declare CUDA (ROCm) awareness is asked
/// once at run time (`MPIX_Query_cuda_support`, `MPIX_Query_rocm_support`), since a build with
/// the support may still run on a transport without it. False without a device backend.
inline bool mpi_is_device_aware() {
#if CTXPAR_DEVICE_AWARE_MPI
  return true;
#elif defined(KOKKOS_ENABLE_CUDA) && defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  static const bool aware = MPIX_Query_cuda_support() == 1;
  return aware;
#elif defined(KOKKOS_ENABLE_HIP) && defined(MPIX_ROCM_AWARE_SUPPORT) && MPIX_ROCM_AWARE_SUPPORT
  static const bool aware = MPIX_Query_rocm_support() == 1;
  return aware;
#else
  return false;
#endif
}

}  // namespace ctxpar::impl
