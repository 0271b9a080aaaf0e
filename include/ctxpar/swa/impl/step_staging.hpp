/// \file
/// The buffers a step's exchanges carve from: plan-owned and grow-only, so that after the first
/// call with given shapes no exchange allocates. Every exchange of one step reuses the same send
/// and receive buffers in turn; the tables that say what moves where live with each exchange.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/core/workspace.hpp"
#include "ctxpar/swa/impl/layout.hpp"
#include "ctxpar/swa/impl/records.hpp"
#include "ctxpar/swa/tensors.hpp"

namespace ctxpar::swa::impl {

/// Reallocates the views of `block` unless they already hold `n` tokens (ids only `with_ids`).
template <class Scalar, class MemorySpace>
void ensure_block(KvBlock<Scalar, MemorySpace>& block, std::int64_t n, std::int64_t kv_heads,
                  std::int64_t dim, bool with_ids, const std::string& label) {
  ctxpar::impl::ensure_extents(block.k, label, n, kv_heads, dim);
  ctxpar::impl::ensure_extents(block.v, label, n, kv_heads, dim);
  ctxpar::impl::ensure_extents(block.pos, label, n);
  ctxpar::impl::ensure_extents(block.ids, label, with_ids ? n : 0);
}

/// Four grow-only buffers a key/value block is carved from.
template <class Scalar, class MemorySpace>
struct BlockBuffers {
  GrowingBuffer<MemorySpace> k, v, pos, ids;
  explicit BlockBuffers(const std::string& label) : k(label), v(label), pos(label), ids(label) {}
  KvBlock<Scalar, MemorySpace> carve(std::int64_t n, std::int64_t kv_heads, std::int64_t dim,
                                     bool with_ids) {
    KvBlock<Scalar, MemorySpace> b;
    b.k = ctxpar::carve<Tensor<Scalar, MemorySpace>>(k, n, kv_heads, dim);
    b.v = ctxpar::carve<Tensor<Scalar, MemorySpace>>(v, n, kv_heads, dim);
    b.pos = ctxpar::carve<Positions<MemorySpace>>(pos, n);
    b.ids = ctxpar::carve<Ids<MemorySpace>>(ids, with_ids ? n : 0);
    return b;
  }
  std::size_t bytes() const {
    return k.capacity_bytes() + v.capacity_bytes() + pos.capacity_bytes() + ids.capacity_bytes();
  }
};

/// The records of one step: `Hkv` heads of dimension `D`.
struct RecordShape {
  std::int64_t kv_heads = 0, dim = 0;
  /// Scalars of one token's keys (or values).
  std::int64_t per_token() const { return kv_heads * dim; }
  /// Bytes of one packed K | V | position | id record.
  template <class Scalar>
  std::int64_t bytes() const {
    return record_bytes<Scalar>(kv_heads, dim);
  }
};

/// The plan's staging for one step's exchanges, forward and backward.
template <class Scalar, class MemorySpace>
struct StepStaging {
  /// Whole-axis layout: the records this rank owns after the assembly.
  BlockBuffers<Scalar, MemorySpace> own{"ctxpar::swa::own"};
  /// `RopeAfterGather`: the raw gathered keys (the step keeps the rotated ones).
  GrowingBuffer<MemorySpace> raw_k{"ctxpar::swa::raw_k"};
  /// The one send and one receive buffer every exchange of the step uses in turn.
  GrowingBuffer<MemorySpace> send{"ctxpar::swa::send"}, recv{"ctxpar::swa::recv"};
  /// Gradient records on their way back, and received.
  GrowingBuffer<MemorySpace> records_a{"ctxpar::swa::gradient_records"},
      records_b{"ctxpar::swa::gradient_records"};
  /// Whole-axis layout, backward: the gradients of the caller's cache ++ chunk shard.
  GrowingBuffer<MemorySpace> in_dk{"ctxpar::swa::input_dk"}, in_dv{"ctxpar::swa::input_dv"};

  /// Send and receive buffers of `send_records` and `recv_records` packed records.
  std::pair<Bytes<MemorySpace>, Bytes<MemorySpace>> byte_buffers(std::int64_t send_records,
                                                                 std::int64_t recv_records,
                                                                 std::int64_t record_bytes) {
    return {ctxpar::carve<Bytes<MemorySpace>>(send, send_records * record_bytes),
            ctxpar::carve<Bytes<MemorySpace>>(recv, recv_records * record_bytes)};
  }
  /// Gradient-record buffers: `out_records` to send (or fill), `in_records` received. Gradients
  /// travel in the compute type: peers' partial sums are added on arrival.
  std::pair<GradientRecords<compute_t<Scalar>, MemorySpace>,
            GradientRecords<compute_t<Scalar>, MemorySpace>>
  gradient_buffers(std::int64_t out_records, std::int64_t in_records, const RecordShape& shape) {
    using records = GradientRecords<compute_t<Scalar>, MemorySpace>;
    return {ctxpar::carve<records>(records_a, out_records, 2 * shape.per_token()),
            ctxpar::carve<records>(records_b, in_records, 2 * shape.per_token())};
  }
  std::size_t bytes() const {
    return own.bytes() + raw_k.capacity_bytes() + send.capacity_bytes() + recv.capacity_bytes() +
           records_a.capacity_bytes() + records_b.capacity_bytes() + in_dk.capacity_bytes() +
           in_dv.capacity_bytes();
  }
};

/// What every exchange of a step works with: the plan's execution space, ranks, staging and
/// record shape. Built by the plan for each call; it refers to the plan's members.
template <class ExecutionSpace, class Scalar, class MemorySpace>
struct ExchangeContext {
  const ExecutionSpace& space;
  const Group& group;
  StepStaging<Scalar, MemorySpace>& staging;
  RecordShape records;
};

/// `counts` in units of `factor` (records to bytes or scalars).
inline std::vector<int> scaled(const std::vector<int>& counts, std::int64_t factor) {
  std::vector<int> out(counts.size());
  for (std::size_t i = 0; i < counts.size(); ++i) out[i] = static_cast<int>(counts[i] * factor);
  return out;
}

/// Adds received gradient blocks (rank-major, `counts[r]` records from rank `r`) into own
/// tokens `records(slot)`. With `first_half`, each peer's block is added in two passes (its
/// first `(*first_half)[r]` records, then the rest), since a record may appear in both.
template <class ExecutionSpace, class Scalar, class MemorySpace>
void add_gradient_blocks(const ExecutionSpace& space,
                         const GradientRecords<Scalar, MemorySpace>& got,
                         const Index<MemorySpace>& records, const std::vector<int>& counts,
                         const std::vector<int>* first_half, const Tensor<Scalar, MemorySpace>& dk,
                         const Tensor<Scalar, MemorySpace>& dv) {
  std::int64_t from = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    const std::int64_t split = first_half ? from + (*first_half)[r] : from;
    if (first_half) add_gradient_records(space, got, records, from, split, dk, dv);
    add_gradient_records(space, got, records, split, from + counts[r], dk, dv);
    from += counts[r];
  }
}

/// Bytes of device index tables.
template <class... Views>
std::size_t index_bytes(const Views&... views) {
  return ((views.span() * sizeof(std::int64_t)) + ... + 0);
}

}  // namespace ctxpar::swa::impl
