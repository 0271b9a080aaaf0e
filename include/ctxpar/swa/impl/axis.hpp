/// \file
/// Copies between token ranges of the key/value tensors, positions and ids.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "ctxpar/core/storage.hpp"

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

/// Calls `f(i, h, e)` for every element of the first `n` tokens of a `[tokens, heads, dim]`
/// tensor shaped like `like`, one work item per element.
template <class ExecutionSpace, class Like, class F>
void for_token_elements(const char* label, const ExecutionSpace& space, const Like& like,
                        std::int64_t n, const F& f) {
  const std::int64_t heads = static_cast<std::int64_t>(like.extent(1)),
                     dim = static_cast<std::int64_t>(like.extent(2)), per = heads * dim;
  Kokkos::parallel_for(
      label,
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n * per),
      KOKKOS_LAMBDA(const std::int64_t x) { f(x / per, (x / dim) % heads, x % dim); });
}

/// Copies `n` tokens of `src` starting at `src_from` into `dst` starting at `dst_from`. Between
/// storage types of different widths (an fp32 gradient into a bf16 tensor) each element is
/// converted and rounded once (`core/storage.hpp`).
template <class ExecutionSpace, class Dst, class Src>
void copy_tokens(const ExecutionSpace& space, const Dst& dst, std::int64_t dst_from, const Src& src,
                 std::int64_t src_from, std::int64_t n) {
  if (n <= 0) return;
  using dst_type = typename Dst::non_const_value_type;
  if constexpr (std::is_same_v<dst_type, typename Src::non_const_value_type>) {
    Kokkos::deep_copy(space, tokens(dst, dst_from, n), tokens(src, src_from, n));
  } else {
    static_assert(Dst::rank == 3, "converting copies are of [tokens, heads, dim] tensors");
    auto d = dst;
    auto s = src;
    for_token_elements(
        "ctxpar::swa::convert_tokens", space, dst, n,
        KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t h, const std::int64_t e) {
          d(dst_from + i, h, e) = ctxpar::narrow<dst_type>(ctxpar::widen(s(src_from + i, h, e)));
        });
  }
}

/// `dst[dst_from + i] += src[src_from + i]` for `n` tokens of a `[tokens, heads, dim]` tensor
/// (`src` widened to `dst`'s type).
template <class ExecutionSpace, class Dst, class Src>
void add_tokens(const ExecutionSpace& space, const Dst& dst, std::int64_t dst_from, const Src& src,
                std::int64_t src_from, std::int64_t n) {
  if (n <= 0) return;
  auto d = dst;
  auto s = src;
  for_token_elements(
      "ctxpar::swa::add_tokens", space, dst, n,
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t h, const std::int64_t e) {
        d(dst_from + i, h, e) += ctxpar::widen(s(src_from + i, h, e));
      });
}

}  // namespace ctxpar::swa::impl
