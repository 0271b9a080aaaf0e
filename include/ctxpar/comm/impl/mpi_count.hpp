/// \file
/// `ctxpar::impl::mpi_count`: the one guard between ctxpar's 64-bit element counts and MPI's `int`
/// counts (the collectives, the head partitions' v-collective counts, the head transposes' blocks).
#pragma once

#include <climits>
#include <cstdint>
#include <string>

#include "ctxpar/core/error.hpp"

namespace ctxpar::impl {

/// Converts an element count to MPI's `int`, throwing a local `Error` of operator `op` instead of
/// wrapping silently. `what` names the count in the message (`"<what> must fit in int"`), so the
/// caller learns which quantity of its call was too large.
inline int mpi_count(std::int64_t count, const std::string& op, const char* what = "an MPI count") {
  require_local(count >= 0 && count <= INT_MAX, op, std::string(what) + " must fit in int",
                "at most " + std::to_string(INT_MAX) + " elements", count);
  return static_cast<int>(count);
}

}  // namespace ctxpar::impl
