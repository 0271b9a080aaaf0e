/// \file
/// Packing of key/value tokens into byte records (K | V | position | id) for one collective per
/// exchange, unpacking into a key/value axis, and the matching moves of gradient records.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ctxpar/core/storage.hpp"
#include "ctxpar/swa/rope.hpp"
#include "ctxpar/swa/tensors.hpp"

namespace ctxpar::swa::impl {

/// Bytes of a record's tail, after its K and V: the position (8 bytes), the id (4 bytes) and 4
/// bytes of padding, so every record starts 8-byte aligned.
constexpr std::int64_t record_tail_bytes = 16;

/// Bytes of one token record: K and V (`Hkv * D` scalars each), then the tail.
template <class Scalar>
std::int64_t record_bytes(std::int64_t kv_heads, std::int64_t dim) {
  return 2 * kv_heads * dim * static_cast<std::int64_t>(sizeof(Scalar)) + record_tail_bytes;
}

/// Writes a record's tail at `tail`: position, id and zero padding (every byte sent is defined).
KOKKOS_INLINE_FUNCTION void write_record_tail(void* tail, std::int64_t pos, std::int32_t id) {
  std::int64_t* p = static_cast<std::int64_t*>(tail);
  *p = pos;
  *reinterpret_cast<std::int32_t*>(p + 1) = id;
  *(reinterpret_cast<std::int32_t*>(p + 1) + 1) = 0;
}

/// The position in the record tail at `tail`.
KOKKOS_INLINE_FUNCTION std::int64_t record_position(const void* tail) {
  return *static_cast<const std::int64_t*>(tail);
}

/// The id in the record tail at `tail`.
KOKKOS_INLINE_FUNCTION std::int32_t record_id(const void* tail) {
  return *reinterpret_cast<const std::int32_t*>(static_cast<const std::int64_t*>(tail) + 1);
}

template <class MemorySpace>
using Bytes = Kokkos::View<unsigned char*, MemorySpace>;
template <class MemorySpace>
using Index = Kokkos::View<std::int64_t*, MemorySpace>;

/// The key/value tokens a rank hands to an exchange, read in place: `first` then `second` (its
/// cache shard then its chunk shard, or one block with `second` empty), so the step never copies
/// them into one block first.
template <class Scalar, class MemorySpace>
struct TokenSource {
  KvBlock<Scalar, MemorySpace> first, second;
  /// Tokens of `first`.
  std::int64_t split = 0;

  KOKKOS_INLINE_FUNCTION Scalar k(std::int64_t i, std::int64_t h, std::int64_t d) const {
    return i < split ? first.k(i, h, d) : second.k(i - split, h, d);
  }
  KOKKOS_INLINE_FUNCTION Scalar v(std::int64_t i, std::int64_t h, std::int64_t d) const {
    return i < split ? first.v(i, h, d) : second.v(i - split, h, d);
  }
  KOKKOS_INLINE_FUNCTION std::int64_t pos(std::int64_t i) const {
    return i < split ? first.pos(i) : second.pos(i - split);
  }
  /// Token `i`'s key and value rows (`Hkv * D` scalars, head-major).
  KOKKOS_INLINE_FUNCTION const Scalar* k_row(std::int64_t i) const {
    return i < split ? &first.k(i, 0, 0) : &second.k(i - split, 0, 0);
  }
  KOKKOS_INLINE_FUNCTION const Scalar* v_row(std::int64_t i) const {
    return i < split ? &first.v(i, 0, 0) : &second.v(i - split, 0, 0);
  }
  /// The token's id, 0 where its block has none.
  KOKKOS_INLINE_FUNCTION std::int32_t id(std::int64_t i) const {
    if (i < split) return first.ids.extent(0) > 0 ? first.ids(i) : 0;
    return second.ids.extent(0) > 0 ? second.ids(i - split) : 0;
  }
};

/// `block` alone as a token source.
template <class Scalar, class MemorySpace>
TokenSource<Scalar, MemorySpace> source_of(const KvBlock<Scalar, MemorySpace>& block) {
  return {block, KvBlock<Scalar, MemorySpace>{}, block.length()};
}

/// Work item `x` of a record kernel over `tokens` tokens: one block of `rope_tokens_per_item`
/// tokens and pair `d` of `half` (item `half` of a block is the positions and ids), so that the
/// pair's RoPE frequency (0 when `rope_base <= 0`: no rotation) is evaluated once per block; calls
/// `write(i, d, frequency)` for every token `i` of the block.
template <class Write>
KOKKOS_INLINE_FUNCTION void for_record_item(std::int64_t x, std::int64_t half, std::int64_t tokens,
                                            double rope_base, const Write& write) {
  const std::int64_t d = x % (half + 1);
  const RopeBlock block = rope_block(x / (half + 1), tokens);
  const double frequency = rope_base > 0.0 && d < half ? rope_frequency(d, half, rope_base) : 0.0;
  for (std::int64_t i = block.first; i < block.last; ++i) write(i, d, frequency);
}

/// Copies pair `(d, d + half)` of every head of token `i` of `src` to `key(h, e)` and
/// `value(h, e)` (references to element `e` of head `h` of the destination), the keys rotated at
/// the token's position by `frequency` when `rotate` (the same bits as `rope_forward`).
template <class Scalar, class MemorySpace, class Key, class Value>
KOKKOS_INLINE_FUNCTION void copy_token_pair(const TokenSource<Scalar, MemorySpace>& src,
                                            std::int64_t i, std::int64_t d, std::int64_t heads,
                                            std::int64_t half, bool rotate, double frequency,
                                            const Key& key, const Value& value) {
  double c = 1.0, s = 0.0;
  if (rotate) rope_rotation(src.pos(i), frequency, 1.0, c, s);
  for (std::int64_t h = 0; h < heads; ++h) {
    if (rotate) {
      rotate_pair(src.k(i, h, d), src.k(i, h, d + half), c, s, key(h, d), key(h, d + half));
    } else {
      key(h, d) = src.k(i, h, d);
      key(h, d + half) = src.k(i, h, d + half);
    }
    value(h, d) = src.v(i, h, d);
    value(h, d + half) = src.v(i, h, d + half);
  }
}

/// The sizes of a record kernel: `count` records or tokens, `heads` key/value heads of `2 * half`
/// elements, `bytes` per record, and the RoPE base of the keys it rotates (`<= 0`: none).
struct RecordSizes {
  std::int64_t count, heads, half, bytes;
  double rope_base;
  /// Scalars of one token's keys (or values), all heads.
  KOKKOS_INLINE_FUNCTION std::int64_t row() const { return heads * 2 * half; }
  /// Work item `x` of the portable kernel (`for_record_item`).
  template <class Write>
  KOKKOS_INLINE_FUNCTION void item(std::int64_t x, const Write& write) const {
    for_record_item(x, half, count, rope_base, write);
  }
  /// Work items of the portable kernel.
  std::int64_t items() const { return rope_items(count, half + 1); }
};

/// The sizes of records of `heads` heads of `dim` Scalars.
template <class Scalar>
RecordSizes record_sizes(std::int64_t count, std::int64_t heads, std::int64_t dim,
                         double rope_base) {
  return {count, heads, dim / 2, record_bytes<Scalar>(heads, dim), rope_base};
}

/// Writes record `slot` of `out` from token `index(slot)` of `src` (or token `slot` when `index`
/// is empty). With `rope_base > 0` the keys are rotated at their positions on the way in (the
/// same bits as `rope_forward`), so no rotated copy of the keys is ever written. One work item
/// per (block of `rope_tokens_per_item` records, pair `d`) serves every head, so the pair's RoPE
/// frequency is evaluated once per block; item `half` of a block writes the positions and ids.
template <class Scalar, class MemorySpace>
struct PackRecords {
  TokenSource<Scalar, MemorySpace> src;
  Index<MemorySpace> index;
  Bytes<MemorySpace> out;
  RecordSizes sizes;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t x) const {
    sizes.item(
        x, [&](std::int64_t slot, std::int64_t d, double frequency) { pack(slot, d, frequency); });
  }
  KOKKOS_INLINE_FUNCTION void pack(std::int64_t slot, std::int64_t d, double frequency) const {
    const std::int64_t i = index.extent(0) > 0 ? index(slot) : slot;
    unsigned char* base = out.data() + slot * sizes.bytes;
    const std::int64_t heads = sizes.heads, half = sizes.half, dim = 2 * half, per = heads * dim;
    if (d < half) {
      Scalar* kv = reinterpret_cast<Scalar*>(base);
      copy_token_pair(
          src, i, d, heads, half, sizes.rope_base > 0.0, frequency,
          [&](std::int64_t h, std::int64_t e) -> Scalar& { return kv[h * dim + e]; },
          [&](std::int64_t h, std::int64_t e) -> Scalar& { return kv[per + h * dim + e]; });
    } else {
      write_record_tail(base + 2 * per * sizeof(Scalar), src.pos(i), src.id(i));
    }
  }
  /// The host fast path: the records of `block`, row by row (keys rotated by
  /// `host_rope_tokens`, the same bits).
  void host_rows(const RopeBlock& block) const {
    const std::int64_t per = sizes.row();
    auto token = [&](std::int64_t slot) { return index.extent(0) > 0 ? index(slot) : slot; };
    auto record = [&](std::int64_t slot) {
      return reinterpret_cast<Scalar*>(out.data() + slot * sizes.bytes);
    };
    for (std::int64_t slot = block.first; slot < block.last; ++slot) {
      const std::int64_t i = token(slot);
      Scalar* kv = record(slot);
      if (sizes.rope_base <= 0.0) std::copy_n(src.k_row(i), per, kv);
      std::copy_n(src.v_row(i), per, kv + per);
      write_record_tail(kv + 2 * per, src.pos(i), src.id(i));
    }
    if (sizes.rope_base > 0.0)
      host_rope_tokens(
          block.first, block.last, sizes.half, sizes.rope_base, 1.0,
          [&](std::int64_t slot) { return src.pos(token(slot)); },
          [&](std::int64_t slot, std::int64_t d0, int n, const double* c, const double* sn) {
            host_rotate_pairs(src.k_row(token(slot)), record(slot), sizes.heads, sizes.half, d0, n,
                              c, sn);
          });
  }
};

/// Launches a kernel over `tokens` tokens: on host cores `host` on blocks of whole rows
/// (`host_items(tokens)` work items), elsewhere the portable `portable` on `portable_items`.
template <class ExecutionSpace, class Host, class Portable>
void launch_token_kernel(const char* label, const ExecutionSpace& space, std::int64_t tokens,
                         const Host& host, std::int64_t portable_items, const Portable& portable) {
  using Policy = Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>;
  if constexpr (ctxpar::impl::uses_host_fast_path_v<ExecutionSpace>)
    Kokkos::parallel_for(label, Policy(space, 0, host_items(tokens)), host);
  else
    Kokkos::parallel_for(label, Policy(space, 0, portable_items), portable);
}

/// The host fast path of a record kernel: one work item per block of `host_tokens_per_item`
/// records or tokens, each written row by row (`Kernel::host_rows`).
template <class Kernel>
struct HostRecordRows {
  Kernel kernel;
  void operator()(const std::int64_t item) const {
    kernel.host_rows(host_block(item, kernel.sizes.count));
  }
};

/// Launches a record kernel, or its host fast path on host cores.
template <class ExecutionSpace, class Kernel>
void launch_record_kernel(const char* label, const ExecutionSpace& space, const Kernel& kernel) {
  launch_token_kernel(label, space, kernel.sizes.count, HostRecordRows<Kernel>{kernel},
                      kernel.sizes.items(), kernel);
}

/// Packs `slots` records into `out` (see `PackRecords`); `rope_base > 0` rotates the keys.
template <class ExecutionSpace, class Scalar, class MemorySpace>
void pack_records(const ExecutionSpace& space, const TokenSource<Scalar, MemorySpace>& src,
                  const Index<MemorySpace>& index, std::int64_t slots,
                  const Bytes<MemorySpace>& out, double rope_base = 0.0) {
  const std::int64_t heads = static_cast<std::int64_t>(src.first.k.extent(1)),
                     dim = static_cast<std::int64_t>(src.first.k.extent(2));
  if (slots == 0 || heads * dim == 0) return;
  const PackRecords<Scalar, MemorySpace> pack{src, index, out,
                                              record_sizes<Scalar>(slots, heads, dim, rope_base)};
  launch_record_kernel("ctxpar::swa::pack_records", space, pack);
}

/// Writes token `i` of `axis` from record `source(i)` of `in` (>= 0, copied as it travelled) or
/// from token `-(source(i) + 1)` of `own` (< 0; its keys rotated on the way when
/// `own_rope_base > 0`). One work item per (block of `rope_tokens_per_item` tokens, pair `d`), so
/// the pair's RoPE frequency is evaluated once per block; item `half` of a block writes the
/// positions and ids.
template <class Scalar, class MemorySpace>
struct UnpackRecords {
  Bytes<MemorySpace> in;
  TokenSource<Scalar, MemorySpace> own;
  KvBlock<Scalar, MemorySpace> axis;
  Index<MemorySpace> source;
  RecordSizes sizes;  // rope_base: of the own tokens' keys
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t x) const {
    sizes.item(x,
               [&](std::int64_t i, std::int64_t d, double frequency) { unpack(i, d, frequency); });
  }
  KOKKOS_INLINE_FUNCTION void unpack(std::int64_t i, std::int64_t d, double frequency) const {
    const std::int64_t s = source(i);
    const std::int64_t heads = sizes.heads, half = sizes.half, dim = 2 * half, per = heads * dim;
    const bool with_ids = axis.ids.extent(0) > 0;
    if (s >= 0) {
      const unsigned char* base = in.data() + s * sizes.bytes;
      if (d < half) {
        const Scalar* kv = reinterpret_cast<const Scalar*>(base);
        for (std::int64_t h = 0; h < heads; ++h) {
          const std::int64_t e = h * dim + d;
          axis.k(i, h, d) = kv[e];
          axis.k(i, h, d + half) = kv[e + half];
          axis.v(i, h, d) = kv[per + e];
          axis.v(i, h, d + half) = kv[per + e + half];
        }
      } else {
        const unsigned char* tail = base + 2 * per * sizeof(Scalar);
        axis.pos(i) = record_position(tail);
        if (with_ids) axis.ids(i) = record_id(tail);
      }
    } else {
      const std::int64_t j = -(s + 1);
      if (d < half) {
        copy_token_pair(
            own, j, d, heads, half, sizes.rope_base > 0.0, frequency,
            [&](std::int64_t h, std::int64_t e) -> Scalar& { return axis.k(i, h, e); },
            [&](std::int64_t h, std::int64_t e) -> Scalar& { return axis.v(i, h, e); });
      } else {
        axis.pos(i) = own.pos(j);
        if (with_ids) axis.ids(i) = own.id(j);
      }
    }
  }
  /// The host fast path: the tokens of `block`, row by row (own keys rotated by
  /// `host_rope_tokens`, the same bits).
  void host_rows(const RopeBlock& block) const {
    const std::int64_t per = sizes.row();
    const bool with_ids = axis.ids.extent(0) > 0;
    const bool rotate_own = sizes.rope_base > 0.0;
    bool any_own = false;
    for (std::int64_t i = block.first; i < block.last; ++i) {
      const std::int64_t s = source(i);
      Scalar* k = &axis.k(i, 0, 0);
      Scalar* v = &axis.v(i, 0, 0);
      if (s >= 0) {
        const Scalar* kv = reinterpret_cast<const Scalar*>(in.data() + s * sizes.bytes);
        std::copy_n(kv, per, k);
        std::copy_n(kv + per, per, v);
        axis.pos(i) = record_position(kv + 2 * per);
        if (with_ids) axis.ids(i) = record_id(kv + 2 * per);
      } else {
        const std::int64_t j = -(s + 1);
        any_own = true;
        if (!rotate_own) std::copy_n(own.k_row(j), per, k);
        std::copy_n(own.v_row(j), per, v);
        axis.pos(i) = own.pos(j);
        if (with_ids) axis.ids(i) = own.id(j);
      }
    }
    if (rotate_own && any_own)
      host_rope_tokens(
          block.first, block.last, sizes.half, sizes.rope_base, 1.0,
          [&](std::int64_t i) { return axis.pos(i); },
          [&](std::int64_t i, std::int64_t d0, int n, const double* c, const double* sn) {
            const std::int64_t s = source(i);
            if (s < 0)
              host_rotate_pairs(own.k_row(-(s + 1)), &axis.k(i, 0, 0), sizes.heads, sizes.half, d0,
                                n, c, sn);
          });
  }
};

/// Unpacks into `axis` (see `UnpackRecords`); `own_rope_base > 0` rotates the own tokens' keys.
template <class ExecutionSpace, class Scalar, class MemorySpace>
void unpack_records(const ExecutionSpace& space, const Bytes<MemorySpace>& in,
                    const TokenSource<Scalar, MemorySpace>& own, const Index<MemorySpace>& source,
                    const KvBlock<Scalar, MemorySpace>& axis, double own_rope_base = 0.0) {
  const std::int64_t heads = static_cast<std::int64_t>(axis.k.extent(1)),
                     dim = static_cast<std::int64_t>(axis.k.extent(2));
  const std::int64_t n = static_cast<std::int64_t>(source.extent(0));
  if (n == 0 || heads * dim == 0) return;
  const UnpackRecords<Scalar, MemorySpace> unpack{
      in, own, axis, source, record_sizes<Scalar>(n, heads, dim, own_rope_base)};
  launch_record_kernel("ctxpar::swa::unpack_records", space, unpack);
}

/// Gradient records are `[slots, 2 * Hkv * D]` scalars: dK then dV.
template <class Scalar, class MemorySpace>
using GradientRecords = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>;

/// Routes the gradients of axis token `i` (`dk`, `dv`): to record `source(i)` of `slots` when
/// `source(i) >= 0`, or added to own token `-(source(i) + 1)` of `own_dk`/`own_dv`. The sources
/// are distinct, so no two threads write the same place. The routed gradients may be stored
/// narrower than the records (a caller's bf16 next-cache gradient): they are widened exactly.
template <class Source, class Scalar, class MemorySpace>
struct RouteGradients {
  Tensor<Source, MemorySpace> dk, dv;
  Index<MemorySpace> source;
  GradientRecords<Scalar, MemorySpace> slots;
  Tensor<Scalar, MemorySpace> own_dk, own_dv;
  std::int64_t per;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t x) const {
    const std::int64_t i = x / per, e = x % per;
    const std::int64_t dim = static_cast<std::int64_t>(dk.extent(2));
    const std::int64_t h = e / dim, d = e % dim;
    const std::int64_t s = source(i);
    if (s >= 0) {
      slots(s, e) = ctxpar::widen(dk(i, h, d));
      slots(s, per + e) = ctxpar::widen(dv(i, h, d));
    } else {
      own_dk(-(s + 1), h, d) += ctxpar::widen(dk(i, h, d));
      own_dv(-(s + 1), h, d) += ctxpar::widen(dv(i, h, d));
    }
  }
};

/// The host fast path of `RouteGradients`: one work item per block of `host_tokens_per_item` axis
/// tokens, each routed row by row.
template <class Source, class Scalar, class MemorySpace>
struct HostRouteGradients {
  RouteGradients<Source, Scalar, MemorySpace> r;
  std::int64_t tokens;
  void operator()(const std::int64_t item) const {
    const RopeBlock block = host_block(item, tokens);
    const std::int64_t per = r.per;
    for (std::int64_t i = block.first; i < block.last; ++i) {
      const std::int64_t s = r.source(i);
      const Source* dk = &r.dk(i, 0, 0);
      const Source* dv = &r.dv(i, 0, 0);
      if (s >= 0) {
        Scalar* sk = &r.slots(s, 0);
        Scalar* sv = &r.slots(s, per);
        for (std::int64_t e = 0; e < per; ++e) sk[e] = ctxpar::widen(dk[e]);
        for (std::int64_t e = 0; e < per; ++e) sv[e] = ctxpar::widen(dv[e]);
      } else {
        Scalar* ok = &r.own_dk(-(s + 1), 0, 0);
        Scalar* ov = &r.own_dv(-(s + 1), 0, 0);
        for (std::int64_t e = 0; e < per; ++e) ok[e] += ctxpar::widen(dk[e]);
        for (std::int64_t e = 0; e < per; ++e) ov[e] += ctxpar::widen(dv[e]);
      }
    }
  }
};

template <class ExecutionSpace, class Source, class Scalar, class MemorySpace>
void route_gradients(const ExecutionSpace& space, const Tensor<Source, MemorySpace>& dk,
                     const Tensor<Source, MemorySpace>& dv, const Index<MemorySpace>& source,
                     const GradientRecords<Scalar, MemorySpace>& slots,
                     const Tensor<Scalar, MemorySpace>& own_dk,
                     const Tensor<Scalar, MemorySpace>& own_dv) {
  static_assert(std::is_same_v<compute_t<Source>, Scalar>,
                "gradients are routed in the compute type of their storage type");
  const std::int64_t per = static_cast<std::int64_t>(dk.extent(1) * dk.extent(2));
  const std::int64_t n = static_cast<std::int64_t>(source.extent(0));
  if (n * per == 0) return;
  const RouteGradients<Source, Scalar, MemorySpace> route{dk,     dv,     source, slots,
                                                          own_dk, own_dv, per};
  launch_token_kernel("ctxpar::swa::route_gradients", space, n,
                      HostRouteGradients<Source, Scalar, MemorySpace>{route, n}, n * per, route);
}

/// Adds gradient records `[from, to)` of `slots` into own tokens `index(slot)`; the records of one
/// block (one peer) name distinct tokens.
template <class ExecutionSpace, class Scalar, class MemorySpace>
void add_gradient_records(const ExecutionSpace& space,
                          const GradientRecords<Scalar, MemorySpace>& slots,
                          const Index<MemorySpace>& index, std::int64_t from, std::int64_t to,
                          const Tensor<Scalar, MemorySpace>& own_dk,
                          const Tensor<Scalar, MemorySpace>& own_dv) {
  const std::int64_t per = static_cast<std::int64_t>(own_dk.extent(1) * own_dk.extent(2));
  if (to <= from || per == 0) return;
  const std::int64_t dim = static_cast<std::int64_t>(own_dk.extent(2));
  auto s = slots;
  auto ix = index;
  auto dk = own_dk;
  auto dv = own_dv;
  Kokkos::parallel_for(
      "ctxpar::swa::add_gradient_records",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, from * per,
                                                                           to * per),
      KOKKOS_LAMBDA(const std::int64_t x) {
        const std::int64_t slot = x / per, e = x % per;
        const std::int64_t j = ix(slot);
        dk(j, e / dim, e % dim) += s(slot, e);
        dv(j, e / dim, e % dim) += s(slot, per + e);
      });
}

/// Copies `[n, 2 * Hkv * D]` gradient records into separate dK and dV tensors `[n, Hkv, D]`.
template <class ExecutionSpace, class Scalar, class MemorySpace>
void split_gradient_records(const ExecutionSpace& space,
                            const GradientRecords<Scalar, MemorySpace>& records,
                            const Tensor<Scalar, MemorySpace>& dk,
                            const Tensor<Scalar, MemorySpace>& dv) {
  const std::int64_t per = static_cast<std::int64_t>(dk.extent(1) * dk.extent(2));
  const std::int64_t n = static_cast<std::int64_t>(dk.extent(0));
  if (n * per == 0) return;
  const std::int64_t dim = static_cast<std::int64_t>(dk.extent(2));
  auto r = records;
  auto k = dk;
  auto v = dv;
  Kokkos::parallel_for(
      "ctxpar::swa::split_gradient_records",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n * per),
      KOKKOS_LAMBDA(const std::int64_t x) {
        const std::int64_t i = x / per, e = x % per;
        k(i, e / dim, e % dim) = r(i, e);
        v(i, e / dim, e % dim) = r(i, per + e);
      });
}

}  // namespace ctxpar::swa::impl
