/// \file
/// Scratch memory of the local attention kernels (packed key tiles, packed query rows, the row
/// terms of the softmax backward), kept between calls so a plan's steady-state step allocates
/// nothing.
#pragma once

#include <cstddef>

#include "ctxpar/core/workspace.hpp"

namespace ctxpar::swa {

/// Grow-only scratch of `attention_forward` / `attention_backward`. One workspace serves one call
/// at a time; the kernels carve what they need from it on every call.
template <class MemorySpace>
struct AttentionWorkspace {
  /// Keys repacked on the key-tile grid, transposed tiles (host kernels).
  GrowingBuffer<MemorySpace> keys_t{"ctxpar::swa::packed_keys"};
  /// Keys repacked on the key-tile grid, row-major tiles (host kernels).
  GrowingBuffer<MemorySpace> keys_r{"ctxpar::swa::packed_keys"};
  /// Values repacked on the key-tile grid, transposed tiles (host kernels).
  GrowingBuffer<MemorySpace> values_t{"ctxpar::swa::packed_keys"};
  /// Values repacked on the key-tile grid, row-major tiles (host kernels).
  GrowingBuffer<MemorySpace> values_r{"ctxpar::swa::packed_keys"};
  /// Scaled queries as padded rows (host dK/dV kernel).
  GrowingBuffer<MemorySpace> query_rows{"ctxpar::swa::packed_rows"};
  /// Output gradients as padded rows (host dK/dV kernel).
  GrowingBuffer<MemorySpace> grad_rows{"ctxpar::swa::packed_rows"};
  /// dQ partial sums of the key segments (host fused backward).
  GrowingBuffer<MemorySpace> query_grad_parts{"ctxpar::swa::dq_parts"};
  /// Query rows each key segment covers (host fused backward).
  GrowingBuffer<MemorySpace> segment_rows{"ctxpar::swa::segment_rows"};
  /// Row terms `delta [tq, Hq]` of the softmax backward.
  GrowingBuffer<MemorySpace> delta{"ctxpar::swa::delta"};

  /// Bytes held now.
  std::size_t bytes() const {
    return keys_t.capacity_bytes() + keys_r.capacity_bytes() + values_t.capacity_bytes() +
           values_r.capacity_bytes() + query_rows.capacity_bytes() + grad_rows.capacity_bytes() +
           query_grad_parts.capacity_bytes() + segment_rows.capacity_bytes() +
           delta.capacity_bytes();
  }
};

}  // namespace ctxpar::swa
