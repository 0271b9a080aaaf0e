/// \file
/// Collective agreement on preconditions: a violation seen on one rank makes every rank throw the
/// same `ctxpar::Error`, before any data collective could hang.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/impl/mpi_stopwatch.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/fingerprint.hpp"

namespace ctxpar {

/// Collects the precondition checks of one operator call on this rank, then agrees on a verdict
/// with every rank of the group in `agree()`.
///
/// Every rank must construct one and call `agree()` on the same code path, before the operator's
/// first data collective. Local checks (`require`) record the first violation on this rank;
/// `require_same` records values that must be equal on every rank (a plan fingerprint). `agree()`
/// costs one broadcast (only when `require_same` was used) and one all-reduce; if any rank failed,
/// the lowest failing rank broadcasts its message and every rank throws the same `Error`.
class Preconditions {
 public:
  /// Starts the checks of operator `op` over `group`.
  Preconditions(const Group& group, std::string op) : group_(group), op_(std::move(op)) {}

  /// Records a violation unless `ok`. Only the first violation on this rank is kept.
  template <class Expected, class Actual>
  Preconditions& require(bool ok, const std::string& condition, const Expected& expected,
                         const Actual& actual) {
    if (!ok && !failed_) {
      failed_ = true;
      condition_ = condition;
      expected_ = impl::to_text(expected);
      actual_ = impl::to_text(actual);
    }
    return *this;
  }

  /// Records `value` as a quantity every rank must agree on (checked in `agree()` against rank 0).
  Preconditions& require_same(const std::string& what, std::int64_t value) {
    same_names_.push_back(what);
    same_values_.push_back(value);
    return *this;
  }

  /// Makes `*value` the lowest value any rank passes, in `agree()`'s own all-reduce (no extra
  /// collective). `value` must stay valid until `agree()` returns.
  Preconditions& take_lowest(int* value) {
    lowest_.push_back(value);
    return *this;
  }

  /// True when no violation has been recorded on this rank so far.
  bool locally_ok() const noexcept { return !failed_; }

  /// Collective. Returns normally on every rank if every check held everywhere; otherwise every
  /// rank throws the same `Error`, naming the lowest rank that failed.
  void agree() {
    const int rank = group_.rank();
    const int size = group_.size();
    MPI_Comm comm = group_.mpi_comm();
    if (!same_values_.empty()) {
      std::vector<std::int64_t> root = same_values_;
      impl::MpiStopwatch clock;
      clock([&] {
        return MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_INT64_T, 0, comm);
      });
      group_.record(CollectiveKind::agreement, 0, 0, clock.seconds());
      for (std::size_t i = 0; i < root.size(); ++i) {
        require(root[i] == same_values_[i], "every rank must agree on " + same_names_[i],
                impl::to_text(root[i]) + " (as on rank 0)", same_values_[i]);
      }
    }
    // The verdict (the lowest failing rank) and the `take_lowest` values in one all-reduce.
    std::vector<int> mine(1 + lowest_.size()), reduced(1 + lowest_.size());
    mine[0] = failed_ ? rank : size;
    for (std::size_t i = 0; i < lowest_.size(); ++i) mine[i + 1] = *lowest_[i];
    impl::MpiStopwatch clock;
    clock([&] {
      return MPI_Allreduce(mine.data(), reduced.data(), static_cast<int>(mine.size()), MPI_INT,
                           MPI_MIN, comm);
    });
    group_.record(CollectiveKind::agreement, 0, 0, clock.seconds());
    for (std::size_t i = 0; i < lowest_.size(); ++i) *lowest_[i] = reduced[i + 1];
    const int lowest = reduced[0];
    if (lowest == size) return;

    // The failing rank's message reaches everyone, so all ranks throw the same error.
    std::string packed = condition_ + '\0' + expected_ + '\0' + actual_;
    int length = static_cast<int>(packed.size());
    MPI_Bcast(&length, 1, MPI_INT, lowest, comm);
    packed.resize(static_cast<std::size_t>(length));
    MPI_Bcast(packed.data(), length, MPI_CHAR, lowest, comm);
    const std::size_t a = packed.find('\0');
    const std::size_t b = packed.find('\0', a + 1);
    throw Error(op_, lowest, packed.substr(0, a), packed.substr(a + 1, b - a - 1),
                packed.substr(b + 1));
  }

 private:
  Group group_;
  std::string op_;
  bool failed_ = false;
  std::string condition_, expected_, actual_;
  std::vector<std::string> same_names_;
  std::vector<std::int64_t> same_values_;
  std::vector<int*> lowest_;
};

}  // namespace ctxpar
