/// \file
/// Packing of key/value tokens into byte records (K | V | position | id) for one collective per
/// exchange, unpacking into a key/value axis, and the matching moves of gradient records.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "ctxpar/swa/tensors.hpp"

namespace ctxpar::swa::impl {

/// Bytes of one token record: K and V (`Hkv * D` scalars each), the position (8 bytes), the id
/// (4 bytes) and 4 bytes of padding, so every record starts 8-byte aligned.
template <class Scalar>
std::int64_t record_bytes(std::int64_t kv_heads, std::int64_t dim) {
  return 2 * kv_heads * dim * static_cast<std::int64_t>(sizeof(Scalar)) + 16;
}

template <class MemorySpace>
using Bytes = Kokkos::View<unsigned char*, MemorySpace>;
template <class MemorySpace>
using Index = Kokkos::View<std::int64_t*, MemorySpace>;

template <class MemorySpace>
Index<MemorySpace> to_device(const std::vector<std::int64_t>& v, const std::string& label) {
  Index<MemorySpace> d(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

/// Writes record `slot` of `out` from token `index(slot)` of `block` (or token `slot` when `index`
/// is empty).
template <class Scalar, class MemorySpace>
struct PackRecords {
  KvBlock<Scalar, MemorySpace> block;
  Index<MemorySpace> index;
  Bytes<MemorySpace> out;
  std::int64_t per, bytes;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t x) const {
    const std::int64_t slot = x / (per + 1), e = x % (per + 1);
    const std::int64_t i = index.extent(0) > 0 ? index(slot) : slot;
    unsigned char* base = out.data() + slot * bytes;
    Scalar* kv = reinterpret_cast<Scalar*>(base);
    const std::int64_t dim = static_cast<std::int64_t>(block.k.extent(2));
    if (e < per) {
      kv[e] = block.k(i, e / dim, e % dim);
      kv[per + e] = block.v(i, e / dim, e % dim);
    } else {
      std::int64_t* p = reinterpret_cast<std::int64_t*>(base + 2 * per * sizeof(Scalar));
      *p = block.pos(i);
      *reinterpret_cast<std::int32_t*>(p + 1) = block.ids.extent(0) > 0 ? block.ids(i) : 0;
      *(reinterpret_cast<std::int32_t*>(p + 1) + 1) = 0;
    }
  }
};

template <class ExecutionSpace, class Scalar, class MemorySpace>
void pack_records(const ExecutionSpace& space, const KvBlock<Scalar, MemorySpace>& block,
                  const Index<MemorySpace>& index, std::int64_t slots,
                  const Bytes<MemorySpace>& out) {
  const std::int64_t per = static_cast<std::int64_t>(block.k.extent(1) * block.k.extent(2));
  if (slots == 0) return;
  Kokkos::parallel_for(
      "ctxpar::swa::pack_records",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0,
                                                                           slots * (per + 1)),
      PackRecords<Scalar, MemorySpace>{block, index, out, per,
                                       record_bytes<Scalar>(block.k.extent(1), block.k.extent(2))});
}

/// Writes token `i` of `axis` from record `source(i)` of `in` (>= 0) or from token
/// `-(source(i) + 1)` of `own` (< 0).
template <class Scalar, class MemorySpace>
struct UnpackRecords {
  Bytes<MemorySpace> in;
  KvBlock<Scalar, MemorySpace> own, axis;
  Index<MemorySpace> source;
  std::int64_t per, bytes;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t x) const {
    const std::int64_t i = x / (per + 1), e = x % (per + 1);
    const std::int64_t s = source(i);
    const std::int64_t dim = static_cast<std::int64_t>(axis.k.extent(2));
    const bool with_ids = axis.ids.extent(0) > 0;
    if (s >= 0) {
      const unsigned char* base = in.data() + s * bytes;
      const Scalar* kv = reinterpret_cast<const Scalar*>(base);
      if (e < per) {
        axis.k(i, e / dim, e % dim) = kv[e];
        axis.v(i, e / dim, e % dim) = kv[per + e];
      } else {
        const std::int64_t* p =
            reinterpret_cast<const std::int64_t*>(base + 2 * per * sizeof(Scalar));
        axis.pos(i) = *p;
        if (with_ids) axis.ids(i) = *reinterpret_cast<const std::int32_t*>(p + 1);
      }
    } else {
      const std::int64_t j = -(s + 1);
      if (e < per) {
        axis.k(i, e / dim, e % dim) = own.k(j, e / dim, e % dim);
        axis.v(i, e / dim, e % dim) = own.v(j, e / dim, e % dim);
      } else {
        axis.pos(i) = own.pos(j);
        if (with_ids) axis.ids(i) = own.ids.extent(0) > 0 ? own.ids(j) : 0;
      }
    }
  }
};

template <class ExecutionSpace, class Scalar, class MemorySpace>
void unpack_records(const ExecutionSpace& space, const Bytes<MemorySpace>& in,
                    const KvBlock<Scalar, MemorySpace>& own, const Index<MemorySpace>& source,
                    const KvBlock<Scalar, MemorySpace>& axis) {
  const std::int64_t per = static_cast<std::int64_t>(axis.k.extent(1) * axis.k.extent(2));
  const std::int64_t n = static_cast<std::int64_t>(source.extent(0));
  if (n == 0) return;
  Kokkos::parallel_for(
      "ctxpar::swa::unpack_records",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n * (per + 1)),
      UnpackRecords<Scalar, MemorySpace>{in, own, axis, source, per,
                                         record_bytes<Scalar>(axis.k.extent(1), axis.k.extent(2))});
}

/// Gradient records are `[slots, 2 * Hkv * D]` scalars: dK then dV.
template <class Scalar, class MemorySpace>
using GradientRecords = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>;

/// Routes the gradients of axis token `i` (`dk`, `dv`): to record `source(i)` of `slots` when
/// `source(i) >= 0`, or added to own token `-(source(i) + 1)` of `own_dk`/`own_dv`. The sources
/// are distinct, so no two threads write the same place.
template <class Scalar, class MemorySpace>
struct RouteGradients {
  Tensor<Scalar, MemorySpace> dk, dv;
  Index<MemorySpace> source;
  GradientRecords<Scalar, MemorySpace> slots;
  Tensor<Scalar, MemorySpace> own_dk, own_dv;
  std::int64_t per;
  bool add_to_slots;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t x) const {
    const std::int64_t i = x / per, e = x % per;
    const std::int64_t dim = static_cast<std::int64_t>(dk.extent(2));
    const std::int64_t h = e / dim, d = e % dim;
    const std::int64_t s = source(i);
    if (s >= 0) {
      if (add_to_slots) {
        slots(s, e) += dk(i, h, d);
        slots(s, per + e) += dv(i, h, d);
      } else {
        slots(s, e) = dk(i, h, d);
        slots(s, per + e) = dv(i, h, d);
      }
    } else {
      own_dk(-(s + 1), h, d) += dk(i, h, d);
      own_dv(-(s + 1), h, d) += dv(i, h, d);
    }
  }
};

template <class ExecutionSpace, class Scalar, class MemorySpace>
void route_gradients(const ExecutionSpace& space, const Tensor<Scalar, MemorySpace>& dk,
                     const Tensor<Scalar, MemorySpace>& dv, const Index<MemorySpace>& source,
                     const GradientRecords<Scalar, MemorySpace>& slots,
                     const Tensor<Scalar, MemorySpace>& own_dk,
                     const Tensor<Scalar, MemorySpace>& own_dv) {
  const std::int64_t per = static_cast<std::int64_t>(dk.extent(1) * dk.extent(2));
  const std::int64_t n = static_cast<std::int64_t>(source.extent(0));
  if (n * per == 0) return;
  Kokkos::parallel_for(
      "ctxpar::swa::route_gradients",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n * per),
      RouteGradients<Scalar, MemorySpace>{dk, dv, source, slots, own_dk, own_dv, per, false});
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
