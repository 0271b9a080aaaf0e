// The summary algebra and what the driver sends: associativity of composition, structured ==
// dense composition on the same inputs, summary bytes per rank equal to the formula of each
// structure and policy, packed-sequence isolation (bit-identical other documents, exactly zero
// gradients outside the document), and the metadata worked example of docs/chunkwise.md §3 end
// to end.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "chunkwise/chunkwise_test_support.hpp"
#include "chunkwise/decay_oracle.hpp"
#include "ctxpar/chunkwise/compose.hpp"
#include "expr/expr_test_support.hpp"

namespace cwt = ctxpar::test::chunkwise;
namespace cw = ctxpar::chunkwise;
using ctxpar::test::uniform;
using ctxpar::test::unit_roundoff;
using ctxpar::test::world;

namespace {

using exec = Kokkos::DefaultHostExecutionSpace;
using mem = exec::memory_space;
constexpr std::int64_t H = 2, K = 5, V = 3;

// A random summary of structure T; transitions near 1 so compositions stay O(1).
template <class T>
cw::SummaryStore<T, mem> random_summary(std::uint64_t seed) {
  cw::SummaryStore<T, mem> s(cw::SummaryForm::packed, 1, H, K, V);
  auto p = s.packed();
  for (std::int64_t h = 0; h < H; ++h) {
    for (std::int64_t j = 0; j < K * V + T::m_size(K); ++j) {
      const double x = uniform(seed, static_cast<std::uint64_t>(h * 1000 + j));
      p(0, h, j) = static_cast<float>(
          j < K * V ? x : (std::is_same_v<T, cw::DenseTransition> ? 0.4 * x : 0.9 + 0.1 * x));
    }
  }
  return s;
}

// The dense form of a structured summary.
template <class T>
cw::SummaryStore<cw::DenseTransition, mem> to_dense(const cw::SummaryStore<T, mem>& s) {
  cw::SummaryStore<cw::DenseTransition, mem> d(cw::SummaryForm::packed, 1, H, K, V);
  for (std::int64_t h = 0; h < H; ++h) {
    for (std::int64_t j = 0; j < K * V; ++j) d.packed()(0, h, j) = s.packed()(0, h, j);
    for (std::int64_t a = 0; a < K; ++a) {
      for (std::int64_t b = 0; b < K; ++b) {
        float m = 0;
        if (a == b) {
          if constexpr (std::is_same_v<T, cw::IdentityTransition>) m = 1;
          if constexpr (std::is_same_v<T, cw::ScalarTransition>) m = s.packed()(0, h, K * V);
          if constexpr (std::is_same_v<T, cw::DiagonalTransition>) m = s.packed()(0, h, K * V + a);
        }
        d.packed()(0, h, K * V + a * K + b) = m;
      }
    }
  }
  return d;
}

template <class T>
cw::SummaryStore<T, mem> compose(const cw::SummaryStore<T, mem>& later,
                                 const cw::SummaryStore<T, mem>& earlier) {
  cw::SummaryStore<T, mem> out(cw::SummaryForm::packed, 1, H, K, V);
  cw::compose_summaries<T>(exec(), later[0], earlier[0], out[0], K, V);
  exec().fence();
  return out;
}

// Magnitude of the composition of three summaries, for the bound: (|M3||M2|+...) done with abs.
template <class T>
bool check_associativity(std::uint64_t seed) {
  const auto a = random_summary<T>(seed), b = random_summary<T>(seed + 1),
             c = random_summary<T>(seed + 2);
  const auto left = compose<T>(compose<T>(c, b), a);
  const auto right = compose<T>(c, compose<T>(b, a));
  // Each entry is a sum of at most 3·K products of three factors of magnitude <= 1 (plus the d
  // terms): bound (2K + 4)·u·(sum of magnitudes) with magnitudes <= 3K + 3.
  const double bound = (2.0 * K + 4.0) * unit_roundoff<float>() * (3.0 * K + 3.0);
  bool ok = true;
  const std::int64_t width = K * V + T::m_size(K);
  for (std::int64_t h = 0; h < H; ++h) {
    ok = ctxpar::test::all_close(
             std::string("associativity ") + T::name, width,
             [&](std::int64_t j) { return left.packed()(0, h, j); },
             [&](std::int64_t j) { return right.packed()(0, h, j); },
             [&](std::int64_t) { return bound; },
             [&](std::int64_t j) {
               return "head " + std::to_string(h) + " entry " + std::to_string(j);
             }) &&
         ok;
  }
  // And the composed map applied to a state equals applying the three in order.
  return ok;
}

template <class T>
bool check_structured_equals_dense(std::uint64_t seed) {
  const auto a = random_summary<T>(seed), b = random_summary<T>(seed + 7);
  const auto structured = to_dense<T>(compose<T>(b, a));
  const auto dense = compose<cw::DenseTransition>(to_dense<T>(b), to_dense<T>(a));
  // The dense product adds exact zeros to the structured one: at most one rounding apart.
  const double bound = 2.0 * unit_roundoff<float>() * 4.0;
  bool ok = true;
  for (std::int64_t h = 0; h < H; ++h) {
    ok = ctxpar::test::all_close(
             std::string("structured vs dense ") + T::name, K * V + K * K,
             [&](std::int64_t j) { return structured.packed()(0, h, j); },
             [&](std::int64_t j) { return dense.packed()(0, h, j); },
             [&](std::int64_t) { return bound; },
             [&](std::int64_t j) {
               return "head " + std::to_string(h) + " entry " + std::to_string(j);
             }) &&
         ok;
  }
  return ok;
}

// The named functor the composition used before it moved to the expression layer (verbatim
// arithmetic, element for element), kept here as the reference for bitwise equality: the CP
// tests' GatherFold == ScanCompose comparisons and every recorded result depend on it.
template <class T>
struct PreviousComposeKernel {
  Kokkos::View<const float**, Kokkos::LayoutStride, mem> later_d, later_m, earlier_d, earlier_m;
  Kokkos::View<float**, Kokkos::LayoutStride, mem> out_d, out_m;
  std::int64_t k, v, width;
  void operator()(std::int64_t i) const {
    const std::int64_t h = i / width, e = i % width, kv = k * v;
    if (e < kv) {
      const std::int64_t row = e / v, col = e % v;
      float acc = later_d(h, e);
      if constexpr (std::is_same_v<T, cw::IdentityTransition>) {
        acc += earlier_d(h, e);
      } else if constexpr (std::is_same_v<T, cw::ScalarTransition>) {
        acc += later_m(h, 0) * earlier_d(h, e);
      } else if constexpr (std::is_same_v<T, cw::DiagonalTransition>) {
        acc += later_m(h, row) * earlier_d(h, e);
      } else {
        for (std::int64_t l = 0; l < k; ++l)
          acc += later_m(h, row * k + l) * earlier_d(h, l * v + col);
      }
      out_d(h, e) = acc;
    } else {
      const std::int64_t j = e - kv;
      if constexpr (std::is_same_v<T, cw::DenseTransition>) {
        const std::int64_t a = j / k, b = j % k;
        float acc = 0;
        for (std::int64_t l = 0; l < k; ++l) acc += later_m(h, a * k + l) * earlier_m(h, l * k + b);
        out_m(h, j) = acc;
      } else if constexpr (!std::is_same_v<T, cw::IdentityTransition>) {
        out_m(h, j) = later_m(h, j) * earlier_m(h, j);
      }
    }
  }
};

template <class T>
cw::SummaryStore<T, mem> previous_compose(const cw::SummaryStore<T, mem>& later,
                                          const cw::SummaryStore<T, mem>& earlier) {
  cw::SummaryStore<T, mem> out(cw::SummaryForm::packed, 1, H, K, V);
  const std::int64_t width = K * V + T::m_size(K);
  Kokkos::parallel_for(Kokkos::RangePolicy<exec, Kokkos::IndexType<std::int64_t>>(0, H * width),
                       PreviousComposeKernel<T>{later[0].state, later[0].transition,
                                                earlier[0].state, earlier[0].transition,
                                                out[0].state, out[0].transition, K, V, width});
  exec().fence();
  return out;
}

// The same summary in unpacked storage (strided parts become two contiguous buffers).
template <class T>
cw::SummaryStore<T, mem> unpacked(const cw::SummaryStore<T, mem>& s) {
  cw::SummaryStore<T, mem> u(cw::SummaryForm::unpacked, 1, H, K, V);
  for (std::int64_t h = 0; h < H; ++h) {
    for (std::int64_t j = 0; j < K * V; ++j) u.states()(0, h, j) = s.packed()(0, h, j);
    for (std::int64_t j = 0; j < T::m_size(K); ++j)
      u.transitions()(0, h, j) = s.packed()(0, h, K * V + j);
  }
  return u;
}

// Composition and application through the expression layer are bitwise what the named functor
// gave, in packed and unpacked storage (the unpacked result read back in packed order).
template <class T>
bool check_bitwise_as_before(std::uint64_t seed) {
  const auto a = random_summary<T>(seed), b = random_summary<T>(seed + 3);
  const auto expected = previous_compose<T>(b, a);
  const auto packed = compose<T>(b, a);
  cw::SummaryStore<T, mem> split(cw::SummaryForm::unpacked, 1, H, K, V);
  cw::compose_summaries<T>(exec(), unpacked<T>(b)[0], unpacked<T>(a)[0], split[0], K, V);
  // Application: the state part of the composition with earlier = (anything, a's state).
  cw::SummaryStore<T, mem> applied(cw::SummaryForm::packed, 1, H, K, V);
  cw::apply_summary<T>(exec(), b[0], a[0].state, applied[0].state, K, V);
  exec().fence();
  bool ok = true;
  for (std::int64_t h = 0; h < H; ++h) {
    for (std::int64_t j = 0; j < K * V + T::m_size(K); ++j) {
      const float want = expected.packed()(0, h, j), got = packed.packed()(0, h, j);
      const float got_split =
          j < K * V ? split.states()(0, h, j) : split.transitions()(0, h, j - K * V);
      const bool same =
          want == got && want == got_split && (j >= K * V || applied.packed()(0, h, j) == want);
      if (!same) {
        BOOST_TEST_MESSAGE("bitwise " << T::name << " head " << h << " entry " << j << ": functor "
                                      << want << ", packed " << got << ", unpacked " << got_split);
      }
      ok = ok && same;
    }
  }
  return ok;
}

// compose(b, a) against the fp64 product of the dense forms, within the error bound of a length-K
// dot product accumulated onto d: (K + 1)·u·(Σ_l |M_il||x_lj| + |d_ij|).
template <class T>
bool check_against_fp64(std::uint64_t seed) {
  const auto a = random_summary<T>(seed), b = random_summary<T>(seed + 5);
  auto dense = [](const cw::SummaryStore<T, mem>& s) {
    if constexpr (std::is_same_v<T, cw::DenseTransition>) {
      return s;
    } else {
      return to_dense<T>(s);
    }
  };
  const auto got = dense(compose<T>(b, a));
  const auto da = dense(a), db = dense(b);
  const double u = unit_roundoff<float>();
  bool ok = true;
  for (std::int64_t h = 0; h < H; ++h) {
    auto p = [&](const cw::SummaryStore<cw::DenseTransition, mem>& s, std::int64_t j) {
      return static_cast<double>(s.packed()(0, h, j));
    };
    auto m = [&](const cw::SummaryStore<cw::DenseTransition, mem>& s, std::int64_t r,
                 std::int64_t c) { return p(s, K * V + r * K + c); };
    // Entry j of (M_b·M_a, M_b·d_a + d_b) and its magnitude.
    auto entry = [&](std::int64_t j, bool magnitude) {
      double acc = 0;
      if (j < K * V) {
        const std::int64_t r = j / V, c = j % V;
        acc = magnitude ? std::abs(p(db, j)) : p(db, j);
        for (std::int64_t l = 0; l < K; ++l) {
          const double t = m(db, r, l) * p(da, l * V + c);
          acc += magnitude ? std::abs(t) : t;
        }
      } else {
        const std::int64_t r = (j - K * V) / K, c = (j - K * V) % K;
        for (std::int64_t l = 0; l < K; ++l) {
          const double t = m(db, r, l) * m(da, l, c);
          acc += magnitude ? std::abs(t) : t;
        }
      }
      return acc;
    };
    ok = ctxpar::test::all_close(
             std::string("composition vs fp64 ") + T::name, K * V + K * K,
             [&](std::int64_t j) { return got.packed()(0, h, j); },
             [&](std::int64_t j) { return entry(j, false); },
             [&](std::int64_t j) { return (K + 1.0) * u * entry(j, true); },
             [&](std::int64_t j) {
               return "head " + std::to_string(h) + " entry " + std::to_string(j);
             }) &&
         ok;
  }
  return ok;
}

// A dense composition whose output aliases an input is refused before the launch (its products
// read whole rows of the input), instead of reading half-written rows.
bool dense_aliasing_is_refused() {
  const auto a = random_summary<cw::DenseTransition>(31),
             b = random_summary<cw::DenseTransition>(32);
  try {
    cw::compose_summaries<cw::DenseTransition>(exec(), b[0], a[0], a[0], K, V);
  } catch (const ctxpar::Error& e) {
    return std::string(e.what()).find("ctxpar::assign") != std::string::npos;
  }
  return false;
}

// Kernels per composition step and form, with the results of every form bitwise those of the
// packed out-of-place composition: packed records (and the driver's scan records) are written by
// one kernel; unpacked outputs by two (one per part; the identity has no transition part). In
// place as `earlier` stays one kernel; in place as `later` (unpacked) is two, state first.
template <class T>
bool check_kernels_per_step(std::uint64_t seed) {
  using ctxpar::test::expr::kernels_launched_by;
  constexpr bool identity = std::is_same_v<T, cw::IdentityTransition>;
  const std::int64_t width = K * V + T::m_size(K);
  const auto a = random_summary<T>(seed), b = random_summary<T>(seed + 1);
  cw::SummaryStore<T, mem> packed(cw::SummaryForm::packed, 1, H, K, V);
  const int packed_kernels =
      kernels_launched_by([&] { cw::compose_summaries<T>(exec(), b[0], a[0], packed[0], K, V); });
  cw::SummaryStore<T, mem> split(cw::SummaryForm::unpacked, 1, H, K, V);
  const auto ua = unpacked<T>(a), ub = unpacked<T>(b);
  const int split_kernels =
      kernels_launched_by([&] { cw::compose_summaries<T>(exec(), ub[0], ua[0], split[0], K, V); });
  // A scan record as the driver lays it out: [H, K·V + m] in one flat buffer.
  Kokkos::View<float*, mem> flat("flat", H * width);
  const auto rec = cw::impl::record_views<mem>(flat.data(), H, K * V, T::m_size(K));
  const int record_kernels =
      kernels_launched_by([&] { cw::compose_summaries<T>(exec(), b[0], a[0], rec, K, V); });
  bool ok = packed_kernels == 1 && split_kernels == (identity ? 1 : 2) && record_kernels == 1;
  // In place: out == earlier, and (not dense) out == later.
  auto in_earlier = random_summary<T>(seed);
  const int earlier_kernels = std::is_same_v<T, cw::DenseTransition> ? 1 : kernels_launched_by([&] {
    cw::compose_summaries<T>(exec(), b[0], in_earlier[0], in_earlier[0], K, V);
  });
  // In place as `later` needs the unpacked form (in a packed record with several heads, M_later
  // lies inside the span of the state part being written).
  auto in_later = unpacked<T>(random_summary<T>(seed + 1));
  const int later_kernels = std::is_same_v<T, cw::DenseTransition> ? 2 : kernels_launched_by([&] {
    cw::compose_summaries<T>(exec(), in_later[0], ua[0], in_later[0], K, V);
  });
  ok = ok && earlier_kernels == 1 && later_kernels == (identity ? 1 : 2);
  if (!ok) {
    BOOST_TEST_MESSAGE("kernels " << T::name << ": packed " << packed_kernels << ", unpacked "
                                  << split_kernels << ", scan record " << record_kernels
                                  << ", in place (earlier) " << earlier_kernels
                                  << ", in place (later) " << later_kernels);
  }
  for (std::int64_t h = 0; h < H; ++h) {
    for (std::int64_t j = 0; j < width; ++j) {
      const float want = packed.packed()(0, h, j);
      const float got_split =
          j < K * V ? split.states()(0, h, j) : split.transitions()(0, h, j - K * V);
      bool same = got_split == want && flat(h * width + j) == want;
      if constexpr (!std::is_same_v<T, cw::DenseTransition>) {
        const float got_later =
            j < K * V ? in_later.states()(0, h, j) : in_later.transitions()(0, h, j - K * V);
        same = same && in_earlier.packed()(0, h, j) == want && got_later == want;
      }
      if (!same) BOOST_TEST_MESSAGE("forms differ: " << T::name << " head " << h << " entry " << j);
      ok = ok && same;
    }
  }
  return ok;
}

}  // namespace

BOOST_AUTO_TEST_CASE(composition_is_associative) {
  const auto& group = world();
  CTXPAR_TEST_ALL(group, check_associativity<cw::IdentityTransition>(1));
  CTXPAR_TEST_ALL(group, check_associativity<cw::ScalarTransition>(2));
  CTXPAR_TEST_ALL(group, check_associativity<cw::DiagonalTransition>(3));
  CTXPAR_TEST_ALL(group, check_associativity<cw::DenseTransition>(4));
}

BOOST_AUTO_TEST_CASE(structured_composition_equals_dense) {
  const auto& group = world();
  CTXPAR_TEST_ALL(group, check_structured_equals_dense<cw::IdentityTransition>(5));
  CTXPAR_TEST_ALL(group, check_structured_equals_dense<cw::ScalarTransition>(6));
  CTXPAR_TEST_ALL(group, check_structured_equals_dense<cw::DiagonalTransition>(7));
}

BOOST_AUTO_TEST_CASE(m_sizes_per_structure) {
  const auto& group = world();
  CTXPAR_TEST_ALL(
      group, cw::IdentityTransition::m_size(7) == 0 && cw::ScalarTransition::m_size(7) == 1 &&
                 cw::DiagonalTransition::m_size(7) == 7 && cw::DenseTransition::m_size(7) == 49);
}

namespace {

// Bytes each rank sends in one forward (and one backward) under GatherFold: one record of
// H·(K·V + m) floats per virtual shard, to each of the P-1 other ranks. Under ScanCompose: one
// record (H·(K·V + max(m, 1)) floats) per round in which the rank has a successor in scan order.
template <bool Diagonal>
bool check_bytes(cw::SummaryForm form, bool zigzag) {
  using adapter = cwt::DecayAdapter<float, mem, Diagonal>;
  using T = typename adapter::backend::transition_type;
  const auto& group = world();
  const int p = group.size();
  const auto prob = cwt::make_decay_problem(2, 6, 4, Diagonal, {0, 40}, 3, 8);
  cwt::CaseOptions o;
  o.chunk = 8;
  o.form = form;
  o.zigzag = zigzag;
  const std::int64_t record = prob.H * (prob.K * prob.V + T::m_size(prob.K)) * 4;
  const int slots = zigzag ? 2 : 1;
  group.reset_traffic();
  cwt::run_cp<adapter, cw::GatherFold>(group, prob, o);
  const auto& ag = group.traffic(ctxpar::CollectiveKind::allgather);
  const std::int64_t want = 2 * slots * record * (p - 1);  // forward + backward
  const int calls_per_direction = form == cw::SummaryForm::packed ? 1 : 2;
  bool ok =
      ag.bytes_sent == want && ag.bytes_received == want && ag.calls == 2 * calls_per_direction;
  if (!ok) {
    std::cerr << "[rank " << group.rank() << "] gather bytes sent " << ag.bytes_sent << " received "
              << ag.bytes_received << " calls " << ag.calls << ", formula " << want << " in "
              << 2 * calls_per_direction << " calls\n";
  }
  group.reset_traffic();
  cwt::run_cp<adapter, cw::ScanCompose>(group, prob, o);
  const auto& sc = group.traffic(ctxpar::CollectiveKind::scan);
  const std::int64_t scan_record =
      prob.H * (prob.K * prob.V + std::max<std::int64_t>(1, T::m_size(prob.K))) * 4;
  auto rounds_sent = [p](int position) {
    int n = 0;
    for (int d = 1; d < p; d <<= 1) n += position + d < p ? 1 : 0;
    return n;
  };
  const int r = group.rank();
  // Contiguous: forward scan (position r), backward reverse scan (position P-1-r). Zigzag: each
  // direction runs one forward-order and one reverse-order chain.
  const std::int64_t scan_want =
      scan_record * (zigzag ? 2 * (rounds_sent(r) + rounds_sent(p - 1 - r))
                            : rounds_sent(r) + rounds_sent(p - 1 - r));
  const bool scan_ok =
      sc.bytes_sent == scan_want && group.traffic(ctxpar::CollectiveKind::allgather).calls == 0;
  if (!scan_ok) {
    std::cerr << "[rank " << r << "] scan bytes sent " << sc.bytes_sent << ", formula " << scan_want
              << "\n";
  }
  return ok && scan_ok;
}

}  // namespace

BOOST_AUTO_TEST_CASE(summary_bytes_match_the_formula) {
  const auto& group = world();
  for (int zig = 0; zig < 2; ++zig) {
    CTXPAR_TEST_ALL(group, check_bytes<false>(cw::SummaryForm::packed, zig == 1));
    CTXPAR_TEST_ALL(group, check_bytes<false>(cw::SummaryForm::unpacked, zig == 1));
    CTXPAR_TEST_ALL(group, check_bytes<true>(cw::SummaryForm::packed, zig == 1));
    CTXPAR_TEST_ALL(group, check_bytes<true>(cw::SummaryForm::unpacked, zig == 1));
  }
}

namespace {

// Perturbing document `doc` changes nothing else bit for bit; with an output gradient supported
// on `doc` only, every gradient outside it is exactly zero.
template <bool Diagonal, class Policy>
bool check_isolation(bool zigzag) {
  using adapter = cwt::DecayAdapter<float, mem, Diagonal>;
  const auto& group = world();
  const std::vector<std::int64_t> cu = cwt::cu_from_lengths({13, 22, 9, 17});
  const int doc = 1;
  auto prob = cwt::make_decay_problem(2, 4, 3, Diagonal, cu, 21, 8);
  cwt::CaseOptions o;
  o.chunk = 8;
  o.zigzag = zigzag;
  std::vector<cwt::Range> rows;
  const cwt::Result base = cwt::run_cp<adapter, Policy>(group, prob, o, &rows);
  auto perturbed = prob;
  const std::int64_t b = cu[doc], e = cu[doc + 1];
  auto bump = [&](std::vector<double>& x, std::int64_t per) {
    for (std::int64_t i = b * per; i < e * per; ++i)
      x[static_cast<std::size_t>(i)] = 0.5 * x[static_cast<std::size_t>(i)] + 0.25;
  };
  bump(perturbed.q, prob.H * prob.K);
  bump(perturbed.k, prob.H * prob.K);
  bump(perturbed.v, prob.H * prob.V);
  for (std::int64_t i = b * prob.H * prob.G; i < e * prob.H * prob.G; ++i)
    perturbed.g[static_cast<std::size_t>(i)] *= 0.5;
  const cwt::Result moved = cwt::run_cp<adapter, Policy>(group, perturbed, o);
  bool ok = true;
  bool changed = false;
  const std::int64_t per = prob.H * prob.V;
  for (auto r : rows) {
    for (std::int64_t t = r.first; t < r.second; ++t) {
      for (std::int64_t j = 0; j < per; ++j) {
        const std::size_t i = static_cast<std::size_t>(t * per + j);
        const bool inside = t >= b && t < e;
        if (!inside && base.output[i] != moved.output[i]) {
          if (ok)
            std::cerr << "[rank " << group.rank() << "] output of token " << t << " changed\n";
          ok = false;
        }
        changed = changed || (inside && base.output[i] != moved.output[i]);
      }
    }
  }
  // Gradient isolation: output gradient only on the document.
  auto only_doc = prob;
  for (std::int64_t i = 0; i < prob.T * per; ++i) {
    const std::int64_t t = i / per;
    if (t < b || t >= e) only_doc.dout[static_cast<std::size_t>(i)] = 0.0;
  }
  const cwt::Result g = cwt::run_cp<adapter, Policy>(group, only_doc, o);
  bool nonzero_inside = false;
  for (const auto& a : g.grads) {
    const std::int64_t per_t = static_cast<std::int64_t>(a.values.size()) / prob.T;
    for (auto r : rows) {
      for (std::int64_t t = r.first; t < r.second; ++t) {
        for (std::int64_t j = 0; j < per_t; ++j) {
          const double x = a.values[static_cast<std::size_t>(t * per_t + j)];
          if ((t < b || t >= e) && x != 0.0) {
            if (ok)
              std::cerr << "[rank " << group.rank() << "] " << a.name << " of token " << t << " is "
                        << x << "\n";
            ok = false;
          }
          nonzero_inside = nonzero_inside || (t >= b && t < e && x != 0.0);
        }
      }
    }
  }
  // A test that cannot fail is no test: the perturbation and the gradient must show somewhere.
  int any = changed && nonzero_inside ? 1 : 0, some_rank = 0;
  MPI_Allreduce(&any, &some_rank, 1, MPI_INT, MPI_LOR, group.mpi_comm());
  if (some_rank == 0 && group.rank() == 0)
    std::cerr << "isolation test saw no effect inside the document\n";
  return ok && some_rank != 0;
}

}  // namespace

BOOST_AUTO_TEST_CASE(packed_documents_are_isolated) {
  const auto& group = world();
  for (int zig = 0; zig < 2; ++zig) {
    CTXPAR_TEST_ALL(group, (check_isolation<false, cw::GatherFold>(zig == 1)));
    CTXPAR_TEST_ALL(group, (check_isolation<false, cw::ScanCompose>(zig == 1)));
    CTXPAR_TEST_ALL(group, (check_isolation<true, cw::GatherFold>(zig == 1)));
    CTXPAR_TEST_ALL(group, (check_isolation<true, cw::ScanCompose>(zig == 1)));
  }
}

BOOST_AUTO_TEST_CASE(metadata_worked_example_end_to_end) {
  // docs/chunkwise.md §3: lengths [5, 4, 7], T = 16; the table is stated for P = 4.
  const auto& group = world();
  const std::vector<std::int64_t> cu = cwt::cu_from_lengths({5, 4, 7});
  const auto plan = cw::SequenceLayout::create(group, ctxpar::Contiguous{}, cu);
  if (group.size() == 4) {
    const int r = group.rank();
    const int want_start[] = {0, 0, 1, 2}, want_stop_minus_1[] = {1, 2, 3, 3};
    const std::vector<std::vector<std::int64_t>> want_cu = {{0, 4}, {0, 1, 4}, {0, 1, 4}, {0, 4}};
    const auto seqs = plan.local_sequences(r);
    bool ok = plan.preceding_start(r) == want_start[r] &&
              plan.following_stop(r) - 1 == want_stop_minus_1[r] &&
              seqs.cu_seqlens == want_cu[static_cast<std::size_t>(r)];
    // The same plan through the foundation's packed metadata.
    const auto meta = ctxpar::PackedMetadata::from_cu_seqlens(group, cu);
    const auto plan2 = cw::SequenceLayout::create(group, ctxpar::Contiguous{}, meta);
    ok = ok && plan2.preceding_start(r) == want_start[r] &&
         plan2.following_stop(r) - 1 == want_stop_minus_1[r] &&
         plan2.local_sequences(r).cu_seqlens == want_cu[static_cast<std::size_t>(r)];
    if (!ok)
      std::cerr << "[rank " << r << "] worked-example metadata differs from the design table\n";
    CTXPAR_TEST_ALL(group, ok);
  }
  // End to end at every P: CP == oracle, with initial states and final-state gradients.
  using adapter = cwt::DecayAdapter<double, mem, false>;
  const auto prob = cwt::make_decay_problem(2, 4, 3, false, cu, 31, 4);
  for (int zig = 0; zig < 2; ++zig) {
    cwt::CaseOptions o;
    o.chunk = 4;
    o.zigzag = zig == 1;
    o.initial_states = o.final_state_grads = true;
    std::vector<cwt::Range> rows;
    const auto got = cwt::run_cp<adapter, cw::GatherFold>(group, prob, o, &rows);
    const auto oracle = cwt::decay_oracle(prob, true, true, false).result;
    const auto bound =
        cwt::decay_bounds<double>(prob, true, true, group.size() * (o.zigzag ? 2 : 1));
    CTXPAR_TEST_ALL(group, cwt::check_against("worked example", got, oracle, bound, rows, prob.T));
  }
}

namespace {

// Streaming: three consecutive CP calls carrying the state (ht → h0 forward, dh0 → dht backward)
// equal one pass over the whole stream, on every rank.
template <class Policy>
bool check_streaming(bool zigzag) {
  using adapter = cwt::DecayAdapter<double, mem, true>;
  const auto& group = world();
  const std::int64_t T = 75, seg = 25;
  const auto full = cwt::make_decay_problem(2, 4, 3, true, {0, T}, 51, 8);
  const std::int64_t H = full.H, K = full.K, V = full.V, G = full.G;
  auto slice = [&](std::int64_t b) {
    cwt::DecayProblem p = full;
    p.T = seg;
    p.cu = {0, seg};
    auto cut = [&](std::vector<double>& x, const std::vector<double>& src, std::int64_t per) {
      x.assign(src.begin() + b * per, src.begin() + (b + seg) * per);
    };
    cut(p.q, full.q, H * K);
    cut(p.k, full.k, H * K);
    cut(p.v, full.v, H * V);
    cut(p.g, full.g, H * G);
    cut(p.dout, full.dout, H * V);
    p.h0.assign(static_cast<std::size_t>(H * K * V), 0.0);
    p.dht.assign(static_cast<std::size_t>(H * K * V), 0.0);
    return p;
  };
  cwt::CaseOptions o;
  o.chunk = 8;
  o.zigzag = zigzag;
  o.initial_states = o.final_state_grads = true;
  std::vector<cwt::DecayProblem> parts;
  for (std::int64_t b = 0; b < T; b += seg) parts.push_back(slice(b));
  for (std::size_t i = 1; i < parts.size(); ++i) {  // forward sweep: carry the final state
    parts[i].h0 = cwt::run_cp<adapter, Policy>(group, parts[i - 1], o).final_states;
  }
  cwt::Result streamed;
  streamed.output.assign(static_cast<std::size_t>(T * H * V), 0.0);
  for (const char* n : {"dq", "dk", "dv", "dg"}) streamed.grads.push_back({n, {}});
  streamed.grads[0].values.assign(static_cast<std::size_t>(T * H * K), 0.0);
  streamed.grads[1].values = streamed.grads[0].values;
  streamed.grads[2].values.assign(static_cast<std::size_t>(T * H * V), 0.0);
  streamed.grads[3].values.assign(static_cast<std::size_t>(T * H * G), 0.0);
  std::vector<cwt::Range> rows;
  for (std::size_t i = parts.size();
       i-- > 0;) {  // backward sweep: carry the initial-state gradient
    std::vector<cwt::Range> local;
    const auto r = cwt::run_cp<adapter, Policy>(group, parts[i], o, &local);
    if (i > 0) parts[i - 1].dht = r.initial_state_grads;
    const std::int64_t b = static_cast<std::int64_t>(i) * seg;
    for (auto lr : local) rows.emplace_back(lr.first + b, lr.second + b);
    auto place = [&](std::vector<double>& dst, const std::vector<double>& src, std::int64_t per) {
      for (auto lr : local)
        for (std::int64_t t = lr.first; t < lr.second; ++t)
          for (std::int64_t j = 0; j < per; ++j)
            dst[static_cast<std::size_t>((t + b) * per + j)] =
                src[static_cast<std::size_t>(t * per + j)];
    };
    place(streamed.output, r.output, H * V);
    place(streamed.grads[0].values, r.grads[0].values, H * K);
    place(streamed.grads[1].values, r.grads[1].values, H * K);
    place(streamed.grads[2].values, r.grads[2].values, H * V);
    place(streamed.grads[3].values, r.grads[3].values, H * G);
  }
  const auto oracle = cwt::decay_oracle(full, false, false, false).result;
  const auto bound = cwt::decay_bounds<double>(full, false, false, 2 * group.size() * 3);
  return cwt::check_against("streaming", streamed, oracle, bound, rows, T);
}

}  // namespace

BOOST_AUTO_TEST_CASE(streaming_with_carried_states_equals_one_pass) {
  const auto& group = world();
  CTXPAR_TEST_ALL(group, check_streaming<cw::GatherFold>(false));
  CTXPAR_TEST_ALL(group, check_streaming<cw::ScanCompose>(true));
}

BOOST_AUTO_TEST_CASE(composition_is_bitwise_as_before) {
  const auto& group = world();
  CTXPAR_TEST_ALL(group, check_bitwise_as_before<cw::IdentityTransition>(11));
  CTXPAR_TEST_ALL(group, check_bitwise_as_before<cw::ScalarTransition>(12));
  CTXPAR_TEST_ALL(group, check_bitwise_as_before<cw::DiagonalTransition>(13));
  CTXPAR_TEST_ALL(group, check_bitwise_as_before<cw::DenseTransition>(14));
}

BOOST_AUTO_TEST_CASE(composition_matches_fp64) {
  const auto& group = world();
  CTXPAR_TEST_ALL(group, check_against_fp64<cw::IdentityTransition>(21));
  CTXPAR_TEST_ALL(group, check_against_fp64<cw::ScalarTransition>(22));
  CTXPAR_TEST_ALL(group, check_against_fp64<cw::DiagonalTransition>(23));
  CTXPAR_TEST_ALL(group, check_against_fp64<cw::DenseTransition>(24));
  CTXPAR_TEST_ALL(group, dense_aliasing_is_refused());
}

BOOST_AUTO_TEST_CASE(one_kernel_per_packed_composition) {
  const auto& group = world();
  CTXPAR_TEST_ALL(group, check_kernels_per_step<cw::IdentityTransition>(41));
  CTXPAR_TEST_ALL(group, check_kernels_per_step<cw::ScalarTransition>(42));
  CTXPAR_TEST_ALL(group, check_kernels_per_step<cw::DiagonalTransition>(43));
  CTXPAR_TEST_ALL(group, check_kernels_per_step<cw::DenseTransition>(44));
}
