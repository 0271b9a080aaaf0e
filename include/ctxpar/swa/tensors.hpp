/// \file
/// The tensors of one sliding-window attention step: a block of raw keys/values with their
/// absolute positions (the cache), and a chunk of raw queries/keys/values.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace ctxpar::swa {

/// Token-major `[tokens, heads, head_dim]` tensor of a step.
template <class Scalar, class MemorySpace>
using Tensor = Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace>;
/// Absolute token positions (strictly increasing along the key/value axis).
template <class MemorySpace>
using Positions = Kokkos::View<std::int64_t*, MemorySpace>;
/// Document (sequence) ids per token; an empty view means one document.
template <class MemorySpace>
using Ids = Kokkos::View<std::int32_t*, MemorySpace>;

/// Raw (un-rotated) keys and values `[n, Hkv, D]` with their absolute positions and optional ids.
/// The carried cache of the streaming step is one of these.
template <class Scalar, class MemorySpace>
struct KvBlock {
  /// Scalar type of K and V.
  using value_type = Scalar;
  /// Memory space of every view.
  using memory_space = MemorySpace;
  /// Raw keys `[n, Hkv, D]`.
  Tensor<Scalar, MemorySpace> k;
  /// Values `[n, Hkv, D]`.
  Tensor<Scalar, MemorySpace> v;
  /// Absolute positions `[n]`.
  Positions<MemorySpace> pos;
  /// Document ids `[n]`, or empty.
  Ids<MemorySpace> ids;
  /// Number of tokens.
  std::int64_t length() const { return static_cast<std::int64_t>(pos.extent(0)); }
};

/// One chunk of the stream: raw queries `[t, Hq, D]`, raw keys and values `[t, Hkv, D]`, their
/// absolute positions and optional ids. Under context parallelism a rank holds its shard of it.
template <class Scalar, class MemorySpace>
struct Chunk {
  /// Scalar type of Q, K and V.
  using value_type = Scalar;
  /// Memory space of every view.
  using memory_space = MemorySpace;
  /// Raw queries `[t, Hq, D]`.
  Tensor<Scalar, MemorySpace> q;
  /// Raw keys `[t, Hkv, D]`.
  Tensor<Scalar, MemorySpace> k;
  /// Values `[t, Hkv, D]`.
  Tensor<Scalar, MemorySpace> v;
  /// Absolute positions `[t]`.
  Positions<MemorySpace> pos;
  /// Document ids `[t]`, or empty.
  Ids<MemorySpace> ids;
  /// Number of tokens.
  std::int64_t length() const { return static_cast<std::int64_t>(pos.extent(0)); }
};

}  // namespace ctxpar::swa
