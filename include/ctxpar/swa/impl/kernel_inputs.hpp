/// \file
/// What the attention kernels read for one step: the rotated queries against the assembled
/// key/value axis, with the window and the softmax scale.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "ctxpar/core/error.hpp"
#include "ctxpar/expr/mask.hpp"
#include "ctxpar/swa/attention_inputs.hpp"
#include "ctxpar/swa/impl/attention_tiles.hpp"
#include "ctxpar/swa/options.hpp"
#include "ctxpar/swa/tensors.hpp"

namespace ctxpar::swa::impl {

/// The softmax scale of `options` for head dimension `dim` (`1/sqrt(D)` unless one is given).
inline double effective_scale(const Options& options, std::int64_t dim) {
  return options.scale != 0.0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(dim));
}

template <class Scalar, class MemorySpace>
AttentionInputs<Scalar, MemorySpace> attention_inputs(const Tensor<Scalar, MemorySpace>& q_rot,
                                                      const Positions<MemorySpace>& q_pos,
                                                      const Ids<MemorySpace>& q_ids,
                                                      const KvBlock<Scalar, MemorySpace>& axis,
                                                      std::int64_t key_origin, std::int64_t window,
                                                      double scale) {
  AttentionInputs<Scalar, MemorySpace> in;
  in.q = q_rot;
  in.q_pos = q_pos;
  in.q_ids = q_ids;
  in.k = axis.k;
  in.v = axis.v;
  in.k_pos = axis.pos;
  in.k_ids = axis.ids;
  in.key_origin = key_origin;
  in.window = window;
  in.scale = scale;
  return in;
}

/// Throws (locally) when the shapes of `in` do not fit one another; `op` names the caller.
template <class Scalar, class MemorySpace>
void check_kernel_shapes(const AttentionInputs<Scalar, MemorySpace>& in, const std::string& op) {
  require_local(in.k.extent(1) > 0 && in.q.extent(1) % in.k.extent(1) == 0, op,
                "query heads must be a multiple of key/value heads", "Hq % Hkv == 0",
                std::to_string(in.q.extent(1)) + " % " + std::to_string(in.k.extent(1)));
  require_local(in.q.extent(2) == in.k.extent(2) && in.k.extent(2) == in.v.extent(2), op,
                "q, k and v must share the head dimension", in.q.extent(2), in.k.extent(2));
  require_local(in.k.extent(0) == in.v.extent(0) && in.k.extent(1) == in.v.extent(1), op,
                "k and v must have the same shape", in.k.extent(0), in.v.extent(0));
  require_local(in.q_pos.extent(0) == in.q.extent(0) && in.k_pos.extent(0) == in.k.extent(0), op,
                "one position per token", in.q.extent(0), in.q_pos.extent(0));
  require_local(in.key_origin >= 0, op, "the key origin must be non-negative", 0, in.key_origin);
}

/// The shape of `in` once the checks of every attention entry point hold: `Mask` is a mask
/// expression and the views are accessible from `ExecutionSpace` (at compile time), and the
/// shapes of `in` fit one another (`check_kernel_shapes`; `op` names the caller).
template <class ExecutionSpace, class Mask, class Scalar, class MemorySpace>
KernelShape<Scalar, MemorySpace> checked_kernel_shape(
    const AttentionInputs<Scalar, MemorySpace>& in, const std::string& op) {
  static_assert(mask::is_mask_v<Mask>,
                "ctxpar::swa::attention_forward/backward: the mask must be a ctxpar::mask "
                "expression");
  static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, MemorySpace>::accessible,
                "ctxpar::swa::attention_forward/backward: the views must be accessible from the "
                "execution space");
  check_kernel_shapes(in, op);
  return KernelShape<Scalar, MemorySpace>(in);
}

}  // namespace ctxpar::swa::impl
