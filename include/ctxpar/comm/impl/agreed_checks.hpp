/// \file
/// Runs a collective's local precondition checks and agrees on the verdict over the group.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/impl/violation.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/view_checks.hpp"

namespace ctxpar::impl {

/// Calls `checks()` (which throws a local `Error` through `require_local`, as the unchecked
/// collective would) and agrees on the outcome: a violation on any rank makes every rank throw
/// the same `Error`. When `same_what` is non-null, `same_value` must also be equal on every rank
/// (e.g. the element count of an equal-count all-gather). Reusing the unchecked path's own checks
/// keeps the two variants' conditions and messages identical.
template <class Checks>
void agree_on_checks(const Group& group, const std::string& op, Checks&& checks,
                     const char* same_what = nullptr, std::int64_t same_value = 0) {
  std::optional<Violation> bad;
  try {
    std::forward<Checks>(checks)();
  } catch (const Error& e) {
    bad = Violation{e.condition(), e.expected(), e.actual()};
  }
  if (same_what != nullptr) {
    agree_on(group, bad, op, {{same_what, same_value}});
  } else {
    agree_on(group, bad, op);
  }
}

/// Both buffers of a collective must be contiguous (MPI sees one flat range of each).
template <class SendView, class RecvView>
void require_buffers(const SendView& send, const RecvView& recv, const std::string& op) {
  require_contiguous(send, op, "every buffer handed to a collective");
  require_contiguous(recv, op, "every buffer handed to a collective");
}

}  // namespace ctxpar::impl
