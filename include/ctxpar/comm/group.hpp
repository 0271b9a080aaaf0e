/// \file
/// `ctxpar::Group`: the communicator every distributed operator takes, with traffic counters.
#pragma once

#include <mpi.h>

#include <array>
#include <boost/mpi/communicator.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "ctxpar/comm/impl/mpi_stopwatch.hpp"
#include "ctxpar/comm/impl/staging_arena.hpp"
#include "ctxpar/core/impl/enum_name.hpp"

namespace ctxpar {

/// The kinds of collective a `Group` counts separately.
enum class CollectiveKind : int {
  allgather = 0,   ///< all-gather, equal or uneven counts
  alltoall,        ///< all-to-all, equal or uneven counts
  reduce_scatter,  ///< reduce-scatter (sum), uneven counts
  scan,            ///< prefix scans with a user operation (each round counted once)
  sendrecv,        ///< neighbour send/receive
  allreduce,       ///< all-reduce of data (not of verdicts)
  agreement,       ///< precondition verdicts and plan fingerprints
  count_
};

/// Human-readable name of a collective kind, for reports.
inline const char* to_string(CollectiveKind kind) {
  static constexpr const char* names[] = {"allgather", "alltoall",  "reduce_scatter", "scan",
                                          "sendrecv",  "allreduce", "agreement"};
  return ctxpar::impl::enum_name(kind, names, "unknown");
}

/// Calls, payload bytes and time of one collective kind on one rank. Bytes count only the payload
/// that leaves or reaches this rank from *other* ranks: the rank's own block of an all-gather or
/// all-to-all is not traffic.
struct Traffic {
  std::int64_t calls = 0;           ///< number of collective calls
  std::int64_t bytes_sent = 0;      ///< payload bytes sent to other ranks
  std::int64_t bytes_received = 0;  ///< payload bytes received from other ranks
  /// Wall-clock seconds this rank spent inside the MPI calls of these collectives: the transfer
  /// and the wait for the other ranks to arrive (a collective is a synchronisation point, so on an
  /// unbalanced run most of it is waiting). The fence before a call, the staging copies of device
  /// buffers and the precondition checks are not included. Always counted (two clock reads per
  /// MPI call); a rank's figure is its own, nothing is exchanged to form it.
  double seconds = 0;
};

/// A duplicated MPI communicator (a private tag space, so ctxpar never interferes with the user's
/// messages), its cached rank and size, per-kind traffic counters and the host staging memory of
/// its collectives. Copies share all of them; the duplicate is freed with the last copy.
class Group {
 public:
  /// Duplicates `comm`.
  explicit Group(const boost::mpi::communicator& comm)
      : state_(
            std::make_shared<State>(boost::mpi::communicator(comm, boost::mpi::comm_duplicate))) {}

  /// Duplicates the raw communicator `comm`.
  explicit Group(MPI_Comm comm)
      : state_(
            std::make_shared<State>(boost::mpi::communicator(comm, boost::mpi::comm_duplicate))) {}

  /// This process's rank in the group.
  int rank() const noexcept { return state_->rank; }
  /// Number of ranks in the group.
  int size() const noexcept { return state_->size; }
  /// The duplicated communicator, for the C API.
  MPI_Comm mpi_comm() const { return static_cast<MPI_Comm>(state_->comm); }
  /// The duplicated communicator, for Boost.MPI.
  const boost::mpi::communicator& communicator() const noexcept { return state_->comm; }

  /// Counters of one collective kind since construction or the last `reset_traffic`.
  const Traffic& traffic(CollectiveKind kind) const { return state_->traffic[index(kind)]; }
  /// Sum of the counters of all data-moving kinds (agreement excluded), seconds included.
  Traffic total_data_traffic() const {
    Traffic sum;
    for (int k = 0; k < static_cast<int>(CollectiveKind::count_); ++k) {
      if (k == static_cast<int>(CollectiveKind::agreement)) continue;
      sum.calls += state_->traffic[k].calls;
      sum.bytes_sent += state_->traffic[k].bytes_sent;
      sum.bytes_received += state_->traffic[k].bytes_received;
      sum.seconds += state_->traffic[k].seconds;
    }
    return sum;
  }
  /// Zeroes every counter, seconds included.
  void reset_traffic() const { state_->traffic = {}; }
  /// The host memory the collectives stage device buffers through (used by the collectives; a
  /// steady-state collective reuses it and allocates nothing).
  impl::StagingArena& staging() const { return state_->staging; }

  /// Records one call of `kind` moving the given payload, which spent `seconds` inside MPI (the
  /// collective's `impl::MpiStopwatch`; 0 for a call that was not timed); used by the collectives.
  void record(CollectiveKind kind, std::int64_t bytes_sent, std::int64_t bytes_received,
              double seconds = 0) const {
    Traffic& t = state_->traffic[index(kind)];
    t.calls += 1;
    t.bytes_sent += bytes_sent;
    t.bytes_received += bytes_received;
    t.seconds += seconds;
  }

 private:
  static int index(CollectiveKind kind) { return static_cast<int>(kind); }

  struct State {
    explicit State(boost::mpi::communicator c)
        : comm(std::move(c)), rank(comm.rank()), size(comm.size()) {}
    boost::mpi::communicator comm;
    int rank;
    int size;
    std::array<Traffic, static_cast<int>(CollectiveKind::count_)> traffic{};
    impl::StagingArena staging;
  };
  std::shared_ptr<State> state_;
};

}  // namespace ctxpar
