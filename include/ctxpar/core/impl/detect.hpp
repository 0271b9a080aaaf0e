/// \file
/// Compile-time detection of a type expression (the "detection idiom"): one SFINAE primary and
/// specialisation that every "does `T` have / accept this?" trait of the library is written with.
#pragma once

#include <type_traits>

namespace ctxpar::impl {

/// What `detected_t` names when the expression is ill-formed.
struct nonesuch {
  nonesuch() = delete;
  ~nonesuch() = delete;
  nonesuch(const nonesuch&) = delete;
  void operator=(const nonesuch&) = delete;
};

/// \cond INTERNAL
template <class AlwaysVoid, template <class...> class Op, class... Args>
struct detector {
  using value_t = std::false_type;
  using type = nonesuch;
};
template <template <class...> class Op, class... Args>
struct detector<std::void_t<Op<Args...>>, Op, Args...> {
  using value_t = std::true_type;
  using type = Op<Args...>;
};
/// \endcond

/// `std::true_type` when `Op<Args...>` is well-formed, else `std::false_type`.
template <template <class...> class Op, class... Args>
using is_detected = typename detector<void, Op, Args...>::value_t;

/// `Op<Args...>` when it is well-formed, else `nonesuch`.
template <template <class...> class Op, class... Args>
using detected_t = typename detector<void, Op, Args...>::type;

}  // namespace ctxpar::impl
