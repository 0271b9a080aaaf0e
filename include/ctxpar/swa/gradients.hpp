/// \file
/// The gradients a step's backward writes and the gradient a step receives at its next cache: the
/// caller-owned views of `StepPlan::backward`.
#pragma once

#include "ctxpar/swa/tensors.hpp"

namespace ctxpar::swa {

/// Gradients of one step.
template <class Scalar, class MemorySpace>
struct StepGradients {
  /// With respect to the raw chunk queries `[t, Hq, D]`.
  Tensor<Scalar, MemorySpace> dq;
  /// With respect to the raw chunk keys `[t, Hkv, D]`.
  Tensor<Scalar, MemorySpace> dk;
  /// With respect to the chunk values `[t, Hkv, D]`.
  Tensor<Scalar, MemorySpace> dv;
  /// With respect to the raw cache keys `[c, Hkv, D]`.
  Tensor<Scalar, MemorySpace> dk_cache;
  /// With respect to the cache values `[c, Hkv, D]`.
  Tensor<Scalar, MemorySpace> dv_cache;
};

/// Gradient arriving at a step's next cache from later steps (an empty view means none).
template <class Scalar, class MemorySpace>
struct CacheGradient {
  /// With respect to the next cache's raw keys `[n, Hkv, D]`.
  Tensor<Scalar, MemorySpace> dk;
  /// With respect to the next cache's values `[n, Hkv, D]`.
  Tensor<Scalar, MemorySpace> dv;
};

}  // namespace ctxpar::swa
