/// \file
/// `CpPlan` on 16-bit tensors (`ctxpar::bfloat16`, `ctxpar::float16`): storage in 16 bits at the
/// plan's boundary, the fp32 plan inside. The specialization widens the caller's inputs (exactly)
/// into fp32 copies its context owns, runs the plan of the same backend family on fp32 and rounds
/// the output and every gradient once into the caller's 16-bit views. States, summaries and
/// everything exchanged between ranks stay fp32, as in the fp32 plan.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "ctxpar/chunkwise/driver.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/core/workspace.hpp"

namespace ctxpar::chunkwise {

namespace impl {

template <class Value, int Rank>
struct pointer_data {
  using type = typename pointer_data<Value, Rank - 1>::type*;
};
template <class Value>
struct pointer_data<Value, 0> {
  using type = Value;
};

// The contiguous view on `To` with the rank of `View` (a 16-bit view's fp32 twin, or back).
template <class To, class View>
using twin_view_t = Kokkos::View<typename pointer_data<To, compat::view_rank<View>>::type,
                                 Kokkos::LayoutRight, typename View::memory_space>;

template <class To, class View, std::size_t... D>
twin_view_t<To, View> twin_at(To* data, const View& view, std::index_sequence<D...>) {
  return twin_view_t<To, View>(data, view.extent(D)...);
}

// The elements of every view of `bundle` (an inputs or gradients struct), and whether all are
// contiguous (a whole view is converted as one flat span).
template <class To, class Bundle>
std::pair<std::size_t, bool> count_views(const Bundle& bundle) {
  std::size_t n = 0;
  bool contiguous = true;
  bundle.template map_views<To>([&](const auto& view) {
    n += view.size();
    contiguous = contiguous && view.span_is_contiguous();
    return twin_view_t<To, std::decay_t<decltype(view)>>();
  });
  return {n, contiguous};
}

// `bundle` on `To`: each view's twin of the same extents, laid end to end from `base` (room for
// `count_views(bundle).first` elements), after `op(twin, view)` ran on each pair in member order.
template <class To, class Bundle, class Op>
auto twin_views(To* base, const Bundle& bundle, const Op& op) {
  std::size_t at = 0;
  return bundle.template map_views<To>([&](const auto& view) {
    const auto twin =
        twin_at(base + at, view,
                std::make_index_sequence<compat::view_rank<std::decay_t<decltype(view)>>>());
    at += view.size();
    op(twin, view);
    return twin;
  });
}

// Whether a backend names its family on another scalar type (`rebind_scalar`, `rebind()`).
template <class Backend, class = void>
struct has_rebind_scalar : std::false_type {};
template <class Backend>
struct has_rebind_scalar<
    Backend, std::void_t<typename Backend::template rebind_scalar<float>,
                         decltype(std::declval<const Backend&>().template rebind<float>())>>
    : std::true_type {};

}  // namespace impl

/// What a forward of a 16-bit plan keeps for its backward, owned by the caller: the caller's
/// 16-bit inputs (views), their fp32 copies (held here, so that several contexts can be in
/// flight: 4 bytes per input element per context) and the fp32 plan's context. Refilled in place
/// by the next forward; with the same shapes nothing is allocated again.
template <class Backend>
struct NarrowChunkwiseContext {
  /// The backend family on the compute type (fp32).
  using wide_backend_type =
      typename Backend::template rebind_scalar<compute_t<typename Backend::scalar_type>>;
  typename Backend::inputs_type inputs;             ///< the caller's 16-bit inputs (views)
  typename wide_backend_type::inputs_type widened;  ///< their fp32 copies, carved from `storage`
  ChunkwiseContext<wide_backend_type> wide;         ///< what the fp32 plan's forward keeps
  /// The memory of `widened`: grows to the largest inputs seen, never shrinks.
  GrowingBuffer<typename Backend::memory_space> storage{"ctxpar::chunkwise::widened_inputs"};
  std::int64_t plan = 0;  ///< id of the plan whose forward filled it (0: none)
};

/// `CpPlan` for a backend on a 16-bit storage type (`Backend::scalar_type` is `ctxpar::bfloat16`
/// or `ctxpar::float16`): inputs, output, output gradient and gradients in 16 bits, computed by
/// the plan of the same family on fp32 (`compute_t`) with the same options. Built and called as
/// the fp32 plan, with the same collective checks and `ctxpar::Error`s (the caller's 16-bit views
/// are checked before they are widened; states and `check_finite` by the fp32 plan, on the
/// widened values, which are exact).
///
/// - `forward` widens every input into fp32 views its context owns, runs the fp32 forward into a
///   plan-owned fp32 output and rounds that once into `output`;
/// - `backward` widens `output_grad` into a plan-owned buffer, runs the fp32 backward into
///   plan-owned fp32 gradients and rounds each once into `grads`;
/// - initial and final states and their gradients are fp32 (`ForwardStates<float, …>`), as are
///   the summaries exchanged between ranks.
///
/// So the output and every gradient are exactly the fp32 plan's results on the widened inputs,
/// rounded once to nearest even. Every 16-bit view must be contiguous (each is converted as one
/// span). A steady-state forward + backward allocates nothing.
template <class Policy, class Backend, class ExecutionSpace>
class CpPlan<Policy, Backend, ExecutionSpace,
             std::enable_if_t<is_narrow_storage_v<typename Backend::scalar_type>>> {
  static_assert(impl::has_rebind_scalar<Backend>::value,
                "ctxpar::chunkwise::CpPlan: a 16-bit backend must name its fp32 family "
                "(rebind_scalar<To>, rebind<To>())");

 public:
  /// The composition policy tag.
  using policy_type = Policy;
  /// The model family's backend on 16-bit storage.
  using backend_type = Backend;
  /// Where the kernels run.
  using execution_space = ExecutionSpace;
  /// Where the views live.
  using memory_space = typename Backend::memory_space;
  /// The storage type of inputs, output and gradients.
  using scalar_type = typename Backend::scalar_type;
  /// The type the plan computes in, and the type of the states (fp32).
  using compute_type = compute_t<scalar_type>;
  /// The same family on `compute_type`, with the same options.
  using wide_backend_type = typename Backend::template rebind_scalar<compute_type>;
  /// The plan that computes.
  using wide_plan_type = CpPlan<Policy, wide_backend_type, ExecutionSpace>;
  /// The backend's 16-bit inputs.
  using inputs_type = typename Backend::inputs_type;
  /// The backend's 16-bit input gradients.
  using gradients_type = typename Backend::gradients_type;
  /// What a forward keeps for its backward.
  using context_type = NarrowChunkwiseContext<Backend>;
  /// The contract's name for `context_type` (`core/plan.hpp`).
  using saved_type = context_type;
  /// Optional per-sequence states of a forward (fp32).
  using forward_states_type = ForwardStates<compute_type, memory_space>;
  /// Optional per-sequence state gradients of a backward (fp32).
  using backward_states_type = BackwardStates<compute_type, memory_space>;

  /// Builds the plan: the fp32 plan of `backend.rebind<compute_type>()` (see `CpPlan`'s
  /// constructor: collective, checked, allocates the backend's tables only).
  CpPlan(const ExecutionSpace& space, const Group& group, const Backend& backend,
         const SequenceLayout& layout, const ChunkwiseShape& shape,
         const DriverOptions& options = {})
      : backend_(backend),
        wide_(space, group, wide_backend(backend), layout, shape, options),
        id_(impl::next_plan_id()) {}

  CpPlan(const CpPlan&) = delete;             ///< not copyable: the plan owns its memory
  CpPlan& operator=(const CpPlan&) = delete;  ///< not copyable: the plan owns its memory
  CpPlan(CpPlan&&) = default;                 ///< movable
  CpPlan& operator=(CpPlan&&) = default;      ///< movable

  /// Forward (as `CpPlan::forward`) on 16-bit inputs and output; `states` are fp32. Keep the
  /// inputs unchanged until the backward, as with the fp32 plan: the context keeps them.
  void forward(const inputs_type& inputs, const token_view<scalar_type, memory_space>& output,
               context_type& ctx, const forward_states_type& states = {}) {
    compat::ScopedRegion region("ctxpar::chunkwise::CpPlan::forward_16bit");
    const auto [count, contiguous] = impl::count_views<compute_type>(inputs);
    {
      Preconditions chk(group(), "ctxpar::chunkwise::CpPlan::forward");
      impl::check_forward_views(chk, backend_, inputs, output, shape());
      // Each view is widened as one flat span: a strided one would be read out of place.
      chk.require(contiguous && output.span_is_contiguous(),
                  "the inputs and the output must be contiguous", "contiguous views",
                  "a strided view");
      chk.agree();
    }
    ctx.plan = 0;
    ctx.inputs = inputs;
    ctx.widened = impl::twin_views(
        ctx.storage.template reserve<compute_type>(count), inputs,
        [&](const auto& wide, const auto& given) { convert_storage(space(), given, wide); });
    const auto out = wide_tokens();
    wide_.forward(ctx.widened, out, ctx.wide, states);
    convert_storage(space(), out, output);
    ctx.plan = id_;
  }

  /// Backward (as `CpPlan::backward`) of the forward that filled `ctx` on this plan: 16-bit
  /// `output_grad` and `grads`, fp32 `states`.
  void backward(context_type& ctx, const const_token_view<scalar_type, memory_space>& output_grad,
                const gradients_type& grads, const backward_states_type& states = {}) {
    compat::ScopedRegion region("ctxpar::chunkwise::CpPlan::backward_16bit");
    const auto [count, contiguous] = impl::count_views<compute_type>(grads);
    {
      Preconditions chk(group(), "ctxpar::chunkwise::CpPlan::backward");
      impl::check_backward_views(chk, backend_, ctx.plan, id_, ctx.inputs, output_grad, grads,
                                 shape());
      chk.require(contiguous && output_grad.span_is_contiguous(),
                  "the output gradient and the gradients must be contiguous", "contiguous views",
                  "a strided view");
      chk.agree();
    }
    const auto dout = wide_tokens();
    convert_storage(space(), output_grad, dout);
    compute_type* const base = grads_.template reserve<compute_type>(count);
    const auto nothing = [](const auto&, const auto&) {};
    wide_.backward(ctx.wide, dout, impl::twin_views(base, grads, nothing), states);
    impl::twin_views(base, grads, [&](const auto& wide, const auto& given) {
      convert_storage(space(), wide, given);
    });
  }

  /// The rank's shape `[T_local, H, K, V]` the plan was built for.
  const ChunkwiseShape& shape() const { return wide_.shape(); }
  /// How the chunk products multiply: the backend's choice with `automatic` resolved for this
  /// space, storage type and family (`resolve_chunk_products`; `exact` for a family without
  /// tensor-core products).
  ChunkProducts products() const {
    return resolve_chunk_products<compute_type>(wide_.backend().options().products, false);
  }
  /// The sequence layout.
  const SequenceLayout& layout() const { return wide_.layout(); }
  /// The options the plan was built with.
  const DriverOptions& options() const { return wide_.options(); }
  /// The 16-bit backend the plan was built with.
  const Backend& backend() const { return backend_; }
  /// The fp32 plan that computes.
  const wide_plan_type& wide_plan() const { return wide_; }
  /// The ranks of the plan.
  const Group& group() const { return wide_.group(); }
  /// The execution space every call runs on.
  const ExecutionSpace& space() const { return wide_.space(); }
  /// The instruction set of the host kernels, agreed by the ranks at construction.
  HostIsa host_isa() const { return wide_.host_isa(); }
  /// Bytes the plan holds now: the fp32 plan's workspace, its fp32 output (output gradient) and
  /// gradient buffers. The widened inputs live in the contexts.
  std::size_t workspace_bytes() const {
    return wide_.workspace_bytes() + tokens_.capacity_bytes() + grads_.capacity_bytes();
  }

 private:
  // `backend`'s family and options on fp32, with `automatic` chunk products resolved here, where
  // the storage type is known (the fp32 plan reads `automatic` as exact).
  static wide_backend_type wide_backend(const Backend& backend) {
    if constexpr (has_tensor_core_products_v<Backend>) {
      BackendOptions options = backend.options();
      options.products = chunk_products_of<ExecutionSpace>(backend);
      return backend.template rebind<compute_type>(options);
    } else {
      return backend.template rebind<compute_type>();
    }
  }

  // The fp32 output (forward) or output gradient (backward), `[T, H, V]`.
  token_view<compute_type, memory_space> wide_tokens() {
    const ChunkwiseShape& s = shape();
    return carve<token_view<compute_type, memory_space>>(tokens_, s.tokens, s.heads, s.value_dim);
  }

  Backend backend_;
  wide_plan_type wide_;
  GrowingBuffer<memory_space> tokens_{"ctxpar::chunkwise::wide_tokens"};
  GrowingBuffer<memory_space> grads_{"ctxpar::chunkwise::wide_gradients"};
  std::int64_t id_;
};

}  // namespace ctxpar::chunkwise
