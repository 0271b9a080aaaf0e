/// \file
/// Where one call's time goes, by kernel: the wall time of every Kokkos kernel and deep copy the
/// call launches, summed by label through the Kokkos Tools begin/end callbacks. On host backends
/// a kernel runs between its two callbacks, so their difference is its time; what the call spends
/// outside every kernel is communication and host work. Timed runs never have it installed.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/json.hpp"

namespace ctxpar::bench {

/// One label's share of a profiled call.
struct KernelTime {
  double seconds = 0;      ///< summed wall time of the label's launches
  std::int64_t calls = 0;  ///< launches
};

/// A profiled call: its wall time and the time of each kernel label inside it.
struct KernelProfile {
  double wall_s = 0;                         ///< the whole call
  std::map<std::string, KernelTime> labels;  ///< per Kokkos label; deep copies as "(deep_copy)"

  /// Time inside any kernel or deep copy.
  double kernels_s() const {
    double s = 0;
    for (const auto& [label, t] : labels) s += t.seconds;
    return s;
  }
  /// The labels, heaviest first.
  std::vector<std::pair<std::string, KernelTime>> heaviest() const {
    std::vector<std::pair<std::string, KernelTime>> v(labels.begin(), labels.end());
    std::sort(v.begin(), v.end(),
              [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    return v;
  }
};

namespace impl {
// The callbacks are plain process-wide function pointers, so their state is too.
struct ProfilerState {
  using Clock = std::chrono::steady_clock;
  std::map<std::string, KernelTime> totals;
  std::unordered_map<std::uint64_t, std::pair<std::string, Clock::time_point>> open;
  std::uint64_t next_id = 0;
  Clock::time_point copy_start;
  bool in_copy = false;
};
inline ProfilerState& profiler_state() {
  static ProfilerState s;
  return s;
}
inline void profile_begin(const char* name, const std::uint32_t, std::uint64_t* id) {
  auto& s = profiler_state();
  *id = s.next_id++;
  // A deep copy may run as a kernel of its own: its time counts once, as the copy's.
  if (s.in_copy) return;
  s.open.emplace(
      *id, std::make_pair(std::string(name != nullptr ? name : "?"), ProfilerState::Clock::now()));
}
inline void profile_end(const std::uint64_t id) {
  auto& s = profiler_state();
  const auto it = s.open.find(id);
  if (it == s.open.end()) return;
  KernelTime& e = s.totals[it->second.first];
  e.seconds +=
      std::chrono::duration<double>(ProfilerState::Clock::now() - it->second.second).count();
  ++e.calls;
  s.open.erase(it);
}
inline void profile_begin_copy(Kokkos::Tools::SpaceHandle, const char*, const void*,
                               Kokkos::Tools::SpaceHandle, const char*, const void*,
                               std::uint64_t) {
  auto& s = profiler_state();
  s.copy_start = ProfilerState::Clock::now();
  s.in_copy = true;
}
inline void profile_end_copy() {
  auto& s = profiler_state();
  s.in_copy = false;
  KernelTime& e = s.totals["(deep_copy)"];
  e.seconds += std::chrono::duration<double>(ProfilerState::Clock::now() - s.copy_start).count();
  ++e.calls;
}
inline void set_profile_callbacks(bool on) {
  namespace kt = Kokkos::Tools::Experimental;
  kt::set_begin_parallel_for_callback(on ? profile_begin : nullptr);
  kt::set_end_parallel_for_callback(on ? profile_end : nullptr);
  kt::set_begin_parallel_reduce_callback(on ? profile_begin : nullptr);
  kt::set_end_parallel_reduce_callback(on ? profile_end : nullptr);
  kt::set_begin_parallel_scan_callback(on ? profile_begin : nullptr);
  kt::set_end_parallel_scan_callback(on ? profile_end : nullptr);
  kt::set_begin_deep_copy_callback(on ? profile_begin_copy : nullptr);
  kt::set_end_deep_copy_callback(on ? profile_end_copy : nullptr);
}
}  // namespace impl

/// Profiles one call of `f` (which fences before returning) on this process.
template <class F>
KernelProfile profile_kernels(F&& f) {
  auto& s = impl::profiler_state();
  s.totals.clear();
  s.open.clear();
  s.in_copy = false;
  impl::set_profile_callbacks(true);
  const auto start = impl::ProfilerState::Clock::now();
  f();
  const double wall =
      std::chrono::duration<double>(impl::ProfilerState::Clock::now() - start).count();
  impl::set_profile_callbacks(false);
  return KernelProfile{wall, s.totals};
}

/// The fastest of `calls` profiled calls of `f` (one short call on a shared machine may be
/// interrupted; the fastest is the one least disturbed).
template <class F>
KernelProfile fastest_profile(int calls, F&& f) {
  KernelProfile best;
  for (int i = 0; i < calls; ++i) {
    KernelProfile p = profile_kernels(f);
    if (i == 0 || p.wall_s < best.wall_s) best = std::move(p);
  }
  return best;
}

/// Writes `prefix` + `wall_s`, `kernels_s`, `outside_kernels_s`, `other_kernels_s`, `labels` and,
/// for the `shown` heaviest labels, `label<i>`, `label<i>_s`, `label<i>_calls` into `r`.
inline void set_profile(Record& r, const std::string& prefix, const KernelProfile& p,
                        int shown = 6) {
  const auto sorted = p.heaviest();
  double rest = 0;
  for (std::size_t i = shown; i < sorted.size(); ++i) rest += sorted[i].second.seconds;
  r.set(prefix + "wall_s", p.wall_s)
      .set(prefix + "kernels_s", p.kernels_s())
      .set(prefix + "outside_kernels_s", p.wall_s - p.kernels_s())
      .set(prefix + "other_kernels_s", rest)
      .set(prefix + "labels", static_cast<int>(std::min<std::size_t>(shown, sorted.size())));
  for (std::size_t i = 0; i < sorted.size() && i < static_cast<std::size_t>(shown); ++i) {
    const std::string k = prefix + "label" + std::to_string(i);
    r.set(k, sorted[i].first.substr(0, 80))
        .set(k + "_s", sorted[i].second.seconds)
        .set(k + "_calls", sorted[i].second.calls);
  }
}

/// Prints the `shown` heaviest labels of `p` under a heading line.
inline void print_profile(const std::string& heading, const KernelProfile& p, int shown = 6) {
  std::printf("%s: wall %.4f s, kernels %.4f s, outside %.4f s\n", heading.c_str(), p.wall_s,
              p.kernels_s(), p.wall_s - p.kernels_s());
  const auto sorted = p.heaviest();
  for (std::size_t i = 0; i < sorted.size() && i < static_cast<std::size_t>(shown); ++i)
    std::printf("    %8.4f s %6lld calls  %s\n", sorted[i].second.seconds,
                (long long)sorted[i].second.calls, sorted[i].first.c_str());
  std::fflush(stdout);
}

/// Where a step's time goes next to the kernels it runs: the fastest of `calls` profiled calls of
/// each of the four (each fences), written into `r` as `step_forward_profile_*`,
/// `step_backward_profile_*`, `kernel_forward_profile_*` and `kernel_backward_profile_*` (the
/// `shown` heaviest labels each) and printed. A label's step time less its kernel time is what
/// the step adds in that kernel; labels the kernels never launch are the step's own passes.
template <class StepForward, class StepBackward, class KernelForward, class KernelBackward>
void profile_step_and_kernels(Record& r, StepForward&& step_forward, StepBackward&& step_backward,
                              KernelForward&& kernel_forward, KernelBackward&& kernel_backward,
                              int calls = 3, int shown = 10) {
  const KernelProfile profiles[4] = {
      fastest_profile(calls, step_forward), fastest_profile(calls, step_backward),
      fastest_profile(calls, kernel_forward), fastest_profile(calls, kernel_backward)};
  const char* names[4] = {"step_forward", "step_backward", "kernel_forward", "kernel_backward"};
  for (int i = 0; i < 4; ++i) {
    set_profile(r, std::string(names[i]) + "_profile_", profiles[i], shown);
    print_profile(std::string("  ") + names[i] + " profile", profiles[i], shown);
  }
  r.set("profile_method",
        "the fastest of " + std::to_string(calls) +
            " untimed calls after the timed ones; Kokkos Tools begin/end callbacks of every "
            "parallel_for/reduce/scan and deep_copy");
}

}  // namespace ctxpar::bench
