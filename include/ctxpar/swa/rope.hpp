/// \file
/// Rotary position embedding (rotate-half convention) at explicit absolute positions, and its
/// backward (the inverse rotation at the same positions).
#pragma once

#include <Kokkos_Core.hpp>

#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/view_checks.hpp"
#include "ctxpar/swa/impl/rope_kernels.hpp"

namespace ctxpar::swa {

/// Writes into `y [n, H, D]` the rotate-half RoPE of `x [n, H, D]` at absolute positions
/// `pos [n]`: for `d < D/2`, `(y_d, y_{d+D/2}) = R(pos * base^(-2d/D)) (x_d, x_{d+D/2})`.
/// Element-wise, so rotating a shard gives the same bits as rotating the whole axis; `y` may
/// alias `x`. Throws `ctxpar::Error` for odd `D` or mismatched shapes.
template <class ExecutionSpace, class InView, class OutView, class PosView>
void rope_forward(const ExecutionSpace& space, const InView& x, const PosView& pos, double base,
                  const OutView& y) {
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::swa::rope_forward", ExecutionSpace, InView, OutView, PosView);
  impl::rope_apply(space, x, pos, base, 1.0, y, "ctxpar::swa::rope_forward");
}

/// Backward of `rope_forward`: writes into `dx` the inverse rotation of `dy` at the same positions
/// (the rotation is orthogonal, so its adjoint is its inverse). `dx` may alias `dy`.
template <class ExecutionSpace, class InView, class OutView, class PosView>
void rope_backward(const ExecutionSpace& space, const InView& dy, const PosView& pos, double base,
                   const OutView& dx) {
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::swa::rope_backward", ExecutionSpace, InView, OutView, PosView);
  impl::rope_apply(space, dy, pos, base, -1.0, dx, "ctxpar::swa::rope_backward");
}

}  // namespace ctxpar::swa
