/// \file
/// The pack and unpack kernels of the head transposes (named functors, device-safe).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>


namespace ctxpar::heads::impl {

/// Sequence-parallel → send buffer: entry `k` of the concatenated channel map (destination rank
/// `owner(k)`, local channel `k - offset(owner)`) gathers channel `map(k)` of every local row into
/// the block for that rank, row-major `[rows, C_j]`.
template <class Src, class Buf, class MemorySpace>
struct PackSequence {
  Src x;
  Buf buf;
  Kokkos::View<const std::int64_t*, MemorySpace> map, offset;
  Kokkos::View<const int*, MemorySpace> owner;
  std::int64_t rows;

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t t, std::int64_t k) const {
    const int j = owner(k);
    const std::int64_t o = offset(j), cj = offset(j + 1) - o;
    buf(rows * o + t * cj + (k - o)) = x(t, map(k));
  }
};

/// Receive buffer (sequence-parallel order) → head-parallel rows in natural order (zigzag undo;
/// `Layout::to_natural` maps a sequence-parallel position to its natural token).
template <class Buf, class Dst, class Layout>
struct UnpackHead {
  Buf buf;
  Dst y;
  Layout order;
  std::int64_t channels;

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t q, std::int64_t c) const {
    y(order.to_natural(q), c) = buf(q * channels + c);
  }
};

/// Head-parallel rows in natural order → send buffer in sequence-parallel order (zigzag redo).
template <class Src, class Buf, class Layout>
struct PackHead {
  Src y;
  Buf buf;
  Layout order;
  std::int64_t channels;

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t q, std::int64_t c) const {
    buf(q * channels + c) = y(order.to_natural(q), c);
  }
};

/// Receive buffer (one `[rows, C_j]` block per source rank) → sequence-parallel rows. A channel
/// repeated on several ranks (a key group when `ngroups < P`) either takes its first copy (the
/// inverse of the forward transpose) or sums all copies in rank order (its adjoint), so the
/// result is deterministic; with one copy per channel both are an exact copy.
template <class Buf, class Dst, class MemorySpace>
struct UnpackSequence {
  Buf buf;
  Dst x;
  Kokkos::View<const std::int64_t*, MemorySpace> inverse_offset, inverse_position, offset;
  Kokkos::View<const int*, MemorySpace> inverse_owner;
  std::int64_t rows;
  bool sum_repeats;

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t t, std::int64_t c) const {
    using value_type = typename Dst::non_const_value_type;
    value_type sum = 0;
    const std::int64_t last = sum_repeats ? inverse_offset(c + 1) : inverse_offset(c) + 1;
    for (std::int64_t e = inverse_offset(c); e < last; ++e) {
      const int j = inverse_owner(e);
      const std::int64_t o = offset(j), cj = offset(j + 1) - o;
      sum += buf(rows * o + t * cj + inverse_position(e));
    }
    x(t, c) = sum;
  }
};

}  // namespace ctxpar::heads::impl
