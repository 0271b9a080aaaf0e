/// \file
/// Copies between token ranges of the key/value tensors, positions and ids.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <utility>

namespace ctxpar::swa::impl {

/// Tokens `[from, from + n)` of a token-major view.
template <class View>
auto tokens(const View& view, std::int64_t from, std::int64_t n) {
  if constexpr (View::rank == 3) {
    return Kokkos::subview(view, std::make_pair(from, from + n), Kokkos::ALL, Kokkos::ALL);
  } else {
    return Kokkos::subview(view, std::make_pair(from, from + n));
  }
}

/// Copies `n` tokens of `src` starting at `src_from` into `dst` starting at `dst_from`.
template <class ExecutionSpace, class Dst, class Src>
void copy_tokens(const ExecutionSpace& space, const Dst& dst, std::int64_t dst_from, const Src& src,
                 std::int64_t src_from, std::int64_t n) {
  if (n <= 0) return;
  Kokkos::deep_copy(space, tokens(dst, dst_from, n), tokens(src, src_from, n));
}

/// `dst[dst_from + i] += src[src_from + i]` for `n` tokens of a `[tokens, heads, dim]` tensor.
template <class ExecutionSpace, class Dst, class Src>
void add_tokens(const ExecutionSpace& space, const Dst& dst, std::int64_t dst_from, const Src& src,
                std::int64_t src_from, std::int64_t n) {
  if (n <= 0) return;
  const std::int64_t per = static_cast<std::int64_t>(dst.extent(1) * dst.extent(2));
  auto d = dst;
  auto s = src;
  const std::int64_t heads = static_cast<std::int64_t>(dst.extent(1)),
                     dim = static_cast<std::int64_t>(dst.extent(2));
  Kokkos::parallel_for(
      "ctxpar::swa::add_tokens",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n * per),
      KOKKOS_LAMBDA(const std::int64_t x) {
        const std::int64_t i = x / per, h = (x / dim) % heads, e = x % dim;
        d(dst_from + i, h, e) += s(src_from + i, h, e);
      });
}

}  // namespace ctxpar::swa::impl
