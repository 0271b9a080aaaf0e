/// \file
/// The packing steps of the host attention kernels: keys and values repacked on the global key-tile
/// grid (`pack_keys`) and the backward's scaled query and output-gradient rows (`PackRowsKernel`),
/// zero-padded to whole vectors so the micro-kernels read them contiguously.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

#include "ctxpar/core/host_isa.hpp"
#include "ctxpar/core/impl/isa_dispatch.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/core/workspace.hpp"
#include "ctxpar/swa/attention_inputs.hpp"
#include "ctxpar/swa/attention_workspace.hpp"
#include "ctxpar/swa/impl/attention_tiles.hpp"
#include "ctxpar/swa/impl/host_kernel.hpp"
#include "ctxpar/swa/impl/kernel_math.hpp"

CTXPAR_WIDE_VECTORS_BEGIN
namespace ctxpar::swa::impl {

/// Keys and values of the local axis repacked on the global key-tile grid (host kernels): tile `t`
/// of head `hk` starts at offset `(t * Hkv + hk) * key_tile * dp`, keys outside the axis and
/// columns past `D` are zeros. `kt`/`vt` hold a tile transposed (`[dp][key_tile]`), `kr`/`vr`
/// row-major (`[key_tile][dp]`); only the layouts a kernel asks for are filled.
template <class Acc, class MemorySpace>
struct PackedKeys {
  Kokkos::View<Acc*, MemorySpace> kt, kr, vt, vr;
  /// Local index of the first packed key (`<= 0`: the tile grid is anchored to the whole axis).
  std::int64_t base = 0;
  std::int64_t tiles = 0;
  int dp = 0;
  std::size_t offset(std::int64_t j0, int hk, int hkv) const {
    return static_cast<std::size_t>(((j0 - base) / key_tile * hkv + hk) * key_tile * dp);
  }
};

/// Copies `rows` rows of `dim` scalars (null rows: zeros) into `out` (row stride `dp`, columns
/// past `dim` zero), converting to the accumulator type. Contiguous loops the compiler vectorises:
/// the packing kernels move every key, value and query of a step, so an element-at-a-time loop
/// through 3-d view indexing would cost a few times the memory traffic.
template <class Acc, class Scalar>
inline void host_copy_rows(const Scalar* const* row, int rows, int dim, int dp, Acc scale,
                           Acc* out) {
  for (int j = 0; j < rows; ++j) {
    Acc* dst = out + static_cast<std::size_t>(j) * dp;
    int d = 0;
    if (row[j] != nullptr)
      for (; d < dim; ++d) dst[d] = static_cast<Acc>(ctxpar::widen(row[j][d])) * scale;
    for (; d < dp; ++d) dst[d] = Acc(0);
  }
}

/// The same rows transposed: `out[d * rows + j]` = row `j`, column `d`.
template <class Acc, class Scalar>
inline void host_copy_rows_transposed(const Scalar* const* row, int rows, int dim, int dp,
                                      Acc* out) {
  for (int d = 0; d < dp; ++d) {
    Acc* dst = out + static_cast<std::size_t>(d) * rows;
    for (int j = 0; j < rows; ++j)
      dst[j] = d < dim && row[j] != nullptr ? static_cast<Acc>(ctxpar::widen(row[j][d])) : Acc(0);
  }
}

template <class Scalar, class MemorySpace>
struct PackKeysKernel {
  using acc = accumulator_t<Scalar>;
  AttentionInputs<Scalar, MemorySpace> in;
  PackedKeys<acc, MemorySpace> packed;
  KernelShape<Scalar, MemorySpace> shape;
  void operator()(const std::int64_t flat) const {
    const std::int64_t tile = flat / shape.hkv;
    const int hk = static_cast<int>(flat % shape.hkv);
    const int dp = packed.dp;
    const std::size_t off = static_cast<std::size_t>(flat) * key_tile * dp;
    // The tile's key and value rows; null outside the axis (packed as zeros).
    const Scalar* krow[key_tile];
    const Scalar* vrow[key_tile];
    for (int j = 0; j < key_tile; ++j) {
      const std::int64_t g = packed.base + tile * key_tile + j;
      const bool ok = g >= 0 && g < shape.nk;
      krow[j] = ok ? &in.k(g, hk, 0) : nullptr;
      vrow[j] = ok ? &in.v(g, hk, 0) : nullptr;
    }
    if (packed.kt.extent(0))
      host_copy_rows_transposed(krow, key_tile, shape.dim, dp, packed.kt.data() + off);
    if (packed.kr.extent(0))
      host_copy_rows(krow, key_tile, shape.dim, dp, acc(1), packed.kr.data() + off);
    if (packed.vt.extent(0))
      host_copy_rows_transposed(vrow, key_tile, shape.dim, dp, packed.vt.data() + off);
    if (packed.vr.extent(0))
      host_copy_rows(vrow, key_tile, shape.dim, dp, acc(1), packed.vr.data() + off);
  }
};

template <class ExecutionSpace, class Scalar, class MemorySpace>
PackedKeys<accumulator_t<Scalar>, MemorySpace> pack_keys(
    const ExecutionSpace& space, const AttentionInputs<Scalar, MemorySpace>& in,
    const KernelShape<Scalar, MemorySpace>& shape, AttentionWorkspace<MemorySpace>& workspace,
    bool kt, bool kr, bool vt, bool vr, ctxpar::HostIsa isa) {
  using acc = accumulator_t<Scalar>;
  PackedKeys<acc, MemorySpace> p;
  p.base = -(in.key_origin % key_tile);
  p.tiles = (shape.nk - p.base + key_tile - 1) / key_tile;
  // Rows padded to whole vectors of the width the kernels will run at.
  p.dp = padded_dim(shape.dim, ctxpar::impl::host_isa_bytes(isa) / static_cast<int>(sizeof(acc)));
  const std::size_t n = static_cast<std::size_t>(p.tiles * shape.hkv * key_tile * p.dp);
  const auto alloc = [&](GrowingBuffer<MemorySpace>& storage, bool want) {
    return carve<Kokkos::View<acc*, MemorySpace>>(storage, want ? n : 0);
  };
  p.kt = alloc(workspace.keys_t, kt);
  p.kr = alloc(workspace.keys_r, kr);
  p.vt = alloc(workspace.values_t, vt);
  p.vr = alloc(workspace.values_r, vr);
  if (n > 0)
    Kokkos::parallel_for("ctxpar::swa::pack_keys",
                         Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(
                             space, 0, p.tiles * shape.hkv),
                         PackKeysKernel<Scalar, MemorySpace>{in, p, shape});
  return p;
}

/// Scaled queries and output gradients of every head as contiguous zero-padded rows
/// (`[Hq][tq + query_tile][dp]`), so the dK/dV kernel reads them in place instead of converting
/// every query row once per key tile that sees it.
template <class Scalar, class MemorySpace>
struct PackRowsKernel {
  using acc = accumulator_t<Scalar>;
  Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace> q, dout;
  Kokkos::View<acc*, MemorySpace> qs, dos;
  acc scale;
  std::int64_t tq, rows_per_head;
  int dim, dp;
  void operator()(const std::int64_t flat) const {
    const std::int64_t h = flat / rows_per_head, i = flat % rows_per_head;
    const std::size_t off = static_cast<std::size_t>(flat) * dp;
    const Scalar* qrow = i < tq ? &q(i, h, 0) : nullptr;
    const Scalar* drow = i < tq ? &dout(i, h, 0) : nullptr;
    host_copy_rows(&qrow, 1, dim, dp, scale, qs.data() + off);
    host_copy_rows(&drow, 1, dim, dp, acc(1), dos.data() + off);
  }
};

}  // namespace ctxpar::swa::impl
CTXPAR_WIDE_VECTORS_END
