// A memory space no host execution space can access, standing in for device memory on a
// host-only build, so the accessibility static_asserts can be exercised without a GPU.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace ctxpar::test {

/// Memory the host cannot touch (Kokkos' default MemorySpaceAccess: not accessible).
struct FakeDeviceSpace {
  using memory_space = FakeDeviceSpace;
  using execution_space = Kokkos::DefaultHostExecutionSpace;
  using device_type = Kokkos::Device<execution_space, memory_space>;
  using size_type = std::size_t;
  static constexpr const char* name() { return "FakeDeviceSpace"; }
};

}  // namespace ctxpar::test
