/// \file
/// Where the tensor-core attention kernels run and what they multiply: the operand type and
/// product shape for each storage type, the spaces and head dimensions they take, the rule of
/// `KernelChoice` that picks them, and the check that refuses them by name where they cannot run.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

#include "ctxpar/core/bfloat16.hpp"
#include "ctxpar/core/float16.hpp"
#include "ctxpar/core/impl/mma_fragment.hpp"
#include "ctxpar/core/impl/warp_lanes.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/core/team_size.hpp"
#include "ctxpar/swa/options.hpp"

namespace ctxpar::swa::impl {

/// The operands of the tensor-core kernels for a 16-bit storage type: the stored values
/// themselves, on the m16n8k16 product.
template <class Scalar>
struct SixteenBitOperands {
  using type = Scalar;
  using layout = ctxpar::impl::MmaM16N8K16;
  KOKKOS_INLINE_FUNCTION static type operand(Scalar x) { return x; }
  KOKKOS_INLINE_FUNCTION static type zero() { return Scalar{0}; }
};

/// The operands of the tensor-core kernels for storage type `Scalar` (`type`, the product
/// `layout`, and `operand(x)`: what a stored value becomes in a fragment or in scratch).
template <class Scalar>
struct TensorCoreOperands;
template <>
struct TensorCoreOperands<bfloat16> : SixteenBitOperands<bfloat16> {};
template <>
struct TensorCoreOperands<float16> : SixteenBitOperands<float16> {};
/// fp32 is read as TF32 (10 fraction bits, rounded to nearest) on the m16n8k8 product: only when
/// the caller asks for `KernelChoice::tensor_core`.
template <>
struct TensorCoreOperands<float> {
  using type = float;
  using layout = ctxpar::impl::MmaM16N8K8Tf32;
  KOKKOS_INLINE_FUNCTION static type operand(float x) { return ctxpar::impl::to_tf32(x); }
  KOKKOS_INLINE_FUNCTION static type zero() { return 0.0f; }
};

/// True for the storage types the tensor-core kernels take: bfloat16, float16 and float (TF32).
template <class Scalar>
inline constexpr bool has_tensor_core_operands_v =
    std::is_same_v<Scalar, bfloat16> || std::is_same_v<Scalar, float16> ||
    std::is_same_v<Scalar, float>;

/// True when the tensor-core kernels run on `ExecutionSpace` for storage type `Scalar` (the host
/// spaces through the emulated warp, CUDA sm_80+ through the instructions).
template <class ExecutionSpace, class Scalar>
inline constexpr bool tensor_core_kernels_v =
    ctxpar::impl::has_warp_mma_v<ExecutionSpace>&& has_tensor_core_operands_v<Scalar>;

/// Largest head dimension of the tensor-core kernels (their accumulators live in registers).
inline constexpr std::int64_t tensor_core_max_dim = 256;

/// True when `kernels` runs the tensor-core kernels on `ExecutionSpace` for `Scalar` and head
/// dimension `dim`: when asked for (`tensor_core`), and under `automatic` on a device that has
/// them with 16-bit tensors (whose products they compute exactly, accumulating in fp32).
template <class ExecutionSpace, class Scalar>
constexpr bool runs_tensor_core_kernels(KernelChoice kernels, std::int64_t dim) {
  if constexpr (!tensor_core_kernels_v<ExecutionSpace, Scalar>) {
    (void)kernels;
    (void)dim;
    return false;
  } else {
    if (dim > tensor_core_max_dim) return false;
    if (kernels == KernelChoice::tensor_core) return true;
    return kernels == KernelChoice::automatic &&
           ctxpar::impl::tensor_cores_by_default_v<ExecutionSpace> &&
           ctxpar::is_narrow_storage_v<Scalar>;
  }
}

/// Refuses `KernelChoice::tensor_core` where it cannot run: a storage type without tensor-core
/// operands (double), a space without them, or a head dimension above `tensor_core_max_dim`.
template <class ExecutionSpace, class Scalar, class Checker>
void check_tensor_core_choice(Checker& chk, KernelChoice kernels, std::int64_t dim) {
  if (kernels != KernelChoice::tensor_core) return;
  chk.require(has_tensor_core_operands_v<Scalar>,
              "options.kernels = tensor_core needs float, bfloat16 or float16 tensors",
              "float, bfloat16 or float16", sizeof(Scalar) == 8 ? "double" : "another type");
  chk.require(ctxpar::impl::has_warp_mma_v<ExecutionSpace>,
              "options.kernels = tensor_core needs a host space or CUDA built for sm_80 or later",
              "a space with tensor-core products", ExecutionSpace::name());
  chk.require(dim <= tensor_core_max_dim,
              "options.kernels = tensor_core takes head dimensions up to 256", "D <= 256", dim);
}

}  // namespace ctxpar::swa::impl
