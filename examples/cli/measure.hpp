// What every subcommand's JSON summary reports about cost: per-rank peak resident memory and, with
// `--repeat N`, the steady state of the operator calls (the fastest of N repeated calls after the
// checked first one, which is their warm-up, and what Kokkos allocated inside them).
#pragma once

#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/core/allocation_counter.hpp"
#include "json.hpp"

namespace ctxpar::cli {

/// This process's peak resident set so far, in bytes (Linux reports `ru_maxrss` in KiB).
inline std::int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;
}

/// The memory this process may use, in bytes, for the up-front estimates of what a run needs: the
/// machine's physical memory, or less under an address-space or data limit (`ulimit -v`,
/// `prlimit --as`), of which a quarter is left for the libraries' own mappings. 0 if unknown.
inline double memory_limit_bytes() {
  double limit = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  for (int resource : {RLIMIT_AS, RLIMIT_DATA}) {
    rlimit r{};
    if (getrlimit(resource, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
      limit = std::min(limit, 0.75 * static_cast<double>(r.rlim_cur));
  }
  return std::max(limit, 0.0);
}

/// This process's resident set now, in bytes (`/proc/self/statm`; 0 where it cannot be read).
inline std::int64_t current_rss_bytes() {
  long pages = 0, resident = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<std::int64_t>(resident) * sysconf(_SC_PAGESIZE);
}

/// Every rank's `value`, as a JSON array on rank 0 (null elsewhere). Collective.
inline Json gather_counts(const Group& group, std::int64_t value) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(group.rank() == 0 ? group.size() : 0));
  MPI_Gather(&value, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, 0, group.mpi_comm());
  if (group.rank() != 0) return Json();
  Json out = Json::array();
  for (std::int64_t v : all) out.push_back(v);
  return out;
}

/// One rank's figures over the repeated operator calls of `--repeat N`.
struct SteadyState {
  /// Repetitions asked for (0: none, the summary then has no `steady_state`).
  int repeat = 0;
  /// Fastest forward and backward of the repetitions on this rank, in seconds.
  double forward_seconds = std::numeric_limits<double>::infinity();
  double backward_seconds = std::numeric_limits<double>::infinity();
  /// Allocations Kokkos made inside the operator calls of all repetitions, and their bytes.
  std::int64_t allocations = 0, bytes = 0;
  /// Those allocations by Kokkos label.
  std::map<std::string, std::int64_t> labels;

  /// Runs `call` (operator calls only: the counts are taken around it) and adds what it allocated.
  template <class F>
  void counted(const AllocationCounter& counter, F&& call) {
    const std::int64_t n0 = counter.allocations(), b0 = counter.bytes();
    const auto labels0 = counter.labels();
    call();
    allocations += counter.allocations() - n0;
    bytes += counter.bytes() - b0;
    for (const auto& [label, n] : counter.labels()) {
      const auto before = labels0.find(label);
      const std::int64_t added = n - (before == labels0.end() ? 0 : before->second);
      if (added > 0) labels[label] += added;
    }
  }
  /// The `repeat` repetitions of an operator that keeps its state between calls: `forward()` and
  /// `backward()` each run the operator call and return its seconds (0 for a backward not run);
  /// their allocations are counted.
  template <class F, class B>
  void run(F&& forward, B&& backward) {
    if (repeat == 0) return;
    AllocationCounter counter;
    for (int r = 0; r < repeat; ++r) {
      double fwd = 0, bwd = 0;
      counted(counter, [&] { fwd = forward(); });
      counted(counter, [&] { bwd = backward(); });
      add(fwd, bwd);
    }
  }
  /// Records one repetition's forward and backward seconds (0 for a backward not run).
  void add(double forward, double backward) {
    forward_seconds = std::min(forward_seconds, forward);
    backward_seconds = std::min(backward_seconds, backward);
  }
  /// `{"repeat", "forward_seconds", "backward_seconds", "allocations", "bytes_allocated"}`, each
  /// per rank, on rank 0: the counts are totals over the `repeat` calls (a call is one forward and,
  /// with --backward, one backward), so a steady state shows 0; and `allocation_labels_rank0`,
  /// rank 0's allocations by label. Collective.
  Json to_json(const Group& group) const {
    Json out = Json::object();
    out["repeat"] = repeat;
    Json fwd = gather_seconds(group, forward_seconds),
         bwd = gather_seconds(group, backward_seconds);
    Json calls = gather_counts(group, allocations), call_bytes = gather_counts(group, bytes);
    if (group.rank() != 0) return Json();
    out["forward_seconds"] = fwd;
    out["backward_seconds"] = bwd;
    out["allocations"] = calls;
    out["bytes_allocated"] = call_bytes;
    Json by_label = Json::object();
    for (const auto& [label, n] : labels) by_label[label] = n;
    out["allocation_labels_rank0"] = by_label;
    return out;
  }
};

}  // namespace ctxpar::cli
