/// \file
/// A precondition violation kept as a value, so that one check function serves both builds of a
/// plan: the local one throws it at once, the collective one agrees on it over the group first.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar/core/error.hpp"

namespace ctxpar::impl {

/// A violated precondition, in the words of `ctxpar::Error` (what must hold, the expected value,
/// the value found). Check functions return `std::optional<Violation>`: empty when all held.
struct Violation {
  std::string condition;  ///< what must hold, in words
  std::string expected;   ///< the expected value, printed
  std::string actual;     ///< the value found, printed
};

/// A value every rank must pass equally, named as the disagreement message names it
/// (`"every rank must agree on <what>"`).
struct SameValue {
  const char* what;    ///< the quantity, in words
  std::int64_t value;  ///< its value on this rank (a fingerprint for a whole vector)
};

/// Local build: throws `bad` as a local `Error` of operator `op` (rank -1), if there is one.
inline void throw_if_bad(const std::optional<Violation>& bad, const std::string& op) {
  if (bad) throw Error(op, -1, bad->condition, bad->expected, bad->actual);
}

/// Collective build: agrees over `group` that no rank found a violation and that every rank
/// passed the same `same` values. If any rank failed, every rank throws the same `Error`, naming
/// the lowest failing rank. A rank's own violation is recorded before the values are compared, so
/// a rank that failed locally reports its own (more precise) message, whatever values it passed.
inline void agree_on(const Group& group, const std::optional<Violation>& bad, const std::string& op,
                     std::initializer_list<SameValue> same = {}) {
  Preconditions checks(group, op);
  if (bad) checks.require(false, bad->condition, bad->expected, bad->actual);
  for (const SameValue& s : same) checks.require_same(s.what, s.value);
  checks.agree();
}

}  // namespace ctxpar::impl
