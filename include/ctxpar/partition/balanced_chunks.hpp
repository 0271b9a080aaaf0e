/// \file
/// `BalancedChunks`: the `torch.chunk` split of an axis of length L over P ranks.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

#include "ctxpar/comm/impl/mpi_buffer.hpp"

namespace ctxpar {

/// Splits `[0, length)` into `parts` contiguous shards the way `torch.chunk(length, parts)` does:
/// every non-empty shard has `chunk = ceil(length / parts)` elements except the last non-empty one,
/// and trailing shards may be empty (e.g. length 5 over 4 ranks gives 2, 2, 1, 0). Uneven and empty
/// shards are normal. Usable inside kernels.
struct BalancedChunks {
  std::int64_t length = 0;  ///< length of the whole axis
  int parts = 1;            ///< number of shards (ranks)

  /// Elements per non-empty shard (the last non-empty one may hold fewer).
  KOKKOS_INLINE_FUNCTION std::int64_t chunk() const {
    return parts > 0 ? (length + parts - 1) / parts : 0;
  }
  /// First index of shard `r`.
  KOKKOS_INLINE_FUNCTION std::int64_t begin(int r) const {
    const std::int64_t b = chunk() * r;
    return b < length ? b : length;
  }
  /// One past the last index of shard `r`.
  KOKKOS_INLINE_FUNCTION std::int64_t end(int r) const { return begin(r + 1); }
  /// Number of elements of shard `r` (possibly zero).
  KOKKOS_INLINE_FUNCTION std::int64_t size(int r) const { return end(r) - begin(r); }
  /// The shard that holds index `i` (`0 <= i < length`).
  KOKKOS_INLINE_FUNCTION int owner(std::int64_t i) const { return static_cast<int>(i / chunk()); }
  /// Number of non-empty shards, `ceil(length / chunk)`; can be fewer than `parts`.
  KOKKOS_INLINE_FUNCTION int nonempty() const {
    return length == 0 ? 0 : static_cast<int>((length + chunk() - 1) / chunk());
  }
  /// Shard sizes multiplied by `per_element` (e.g. `heads * head_dim`), as counts for the
  /// v-collectives.
  std::vector<int> counts(std::int64_t per_element = 1) const {
    std::vector<int> c(static_cast<std::size_t>(parts));
    for (int r = 0; r < parts; ++r) {
      c[static_cast<std::size_t>(r)] =
          impl::mpi_count(size(r) * per_element, "ctxpar::BalancedChunks::counts");
    }
    return c;
  }
};

}  // namespace ctxpar
