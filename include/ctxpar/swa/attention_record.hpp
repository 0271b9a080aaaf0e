/// \file
/// `AttentionRecord`: what the attention backward reads from its forward (rotated queries with
/// their positions and ids, the key/value axis the kernel saw, the output and the row log-sum-exp).
/// The distributed step's saved state and the single-rank reference step's both hold one.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

#include "ctxpar/swa/attention_inputs.hpp"
#include "ctxpar/swa/tensors.hpp"

namespace ctxpar::swa {

/// The forward's activations the attention backward reads, on one rank.
template <class Scalar, class MemorySpace>
struct AttentionRecord {
  /// Rotated queries `[t, Hq, D]`.
  Tensor<Scalar, MemorySpace> q_rot;
  /// Positions of the queries.
  Positions<MemorySpace> q_pos;
  /// Ids of the queries (or empty).
  Ids<MemorySpace> q_ids;
  /// The keys the kernel saw, with their values, positions and ids (keys rotated).
  KvBlock<Scalar, MemorySpace> axis;
  /// The forward's output `[t, Hq, D]`.
  Tensor<Scalar, MemorySpace> out;
  /// Row log-sum-exp `[t, Hq]`.
  Kokkos::View<accumulator_t<Scalar>**, Kokkos::LayoutRight, MemorySpace> lse;

  /// Bytes of the memory the record allocates itself: the rotated queries, the axis and the
  /// log-sum-exp (the query positions, ids and output are the caller's views).
  std::size_t own_bytes() const {
    return q_rot.span() * sizeof(Scalar) + axis.k.span() * sizeof(Scalar) +
           axis.v.span() * sizeof(Scalar) + axis.pos.span() * sizeof(std::int64_t) +
           axis.ids.span() * sizeof(std::int32_t) + lse.span() * sizeof(accumulator_t<Scalar>);
  }
};

}  // namespace ctxpar::swa
