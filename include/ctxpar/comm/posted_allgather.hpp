/// \file
/// An in-place all-gather with uneven counts that is posted now and completed later
/// (`MPI_Iallgatherv`), so that its messages can travel while the caller computes: the device
/// kernels a host thread launches run asynchronously, and the thread waits on the gather
/// meanwhile.
#pragma once

#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/impl/device_aware.hpp"
#include "ctxpar/comm/impl/mpi_buffer.hpp"
#include "ctxpar/comm/impl/mpi_stopwatch.hpp"
#include "ctxpar/comm/impl/staging_arena.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/config.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/view_checks.hpp"

namespace ctxpar {

/// One in-place all-gather at a time, posted by `post` and completed by `wait`: the same contract
/// as `allgatherv_in_place` (this rank's `counts[rank]` elements already sit in `recv` at its
/// displacement, every other rank's block arrives around them), split in two. It owns its staging
/// memory — grow-only, in pinned host memory where the view is on a device and MPI is not
/// device-aware (or under `CTXPAR_EMULATE_DEVICE_STAGING`) — so no staging lease of the group is
/// held between the two calls, and a post with sizes seen before allocates nothing.
///
/// Collective: every rank posts and waits at the same point of its sequence of collectives on
/// the group (other collectives may run between the two). Until `wait` returns, `recv` must not be
/// read or written. Destroying it with a gather in flight completes the gather first.
template <class RecvView>
class PostedAllgatherv {
 public:
  /// The element type moved.
  using value_type = std::remove_const_t<typename RecvView::value_type>;

  PostedAllgatherv() = default;
  PostedAllgatherv(const PostedAllgatherv&) = delete;             ///< one request, one owner
  PostedAllgatherv& operator=(const PostedAllgatherv&) = delete;  ///< one request, one owner
  /// Moves the gather (in flight or not) with its staging.
  PostedAllgatherv(PostedAllgatherv&& other) noexcept { take(other); }
  /// Completes this object's gather, then takes `other`'s.
  PostedAllgatherv& operator=(PostedAllgatherv&& other) noexcept {
    if (this != &other) {
      complete_quietly();
      take(other);
    }
    return *this;
  }
  ~PostedAllgatherv() { complete_quietly(); }

  /// Whether a gather is in flight.
  bool pending() const { return request_ != MPI_REQUEST_NULL; }

  /// Posts the gather of `recv` (contiguous, at least the sum of `counts` elements) on `group`,
  /// after `space` has finished writing this rank's block. A gather already in flight is an error.
  template <class ExecutionSpace>
  void post(const ExecutionSpace& space, const Group& group, const RecvView& recv,
            const std::vector<int>& counts) {
    const std::string op = "ctxpar::PostedAllgatherv::post";
    require_local(!pending(), op, "one gather in flight at a time: wait for the last one first",
                  "no gather in flight", "one in flight");
    require_local(static_cast<int>(counts.size()) == group.size(), op, "one count per rank",
                  group.size(), counts.size());
    require_contiguous(recv, op, "recv");
    displs_ = impl::displacements(counts, op);
    counts_ = counts;
    total_ = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
    require_local(static_cast<std::int64_t>(recv.span()) >= total_, op,
                  "recv must hold the sum of counts", total_, recv.span());
    compat::fence(space, "ctxpar::comm::posted_allgatherv::before");
    recv_ = recv;
    own_ = counts[static_cast<std::size_t>(group.rank())];
    own_first_ = displs_[static_cast<std::size_t>(group.rank())];
    value_type* data = recv.data();
    staged_ = false;
    if constexpr (may_stage) {
      if (CTXPAR_EMULATE_DEVICE_STAGING || !impl::mpi_is_device_aware()) {
        if (static_cast<std::int64_t>(staging_.extent(0)) < total_)
          staging_ = staging_view(
              Kokkos::view_alloc(Kokkos::WithoutInitializing, "ctxpar::comm::posted_staging"),
              static_cast<std::size_t>(total_));
        // Only this rank's block goes out; the rest of the staging is MPI's to write.
        const std::pair<std::int64_t, std::int64_t> mine(own_first_, own_first_ + own_);
        Kokkos::deep_copy(Kokkos::subview(staging_, mine), Kokkos::subview(flat(), mine));
        data = staging_.data();
        staged_ = true;
      }
    }
    group_ = group;  // shares the group's counters
    clock_ = impl::MpiStopwatch();
    clock_([&] {
      return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts_.data(),
                             displs_.data(), impl::mpi_datatype_of<RecvView>(), group.mpi_comm(),
                             &request_);
    });
  }

  /// Completes the gather in flight (none: nothing to do): `recv` then holds every rank's block.
  /// Records the traffic on the group, its time being that of the post and the wait.
  void wait() {
    if (!pending()) return;
    clock_([&] { return MPI_Wait(&request_, MPI_STATUS_IGNORE); });
    request_ = MPI_REQUEST_NULL;
    if (staged_) {
      // Every block but this rank's own came in through the staging.
      const std::pair<std::int64_t, std::int64_t> before(0, own_first_),
          after(own_first_ + own_, total_);
      Kokkos::deep_copy(Kokkos::subview(flat(), before), Kokkos::subview(staging_, before));
      Kokkos::deep_copy(Kokkos::subview(flat(), after), Kokkos::subview(staging_, after));
    }
    const std::int64_t elem = sizeof(value_type);
    group_->record(CollectiveKind::allgather, own_ * elem * (group_->size() - 1),
                   (total_ - own_) * elem, clock_.seconds());
  }

  /// Bytes of staging memory held.
  std::size_t staging_bytes() const { return staging_.span() * sizeof(value_type); }

 private:
  static constexpr bool may_stage =
      CTXPAR_EMULATE_DEVICE_STAGING || !is_host_accessible_v<RecvView>;
  using staging_view = Kokkos::View<value_type*, impl::staging_memory_space>;

  auto flat() const {
    return Kokkos::View<value_type*, typename RecvView::memory_space, Kokkos::MemoryUnmanaged>(
        recv_.data(), recv_.span());
  }

  void take(PostedAllgatherv& other) {
    request_ = std::exchange(other.request_, MPI_REQUEST_NULL);
    group_ = std::move(other.group_);
    recv_ = std::move(other.recv_);
    staging_ = std::move(other.staging_);
    counts_ = std::move(other.counts_);
    displs_ = std::move(other.displs_);
    total_ = other.total_;
    own_ = other.own_;
    own_first_ = other.own_first_;
    staged_ = other.staged_;
    clock_ = other.clock_;
  }

  // A destructor cannot throw: a gather that fails to complete there is abandoned.
  void complete_quietly() noexcept {
    if (!pending()) return;
    try {
      wait();
    } catch (...) {
      request_ = MPI_REQUEST_NULL;
    }
  }

  MPI_Request request_ = MPI_REQUEST_NULL;
  std::optional<Group> group_;
  RecvView recv_;
  staging_view staging_;
  // MPI reads the counts and displacements until the gather completes: they live here.
  std::vector<int> counts_, displs_;
  std::int64_t total_ = 0, own_ = 0, own_first_ = 0;
  bool staged_ = false;
  impl::MpiStopwatch clock_;
};

}  // namespace ctxpar
