/// \file
/// Memory a plan owns between calls: grow-only buffers that typed views are carved from, and the
/// rule for outputs the caller may leave empty. This is what lets a plan's steady-state call
/// allocate nothing.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ctxpar/core/view_checks.hpp"

namespace ctxpar {

/// Device storage that only grows: `reserve<T>(n)` returns room for `n` elements of `T`,
/// reallocating (without keeping the contents) only when the request exceeds the capacity. Views
/// carved from it are valid until the next `reserve` on the same buffer, so each buffer serves one
/// carving at a time.
template <class MemorySpace>
class GrowingBuffer {
 public:
  /// `label` names the allocation in Kokkos Tools (and in `ctxpar::AllocationCounter`).
  explicit GrowingBuffer(std::string label = "ctxpar::workspace") : label_(std::move(label)) {}

  /// Room for `count` elements of `T` (8-byte aligned); grows the storage when needed.
  template <class T>
  T* reserve(std::size_t count) {
    static_assert(alignof(T) <= alignof(Word), "ctxpar::GrowingBuffer: over-aligned element type");
    const std::size_t words = (count * sizeof(T) + sizeof(Word) - 1) / sizeof(Word);
    if (words > storage_.extent(0))
      storage_ = Kokkos::View<Word*, MemorySpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, label_), words);
    return reinterpret_cast<T*>(storage_.data());
  }

  /// Bytes held now.
  std::size_t capacity_bytes() const { return storage_.extent(0) * sizeof(Word); }

 private:
  using Word = std::uint64_t;
  std::string label_;
  Kokkos::View<Word*, MemorySpace> storage_;
};

/// An unmanaged view of type `View` with the given extents on `buffer`'s storage (grown if
/// needed). Valid until the next `reserve` or `carve` on the same buffer.
template <class View, class MemorySpace, class... Extents>
View carve(GrowingBuffer<MemorySpace>& buffer, Extents... extents) {
  static_assert(std::is_same_v<typename View::memory_space, MemorySpace>,
                "ctxpar::carve: the view must live in the buffer's memory space");
  std::size_t count = 1;
  ((count *= static_cast<std::size_t>(extents)), ...);
  using value_type = typename View::non_const_value_type;
  return View(buffer.template reserve<value_type>(count), static_cast<std::size_t>(extents)...);
}

namespace impl {

/// Reallocates `view` (uninitialised, labelled `label`) unless it already has exactly `extents`:
/// state a plan keeps per call (saved activations, exchange tables) is allocated on the first call
/// and reused while shapes stay the same.
template <class View, class... Extents>
void ensure_extents(View& view, const std::string& label, Extents... extents) {
  if (!has_extents(view, extents...))
    view = View(Kokkos::view_alloc(Kokkos::WithoutInitializing, label),
                static_cast<std::size_t>(extents)...);
}

/// Copies host `values` into the device view `out`, reallocating it only when its length differs:
/// how a plan uploads its index tables (again only when they change).
template <class T, class View>
void upload(const std::vector<T>& values, View& out, const std::string& label) {
  ensure_extents(out, label, values.size());
  Kokkos::deep_copy(out, Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                             values.data(), values.size()));
}

/// True when `view` is an output the plan may allocate: it was never given storage.
template <class View>
bool is_unallocated(const View& view) {
  return view.data() == nullptr && view.span() == 0 && view.extent(0) == 0;
}

}  // namespace impl

}  // namespace ctxpar
