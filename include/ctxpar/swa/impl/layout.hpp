/// \file
/// Where every token of the key/value axis lives under context parallelism, and the host-side
/// plans of the exchanges that move tokens between ranks.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ctxpar/partition/balanced_chunks.hpp"
#include "ctxpar/swa/impl/window_range.hpp"

namespace ctxpar::swa::impl {

/// The key/value axis `cache ++ chunk` of one step and who owns which of its tokens. The queries
/// (chunk tokens) are always sharded by `BalancedChunks(t, P)`. Keys/values are owned either per
/// segment (`whole_axis == false`: the cache by `BalancedChunks(c, P)`, the chunk like the queries,
/// so a rank's chunk keys are its own tokens) or by the literal torch.chunk rule over the whole
/// axis (`whole_axis == true`: rank `r` owns `[BalancedChunks(L, P).begin(r), end(r))`). A rank's
/// "records" are the axis tokens it owns, in axis order.
struct AxisLayout {
  std::int64_t cache = 0, chunk = 0;
  int ranks = 1;
  bool whole_axis = false;  ///< key/value ownership by BalancedChunks(L, P) of the whole axis

  BalancedChunks cache_split() const { return BalancedChunks{cache, ranks}; }
  BalancedChunks chunk_split() const { return BalancedChunks{chunk, ranks}; }
  BalancedChunks axis_split() const { return BalancedChunks{cache + chunk, ranks}; }
  std::int64_t length() const { return cache + chunk; }
  /// The same step with the per-segment ownership (the layout the caller's shards arrive in).
  AxisLayout per_segment() const {
    AxisLayout l = *this;
    l.whole_axis = false;
    return l;
  }
  /// The rank that owns axis index `a`.
  int owner(std::int64_t a) const {
    if (whole_axis) return axis_split().owner(a);
    return a < cache ? cache_split().owner(a) : chunk_split().owner(a - cache);
  }
  /// Number of records of rank `r`.
  std::int64_t records(int r) const {
    if (whole_axis) return axis_split().size(r);
    return cache_split().size(r) + chunk_split().size(r);
  }
  /// The record index of axis index `a` on its owner.
  std::int64_t record_of(std::int64_t a) const {
    const int o = owner(a);
    if (whole_axis) return a - axis_split().begin(o);
    return a < cache ? a - cache_split().begin(o)
                     : cache_split().size(o) + (a - cache - chunk_split().begin(o));
  }
  /// Axis index of the first query (chunk token) of rank `r`.
  std::int64_t first_query(int r) const { return cache + chunk_split().begin(r); }
  /// Axis range `[begin, end)` of rank `r`'s records under the whole-axis rule.
  std::pair<std::int64_t, std::int64_t> axis_range(int r) const {
    return {axis_split().begin(r), axis_split().end(r)};
  }
};

/// An exchange in which every rank `s` needs the axis range `[lo_s, hi_s)`, taking what it owns
/// itself from its own records and receiving the rest from the owners, in axis order per source.
/// Sends and receives are packed rank-major.
struct ExchangePlan {
  std::int64_t lo = 0, hi = 0;             ///< this rank's needed range
  std::vector<int> send_counts;            ///< records sent to each rank
  std::vector<int> recv_counts;            ///< records received from each rank
  std::vector<std::int64_t> send_records;  ///< own record index of each send slot
  /// For each needed axis index `lo + i`: the receive slot (>= 0), or `-(record + 1)` for an own
  /// record.
  std::vector<std::int64_t> source;

  std::int64_t send_total() const { return static_cast<std::int64_t>(send_records.size()); }
  std::int64_t recv_total() const {
    std::int64_t s = 0;
    for (int c : recv_counts) s += c;
    return s;
  }
  std::vector<int> displacements(const std::vector<int>& counts) const {
    std::vector<int> d(counts.size(), 0);
    for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
    return d;
  }
};

/// One all-to-all that carries two exchanges planned over the same own records: per peer, the
/// records of `a` then those of `b`. `source_a` / `source_b` are the plans' `source` lists with
/// receive slots renumbered into the fused receive buffer; `send_records` lists per peer the
/// records of `a` then of `b`.
struct FusedPlan {
  std::vector<int> send_counts, recv_counts;  ///< per peer, `a` + `b`
  std::vector<int> send_a, send_b;            ///< per peer, the share of each plan
  std::vector<std::int64_t> send_records;     ///< own record index of each send slot
  std::vector<std::int64_t> source_a;         ///< `a.source`, receive slots renumbered
  std::vector<std::int64_t> source_b;         ///< `b.source`, receive slots renumbered

  std::int64_t send_total() const { return static_cast<std::int64_t>(send_records.size()); }
  std::int64_t recv_total() const {
    std::int64_t s = 0;
    for (int c : recv_counts) s += c;
    return s;
  }
};

/// Fuses two plans of the same rank over the same own records into one exchange.
inline FusedPlan fuse(const ExchangePlan& a, const ExchangePlan& b) {
  FusedPlan f;
  const std::size_t p = a.send_counts.size();
  f.send_counts.assign(p, 0);
  f.recv_counts.assign(p, 0);
  f.send_a = a.send_counts;
  f.send_b = b.send_counts;
  const auto sa = a.displacements(a.send_counts), sb = b.displacements(b.send_counts);
  for (std::size_t j = 0; j < p; ++j) {
    for (int k = 0; k < a.send_counts[j]; ++k) f.send_records.push_back(a.send_records[sa[j] + k]);
    for (int k = 0; k < b.send_counts[j]; ++k) f.send_records.push_back(b.send_records[sb[j] + k]);
    f.send_counts[j] = a.send_counts[j] + b.send_counts[j];
    f.recv_counts[j] = a.recv_counts[j] + b.recv_counts[j];
  }
  const auto fd = a.displacements(f.recv_counts);
  auto renumber = [&](const ExchangePlan& x, bool second) {
    // Slot -> (peer, offset) of the plan's own receive buffer, then into the fused one.
    std::vector<std::int64_t> slot_to(static_cast<std::size_t>(x.recv_total()));
    std::int64_t s = 0;
    for (std::size_t i = 0; i < p; ++i)
      for (int k = 0; k < x.recv_counts[i]; ++k)
        slot_to[static_cast<std::size_t>(s++)] = fd[i] + (second ? a.recv_counts[i] : 0) + k;
    std::vector<std::int64_t> out = x.source;
    for (auto& v : out)
      if (v >= 0) v = slot_to[static_cast<std::size_t>(v)];
    return out;
  };
  f.source_a = renumber(a, false);
  f.source_b = renumber(b, true);
  return f;
}

/// Builds the plan of rank `me` for the needed ranges given by `needed(r) -> pair(lo, hi)`.
template <class Needed>
ExchangePlan make_plan(const AxisLayout& layout, int me, Needed needed) {
  ExchangePlan plan;
  const int p = layout.ranks;
  plan.send_counts.assign(p, 0);
  plan.recv_counts.assign(p, 0);
  for (int s = 0; s < p; ++s) {
    if (s == me) continue;
    const auto [lo, hi] = needed(s);
    for (std::int64_t a = lo; a < hi; ++a) {
      if (layout.owner(a) != me) continue;
      plan.send_records.push_back(layout.record_of(a));
      ++plan.send_counts[s];
    }
  }
  const auto [lo, hi] = needed(me);
  plan.lo = lo;
  plan.hi = hi;
  for (std::int64_t a = lo; a < hi; ++a) {
    const int o = layout.owner(a);
    if (o != me) ++plan.recv_counts[o];
  }
  std::vector<int> next = plan.displacements(plan.recv_counts);
  plan.source.resize(static_cast<std::size_t>(hi > lo ? hi - lo : 0));
  for (std::int64_t a = lo; a < hi; ++a) {
    const int o = layout.owner(a);
    plan.source[a - lo] = o == me ? -(layout.record_of(a) + 1) : next[o]++;
  }
  return plan;
}

/// The keys rank `r`'s queries read: the axis indices its first query may reach back to (the
/// `W - 1` before it, everything before it for an unlimited window) and the keys of its own
/// queries; nothing when it has no query.
inline std::pair<std::int64_t, std::int64_t> halo_range(const AxisLayout& layout,
                                                        const WindowRange& range, int r) {
  if (layout.chunk_split().size(r) == 0) return {0, 0};
  const std::int64_t first = layout.first_query(r);
  return {range.first_reachable(first), first + layout.chunk_split().size(r)};
}

/// The axis range that becomes rank `r`'s shard of the next cache (the last `n` axis indices,
/// split by `BalancedChunks(n, P)`).
inline std::pair<std::int64_t, std::int64_t> next_cache_range(const AxisLayout& layout,
                                                              std::int64_t n, int r) {
  const BalancedChunks split{n, layout.ranks};
  const std::int64_t base = layout.length() - n;
  return {base + split.begin(r), base + split.end(r)};
}

}  // namespace ctxpar::swa::impl
