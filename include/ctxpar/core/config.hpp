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
