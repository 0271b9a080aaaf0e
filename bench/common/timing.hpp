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

/// Times `f` on rank 0 of `comm` alone while the other ranks wait in a barrier, and gives every
/// rank rank 0's Timing: the T(1) of the CP efficiency (docs/performance.md, "Definitions"), one
/// rank alone on the machine, so the machine's own contention is not folded into the baseline.
/// `f` must not communicate over `comm` (run it on a one-rank group). Collective.
template <class F>
Timing time_solo(MPI_Comm comm, F&& f, int warmup = 2, int repeats = 7) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  Timing t;
  if (rank == 0) t = time_it(f, warmup, repeats);
  MPI_Barrier(comm);
  double fields[3] = {t.median_s, t.min_s, t.max_s};
  MPI_Bcast(fields, 3, MPI_DOUBLE, 0, comm);
  MPI_Bcast(&t.repeats, 1, MPI_INT, 0, comm);
  t.median_s = fields[0];
  t.min_s = fields[1];
  t.max_s = fields[2];
  return t;
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
