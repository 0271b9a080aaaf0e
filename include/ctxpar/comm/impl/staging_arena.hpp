/// \file
/// The host memory a group stages device buffers through when MPI cannot read device memory:
/// pinned where the backend has pinned host memory, grown to the largest message and then reused,
/// so a steady-state collective allocates nothing.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <memory>
#include <vector>

namespace ctxpar::impl {

/// Host memory that the device backend can copy to and from at full speed (page-locked).
#if defined(KOKKOS_ENABLE_CUDA)
using staging_memory_space = Kokkos::CudaHostPinnedSpace;
#elif defined(KOKKOS_ENABLE_HIP) && KOKKOS_VERSION >= 40000
using staging_memory_space = Kokkos::HIPHostPinnedSpace;
#elif defined(KOKKOS_ENABLE_HIP)
using staging_memory_space = Kokkos::Experimental::HIPHostPinnedSpace;
#else
using staging_memory_space = Kokkos::HostSpace;
#endif

/// Staging buffers in last-in-first-out leases: a collective takes one lease per buffer it
/// stages (a send and a receive), each lease level keeps its memory for the next collective and
/// grows only when a message is larger than any before. The memory is released at
/// `Kokkos::finalize` at the latest, so a group may outlive Kokkos.
class StagingArena {
 public:
  /// Staging memory of at least `bytes`, held until the lease is destroyed.
  class Lease {
   public:
    Lease(Lease&& other) noexcept : arena_(other.arena_), data_(other.data_) {
      other.arena_ = nullptr;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (arena_ != nullptr) --arena_->depth_;
    }
    /// Start of the leased memory.
    void* data() const { return data_; }

   private:
    friend class StagingArena;
    Lease(StagingArena* arena, void* data) : arena_(arena), data_(data) {}
    StagingArena* arena_;
    void* data_;
  };

  /// Leases `bytes` of staging memory; allocates only when this level has never held as many.
  Lease acquire(std::size_t bytes) {
    State& s = *state_;
    if (!s.hooked) {
      // Views must not outlive Kokkos: drop the memory when Kokkos finalizes. The hook holds
      // the state weakly, so a group destroyed earlier leaves nothing behind.
      std::weak_ptr<State> weak = state_;
      Kokkos::push_finalize_hook([weak] {
        if (auto live = weak.lock()) live->levels.clear();
      });
      s.hooked = true;
    }
    if (s.levels.size() <= static_cast<std::size_t>(depth_)) s.levels.resize(depth_ + 1);
    auto& level = s.levels[depth_];
    if (level.extent(0) < bytes)
      level = buffer(Kokkos::view_alloc(Kokkos::WithoutInitializing, "ctxpar::comm::staging"),
                     bytes);  // Kokkos aligns every allocation for any scalar
    ++depth_;
    return Lease(this, level.data());
  }

 private:
  using buffer = Kokkos::View<unsigned char*, staging_memory_space>;
  struct State {
    std::vector<buffer> levels;
    bool hooked = false;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
  int depth_ = 0;
};

}  // namespace ctxpar::impl
