/// \file
/// What the attention kernels read for one step: the rotated queries against the assembled
/// key/value axis, with the window and the softmax scale.
#pragma once

#include <cmath>
#include <cstdint>

#include "ctxpar/swa/attention_inputs.hpp"
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

}  // namespace ctxpar::swa::impl
