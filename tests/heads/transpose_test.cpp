// The head transposes: forward equals a gather-then-slice oracle, the round trip is the identity
// bit for bit, the adjoint sums repeated key groups, and the all-to-all bytes equal the formula —
// for even and uneven heads, contiguous and zigzag token order, dense and packed sequences.
#include <cstring>
#include <type_traits>

#include "ctxpar/comm/allgather.hpp"
#include "ctxpar/heads/transpose_plan.hpp"
#include "ctxpar_test/harness.hpp"
#include "oracle.hpp"

namespace {

using ctxpar::test::world;
namespace ch = ctxpar::heads;

// The transpose is a linear map: it follows the plan contract with no saved state.
using zigzag_plan =
    ch::TransposePlan<ch::UnevenHeads, ch::ZigzagPerSequence, Kokkos::DefaultExecutionSpace, float>;
static_assert(ctxpar::follows_plan_contract<zigzag_plan>);
static_assert(std::is_same_v<zigzag_plan::saved_type, ctxpar::NoSavedState>);

struct Case {
  std::string name;
  ch::ChannelLayout layout;
  std::int64_t tokens;
  std::vector<std::int64_t> cu;                                     // empty: dense
  std::function<std::vector<std::int64_t>(int, bool)> channels_of;  // rank, uneven → P=1 channels
  bool repeats;
};

std::vector<Case> cases(int p) {
  std::vector<Case> out;
  const int hd = 3;
  out.push_back({"heads_only",
                 ch::ChannelLayout::heads_only(2 * p, hd),
                 6 * p,
                 {},
                 [=](int j, bool uneven) {
                   const auto [b, e] = heads_test::head_range(2 * p, p, j, uneven);
                   std::vector<std::int64_t> c;
                   for (std::int64_t x = b * hd; x < e * hd; ++x) c.push_back(x);
                   return c;
                 },
                 false});
  for (int m : {1, 2, 3}) {
    for (int g : {1, p, 2 * p}) {
      ch::GdpShape s{4 * p, 2, g, 3, m, 4};
      out.push_back({"gdp_M" + std::to_string(m) + "_G" + std::to_string(g),
                     s.input_layout(),
                     4 * p,
                     {0, 2 * p, 2 * p, 4 * p},
                     [=](int j, bool uneven) {
                       return heads_test::gdp_channels(s.nheads, s.headdim, g, s.d_state, m, p, j,
                                                       uneven);
                     },
                     g < p});
    }
  }
  return out;
}

template <class Exec, class Scalar, class HeadPolicy, class TokenOrder>
bool check(const Case& c, std::uint64_t seed) {
  const auto& group = world();
  const int p = group.size(), me = group.rank();
  constexpr bool uneven = std::is_same_v<HeadPolicy, ch::UnevenHeads>;
  constexpr bool zigzag = std::is_same_v<TokenOrder, ch::ZigzagPerSequence>;
  using mem = typename Exec::memory_space;
  using plan_type = ch::TransposePlan<HeadPolicy, TokenOrder, Exec, Scalar>;
  plan_type plan(Exec(), group, c.layout, c.tokens, c.cu);
  const std::int64_t t_total = c.tokens, ch_all = c.layout.channels();
  bool ok = true;

  // Row ranges of the shards, written independently of the plan.
  const std::int64_t chunk = (!uneven || zigzag) ? t_total / p : (t_total + p - 1) / p;
  auto row_begin = [&](int i) { return std::min<std::int64_t>(chunk * i, t_total); };
  const std::int64_t rows = (me + 1 == p ? t_total : row_begin(me + 1)) - row_begin(me);
  ok = ok && plan.local_rows() == rows;

  // Natural token of every sequence-parallel position.
  const auto cu = c.cu.empty() ? std::vector<std::int64_t>{0, t_total} : c.cu;
  const auto pos = heads_test::shard_position(t_total, p, zigzag, cu);
  std::vector<std::int64_t> natural_of(t_total);
  for (std::int64_t x = 0; x < t_total; ++x) natural_of[pos[x]] = x;
  auto value = [&](std::int64_t n, std::int64_t ch) {
    return static_cast<Scalar>(ctxpar::test::uniform(seed, n * ch_all + ch));
  };

  Kokkos::View<Scalar**, Kokkos::LayoutRight, mem> x("x", rows, ch_all), back("back", rows, ch_all);
  auto xh = Kokkos::create_mirror_view(x);
  for (std::int64_t t = 0; t < rows; ++t)
    for (std::int64_t k = 0; k < ch_all; ++k) xh(t, k) = value(natural_of[row_begin(me) + t], k);
  Kokkos::deep_copy(x, xh);

  // Gather-then-slice oracle: all shards gathered, reordered, sliced to this rank's channels.
  Kokkos::View<Scalar*, Kokkos::HostSpace> all("all", t_total * ch_all);
  std::vector<int> counts(p);
  for (int i = 0; i < p; ++i)
    counts[i] = int(((i + 1 == p ? t_total : row_begin(i + 1)) - row_begin(i)) * ch_all);
  Kokkos::View<Scalar*, Kokkos::HostSpace> mine(xh.data(), rows * ch_all);
  ctxpar::allgatherv(Kokkos::DefaultHostExecutionSpace(), group, mine, all, counts);
  const auto chans = c.channels_of(me, uneven);
  ok = ok && plan.local_channels() == static_cast<std::int64_t>(chans.size());

  Kokkos::View<Scalar**, Kokkos::LayoutRight, mem> y("y", t_total, plan.local_channels());
  group.reset_traffic();
  plan.to_head_parallel(x, y);
  const auto traffic = group.traffic(ctxpar::CollectiveKind::alltoall);
  auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  for (std::int64_t n = 0; n < t_total && ok; ++n)
    for (std::size_t k = 0; k < chans.size(); ++k) {
      const Scalar expected = all(pos[n] * ch_all + chans[k]);
      if (std::memcmp(&expected, &yh(n, k), sizeof(Scalar)) != 0) {
        std::cerr << "[rank " << me << "] " << c.name << " y(" << n << "," << k
                  << ") = " << yh(n, k) << ", expected " << expected << "\n";
        ok = false;
        break;
      }
    }

  // Bytes: every other rank's block, rows · C_j each; without repeats (P−1)/P · T/P · C.
  std::int64_t others = 0;
  for (int j = 0; j < p; ++j)
    if (j != me) others += static_cast<std::int64_t>(c.channels_of(j, uneven).size());
  const std::int64_t bytes = rows * others * std::int64_t(sizeof(Scalar));
  // One all-to-all per transpose; a group of one has nobody to exchange with and calls none.
  ok = ok && traffic.calls == (p > 1 ? 1 : 0) && traffic.bytes_sent == bytes &&
       plan.bytes_per_transpose() == bytes;
  if (!uneven && !c.repeats)
    ok = ok && bytes * p * p == (p - 1) * t_total * ch_all * std::int64_t(sizeof(Scalar));
  if (!ok)
    std::cerr << "[rank " << me << "] " << c.name << " bytes " << traffic.bytes_sent << " vs "
              << bytes << "\n";

  // Round trip: bit for bit.
  plan.to_sequence_parallel(y, back);
  auto bh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), back);
  ok = ok && std::memcmp(bh.data(), xh.data(), sizeof(Scalar) * rows * ch_all) == 0;

  // Adjoint: dx(t, c) = Σ over ranks j and their copies of c of dy_j(natural(t), c').
  auto dy_value = [&](int j, std::int64_t n, std::int64_t k) {
    return static_cast<Scalar>(ctxpar::test::uniform(seed + 1 + j, n * 1000 + k));
  };
  auto dyh = Kokkos::create_mirror_view(y);
  for (std::int64_t n = 0; n < t_total; ++n)
    for (std::size_t k = 0; k < chans.size(); ++k) dyh(n, k) = dy_value(me, n, k);
  Kokkos::deep_copy(y, dyh);
  plan.adjoint_to_head_parallel(y, back);
  Kokkos::deep_copy(bh, back);
  std::vector<double> expected(rows * ch_all, 0.0), magnitude(rows * ch_all, 0.0);
  for (int j = 0; j < p; ++j) {
    const auto cj = c.channels_of(j, uneven);
    for (std::int64_t t = 0; t < rows; ++t)
      for (std::size_t k = 0; k < cj.size(); ++k) {
        const double v = dy_value(j, natural_of[row_begin(me) + t], k);
        expected[t * ch_all + cj[k]] += v;
        magnitude[t * ch_all + cj[k]] += std::fabs(v);
      }
  }
  ok = ok &&
       ctxpar::test::all_close(
           c.name + " adjoint", rows * ch_all, [&](std::int64_t i) { return bh.data()[i]; },
           [&](std::int64_t i) { return expected[i]; },
           [&](std::int64_t i) { return p * ctxpar::test::unit_roundoff<Scalar>() * magnitude[i]; },
           [&](std::int64_t i) {
             return std::to_string(i / ch_all) + "," + std::to_string(i % ch_all);
           });
  return ok;
}

template <class Exec, class Scalar, class HeadPolicy, class TokenOrder>
void run_all(bool packed_too) {
  const auto& group = world();
  std::uint64_t seed = 11;
  for (Case c : cases(group.size())) {
    std::vector<Case> variants{c};
    variants[0].cu.clear();
    if (packed_too && !c.cu.empty()) variants.push_back(c);
    for (const Case& v : variants) {
      if (std::is_same_v<HeadPolicy, ch::UnevenHeads> &&
          std::is_same_v<TokenOrder, ch::Contiguous> && v.cu.empty())
        const_cast<Case&>(v).tokens =
            5 * group.size() + (group.size() > 1 ? 1 : 0);  // uneven token shards
      BOOST_TEST_CONTEXT(v.name << (v.cu.empty() ? " dense" : " packed") << " T=" << v.tokens) {
        CTXPAR_TEST_ALL(group, (check<Exec, Scalar, HeadPolicy, TokenOrder>(v, seed++)));
      }
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(even_contiguous, Exec, ctxpar::test::execution_spaces) {
  run_all<Exec, double, ch::EvenHeads, ch::Contiguous>(true);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(even_zigzag, Exec, ctxpar::test::execution_spaces) {
  run_all<Exec, double, ch::EvenHeads, ch::ZigzagPerSequence>(true);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(uneven_contiguous, Exec, ctxpar::test::execution_spaces) {
  run_all<Exec, float, ch::UnevenHeads, ch::Contiguous>(true);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(uneven_zigzag, Exec, ctxpar::test::execution_spaces) {
  run_all<Exec, float, ch::UnevenHeads, ch::ZigzagPerSequence>(true);
}

// Uneven head counts: nheads = 2P + 1 (and fewer heads than ranks) under UnevenHeads.
BOOST_AUTO_TEST_CASE(uneven_head_counts) {
  const auto& group = world();
  const int p = group.size();
  for (int h : {2 * p + 1, std::max(1, p - 1)}) {
    ch::GdpShape s{h, 2, 1, 3, 2, 4};
    Case c{
        "gdp_H" + std::to_string(h),
        s.input_layout(),
        4 * p,
        {},
        [=](int j, bool uneven) { return heads_test::gdp_channels(h, 2, 1, 3, 2, p, j, uneven); },
        p > 1};
    CTXPAR_TEST_ALL(
        group,
        (check<Kokkos::DefaultHostExecutionSpace, double, ch::UnevenHeads, ch::ZigzagPerSequence>(
            c, 99)));
    c.tokens = 3 * p + 2;
    CTXPAR_TEST_ALL(
        group,
        (check<Kokkos::DefaultHostExecutionSpace, double, ch::UnevenHeads, ch::Contiguous>(c, 98)));
  }
}
