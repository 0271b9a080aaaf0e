/// \file
/// Wall-clock timing for benchmarks: warm-up, repeats, and median / min / max of the repeats.
/// Callers fence inside the timed function, so the time covers the finished work.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

namespace ctxpar::bench {

/// Summary of the repeats of one timed case, in seconds.
struct Timing {
  /// Median of the repeats (the figure ratios are computed from).
  double median_s = 0;
  /// Fastest repeat.
  double min_s = 0;
  /// Slowest repeat.
  double max_s = 0;
  /// Number of timed repeats (warm-up excluded).
  int repeats = 0;
};

/// Summarises a list of per-repeat times.
inline Timing summarise(std::vector<double> seconds) {
  Timing t;
  if (seconds.empty()) return t;
  std::sort(seconds.begin(), seconds.end());
  const std::size_t n = seconds.size();
  t.median_s = n % 2 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
  t.min_s = seconds.front();
  t.max_s = seconds.back();
  t.repeats = static_cast<int>(n);
  return t;
}

/// Runs `f` `warmup` times untimed, then `repeats` times timed. `f` must fence its execution
/// space before returning.
template <class F>
Timing time_it(F&& f, int warmup = 2, int repeats = 7) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> seconds;
  seconds.reserve(static_cast<std::size_t>(repeats));
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    const auto stop = std::chrono::steady_clock::now();
    seconds.push_back(std::chrono::duration<double>(stop - start).count());
  }
  return summarise(std::move(seconds));
}

/// Times a collective step on every rank of `comm`: each repeat starts after a barrier and counts
/// the slowest rank's time (all ranks return the same Timing). Collective.
template <class F>
Timing time_collective(MPI_Comm comm, F&& f, int warmup = 2, int repeats = 7) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> seconds;
  seconds.reserve(static_cast<std::size_t>(repeats));
  for (int i = 0; i < repeats; ++i) {
    MPI_Barrier(comm);
    const double start = MPI_Wtime();
    f();
    double mine = MPI_Wtime() - start, slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
    seconds.push_back(slowest);
  }
  return summarise(std::move(seconds));
}

/// The two times of a CP efficiency in alternating rounds: `solo` on rank 0 of `comm` alone while
/// the other ranks wait in a barrier (T(1): one rank alone on the machine, so its contention is not
/// folded into the baseline), then `together` on every rank (T(P), as `time_collective` times it),
/// one call of each per round after `warmup` rounds, so both medians see the same drift of a shared
/// machine's load instead of one stretch each. Every rank gets both Timings. `solo` must not
/// communicate over `comm`. Collective; each must fence before returning.
template <class S, class A>
std::pair<Timing, Timing> time_solo_and_collective(MPI_Comm comm, S&& solo, A&& together,
                                                   int warmup, int rounds) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  for (int i = 0; i < warmup; ++i) {
    if (rank == 0) solo();
    MPI_Barrier(comm);
    together();
    MPI_Barrier(comm);
  }
  std::vector<double> t1, tp;
  for (int i = 0; i < rounds; ++i) {
    MPI_Barrier(comm);
    double start = MPI_Wtime();
    if (rank == 0) solo();
    double mine = MPI_Wtime() - start;
    MPI_Bcast(&mine, 1, MPI_DOUBLE, 0, comm);
    t1.push_back(mine);
    MPI_Barrier(comm);
    start = MPI_Wtime();
    together();
    mine = MPI_Wtime() - start;
    double slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
    tp.push_back(slowest);
  }
  return {summarise(std::move(t1)), summarise(std::move(tp))};
}

/// Times `a` and `b` in alternation, one call each per round after `warmup` rounds, so that both
/// medians see the same drift of a shared machine's load (a ratio near 1 is what is measured).
/// Each must fence before returning.
template <class A, class B>
std::pair<Timing, Timing> time_alternating(A&& a, B&& b, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) {
    a();
    b();
  }
  auto seconds = [](auto& f) {
    const auto start = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<double> ta, tb;
  for (int i = 0; i < repeats; ++i) {
    ta.push_back(seconds(a));
    tb.push_back(seconds(b));
  }
  return {summarise(ta), summarise(tb)};
}

/// Times every collective step of `steps` in rounds, one call of each per round in order (after
/// `warmup` such rounds), each call as `time_collective` does (a barrier, then the slowest
/// rank's time). The cases of a sweep then see the same drift of a shared machine's load instead
/// of the longest case running last, in whatever load the end of the sweep meets. Collective;
/// each step must fence before returning.
inline std::vector<Timing> time_interleaved_collective(
    MPI_Comm comm, const std::vector<std::function<void()>>& steps, int warmup, int rounds) {
  for (int i = 0; i < warmup; ++i)
    for (const auto& f : steps) f();
  std::vector<std::vector<double>> seconds(steps.size());
  for (int i = 0; i < rounds; ++i) {
    for (std::size_t c = 0; c < steps.size(); ++c) {
      MPI_Barrier(comm);
      const double start = MPI_Wtime();
      steps[c]();
      double mine = MPI_Wtime() - start, slowest = 0;
      MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
      seconds[c].push_back(slowest);
    }
  }
  std::vector<Timing> out;
  out.reserve(steps.size());
  for (auto& s : seconds) out.push_back(summarise(std::move(s)));
  return out;
}

}  // namespace ctxpar::bench
