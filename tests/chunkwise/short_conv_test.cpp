// The short-convolution halo: sharded forward and backward against an fp64 oracle of the whole
// sequence (every rank, uneven shards, packed documents with boundaries at and next to rank
// borders, with and without bias), and the error for a shard shorter than w - 1 on one rank.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ctxpar/chunkwise/short_conv.hpp"
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

template <class Scalar>
bool check_conv(const std::vector<std::int64_t>& lengths, std::int64_t C, std::int64_t W,
                bool packed, bool with_bias, std::uint64_t seed) {
  const auto& group = world();
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
  const ctxpar::BalancedChunks split{T, group.size()};
  const std::int64_t begin = split.begin(group.rank()), L = split.size(group.rank());
  Kokkos::View<Scalar**, Kokkos::LayoutRight, mem> xl("x", L, C), dyl("dy", L, C), y("y", L, C),
      dx("dx", L, C), wv("w", C, W), dw("dw", C, W);
  Kokkos::View<Scalar*, mem> bv, db;
  Kokkos::View<std::int32_t*, mem> idv;
  for (std::int64_t t = 0; t < L; ++t) {
    for (std::int64_t c = 0; c < C; ++c) {
      xl(t, c) = static_cast<Scalar>(x[static_cast<std::size_t>((begin + t) * C + c)]);
      dyl(t, c) = static_cast<Scalar>(dy[static_cast<std::size_t>((begin + t) * C + c)]);
    }
  }
  for (std::int64_t i = 0; i < C * W; ++i)
    wv.data()[i] = static_cast<Scalar>(w[static_cast<std::size_t>(i)]);
  if (with_bias) {
    bv = Kokkos::View<Scalar*, mem>("b", C);
    db = Kokkos::View<Scalar*, mem>("db", C);
    for (std::int64_t c = 0; c < C; ++c)
      bv(c) = static_cast<Scalar>(b[static_cast<std::size_t>(c)]);
  }
  if (packed) {
    idv = Kokkos::View<std::int32_t*, mem>("ids", L);
    for (std::int64_t t = 0; t < L; ++t) idv(t) = ids[static_cast<std::size_t>(begin + t)];
  }
  cw::short_conv_forward(exec(), group, Kokkos::View<const Scalar**, Kokkos::LayoutRight, mem>(xl),
                         Kokkos::View<const Scalar**, Kokkos::LayoutRight, mem>(wv),
                         Kokkos::View<const Scalar*, mem>(bv),
                         Kokkos::View<const std::int32_t*, mem>(idv), y);
  cw::short_conv_backward(exec(), group, Kokkos::View<const Scalar**, Kokkos::LayoutRight, mem>(xl),
                          Kokkos::View<const Scalar**, Kokkos::LayoutRight, mem>(wv),
                          Kokkos::View<const std::int32_t*, mem>(idv),
                          Kokkos::View<const Scalar**, Kokkos::LayoutRight, mem>(dyl), dx, dw, db);
  exec().fence();
  const double u = unit_roundoff<Scalar>();
  const double k_local = W + 1,
               k_sum = static_cast<double>(T) + 2.0 * group.size();  // longest sums
  auto where = [](std::int64_t i) { return "flat index " + std::to_string(i); };
  const std::size_t off = static_cast<std::size_t>(begin * C);
  bool ok = all_close(
      "conv y", L * C, [&](std::int64_t i) { return y.data()[i]; },
      [&](std::int64_t i) { return o.y[off + static_cast<std::size_t>(i)]; },
      [&](std::int64_t i) {
        return k_local * u * o.y_mag[off + static_cast<std::size_t>(i)] + 1e-300;
      },
      where);
  ok = all_close(
           "conv dx", L * C, [&](std::int64_t i) { return dx.data()[i]; },
           [&](std::int64_t i) { return o.dx[off + static_cast<std::size_t>(i)]; },
           [&](std::int64_t i) {
             return k_local * u * o.dx_mag[off + static_cast<std::size_t>(i)] + 1e-300;
           },
           where) &&
       ok;
  ok = all_close(
           "conv dweight", C * W, [&](std::int64_t i) { return dw.data()[i]; },
           [&](std::int64_t i) { return o.dw[static_cast<std::size_t>(i)]; },
           [&](std::int64_t i) {
             return k_sum * u * o.dw_mag[static_cast<std::size_t>(i)] + 1e-300;
           },
           where) &&
       ok;
  if (with_bias) {
    ok = all_close(
             "conv dbias", C, [&](std::int64_t i) { return db.data()[i]; },
             [&](std::int64_t i) { return o.db[static_cast<std::size_t>(i)]; },
             [&](std::int64_t i) {
               return k_sum * u * o.db_mag[static_cast<std::size_t>(i)] + 1e-300;
             },
             where) &&
         ok;
  }
  return ok;
}

}  // namespace

BOOST_AUTO_TEST_CASE(conv_halo_matches_whole_sequence_oracle) {
  const auto& group = world();
  const int p = group.size();
  const std::int64_t W = 4, L = 6;
  // One sequence, uneven shards (the last is shorter).
  CTXPAR_TEST_ALL(group, check_conv<double>({L * p - 2}, 5, W, false, true, 1));
  CTXPAR_TEST_ALL(group, check_conv<float>({L * p - 2}, 5, W, false, false, 2));
  // Packed: documents ending on, just before and just after rank borders.
  std::vector<std::int64_t> cuts{0};
  for (int r = 1; r < p; ++r) cuts.push_back(r * L + (r % 3) - 1);  // before, on, after border r
  cuts.push_back(L * p);
  std::vector<std::int64_t> docs;
  for (std::size_t i = 1; i < cuts.size(); ++i) docs.push_back(cuts[i] - cuts[i - 1]);
  CTXPAR_TEST_ALL(group, check_conv<double>(docs, 3, W, true, true, 3));
  CTXPAR_TEST_ALL(group, check_conv<float>(docs, 3, W, true, false, 4));
  // Width 1: no halo at all.
  CTXPAR_TEST_ALL(group, check_conv<double>({3 * p}, 2, 1, false, true, 5));
}

BOOST_AUTO_TEST_CASE(conv_shard_shorter_than_halo_on_one_rank) {
  const auto& group = world();
  if (group.size() == 1) return;  // the last shard never sends a halo: a lone rank cannot fail
  const int bad_rank = 0;
  auto f = [&] {
    const std::int64_t L = group.rank() == bad_rank ? 2 : 6, C = 2, W = 4;
    Kokkos::View<double**, Kokkos::LayoutRight, mem> x("x", L, C), y("y", L, C), w("w", C, W);
    cw::short_conv_forward(exec(), group, Kokkos::View<const double**, Kokkos::LayoutRight, mem>(x),
                           Kokkos::View<const double**, Kokkos::LayoutRight, mem>(w),
                           Kokkos::View<const double*, mem>(),
                           Kokkos::View<const std::int32_t*, mem>(), y);
  };
  CTXPAR_TEST_ALL(group, throws_everywhere(group, f, "at least w - 1 tokens", bad_rank));
}
