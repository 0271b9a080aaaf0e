/// \file
/// The single-rank reference step: the sliding-window attention step written directly (forward
/// with the carried raw K/V cache, the backward that also returns the cache gradients so steps
/// chain in reverse), without a plan, a group or kept memory. Tests compare `StepPlan` with it as
/// a second, independent implementation; users run a `StepPlan` on a one-rank group instead.
/// Every call allocates.
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>

#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/view_checks.hpp"
#include "ctxpar/swa/attention_kernel.hpp"
#include "ctxpar/swa/attention_record.hpp"
#include "ctxpar/swa/cache.hpp"
#include "ctxpar/swa/document_mask.hpp"
#include "ctxpar/swa/gradients.hpp"
#include "ctxpar/swa/impl/axis.hpp"
#include "ctxpar/swa/impl/kernel_inputs.hpp"
#include "ctxpar/swa/impl/validate.hpp"
#include "ctxpar/swa/options.hpp"
#include "ctxpar/swa/rope.hpp"
#include "ctxpar/swa/tensors.hpp"

namespace ctxpar::swa::impl {

/// What the backward of one step needs from its forward. Its record's `axis` is the assembled
/// key/value axis `cache ++ chunk`.
template <class Scalar, class MemorySpace>
struct ReferenceState : AttentionRecord<Scalar, MemorySpace> {
  /// Length `c` of the input cache.
  std::int64_t cache_length = 0;
  /// Length of the next cache (the tail of the axis it was cut from).
  std::int64_t next_cache_length = 0;
  /// The options of the forward.
  Options options;
  /// The softmax scale in use.
  double scale = 1.0;
};

/// Result of a forward step.
template <class Scalar, class MemorySpace>
struct ReferenceResult {
  /// Attention output `[t, Hq, D]`.
  Tensor<Scalar, MemorySpace> out;
  /// The cache for the next step: the last `min(W-1, c+t)` raw keys/values with positions, ids.
  Cache<Scalar, MemorySpace> next_cache;
  /// Saved for the backward.
  ReferenceState<Scalar, MemorySpace> state;
};

/// Forward of one streaming step on one rank. The key/value axis is `cache ++ chunk`; keys are
/// rotated once at assembly at their absolute positions, queries at theirs; the next cache holds
/// the last `min(W-1, c+t)` raw keys and values (all of them when `W = 0`). Throws
/// `ctxpar::Error` on bad input (odd D, Hq % Hkv != 0, shape or id-length mismatch, positions not
/// strictly increasing along the axis, a cache longer than W-1, NaN/Inf with `check_finite`).
template <class ExecutionSpace, class Scalar, class MemorySpace>
ReferenceResult<Scalar, MemorySpace> reference_step_forward(const ExecutionSpace& space,
                                                            const Chunk<Scalar, MemorySpace>& chunk,
                                                            const Cache<Scalar, MemorySpace>& cache,
                                                            const Options& options) {
  using tensor_type = Tensor<Scalar, MemorySpace>;
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::swa::impl::reference_step_forward", ExecutionSpace,
                           tensor_type);
  compat::ScopedRegion region("ctxpar::swa::impl::reference_step_forward");
  LocalChecker chk{"ctxpar::swa::impl::reference_step_forward"};
  check_inputs(chk, chunk, cache, options);
  check_options(chk, options);
  check_tensor_core_choice<ExecutionSpace, Scalar>(chk, options.kernels, chunk.q.extent(2));
  const std::int64_t c = cache.length(), t = chunk.length();
  chk.require(options.window == 0 || c <= options.window - 1,
              "the cache must not be longer than W - 1",
              "at most " + std::to_string(options.window - 1), std::to_string(c));
  const bool with_ids = chunk.ids.extent(0) > 0;
  chk.require(c == 0 || with_ids == (cache.ids.extent(0) > 0),
              "ids must be given for both the chunk and the cache, or for neither",
              with_ids ? "cache ids" : "no cache ids", with_ids ? "none" : "cache ids");
  const std::int64_t hq = chunk.q.extent(1), hkv = chunk.k.extent(1), dim = chunk.q.extent(2);
  const std::int64_t length = c + t;

  ReferenceResult<Scalar, MemorySpace> result;
  ReferenceState<Scalar, MemorySpace>& st = result.state;
  st.options = options;
  st.scale = effective_scale(options, dim);
  st.cache_length = c;
  st.next_cache_length = next_cache_length(options.window, length);

  KvBlock<Scalar, MemorySpace> raw =
      allocate_block<Scalar, MemorySpace>(length, hkv, dim, with_ids, "ctxpar::swa::axis");
  copy_tokens(space, raw.k, 0, cache.k, 0, c);
  copy_tokens(space, raw.k, c, chunk.k, 0, t);
  copy_tokens(space, raw.v, 0, cache.v, 0, c);
  copy_tokens(space, raw.v, c, chunk.v, 0, t);
  copy_tokens(space, raw.pos, 0, cache.pos, 0, c);
  copy_tokens(space, raw.pos, c, chunk.pos, 0, t);
  if (with_ids) {
    copy_tokens(space, raw.ids, 0, cache.ids, 0, c);
    copy_tokens(space, raw.ids, c, chunk.ids, 0, t);
  }

  st.axis = raw;
  st.axis.k = Tensor<Scalar, MemorySpace>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::k_rot")), length,
      hkv, dim);
  rope_forward(space, raw.k, raw.pos, options.rope_base, st.axis.k);
  st.q_rot = Tensor<Scalar, MemorySpace>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::q_rot")), t, hq,
      dim);
  rope_forward(space, chunk.q, chunk.pos, options.rope_base, st.q_rot);
  st.q_pos = chunk.pos;
  st.q_ids = chunk.ids;

  st.out = Tensor<Scalar, MemorySpace>("ctxpar::swa::out", t, hq, dim);
  st.lse = decltype(st.lse)("ctxpar::swa::lse", t, hq);
  const auto in =
      attention_inputs(st.q_rot, st.q_pos, st.q_ids, st.axis, 0, options.window, st.scale);
  AttentionWorkspace<MemorySpace> workspace;
  attention_forward(space, document_mask(), in, st.out, st.lse, workspace, options.kernels);
  result.out = st.out;

  const std::int64_t n = st.next_cache_length;
  result.next_cache =
      allocate_block<Scalar, MemorySpace>(n, hkv, dim, with_ids, "ctxpar::swa::next_cache");
  copy_tokens(space, result.next_cache.k, 0, raw.k, length - n, n);
  copy_tokens(space, result.next_cache.v, 0, raw.v, length - n, n);
  copy_tokens(space, result.next_cache.pos, 0, raw.pos, length - n, n);
  if (with_ids) copy_tokens(space, result.next_cache.ids, 0, raw.ids, length - n, n);
  return result;
}

/// Backward of `step_forward`: from `dout [t, Hq, D]` (and the gradient of the next cache coming
/// back from later steps, empty for the last step) returns dq, dk, dv of the chunk and
/// dK, dV of the input cache.
template <class ExecutionSpace, class Scalar, class MemorySpace>
StepGradients<Scalar, MemorySpace> reference_step_backward(
    const ExecutionSpace& space, const ReferenceState<Scalar, MemorySpace>& st,
    const Tensor<Scalar, MemorySpace>& dout,
    const CacheGradient<Scalar, MemorySpace>& d_next_cache = {}) {
  using tensor_type = Tensor<Scalar, MemorySpace>;
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::swa::impl::reference_step_backward", ExecutionSpace,
                           tensor_type);
  compat::ScopedRegion region("ctxpar::swa::impl::reference_step_backward");
  const std::string op = "ctxpar::swa::impl::reference_step_backward";
  const std::int64_t t = st.q_rot.extent(0), hq = st.q_rot.extent(1), dim = st.q_rot.extent(2);
  const std::int64_t length = st.axis.length(), hkv = st.axis.k.extent(1), c = st.cache_length;
  require_local(dout.extent(0) == static_cast<std::size_t>(t) &&
                    dout.extent(1) == static_cast<std::size_t>(hq) &&
                    dout.extent(2) == static_cast<std::size_t>(dim),
                op, "dout must have the shape of the output", std::to_string(t),
                std::to_string(dout.extent(0)));
  const bool has_next = d_next_cache.dk.data() != nullptr || d_next_cache.dv.data() != nullptr;
  require_local(
      !has_next || (d_next_cache.dk.extent(0) == static_cast<std::size_t>(st.next_cache_length) &&
                    d_next_cache.dv.extent(0) == static_cast<std::size_t>(st.next_cache_length)),
      op, "the next-cache gradient must have the next cache's length", st.next_cache_length,
      d_next_cache.dk.extent(0));

  Tensor<accumulator_t<Scalar>, MemorySpace> dq_rot("ctxpar::swa::dq_rot", t, hq, dim);
  Tensor<accumulator_t<Scalar>, MemorySpace> dk_axis("ctxpar::swa::dk_axis", length, hkv, dim);
  Tensor<accumulator_t<Scalar>, MemorySpace> dv_axis("ctxpar::swa::dv_axis", length, hkv, dim);
  const auto in =
      attention_inputs(st.q_rot, st.q_pos, st.q_ids, st.axis, 0, st.options.window, st.scale);
  AttentionWorkspace<MemorySpace> workspace;
  attention_backward(
      space, document_mask(), in,
      Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace>(st.out),
      Kokkos::View<const accumulator_t<Scalar>**, Kokkos::LayoutRight, MemorySpace>(st.lse),
      Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace>(dout), dq_rot, dk_axis,
      dv_axis, workspace, st.options.kernels);

  StepGradients<Scalar, MemorySpace> g;
  g.dq = Tensor<Scalar, MemorySpace>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("ctxpar::swa::dq")), t, hq, dim);
  rope_backward(space, dq_rot, st.q_pos, st.options.rope_base, g.dq);
  rope_backward(space, dk_axis, st.axis.pos, st.options.rope_base, dk_axis);
  if (has_next) {
    const std::int64_t n = st.next_cache_length;
    add_tokens(space, dk_axis, length - n, d_next_cache.dk, 0, n);
    add_tokens(space, dv_axis, length - n, d_next_cache.dv, 0, n);
  }
  g.dk = Tensor<Scalar, MemorySpace>("ctxpar::swa::dk", t, hkv, dim);
  g.dv = Tensor<Scalar, MemorySpace>("ctxpar::swa::dv", t, hkv, dim);
  g.dk_cache = Tensor<Scalar, MemorySpace>("ctxpar::swa::dk_cache", c, hkv, dim);
  g.dv_cache = Tensor<Scalar, MemorySpace>("ctxpar::swa::dv_cache", c, hkv, dim);
  copy_tokens(space, g.dk, 0, dk_axis, c, t);
  copy_tokens(space, g.dv, 0, dv_axis, c, t);
  copy_tokens(space, g.dk_cache, 0, dk_axis, 0, c);
  copy_tokens(space, g.dv_cache, 0, dv_axis, 0, c);
  return g;
}

}  // namespace ctxpar::swa::impl
