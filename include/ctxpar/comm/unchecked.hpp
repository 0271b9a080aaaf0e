/// \file
/// `ctxpar::unchecked`: the tag that selects a collective without the agreed precondition check.
#pragma once

namespace ctxpar {

/// Tag type of the unchecked collectives (see `ctxpar::unchecked`).
struct Unchecked {
  /// Explicit, so that `{}` never selects the unchecked overload by accident.
  explicit constexpr Unchecked() = default;
};

/// Passed as the last argument of a collective (`ctxpar::allgather(space, group, send, recv,
/// ctxpar::unchecked)`), skips the agreement on its preconditions: the checks still run on the
/// calling rank, but a violation throws there only, while the other ranks enter MPI and block.
/// For callers that have already agreed on the inputs (every ctxpar operator does so once per
/// call, in its plan or its `Preconditions`), so that they do not pay one all-reduce per
/// collective.
inline constexpr Unchecked unchecked{};

}  // namespace ctxpar
