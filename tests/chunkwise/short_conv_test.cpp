// The short-convolution halo: sharded forward and backward (input, weight and bias gradients)
// against an fp64 oracle of the whole sequence and against the single-rank path, on every rank,
// for contiguous shards (uneven, empty) and zigzag shards (chunk r's halo from rank r-1, chunk
// 2P-1-r's from rank r+1 or rank P-1 itself), dense and packed (documents ending on, just before
// and just after shard and chunk borders), with and without bias, all through `ShortConvPlan`; the
// plan's repeated calls give its first call's results to the bit and allocate nothing (its buffers
// come with its construction); and the collective errors: a shard or chunk shorter than w - 1 on
// one rank, views that disagree with the plan's shape, a backward with a saved state no forward
// filled.
#include <boost/test/unit_test.hpp>

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "ctxpar/chunkwise/short_conv.hpp"
#include "ctxpar/core/allocation_counter.hpp"
#include "ctxpar/core/plan.hpp"
#include "ctxpar/partition/balanced_chunks.hpp"
#include "ctxpar_test/harness.hpp"

namespace cw = ctxpar::chunkwise;
using ctxpar::test::all_close;
using ctxpar::test::throws_everywhere;
using ctxpar::test::uniform;
using ctxpar::test::unit_roundoff;
using ctxpar::test::world;

namespace {

using exec = Kokkos::DefaultHostExecutionSpace;
using mem = exec::memory_space;

struct ConvOracle {
  std::vector<double> y, dx, dw, db, y_mag, dx_mag, dw_mag, db_mag;
};

// Whole-sequence fp64 conv with document masking, and the magnitudes Σ|terms| for bounds.
ConvOracle conv_oracle(const std::vector<double>& x, const std::vector<double>& w,
                       const std::vector<double>& b, const std::vector<int>& ids,
                       const std::vector<double>& dy, std::int64_t T, std::int64_t C,
                       std::int64_t W) {
  ConvOracle o;
  o.y.assign(static_cast<std::size_t>(T * C), 0);
  o.y_mag = o.y;
  o.dx = o.y;
  o.dx_mag = o.y;
  o.dw.assign(static_cast<std::size_t>(C * W), 0);
  o.dw_mag = o.dw;
  o.db.assign(static_cast<std::size_t>(C), 0);
  o.db_mag = o.db;
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t c = 0; c < C; ++c) {
      const std::size_t tc = static_cast<std::size_t>(t * C + c);
      double acc = b.empty() ? 0 : b[static_cast<std::size_t>(c)], mag = std::fabs(acc);
      for (std::int64_t j = 0; j < W; ++j) {
        const std::int64_t s = t - (W - 1) + j;
        if (s < 0 || ids[static_cast<std::size_t>(s)] != ids[static_cast<std::size_t>(t)]) continue;
        const std::size_t sc = static_cast<std::size_t>(s * C + c),
                          cj = static_cast<std::size_t>(c * W + j);
        acc += w[cj] * x[sc];
        mag += std::fabs(w[cj] * x[sc]);
        o.dx[sc] += w[cj] * dy[tc];
        o.dx_mag[sc] += std::fabs(w[cj] * dy[tc]);
        o.dw[cj] += dy[tc] * x[sc];
        o.dw_mag[cj] += std::fabs(dy[tc] * x[sc]);
      }
      o.y[tc] = acc;
      o.y_mag[tc] = mag;
      o.db[static_cast<std::size_t>(c)] += dy[tc];
      o.db_mag[static_cast<std::size_t>(c)] += std::fabs(dy[tc]);
    }
  }
  return o;
}

// Natural token indices of rank r's rows, in local order.
std::vector<std::int64_t> shard_tokens(std::int64_t T, int p, int r, bool zigzag) {
  std::vector<std::int64_t> out;
  if (!zigzag) {
    const ctxpar::BalancedChunks split{T, p};
    for (std::int64_t i = split.begin(r); i < split.end(r); ++i) out.push_back(i);
    return out;
  }
  const std::int64_t c = T / (2 * p);
  for (std::int64_t n : {static_cast<std::int64_t>(r), static_cast<std::int64_t>(2 * p - 1 - r)})
    for (std::int64_t i = n * c; i < (n + 1) * c; ++i) out.push_back(i);
  return out;
}

template <class Scalar>
using rows_t = Kokkos::View<Scalar**, Kokkos::LayoutRight, mem>;

// One forward + backward of the conv over `tokens` (natural indices) of the whole problem.
template <class Scalar>
struct ConvRun {
  rows_t<Scalar> y, dx, dw;
  Kokkos::View<Scalar*, mem> db;
};

// How `run_conv` calls the plan: once (the plan's first forward + backward), or with
// `repeats > 0` that many more times on the same plan and saved state, each overwriting the
// outputs. `allocations` (when given) receives the allocations of those repeats (a repeat that
// regrew the plan's buffers counts a million), `conv_first` those of the first call whose label
// names the conv's buffers, and `conv_built` those of the plan's construction.
struct PlanCounts {
  int repeats = 0;
  std::int64_t* allocations = nullptr;
  std::int64_t conv_first = -1, conv_built = -1;
};

// Allocations `counter` saw whose label names one of the conv's halo buffers.
std::int64_t conv_buffer_allocations(const ctxpar::AllocationCounter& counter) {
  std::int64_t n = 0;
  for (const auto& [label, count] : counter.labels())
    if (label.rfind("ctxpar::chunkwise::conv::", 0) == 0) n += count;
  return n;
}

template <class Scalar>
ConvRun<Scalar> run_conv(const ctxpar::Group& group, bool zigzag,
                         const std::vector<std::int64_t>& tokens, const std::vector<double>& x,
                         const std::vector<double>& dy, const std::vector<double>& w,
                         const std::vector<double>& b, const std::vector<int>& ids, bool packed,
                         std::int64_t C, std::int64_t W, PlanCounts* counts = nullptr) {
  const std::int64_t L = static_cast<std::int64_t>(tokens.size());
  rows_t<Scalar> xl("x", L, C), dyl("dy", L, C), wv("w", C, W);
  ConvRun<Scalar> out{rows_t<Scalar>("y", L, C), rows_t<Scalar>("dx", L, C),
                      rows_t<Scalar>("dw", C, W), Kokkos::View<Scalar*, mem>()};
  Kokkos::View<Scalar*, mem> bv;
  Kokkos::View<std::int32_t*, mem> idv;
  for (std::int64_t t = 0; t < L; ++t) {
    const std::int64_t g = tokens[static_cast<std::size_t>(t)];
    for (std::int64_t c = 0; c < C; ++c) {
      xl(t, c) = static_cast<Scalar>(x[static_cast<std::size_t>(g * C + c)]);
      dyl(t, c) = static_cast<Scalar>(dy[static_cast<std::size_t>(g * C + c)]);
    }
  }
  for (std::int64_t i = 0; i < C * W; ++i)
    wv.data()[i] = static_cast<Scalar>(w[static_cast<std::size_t>(i)]);
  if (!b.empty()) {
    bv = Kokkos::View<Scalar*, mem>("b", C);
    out.db = Kokkos::View<Scalar*, mem>("db", C);
    for (std::int64_t c = 0; c < C; ++c)
      bv(c) = static_cast<Scalar>(b[static_cast<std::size_t>(c)]);
  }
  if (packed) {
    idv = Kokkos::View<std::int32_t*, mem>("ids", L);
    for (std::int64_t t = 0; t < L; ++t)
      idv(t) = ids[static_cast<std::size_t>(tokens[static_cast<std::size_t>(t)])];
  }
  using crows = Kokkos::View<const Scalar**, Kokkos::LayoutRight, mem>;
  const Kokkos::View<const Scalar*, mem> cb(bv);
  const Kokkos::View<const std::int32_t*, mem> cid(idv);
  const cw::ShortConvShape shape{L, C, W, !b.empty(), packed};
  auto through_plan = [&](auto layout) {
    std::optional<ctxpar::AllocationCounter> counter;
    if (counts) counter.emplace();
    cw::ShortConvPlan<decltype(layout), exec, Scalar, mem> plan(exec(), group, shape, layout);
    if (counts) {
      counts->conv_built = conv_buffer_allocations(*counter);
      counter->reset();
    }
    typename decltype(plan)::saved_type saved;
    auto call = [&] {
      plan.forward(crows(xl), crows(wv), cb, cid, out.y, saved);
      plan.backward(saved, crows(dyl), out.dx, out.dw, out.db);
      exec().fence();
    };
    call();
    if (!counts) return;
    counts->conv_first = conv_buffer_allocations(*counter);
    const std::size_t built = plan.workspace_bytes();
    counter->reset();
    for (int r = 0; r < counts->repeats; ++r) call();
    *counts->allocations = counter->allocations();
    if (plan.workspace_bytes() != built) *counts->allocations += 1000000;  // a buffer regrew
  };
  if (zigzag)
    through_plan(ctxpar::Zigzag{});
  else
    through_plan(ctxpar::Contiguous{});
  return out;
}

// Repeated forward + backward calls on one plan and saved state give the first call's results
// to the bit, on every rank, and allocate nothing; the plan's construction allocates the conv's
// buffers (so the counter is shown to see them) and its first call allocates none of them.
template <class Scalar>
bool check_plan(const std::vector<std::int64_t>& lengths, std::int64_t C, std::int64_t W,
                bool packed, bool zigzag, std::uint64_t seed) {
  const auto& group = world();
  std::vector<int> ids;
  for (std::size_t d = 0; d < lengths.size(); ++d)
    ids.insert(ids.end(), static_cast<std::size_t>(lengths[d]), packed ? static_cast<int>(d) : 0);
  const std::int64_t T = static_cast<std::int64_t>(ids.size());
  std::vector<double> x(static_cast<std::size_t>(T * C)), dy(x.size()),
      w(static_cast<std::size_t>(C * W)), b(static_cast<std::size_t>(C));
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = uniform(seed, i);
    dy[i] = uniform(seed + 1, i);
  }
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = uniform(seed + 2, i);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = uniform(seed + 3, i);
  const std::vector<std::int64_t> mine = shard_tokens(T, group.size(), group.rank(), zigzag);
  const std::int64_t L = static_cast<std::int64_t>(mine.size());
  std::int64_t repeat_allocations = -1;
  PlanCounts counts{3, &repeat_allocations};
  const auto f = run_conv<Scalar>(group, zigzag, mine, x, dy, w, b, ids, packed, C, W);
  const auto q = run_conv<Scalar>(group, zigzag, mine, x, dy, w, b, ids, packed, C, W, &counts);
  const std::string tag = std::string(zigzag ? " zigzag" : " contiguous") +
                          (packed ? " packed" : " dense") + " rank " + std::to_string(group.rank());
  auto where = [&](std::int64_t i) { return "flat index " + std::to_string(i) + tag; };
  auto same = [&](const char* what, std::int64_t n, const Scalar* a, const Scalar* b) {
    return all_close(
        what, n, [&](std::int64_t i) { return static_cast<double>(a[i]); },
        [&](std::int64_t i) { return static_cast<double>(b[i]); },
        [&](std::int64_t) { return 0.0; }, where);
  };
  bool ok = same("repeated y", L * C, q.y.data(), f.y.data());
  ok = same("repeated dx", L * C, q.dx.data(), f.dx.data()) && ok;
  ok = same("repeated dweight", C * W, q.dw.data(), f.dw.data()) && ok;
  ok = same("repeated dbias", C, q.db.data(), f.db.data()) && ok;
  if (repeat_allocations != 0) {
    std::cerr << "ShortConvPlan" << tag << ": " << repeat_allocations
              << " allocations in 3 calls after the first\n";
    ok = false;
  }
  if (counts.conv_first != 0) {
    std::cerr << "ShortConvPlan" << tag << ": its first call allocated " << counts.conv_first
              << " conv buffers (the constructor should have)\n";
    ok = false;
  }
  if (W > 1 && counts.conv_built == 0) {
    std::cerr << "ShortConvPlan" << tag
              << ": its construction allocated no conv buffer, so the counter cannot see them\n";
    ok = false;
  }
  return ok;
}

template <class Scalar>
bool check_conv(const std::vector<std::int64_t>& lengths, std::int64_t C, std::int64_t W,
                bool packed, bool with_bias, bool zigzag, std::uint64_t seed) {
  const auto& group = world();
  const ctxpar::Group self(MPI_COMM_SELF);
  std::vector<int> ids;
  for (std::size_t d = 0; d < lengths.size(); ++d)
    ids.insert(ids.end(), static_cast<std::size_t>(lengths[d]), packed ? static_cast<int>(d) : 0);
  const std::int64_t T = static_cast<std::int64_t>(ids.size());
  std::vector<double> x(static_cast<std::size_t>(T * C)), dy(x.size()),
      w(static_cast<std::size_t>(C * W)), b;
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = uniform(seed, i);
    dy[i] = uniform(seed + 1, i);
  }
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = uniform(seed + 2, i);
  if (with_bias) {
    b.resize(static_cast<std::size_t>(C));
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = uniform(seed + 3, i);
  }
  const auto o = conv_oracle(x, w, b, ids, dy, T, C, W);
  const std::vector<std::int64_t> mine = shard_tokens(T, group.size(), group.rank(), zigzag);
  const std::vector<std::int64_t> all = shard_tokens(T, 1, 0, false);
  const std::int64_t L = static_cast<std::int64_t>(mine.size());
  const auto d = run_conv<Scalar>(group, zigzag, mine, x, dy, w, b, ids, packed, C, W);
  const auto s = run_conv<Scalar>(self, false, all, x, dy, w, b, ids, packed, C, W);

  const double u = unit_roundoff<Scalar>();
  const double k_local = W + 1,
               k_sum = static_cast<double>(T) + 2.0 * group.size();  // longest sums
  const std::string tag = std::string(zigzag ? " zigzag" : " contiguous") +
                          (packed ? " packed" : " dense") + " rank " + std::to_string(group.rank());
  // Local rows: flat index i = row·C + c of this rank, natural row mine[row].
  auto nat = [&](std::int64_t i) {
    return static_cast<std::size_t>(mine[static_cast<std::size_t>(i / C)] * C + i % C);
  };
  auto where = [&](std::int64_t i) {
    return "local row " + std::to_string(i / C) + " (token " +
           std::to_string(mine[static_cast<std::size_t>(i / C)]) + "), channel " +
           std::to_string(i % C) + tag;
  };
  auto where_w = [&](std::int64_t i) { return "flat index " + std::to_string(i) + tag; };
  bool ok = true;
  // Against the fp64 oracle.
  ok = all_close(
           "conv y", L * C, [&](std::int64_t i) { return d.y.data()[i]; },
           [&](std::int64_t i) { return o.y[nat(i)]; },
           [&](std::int64_t i) { return k_local * u * o.y_mag[nat(i)] + 1e-300; }, where) &&
       ok;
  ok = all_close(
           "conv dx", L * C, [&](std::int64_t i) { return d.dx.data()[i]; },
           [&](std::int64_t i) { return o.dx[nat(i)]; },
           [&](std::int64_t i) { return k_local * u * o.dx_mag[nat(i)] + 1e-300; }, where) &&
       ok;
  ok = all_close(
           "conv dweight", C * W, [&](std::int64_t i) { return d.dw.data()[i]; },
           [&](std::int64_t i) { return o.dw[static_cast<std::size_t>(i)]; },
           [&](std::int64_t i) {
             return k_sum * u * o.dw_mag[static_cast<std::size_t>(i)] + 1e-300;
           },
           where_w) &&
       ok;
  if (with_bias) {
    ok = all_close(
             "conv dbias", C, [&](std::int64_t i) { return d.db.data()[i]; },
             [&](std::int64_t i) { return o.db[static_cast<std::size_t>(i)]; },
             [&](std::int64_t i) {
               return k_sum * u * o.db_mag[static_cast<std::size_t>(i)] + 1e-300;
             },
             where_w) &&
         ok;
  }
  // Against the single-rank path (each side within its oracle bound of the exact value). The
  // forward sums the same taps in the same order, so it must match to the bit.
  ok = all_close(
           "conv y vs P=1", L * C, [&](std::int64_t i) { return d.y.data()[i]; },
           [&](std::int64_t i) { return static_cast<double>(s.y.data()[nat(i)]); },
           [&](std::int64_t) { return 0.0; }, where) &&
       ok;
  ok = all_close(
           "conv dx vs P=1", L * C, [&](std::int64_t i) { return d.dx.data()[i]; },
           [&](std::int64_t i) { return static_cast<double>(s.dx.data()[nat(i)]); },
           [&](std::int64_t i) { return 2 * k_local * u * o.dx_mag[nat(i)] + 1e-300; }, where) &&
       ok;
  ok = all_close(
           "conv dweight vs P=1", C * W, [&](std::int64_t i) { return d.dw.data()[i]; },
           [&](std::int64_t i) { return static_cast<double>(s.dw.data()[i]); },
           [&](std::int64_t i) {
             return 2 * k_sum * u * o.dw_mag[static_cast<std::size_t>(i)] + 1e-300;
           },
           where_w) &&
       ok;
  return ok;
}

// Documents with boundaries one before, on, and one after every multiple of `border`.
std::vector<std::int64_t> documents_near(std::int64_t T, std::int64_t border) {
  std::vector<std::int64_t> cuts{0};
  for (std::int64_t k = 1; k * border < T; ++k) {
    const std::int64_t cut = k * border + (k % 3) - 1;
    if (cut > cuts.back() && cut < T) cuts.push_back(cut);
  }
  cuts.push_back(T);
  std::vector<std::int64_t> docs;
  for (std::size_t i = 1; i < cuts.size(); ++i) docs.push_back(cuts[i] - cuts[i - 1]);
  return docs;
}

}  // namespace

BOOST_AUTO_TEST_CASE(conv_halo_matches_whole_sequence_oracle) {
  const auto& group = world();
  const int p = group.size();
  const std::int64_t W = 4, L = 6;
  // One sequence, uneven shards (the last is shorter).
  CTXPAR_TEST_ALL(group, check_conv<double>({L * p - 2}, 5, W, false, true, false, 1));
  CTXPAR_TEST_ALL(group, check_conv<float>({L * p - 2}, 5, W, false, false, false, 2));
  // Packed: documents ending on, just before and just after rank borders.
  CTXPAR_TEST_ALL(group, check_conv<double>(documents_near(L * p, L), 3, W, true, true, false, 3));
  CTXPAR_TEST_ALL(group, check_conv<float>(documents_near(L * p, L), 3, W, true, false, false, 4));
  // Width 1: no halo at all.
  CTXPAR_TEST_ALL(group, check_conv<double>({3 * p}, 2, 1, false, true, false, 5));
}

BOOST_AUTO_TEST_CASE(conv_halo_empty_trailing_shards) {
  const auto& group = world();
  const int p = group.size();
  // T = p + 1 with width 2: torch.chunk shards of 2, the last one short (p = 2, 4) or empty
  // (p = 3, 4). Beyond 4 ranks torch.chunk leaves several empty shards, and an empty shard that is
  // not the last cannot serve its successor's halo (the documented precondition), so stop there.
  if (p <= 4) CTXPAR_TEST_ALL(group, check_conv<double>({p + 1}, 3, 2, false, true, false, 6));
}

BOOST_AUTO_TEST_CASE(conv_halo_zigzag_matches_whole_sequence_oracle) {
  const auto& group = world();
  const int p = group.size();
  const std::int64_t W = 4;
  for (std::int64_t chunk : {std::int64_t{3}, std::int64_t{5}}) {  // exactly w - 1, and more
    const std::int64_t T = 2 * p * chunk;
    CTXPAR_TEST_ALL(group, check_conv<double>({T}, 5, W, false, true, true, 10 + chunk));
    CTXPAR_TEST_ALL(group, check_conv<float>({T}, 4, W, false, false, true, 20 + chunk));
    // Packed: document borders next to every chunk border (rank borders in the zigzag order).
    CTXPAR_TEST_ALL(
        group, check_conv<double>(documents_near(T, chunk), 3, W, true, true, true, 30 + chunk));
    CTXPAR_TEST_ALL(
        group, check_conv<float>(documents_near(T, chunk), 3, W, true, false, true, 40 + chunk));
  }
  // Width 1 (no halo) and width 2.
  CTXPAR_TEST_ALL(group, check_conv<double>({4 * p}, 2, 1, false, true, true, 50));
  CTXPAR_TEST_ALL(group, check_conv<double>({2 * p}, 2, 2, true, true, true, 51));
}

BOOST_AUTO_TEST_CASE(conv_plan_repeats_its_results_and_allocates_nothing_in_calls) {
  const auto& group = world();
  const int p = group.size();
  const std::int64_t W = 4, chunk = 5;
  CTXPAR_TEST_ALL(group, check_plan<double>({6 * p - 2}, 5, W, false, false, 60));
  CTXPAR_TEST_ALL(group, check_plan<float>(documents_near(6 * p, 6), 3, W, true, false, 61));
  CTXPAR_TEST_ALL(group, check_plan<double>({2 * p * chunk}, 5, W, false, true, 62));
  CTXPAR_TEST_ALL(group,
                  check_plan<double>(documents_near(2 * p * chunk, chunk), 3, W, true, true, 63));
}

using crows = Kokkos::View<const double**, Kokkos::LayoutRight, mem>;
using conv_plan = cw::ShortConvPlan<ctxpar::Contiguous, exec, double, mem>;
using zigzag_conv_plan = cw::ShortConvPlan<ctxpar::Zigzag, exec, double, mem>;
static_assert(ctxpar::follows_plan_contract<conv_plan>);
static_assert(ctxpar::follows_plan_contract<zigzag_conv_plan>);
static_assert(std::is_same_v<conv_plan::saved_type, cw::ShortConvSaved<double, mem>>);

BOOST_AUTO_TEST_CASE(conv_shard_shorter_than_halo_on_one_rank) {
  const auto& group = world();
  if (group.size() == 1) return;  // the last shard never sends a halo: a lone rank cannot fail
  const int bad_rank = 0;
  auto f = [&] {
    const std::int64_t L = group.rank() == bad_rank ? 2 : 6, C = 2, W = 4;
    conv_plan plan(exec(), group, cw::ShortConvShape{L, C, W});
  };
  CTXPAR_TEST_ALL(group, throws_everywhere(group, f, "at least w - 1 tokens", bad_rank));
}

BOOST_AUTO_TEST_CASE(conv_zigzag_errors_on_one_rank) {
  const auto& group = world();
  const int bad_rank = group.size() - 1;
  // Chunks of 2 tokens with w = 4: every chunk feeds a successor (at P = 1 chunk 0 feeds chunk 1),
  // so every rank is short; the error names the lowest rank.
  auto short_chunks = [&] { zigzag_conv_plan plan(exec(), group, cw::ShortConvShape{4, 2, 4}); };
  CTXPAR_TEST_ALL(group, throws_everywhere(group, short_chunks, "at least w - 1 tokens", 0));
  // An odd shard on one rank (not two equal chunks).
  auto odd = [&] {
    const std::int64_t L = group.rank() == bad_rank ? 9 : 10;
    zigzag_conv_plan plan(exec(), group, cw::ShortConvShape{L, 2, 3});
  };
  CTXPAR_TEST_ALL(group, throws_everywhere(group, odd, "two chunks of equal length", bad_rank));
}

BOOST_AUTO_TEST_CASE(conv_plan_shape_errors_on_one_rank) {
  const auto& group = world();
  const int bad_rank = group.size() - 1;
  const std::int64_t L = 6, C = 3, W = 3;
  // A width or channel count that differs on one rank: refused by the constructor.
  auto other_width = [&] {
    conv_plan plan(exec(), group, cw::ShortConvShape{L, C, group.rank() == bad_rank ? 2 : W});
  };
  auto other_channels = [&] {
    conv_plan plan(exec(), group, cw::ShortConvShape{L, group.rank() == bad_rank ? 4 : C, W});
  };
  auto no_width = [&] { conv_plan plan(exec(), group, cw::ShortConvShape{L, C, 0}); };
  if (group.size() > 1) {
    CTXPAR_TEST_ALL(group,
                    throws_everywhere(group, other_width, "agree on the conv width w", bad_rank));
    CTXPAR_TEST_ALL(
        group, throws_everywhere(group, other_channels, "agree on the channel count C", bad_rank));
  }
  CTXPAR_TEST_ALL(group, throws_everywhere(group, no_width, "shape.width", 0));
}

BOOST_AUTO_TEST_CASE(conv_plan_call_errors_on_one_rank) {
  const auto& group = world();
  const int bad_rank = group.size() - 1;
  const std::int64_t L = 6, C = 3, W = 3;
  conv_plan plan(exec(), group, cw::ShortConvShape{L, C, W, true, false});
  Kokkos::View<double**, Kokkos::LayoutRight, mem> x("x", L, C), y("y", L, C), w("w", C, W),
      dy("dy", L, C), dx("dx", L, C), dw("dw", C, W), longer("x", L + 1, C);
  Kokkos::View<double*, mem> b("b", C), db("db", C);
  Kokkos::View<std::int32_t*, mem> ids("ids", L);
  const Kokkos::View<const double*, mem> cb(b);
  const Kokkos::View<const std::int32_t*, mem> no_ids;
  conv_plan::saved_type filled;
  plan.forward(crows(x), crows(w), cb, no_ids, y, filled);
  const bool bad = group.rank() == bad_rank;
  // x with one token more than the plan's shape, on one rank.
  auto forward_longer_x = [&] {
    conv_plan::saved_type saved;
    plan.forward(crows(bad ? longer : x), crows(w), cb, no_ids, y, saved);
  };
  CTXPAR_TEST_ALL(group, throws_everywhere(group, forward_longer_x, "x must be [T, C]", bad_rank));
  // Sequence ids the shape does not have, on one rank.
  auto forward_ids = [&] {
    conv_plan::saved_type saved;
    plan.forward(crows(x), crows(w), cb, bad ? Kokkos::View<const std::int32_t*, mem>(ids) : no_ids,
                 y, saved);
  };
  CTXPAR_TEST_ALL(group,
                  throws_everywhere(group, forward_ids, "seq_ids must be [T] when", bad_rank));
  // No bias though the shape has one, on one rank.
  auto forward_no_bias = [&] {
    conv_plan::saved_type saved;
    plan.forward(crows(x), crows(w), bad ? Kokkos::View<const double*, mem>() : cb, no_ids, y,
                 saved);
  };
  CTXPAR_TEST_ALL(group, throws_everywhere(group, forward_no_bias, "bias must be [C]", bad_rank));
  // dweight of the wrong width, on one rank.
  Kokkos::View<double**, Kokkos::LayoutRight, mem> dw_narrow("dw", C, W - 1);
  auto backward_dweight = [&] { plan.backward(filled, crows(dy), dx, bad ? dw_narrow : dw, db); };
  CTXPAR_TEST_ALL(group,
                  throws_everywhere(group, backward_dweight, "dweight must be [C, w]", bad_rank));
  // A backward with a saved state no forward filled, on one rank.
  auto backward_unfilled = [&] {
    conv_plan::saved_type empty;
    plan.backward(bad ? empty : filled, crows(dy), dx, dw, db);
  };
  CTXPAR_TEST_ALL(group, throws_everywhere(group, backward_unfilled,
                                           "saved must come from a forward", bad_rank));
  // The plan still works after the refused calls (they refused before any data moved).
  plan.backward(filled, crows(dy), dx, dw, db);
}
