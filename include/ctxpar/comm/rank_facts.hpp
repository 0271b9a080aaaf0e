/// \file
/// `gather_rank_facts`: every rank's copy of a small named struct of per-rank facts (shard lengths,
/// first and last positions, flags), for the per-call checks that need to see the other ranks.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/impl/mpi_stopwatch.hpp"

namespace ctxpar::impl {

/// Gathers `mine` from every rank into `all` (rank order). `Facts` is a struct of `std::int64_t`
/// fields only, so it travels as `MPI_INT64_T` and reads the same on every rank whatever the
/// padding rules. `all` is resized to the group size: a caller that reserved it (a plan, once)
/// allocates nothing. Counted as agreement traffic: it checks inputs, it moves no payload.
/// Collective; called by every rank at the same point, before the verdict is agreed.
template <class Facts>
void gather_rank_facts(const Group& group, const Facts& mine, std::vector<Facts>& all) {
  static_assert(std::is_trivially_copyable_v<Facts> && sizeof(Facts) % sizeof(std::int64_t) == 0 &&
                    alignof(Facts) == alignof(std::int64_t),
                "gather_rank_facts: Facts must be a struct of std::int64_t fields");
  constexpr int fields = static_cast<int>(sizeof(Facts) / sizeof(std::int64_t));
  all.resize(static_cast<std::size_t>(group.size()));
  MpiStopwatch clock;
  clock([&] {
    return MPI_Allgather(&mine, fields, MPI_INT64_T, all.data(), fields, MPI_INT64_T,
                         group.mpi_comm());
  });
  group.record(CollectiveKind::agreement, 0, 0, clock.seconds());
}

}  // namespace ctxpar::impl
