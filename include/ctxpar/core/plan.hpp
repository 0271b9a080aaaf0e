/// \file
/// The plan contract every operator follows (CONTRIBUTING.md, "The plan contract"), and a
/// compile-time check of its member surface.
///
/// A plan is built once, collectively, from (execution space, group, shapes, options); the ranks
/// agree on all of it before the constructor returns. Its calls then take only caller-owned views:
///
/// - `forward(inputs…, outputs…, saved)` writes outputs the caller allocated (never an empty
///   view it fills in) and records in `saved`, a caller-owned object of type `saved_type`, what
///   the backward needs;
/// - `backward(saved, output gradients…, input gradients…)` reads only `saved` and its arguments;
/// - a plan whose backward needs nothing from its forward (a linear map such as the heads
///   transpose) has `saved_type = NoSavedState` and its calls take no saved object;
/// - buffers live in the plan (or in `saved`, sized on its first forward): a steady-state call
///   allocates nothing on any device;
/// - template parameters come in one order: policies first, then `ExecutionSpace`, `Scalar`,
///   `MemorySpace` (`Scalar` and `MemorySpace` may be fixed by a policy instead, as a chunkwise
///   backend fixes them);
/// - plans are movable, not copyable: copying would share (or duplicate) the workspaces they own.
///
/// Single-rank use is the same plan on a one-rank group. What differs between operators is only
/// the list of inputs and outputs, so the call shapes are per operator; what every plan exposes
/// is checked by `follows_plan_contract`.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

namespace ctxpar {

/// The `saved_type` of a plan whose backward needs nothing from its forward.
struct NoSavedState {};

namespace impl {

template <class Plan, class = void>
struct has_plan_types : std::false_type {};
template <class Plan>
struct has_plan_types<Plan, std::void_t<typename Plan::execution_space, typename Plan::scalar_type,
                                        typename Plan::memory_space, typename Plan::saved_type>>
    : std::true_type {};

template <class Plan, class = void>
struct has_plan_accessors : std::false_type {};
template <class Plan>
struct has_plan_accessors<
    Plan,
    std::enable_if_t<std::is_same_v<decltype(std::declval<const Plan&>().space()),
                                    const typename Plan::execution_space&> &&
                     !std::is_void_v<decltype(std::declval<const Plan&>().group())> &&
                     std::is_convertible_v<decltype(std::declval<const Plan&>().workspace_bytes()),
                                           std::size_t>>> : std::true_type {};

template <class Plan, bool = has_plan_types<Plan>::value>
struct saved_state_is_caller_owned : std::false_type {};
template <class Plan>
struct saved_state_is_caller_owned<Plan, true>
    : std::bool_constant<std::is_default_constructible_v<typename Plan::saved_type> &&
                         !std::is_same_v<typename Plan::saved_type, Plan>> {};

}  // namespace impl

/// True when `Plan` exposes what the contract asks of every plan: the types `execution_space`,
/// `scalar_type`, `memory_space` and `saved_type` (default-constructible, so the caller can own
/// one before the first forward); `space()` (the plan's execution space), `group()` (its rank
/// group) and `workspace_bytes()`; movable and not copyable. The call shapes are checked by each
/// operator's tests.
template <class Plan>
inline constexpr bool follows_plan_contract =
    impl::has_plan_types<Plan>::value&& impl::has_plan_accessors<Plan>::value&&
        impl::saved_state_is_caller_owned<Plan>::value&& std::is_move_constructible_v<Plan> &&
    !std::is_copy_constructible_v<Plan> && !std::is_copy_assignable_v<Plan>;

}  // namespace ctxpar
