/// \file
/// The library's one way to get a host copy of a view, so that the copy a device build makes is
/// made (and counted) in CPU builds too when `CTXPAR_EMULATE_DEVICE_STAGING` is on.
#pragma once

#include <Kokkos_Core.hpp>

#include "ctxpar/core/config.hpp"

namespace ctxpar::impl {

/// A host view shaped like `view`: `view` itself when it is host memory, a new allocation when it
/// is device memory (and always under `CTXPAR_EMULATE_DEVICE_STAGING`). The values are not copied.
/// Call it where allocating is allowed (a plan's construction), never in a steady-state call.
template <class View>
typename View::HostMirror host_mirror(const View& view) {
#if CTXPAR_EMULATE_DEVICE_STAGING
  return Kokkos::create_mirror(view);
#else
  return Kokkos::create_mirror_view(view);
#endif
}

/// `host_mirror(view)` holding `view`'s values.
template <class View>
typename View::HostMirror host_copy(const View& view) {
  auto host = host_mirror(view);
  Kokkos::deep_copy(host, view);
  return host;
}

}  // namespace ctxpar::impl
