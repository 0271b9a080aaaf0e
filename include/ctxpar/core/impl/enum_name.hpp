/// \file
/// `impl::enum_name`: the printable name of an enumerator, read from a table of names.
#pragma once

#include <cstddef>

namespace ctxpar::impl {

/// `names[value]` for an enumeration whose enumerators are `0, 1, …` in the order of `names`;
/// `fallback` for any other value (a value cast from an unchecked integer).
template <class Enum, std::size_t N>
constexpr const char* enum_name(Enum value, const char* const (&names)[N], const char* fallback) {
  const auto i = static_cast<std::size_t>(value);
  return i < N ? names[i] : fallback;
}

}  // namespace ctxpar::impl
