/// \file
/// The local sliding-window attention kernels (flash-style, tiled, GQA-aware, mask inlined), used
/// by both the single-rank and the distributed step. They see already-rotated queries and keys.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

#include "ctxpar/core/host_isa.hpp"
#include "ctxpar/core/impl/isa_dispatch.hpp"
#include "ctxpar/core/workspace.hpp"
#include "ctxpar/expr/mask.hpp"
#include "ctxpar/swa/attention_inputs.hpp"
#include "ctxpar/swa/attention_workspace.hpp"
#include "ctxpar/swa/impl/attention_tiles.hpp"
#include "ctxpar/swa/impl/host_backward_kernels.hpp"
#include "ctxpar/swa/impl/host_forward_kernel.hpp"
#include "ctxpar/swa/impl/host_kernel.hpp"
#include "ctxpar/swa/impl/host_packing.hpp"
#include "ctxpar/swa/impl/kernel_inputs.hpp"
#include "ctxpar/swa/impl/team_kernels.hpp"
#include "ctxpar/swa/impl/tensor_core_backward.hpp"
#include "ctxpar/swa/impl/tensor_core_forward.hpp"
#include "ctxpar/swa/impl/validate.hpp"
#include "ctxpar/swa/options.hpp"

CTXPAR_WIDE_VECTORS_BEGIN
namespace ctxpar::swa {

/// Forward attention of rotated queries against rotated keys: `out [tq, Hq, D]` and the row
/// log-sum-exp `lse [tq, Hq]` (saved for the backward; a query with no visible key gets zeros and a
/// large negative lse, never NaN). Query head `h` reads key head `h / (Hq / Hkv)`; key `j` is
/// visible to query `i` iff `pos_j` lies in `(pos_i - W, pos_i]` (`W = in.window`, 0: unlimited)
/// and `mask(token_i, token_j)` (`document_mask()` for sliding-window attention: its tiles inside
/// the window and one document skip the per-pair test). `kernels` picks the kernels
/// (`KernelChoice`; `tensor_core` where it cannot run throws `ctxpar::Error`).
template <class ExecutionSpace, class Mask, class Scalar, class MemorySpace>
void attention_forward(
    const ExecutionSpace& space, const Mask& mask, const AttentionInputs<Scalar, MemorySpace>& in,
    const Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace>& out,
    const Kokkos::View<accumulator_t<Scalar>**, Kokkos::LayoutRight, MemorySpace>& lse,
    AttentionWorkspace<MemorySpace>& workspace, KernelChoice kernels = default_kernel_choice) {
  const auto shape =
      impl::checked_kernel_shape<ExecutionSpace, Mask>(in, "ctxpar::swa::attention_forward");
  impl::LocalChecker chk{"ctxpar::swa::attention_forward"};
  impl::check_tensor_core_choice<ExecutionSpace, Scalar>(chk, kernels, shape.dim);
  if (shape.tq == 0 || shape.hq == 0) return;
  if constexpr (impl::tensor_core_kernels_v<ExecutionSpace, Scalar>) {
    if (impl::runs_tensor_core_kernels<ExecutionSpace, Scalar>(kernels, shape.dim)) {
      impl::tensor_core_attention_forward(space, mask, in, shape, {out, lse});
      return;
    }
  }
  // An empty key axis stays on the portable path.
  if constexpr (impl::uses_host_kernels<ExecutionSpace>) {
    if (shape.nk > 0 && impl::runs_host_kernels<ExecutionSpace>(kernels)) {
      using Member = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
      using Kernel = impl::HostForwardKernel<Scalar, MemorySpace, Mask, Member>;
      const std::int64_t tiles = (shape.tq + query_tile - 1) / query_tile;
      int level = 0;
      const ctxpar::HostIsa isa = ctxpar::impl::active_host_isa();
      const auto packed =
          impl::pack_keys(space, in, shape, workspace, true, false, false, true, isa);
      auto policy = impl::host_kernel_policy(space, tiles * shape.hq,
                                             Kernel::scratch_bytes(packed.dp), level);
      Kokkos::parallel_for("ctxpar::swa::attention_forward", policy,
                           Kernel{{in, packed, mask, shape, tiles, level, isa}, out, lse});
      return;
    }
  }
  impl::portable_attention_forward(space, mask, in, shape, {out, lse});
}

/// Backward of `attention_forward`: from `dout [tq, Hq, D]`, the forward's `out` and `lse`, writes
/// the gradients with respect to the rotated queries `dq [tq, Hq, D]`, the rotated keys
/// `dk [nk, Hkv, D]` and the values `dv [nk, Hkv, D]` (overwritten), with the kernels `kernels`
/// picks (`tensor_core` where it cannot run throws `ctxpar::Error`).
template <class ExecutionSpace, class Mask, class Scalar, class MemorySpace>
void attention_backward(
    const ExecutionSpace& space, const Mask& mask, const AttentionInputs<Scalar, MemorySpace>& in,
    const Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace>& out,
    const Kokkos::View<const accumulator_t<Scalar>**, Kokkos::LayoutRight, MemorySpace>& lse,
    const Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace>& dout,
    const Kokkos::View<accumulator_t<Scalar>***, Kokkos::LayoutRight, MemorySpace>& dq,
    const Kokkos::View<accumulator_t<Scalar>***, Kokkos::LayoutRight, MemorySpace>& dk,
    const Kokkos::View<accumulator_t<Scalar>***, Kokkos::LayoutRight, MemorySpace>& dv,
    AttentionWorkspace<MemorySpace>& workspace, KernelChoice kernels = default_kernel_choice) {
  using acc = accumulator_t<Scalar>;
  const auto shape =
      impl::checked_kernel_shape<ExecutionSpace, Mask>(in, "ctxpar::swa::attention_backward");
  // `delta_i = dout_i . out_i`, which both kernel families read.
  const Kokkos::View<const acc**, Kokkos::LayoutRight, MemorySpace> delta =
      impl::row_deltas(space, out, dout, workspace.delta);
  const impl::BackwardViews<Scalar, MemorySpace> views{lse, delta, dout, dq, dk, dv};
  impl::LocalChecker chk{"ctxpar::swa::attention_backward"};
  impl::check_tensor_core_choice<ExecutionSpace, Scalar>(chk, kernels, shape.dim);
  if constexpr (impl::tensor_core_kernels_v<ExecutionSpace, Scalar>) {
    if (impl::runs_tensor_core_kernels<ExecutionSpace, Scalar>(kernels, shape.dim)) {
      impl::tensor_core_attention_backward(space, mask, in, views);
      return;
    }
  }
  if constexpr (impl::uses_host_kernels<ExecutionSpace>) {
    if (shape.tq > 0 && shape.hq > 0 && shape.nk > 0 &&
        impl::runs_host_kernels<ExecutionSpace>(kernels)) {
      using Member = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
      int level = 0;
      const ctxpar::HostIsa isa = ctxpar::impl::active_host_isa();
      const auto packed =
          impl::pack_keys(space, in, shape, workspace, true, true, true, false, isa);
      // The segment rows are read on the host from the positions the caller may have just
      // written on this space.
      space.fence();
      impl::KeySegments segments;
      Kokkos::View<std::int64_t*, MemorySpace> segment_rows;
      const bool fused = impl::fused_backward_segments(in, shape, packed, workspace.segment_rows,
                                                       segments, segment_rows, isa, kernels);
      if (!fused) {
        using Kernel = impl::HostQueryGradientKernel<Scalar, MemorySpace, Mask, Member>;
        const std::int64_t tiles = (shape.tq + query_tile - 1) / query_tile;
        auto policy = impl::host_kernel_policy(space, tiles * shape.hq,
                                               Kernel::scratch_bytes(packed.dp), level);
        Kokkos::parallel_for(
            "ctxpar::swa::attention_backward_dq", policy,
            Kernel{{in, packed, mask, shape, tiles, level, isa}, dout, lse, delta, dq});
        segments =
            impl::KeySegments{1, in.key_origin / key_tile, packed.tiles, in.key_origin / key_tile};
      }
      const std::int64_t rows_per_head = shape.tq + query_tile;
      const std::size_t n = static_cast<std::size_t>(shape.hq * rows_per_head * packed.dp);
      const auto qrows = carve<Kokkos::View<acc*, MemorySpace>>(workspace.query_rows, n);
      const auto dorows = carve<Kokkos::View<acc*, MemorySpace>>(workspace.grad_rows, n);
      Kokkos::parallel_for("ctxpar::swa::pack_rows",
                           Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(
                               space, 0, shape.hq * rows_per_head),
                           impl::PackRowsKernel<Scalar, MemorySpace>{
                               in.q, dout, qrows, dorows, static_cast<acc>(in.scale), shape.tq,
                               rows_per_head, shape.dim, packed.dp});
      const auto dq_parts = carve<Kokkos::View<acc*, MemorySpace>>(
          workspace.query_grad_parts,
          fused ? static_cast<std::size_t>(2 * shape.hq * shape.tq * packed.dp) : 0);
      using KKernel = impl::HostKeyGradientKernel<Scalar, MemorySpace, Mask, Member>;
      auto kpolicy = impl::host_kernel_policy(space, segments.count * shape.hkv,
                                              KKernel::scratch_bytes(packed.dp), level);
      Kokkos::parallel_for(
          "ctxpar::swa::attention_backward_dkdv", kpolicy,
          KKernel{in, dout, lse, delta, dk, dv, packed, qrows, dorows, rows_per_head, mask, shape,
                  segments, dq_parts, segment_rows, level, isa});
      if (fused)
        Kokkos::parallel_for("ctxpar::swa::attention_backward_dq_sum",
                             Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(
                                 space, 0, shape.hq * shape.tq),
                             impl::SumQueryGradientPartsKernel<Scalar, MemorySpace>{
                                 dq_parts, segment_rows, dq, segments, static_cast<acc>(in.scale),
                                 shape.tq, shape.hq, shape.dim, packed.dp});
      return;
    }
  }
  impl::portable_attention_backward(space, mask, in, views);
}

}  // namespace ctxpar::swa
CTXPAR_WIDE_VECTORS_END
