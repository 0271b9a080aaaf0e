/// \file
/// The stopwatch a collective runs its MPI calls through, so that `Traffic::seconds` is the time
/// spent inside MPI and nothing around it.
#pragma once

#include <chrono>
#include <utility>

namespace ctxpar::impl {

/// Wall-clock seconds spent inside MPI calls. A collective passes each of its MPI calls through
/// `operator()` and hands `seconds()` to `Group::record` together with its bytes, so the fence,
/// the staging copies and the checks around the calls stay out of the figure. Two reads of a
/// monotonic clock per call, no allocation: cheap enough for every collective, always on.
class MpiStopwatch {
 public:
  /// Runs `call` (an MPI call returning its status) and adds its wall time; returns the status.
  template <class Call>
  int operator()(Call&& call) {
    const auto start = std::chrono::steady_clock::now();
    const int status = std::forward<Call>(call)();
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return status;
  }

  /// The wall time of every call run so far, in seconds.
  double seconds() const noexcept { return seconds_; }

 private:
  double seconds_ = 0;
};

}  // namespace ctxpar::impl
