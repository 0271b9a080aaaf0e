/// \file
/// Build-wide configuration of ctxpar: version and the device-aware MPI switch.
#pragma once

/// Major version of ctxpar.
#define CTXPAR_VERSION_MAJOR 0
/// Minor version of ctxpar.
#define CTXPAR_VERSION_MINOR 1
/// Patch version of ctxpar.
#define CTXPAR_VERSION_PATCH 0

/// When defined to 1, device buffers are handed to MPI directly (the MPI library must be
/// device-aware); otherwise every collective stages through host mirrors. Set by the CMake option
/// `CTXPAR_DEVICE_AWARE_MPI`.
#ifndef CTXPAR_DEVICE_AWARE_MPI
#define CTXPAR_DEVICE_AWARE_MPI 0
#endif

/// When defined to 1 (tests only), host memory is treated as if it were a device's wherever that
/// changes the code path: every collective stages its buffers through the group's staging arena
/// and every host copy the library makes of a view is a separate allocation (`host_mirror`), as
/// on a GPU without device-aware MPI. The CPU tests thereby run, and the allocation tests count,
/// the paths only a device takes otherwise. Set per target by the test suite.
#ifndef CTXPAR_EMULATE_DEVICE_STAGING
#define CTXPAR_EMULATE_DEVICE_STAGING 0
#endif
