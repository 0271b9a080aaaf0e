/// \file
/// `is_one_of_v<T, Tags...>`: the one spelling of "T is one of these policy tags", which every
/// mechanism's tag check (`swa::is_policy_v`, `chunkwise::is_transition_v`, …) is written with.
#pragma once

#include <type_traits>

namespace ctxpar::impl {

/// True when `T` is exactly one of `Tags...`.
template <class T, class... Tags>
inline constexpr bool is_one_of_v = (std::is_same_v<T, Tags> || ...);

}  // namespace ctxpar::impl
