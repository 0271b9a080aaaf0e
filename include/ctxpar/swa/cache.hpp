/// \file
/// The carried state of the streaming step: a cache of raw keys/values with their positions.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>

#include "ctxpar/swa/impl/window_range.hpp"
#include "ctxpar/swa/tensors.hpp"

namespace ctxpar::swa {

/// The carried cache: raw (never rotated) keys and values with their absolute positions and ids.
/// Keeping it raw means no key is ever rotated twice, whatever the number of steps.
template <class Scalar, class MemorySpace>
using Cache = KvBlock<Scalar, MemorySpace>;

/// Length of the cache after a step whose key/value axis (cache ++ chunk) has `axis_length` tokens:
/// the last `min(W - 1, axis_length)` keys, or all of them when the window is unlimited (`W = 0`).
inline std::int64_t next_cache_length(std::int64_t window, std::int64_t axis_length) {
  return impl::WindowRange{window}.carried(axis_length);
}

/// An empty cache (`c = 0`) for `kv_heads` heads of dimension `dim`, for the first step.
template <class Scalar, class MemorySpace>
Cache<Scalar, MemorySpace> empty_cache(std::int64_t kv_heads, std::int64_t dim) {
  Cache<Scalar, MemorySpace> c;
  c.k = Tensor<Scalar, MemorySpace>("ctxpar::swa::cache_k", 0, kv_heads, dim);
  c.v = Tensor<Scalar, MemorySpace>("ctxpar::swa::cache_v", 0, kv_heads, dim);
  c.pos = Positions<MemorySpace>("ctxpar::swa::cache_pos", 0);
  c.ids = Ids<MemorySpace>("ctxpar::swa::cache_ids", 0);
  return c;
}

/// Allocates an uninitialised block of `n` tokens (ids only when `with_ids`).
template <class Scalar, class MemorySpace>
KvBlock<Scalar, MemorySpace> allocate_block(std::int64_t n, std::int64_t kv_heads, std::int64_t dim,
                                            bool with_ids, const std::string& label) {
  KvBlock<Scalar, MemorySpace> b;
  b.k = Tensor<Scalar, MemorySpace>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n,
                                    kv_heads, dim);
  b.v = Tensor<Scalar, MemorySpace>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n,
                                    kv_heads, dim);
  b.pos = Positions<MemorySpace>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n);
  b.ids =
      Ids<MemorySpace>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), with_ids ? n : 0);
  return b;
}

}  // namespace ctxpar::swa
