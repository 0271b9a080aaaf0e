/// \file
/// The team products of the chunkwise kernels (`chunk_product`) and the team size of a kernel
/// that multiplies through them (`chunk_team_size`): the exact fp32 team product, or the
/// tensor-core one with the operands read as the plan's `ChunkProducts` type. The gated delta and
/// decay kernels both multiply through this one switch.
#pragma once

#include <Kokkos_Core.hpp>

#include <type_traits>

#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/impl/team_mma_product.hpp"
#include "ctxpar/core/impl/tile_product.hpp"
#include "ctxpar/core/team_size.hpp"

// The host team kernels run at the vector width of the instruction set their launch chose.
CTXPAR_WIDE_VECTORS_BEGIN
namespace ctxpar::impl {

/// `C (+)= alpha·op(A)·B` (`accumulate`) as `team_gemm` computes it for `exact` products, or on
/// tensor cores with the operands read as `products`' type (`team_mma_gemm`, fp32 data only;
/// other data always multiply exactly, and the backends refuse anything else for them).
template <int Bytes, class Scalar, class Member>
KOKKOS_INLINE_FUNCTION void chunk_product(ctxpar::chunkwise::ChunkProducts products,
                                          const Member& team, int m, int n, int k, Scalar alpha,
                                          Left<Scalar> a, const Scalar* b, int ldb, Scalar* c,
                                          int ldc, bool accumulate, bool lower_output = false) {
  using ctxpar::chunkwise::ChunkProducts;
  if constexpr (std::is_same_v<Scalar, float>) {
    switch (products) {
      case ChunkProducts::tf32:
        return team_mma_gemm<float>(team, m, n, k, alpha, a, b, ldb, c, ldc, accumulate,
                                    lower_output);
      case ChunkProducts::bfloat16:
        return team_mma_gemm<bfloat16>(team, m, n, k, alpha, a, b, ldb, c, ldc, accumulate,
                                       lower_output);
      case ChunkProducts::float16:
        return team_mma_gemm<float16>(team, m, n, k, alpha, a, b, ldb, c, ldc, accumulate,
                                      lower_output);
      default:
        break;
    }
  }
  team_gemm<Bytes>(team, m, n, k, alpha, a, b, ldb, c, ldc, accumulate, lower_output);
}

/// The team size of a chunk kernel `Functor` launched as `probe` (its league and scratch): the
/// library's one rule (`choose_team_size`; a value-initialised functor is enough for Kokkos to
/// size the launch), in whole warps on a device when the team multiplies on tensor cores
/// (`tensor_cores`: `whole_warps` of `team_mma_lanes_v` threads, 64 on HIP). A launch that cannot
/// hold one warp is refused (`who` names the caller).
template <class Functor, class Policy>
int chunk_team_size(const Policy& probe, bool tensor_cores, const char* who) {
  using execution_space = typename Policy::execution_space;
  int size = choose_team_size(probe, Functor{});
  if (tensor_cores && !is_host_space_v<execution_space>) {
    constexpr int lanes = team_mma_lanes_v<execution_space>;
    size = whole_warps(size, probe.team_size_max(Functor{}, Kokkos::ParallelForTag()), lanes);
    require_local(size > 0, who, "the tensor-core chunk products need a team of at least one warp",
                  lanes == 64 ? "a launch that fits 64 threads (or options.products = exact)"
                              : "a launch that fits 32 threads (or options.products = exact)",
                  "a launch that fits fewer");
  }
  return size;
}

}  // namespace ctxpar::impl
CTXPAR_WIDE_VECTORS_END
