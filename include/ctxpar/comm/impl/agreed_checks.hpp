/// \file
/// Runs a collective's local precondition checks and agrees on the verdict over the group.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/preconditions.hpp"
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
  Preconditions chk(group, op);
  bool ok = true;
  try {
    std::forward<Checks>(checks)();
  } catch (const Error& e) {
    ok = false;
    chk.require(false, e.condition(), e.expected(), e.actual());
  }
  // A rank that failed locally contributes a value no valid rank can have, so the mismatch does
  // not hide its own (more precise) message: the lowest failing rank's message wins either way.
  if (same_what != nullptr) chk.require_same(same_what, ok ? same_value : -1);
  chk.agree();
}

/// Both buffers of a collective must be contiguous (MPI sees one flat range of each).
template <class SendView, class RecvView>
void require_buffers(const SendView& send, const RecvView& recv, const std::string& op) {
  require_contiguous(send, op, "every buffer handed to a collective");
  require_contiguous(recv, op, "every buffer handed to a collective");
}

/// A fingerprint of a per-rank count vector, for agreeing that every rank passed the same one.
inline std::int64_t counts_fingerprint(const std::vector<int>& counts) {
  std::int64_t hash = ctxpar::fingerprint({static_cast<std::int64_t>(counts.size())});
  for (int c : counts) hash = ctxpar::fingerprint({hash, c});
  return hash;
}

}  // namespace ctxpar::impl
