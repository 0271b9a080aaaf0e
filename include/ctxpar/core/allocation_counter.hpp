/// \file
/// Counting what Kokkos allocates: the measure behind "no allocation in a steady-state call".
#pragma once

#include <Kokkos_Core.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "ctxpar/core/error.hpp"

namespace ctxpar {

namespace impl {
/// Totals of the one live `AllocationCounter` (Kokkos's tool callbacks are process-wide plain
/// function pointers, so the state they update is too).
struct AllocationTotals {
  std::atomic<std::int64_t> allocations{0};
  std::atomic<std::int64_t> bytes{0};
  std::atomic<std::int64_t> deallocations{0};
  std::atomic<bool> live{false};
  std::mutex labels_mutex;
  std::map<std::string, std::int64_t> labels;  // allocations per Kokkos label
};

inline AllocationTotals& allocation_totals() {
  static AllocationTotals totals;
  return totals;
}

inline void count_allocation(const Kokkos_Profiling_SpaceHandle, const char* label,
                             const void* const, const std::uint64_t size) {
  auto& t = allocation_totals();
  t.allocations.fetch_add(1, std::memory_order_relaxed);
  t.bytes.fetch_add(static_cast<std::int64_t>(size), std::memory_order_relaxed);
  const std::lock_guard<std::mutex> lock(t.labels_mutex);
  ++t.labels[label != nullptr ? label : ""];
}

inline void count_deallocation(const Kokkos_Profiling_SpaceHandle, const char*, const void* const,
                               const std::uint64_t) {
  allocation_totals().deallocations.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace impl

/// Counts every allocation Kokkos makes, in any memory space (views, scratch-free device buffers,
/// host mirrors), while it lives, through the Kokkos Tools allocate/deallocate callbacks. Used to
/// show that a repeated call on the same shapes allocates nothing, and by the CLI's `--repeat`.
///
/// The callbacks are process-wide: one counter may live at a time (a second one throws), and while
/// it lives it replaces any allocate/deallocate callbacks a loaded Kokkos tool had set; they are
/// restored when it is destroyed. Construct it after `Kokkos::initialize`, on the host thread.
class AllocationCounter {
 public:
  /// Installs the callbacks. Throws `ctxpar::Error` if another counter is alive.
  AllocationCounter() {
    auto& t = impl::allocation_totals();
    bool expected = false;
    require_local(t.live.compare_exchange_strong(expected, true), "ctxpar::AllocationCounter",
                  "only one allocation counter may be alive at a time", "none alive",
                  "one already alive");
    const auto previous = Kokkos::Tools::Experimental::get_callbacks();
    previous_allocate_ = previous.allocate_data;
    previous_deallocate_ = previous.deallocate_data;
    reset();
    Kokkos::Tools::Experimental::set_allocate_data_callback(impl::count_allocation);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(impl::count_deallocation);
  }
  AllocationCounter(const AllocationCounter&) = delete;
  AllocationCounter& operator=(const AllocationCounter&) = delete;
  /// Restores the callbacks that were set before.
  ~AllocationCounter() {
    Kokkos::Tools::Experimental::set_allocate_data_callback(previous_allocate_);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(previous_deallocate_);
    impl::allocation_totals().live.store(false);
  }

  /// Allocations since construction or the last `reset()`.
  std::int64_t allocations() const { return impl::allocation_totals().allocations.load(); }
  /// Bytes those allocations asked for.
  std::int64_t bytes() const { return impl::allocation_totals().bytes.load(); }
  /// Deallocations since construction or the last `reset()`.
  std::int64_t deallocations() const { return impl::allocation_totals().deallocations.load(); }
  /// The allocations by Kokkos label (the view's label): where a steady state still allocates.
  std::map<std::string, std::int64_t> labels() const {
    auto& t = impl::allocation_totals();
    const std::lock_guard<std::mutex> lock(t.labels_mutex);
    return t.labels;
  }
  /// Sets the counts to zero and forgets the labels.
  void reset() {
    auto& t = impl::allocation_totals();
    t.allocations.store(0);
    t.bytes.store(0);
    t.deallocations.store(0);
    const std::lock_guard<std::mutex> lock(t.labels_mutex);
    t.labels.clear();
  }

 private:
  Kokkos_Profiling_allocateDataFunction previous_allocate_ = nullptr;
  Kokkos_Profiling_deallocateDataFunction previous_deallocate_ = nullptr;
};

}  // namespace ctxpar
