/// \file
/// Hands the memory of a contiguous Kokkos view to MPI: directly when the MPI is device-aware or
/// the view is host-accessible, otherwise through the group's staging memory.
#pragma once

#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <boost/mpi/datatype.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ctxpar/comm/impl/device_aware.hpp"
#include "ctxpar/comm/impl/mpi_count.hpp"
#include "ctxpar/comm/impl/staging_arena.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/config.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/core/view_checks.hpp"

namespace ctxpar::impl {

/// The MPI datatype of a view's scalar type. The 16-bit storage types (`core/storage.hpp`) travel
/// as `MPI_UINT16_T`: their bit patterns, moved, never added (`mpi_sum_datatype_of`).
template <class View>
MPI_Datatype mpi_datatype_of() {
  using value_type = std::remove_const_t<typename View::value_type>;
  if constexpr (is_narrow_storage_v<value_type>) {
    static_assert(sizeof(value_type) == sizeof(std::uint16_t), "16-bit storage types are 2 bytes");
    return MPI_UINT16_T;
  } else {
    static_assert(std::is_arithmetic_v<value_type>,
                  "ctxpar collectives: views must hold arithmetic scalars (float, double, int, "
                  "...) or a 16-bit storage type (ctxpar::bfloat16, ctxpar::float16)");
    return boost::mpi::get_mpi_datatype<value_type>(value_type());
  }
}

/// The MPI datatype of a view that a collective sums: only arithmetic types (MPI cannot add
/// 16-bit floats; sums of them are formed in their compute type, `core/storage.hpp`).
template <class View>
MPI_Datatype mpi_sum_datatype_of() {
  using value_type = std::remove_const_t<typename View::value_type>;
  static_assert(
      !is_narrow_storage_v<value_type>,
      "ctxpar sums: MPI cannot add 16-bit floats; widen them to their compute type first");
  return mpi_datatype_of<View>();
}

/// A contiguous view's memory as MPI sees it. For a staged view (device memory and an MPI that is
/// not device-aware, `mpi_is_device_aware`, or any view under `CTXPAR_EMULATE_DEVICE_STAGING`)
/// the memory is a lease of the group's staging arena: the constructor copies device → staging
/// when `copy_in`, and `copy_out()` copies staging → device. Buffers of one collective are
/// destroyed in reverse order of construction, as the arena's leases require.
template <class View>
class MpiBuffer {
 public:
  using value_type = std::remove_const_t<typename View::value_type>;

  MpiBuffer(const View& view, bool copy_in, const std::string& op, StagingArena& arena)
      : view_(view) {
    require_contiguous(view, op, "every buffer handed to a collective");
    if constexpr (may_stage) {
      if (CTXPAR_EMULATE_DEVICE_STAGING || !mpi_is_device_aware()) {
        lease_.emplace(arena.acquire(view.span() * sizeof(value_type)));
        host_ = staging_view(static_cast<value_type*>(lease_->data()), view.span());
        if (copy_in) Kokkos::deep_copy(host_, device_flat());
      }
    } else {
      (void)arena;
    }
  }

  /// Pointer MPI reads from or writes to.
  value_type* data() const { return lease_ ? host_.data() : const_cast<value_type*>(view_.data()); }
  /// Elements in the view.
  std::int64_t size() const { return static_cast<std::int64_t>(view_.span()); }

  /// After MPI wrote the first `count` elements of `data()` (all of them when `count < 0`): makes
  /// the view hold the received values. Only the received prefix is copied, so a receive view
  /// longer than the message keeps its tail.
  void copy_out(std::int64_t count = -1) const {
    if (lease_) {
      const std::size_t n = count < 0 ? view_.span() : static_cast<std::size_t>(count);
      const std::pair<std::size_t, std::size_t> prefix(0, n);
      Kokkos::deep_copy(Kokkos::subview(device_flat(), prefix), Kokkos::subview(host_, prefix));
    } else {
      (void)count;
    }
  }

 private:
  auto device_flat() const {
    return Kokkos::View<value_type*, typename View::memory_space, Kokkos::MemoryUnmanaged>(
        const_cast<value_type*>(view_.data()), view_.span());
  }

  // Host-accessible memory goes to MPI as it is, unless the tests emulate a device.
  static constexpr bool may_stage = CTXPAR_EMULATE_DEVICE_STAGING || !is_host_accessible_v<View>;
  using staging_view =
      Kokkos::View<value_type*, staging_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  View view_;
  std::optional<StagingArena::Lease> lease_;
  staging_view host_;
};

/// Prefix sums of `counts` (displacements for the v-collectives), checked for `int` overflow.
inline std::vector<int> displacements(const std::vector<int>& counts, const std::string& op) {
  std::vector<int> displs(counts.size(), 0);
  std::int64_t running = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    displs[i] = mpi_count(running, op);
    running += mpi_count(counts[i], op);
  }
  mpi_count(running, op);
  return displs;
}

}  // namespace ctxpar::impl
