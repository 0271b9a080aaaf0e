// The window range type against a brute-force scan: random strictly increasing positions (with
// gaps), windows 0 (unlimited), 1, 2, odd and longer than the axis; every key range of a query
// run, every query range of a key run, the all-visible test and the tiles per window.
// The axis ranges of the exchange tables (first reachable index, carried keys) likewise.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <iostream>
#include <random>
#include <vector>

#include "ctxpar/swa/impl/window_range.hpp"
#include "ctxpar_test/harness.hpp"

using ctxpar::swa::impl::WindowRange;
using ctxpar::test::world;

namespace {

/// The window's definition, written out independently of the type under test.
bool in_window(std::int64_t window, std::int64_t q, std::int64_t k) {
  return k <= q && (window == 0 || k > q - window);
}

// Positions read by index, callable where WindowRange calls them (host and device functions):
// under nvcc a host lambda there draws "calling a __host__ function from a __host__ __device__
// function".
struct PositionsAt {
  const std::int64_t* data;
  KOKKOS_INLINE_FUNCTION std::int64_t operator()(std::int64_t i) const { return data[i]; }
};

std::vector<std::int64_t> sorted_positions(std::mt19937_64& rng, int n) {
  std::uniform_int_distribution<std::int64_t> gap(1, 4), start(0, 9);
  std::vector<std::int64_t> pos(static_cast<std::size_t>(n));
  std::int64_t p = start(rng);
  for (auto& x : pos) {
    x = p;
    p += gap(rng);
  }
  return pos;
}

/// Checks that exactly the indices `[lo, hi)` of `[begin, end)` satisfy `wanted`.
template <class Wanted>
bool exactly(const char* what, std::int64_t begin, std::int64_t end, std::int64_t lo,
             std::int64_t hi, const Wanted& wanted) {
  bool ok = begin <= lo && lo <= hi && hi <= end;
  for (std::int64_t i = begin; ok && i < end; ++i) ok = wanted(i) == (i >= lo && i < hi);
  if (!ok) std::cerr << what << ": got [" << lo << ", " << hi << ")\n";
  return ok;
}

}  // namespace

BOOST_AUTO_TEST_CASE(window_range_matches_a_brute_force_scan) {
  std::mt19937_64 rng(33);
  bool ok = true;
  for (const std::int64_t window : {0, 1, 2, 7, 33, 100000}) {
    const WindowRange range{window};
    ok = ok && range.limited() == (window > 0);
    if (window > 0)
      for (const std::int64_t tile : {1, 5, 32})
        ok = ok && range.tiles_per_window(tile) * tile >= window &&
             (range.tiles_per_window(tile) - 1) * tile < window;
    for (int trial = 0; trial < 40; ++trial) {
      const auto kpos = sorted_positions(rng, 1 + trial % 23);
      const auto qpos = sorted_positions(rng, 1 + trial % 17);
      const PositionsAt kat{kpos.data()}, qat{qpos.data()};
      const std::int64_t nk = static_cast<std::int64_t>(kpos.size());
      const std::int64_t nq = static_cast<std::int64_t>(qpos.size());
      // Single pairs.
      for (std::int64_t q = 0; q < 30; ++q)
        for (std::int64_t k = 0; k < 30; ++k)
          ok = ok && range.admits(q, k) == in_window(window, q, k);
      std::uniform_int_distribution<std::int64_t> any(-3, 60), span(0, 8);
      for (int run = 0; run < 20; ++run) {
        // Keys of a sub-range that some query position in [first, last] admits.
        const std::int64_t first = any(rng), last = first + span(rng);
        std::uniform_int_distribution<std::int64_t> at(0, nk);
        std::int64_t begin = at(rng), end = at(rng);
        if (begin > end) std::swap(begin, end);
        std::int64_t lo = -1, hi = -1;
        range.keys(kat, begin, end, first, last, lo, hi);
        ok = exactly("keys", begin, end, lo, hi,
                     [&](std::int64_t j) {
                       for (std::int64_t q = first; q <= last; ++q)
                         if (in_window(window, q, kat(j))) return true;
                       return false;
                     }) &&
             ok;
        // Queries that admit some key position in [first, last].
        range.queries(qat, nq, first, last, lo, hi);
        ok = exactly("queries", 0, nq, lo, hi,
                     [&](std::int64_t i) {
                       for (std::int64_t k = first; k <= last; ++k)
                         if (in_window(window, qat(i), k)) return true;
                       return false;
                     }) &&
             ok;
        // Every pair of two runs visible.
        const std::int64_t k_first = any(rng), k_last = k_first + span(rng);
        bool all = true;
        for (std::int64_t q = first; q <= last; ++q)
          for (std::int64_t k = k_first; k <= k_last; ++k) all = all && in_window(window, q, k);
        ok = ok && range.admits_all(first, last, k_first, k_last) == all;
      }
    }
    if (!ok) {
      std::cerr << "window " << window << " differs from the scan\n";
      break;
    }
  }
  CTXPAR_TEST_ALL(world(), ok);
}

// The axis ranges the exchange tables take from the type, on gap-free positions (axis indices):
// the first index a query may reach is the first one in its window, and the carried cache is
// exactly the keys some later query (at any index past the axis) may still see.
BOOST_AUTO_TEST_CASE(table_ranges_match_a_brute_force_scan) {
  bool ok = true;
  for (const std::int64_t window : {0, 1, 2, 3, 7, 40}) {
    const WindowRange range{window};
    for (std::int64_t q = 0; q < 30; ++q) {
      std::int64_t first = q;
      while (first > 0 && in_window(window, q, first - 1)) --first;
      ok = ok && range.first_reachable(q) == first;
    }
    for (std::int64_t length = 0; length < 30; ++length) {
      std::int64_t seen = 0;  // keys of [0, length) some query at index >= length may see
      for (std::int64_t k = 0; k < length; ++k) seen += in_window(window, length, k) ? 1 : 0;
      ok = ok && range.carried(length) == seen;
    }
    if (!ok) {
      std::cerr << "window " << window << ": table ranges differ from the scan\n";
      break;
    }
  }
  CTXPAR_TEST_ALL(world(), ok);
}
