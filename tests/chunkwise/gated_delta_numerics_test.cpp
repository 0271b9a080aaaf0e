// Numerics of the gated delta rule (GDN) and gated delta product (GDP, n_h = 2) at the extremes,
// on every rank at every rank count, against the fp64 token-by-token recurrence:
// - dg under strong decay (log-gates down to −30) is as accurate as dq and dk of the same run;
// - a log-decay of −∞ (hard reset) inside a chunk, at a chunk start and at a rank boundary gives
//   what the recurrence gives, with no NaN;
// - a NaN in one packed document's inputs never reaches another document's results.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "chunkwise/gated_delta_cp_support.hpp"
#include "chunkwise/numerics_support.hpp"

namespace cwt = ctxpar::test::chunkwise;
namespace cw = ctxpar::chunkwise;
using ctxpar::test::world;

namespace {

// dg against the fp64 recurrence with log-gates uniform in [lo, hi] (T = 96, chunk 16, one
// sequence over the ranks, initial states and final-state gradients), within the bound of
// dg_as_accurate_as_dq_dk (numerics_support.hpp) of dq's and dk's errors in the same run.
template <class Scalar, bool Product>
bool dg_is_as_accurate_as_dq_dk(double lo, double hi, std::uint64_t seed) {
  using adapter = cwt::GdAdapter<Scalar, Product>;
  const int n_h = Product ? 2 : 1;
  auto prob = cwt::make_cp_problem(seed, {0, 96}, n_h, 2, 8, 6, 16);
  for (std::size_t i = 0; i < prob.p.g.size(); ++i)
    prob.p.g[i] = lo + (hi - lo) * 0.5 * (ctxpar::test::uniform(seed * 7 + 3, i) + 1.0);
  // The oracle sees the inputs the kernels see (rounded to Scalar): dg's sensitivity to g is
  // |g|·u relative (up to 30u at g = −30), far above dq's and dk's, and not the algorithm's error.
  for (auto* x : {&prob.p.q, &prob.p.k, &prob.p.v, &prob.p.g, &prob.p.beta, &prob.p.h0, &prob.dout,
                  &prob.dht})
    for (auto& e : *x) e = static_cast<double>(static_cast<Scalar>(e));
  prob.h0 = prob.p.h0;
  cwt::CaseOptions o;
  o.chunk = 16;
  o.initial_states = o.final_state_grads = true;
  const auto want = cwt::oracle(prob, true, true);
  std::vector<cwt::Range> rows;
  const auto got = cwt::run_cp<adapter, cw::GatherFold>(world(), prob, o, &rows);
  return cwt::dg_as_accurate_as_dq_dk(got, want, rows, prob.T,
                                      std::string(Product ? "gdp n_h=2" : "gdn") +
                                          (sizeof(Scalar) == 4 ? " fp32" : " fp64") + " g in [" +
                                          std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

template <class Scalar, bool Product>
void dg_accuracy_family() {
  const auto& group = world();
  // Weak gates: a 16-token chunk spreads over at most 24 e-folds, so the diagonal family takes
  // its factored path; the others take it too.
  CTXPAR_TEST_ALL(group, (dg_is_as_accurate_as_dq_dk<Scalar, Product>(-1.5, 0, 70)));
  CTXPAR_TEST_ALL(group, (dg_is_as_accurate_as_dq_dk<Scalar, Product>(-5, 0, 71)));
  CTXPAR_TEST_ALL(group, (dg_is_as_accurate_as_dq_dk<Scalar, Product>(-20, -5, 72)));
  CTXPAR_TEST_ALL(group, (dg_is_as_accurate_as_dq_dk<Scalar, Product>(-30, -10, 73)));
}

// Hard resets: g = −∞ at token 5 (inside the first chunk), 8 (a chunk start), the first token of
// every rank's shard and the last token, in head 0 only. Outputs, final states and every gradient
// must equal the recurrence within the CP test's bounds (so finite).
template <class Scalar, bool Product>
bool hard_resets_match_recurrence(bool zigzag, bool scan) {
  using adapter = cwt::GdAdapter<Scalar, Product>;
  const auto& group = world();
  const std::int64_t T = 24 * group.size() + 5;
  auto prob =
      cwt::make_cp_problem(81, cwt::cu_from_lengths({T - 9, 9}), Product ? 2 : 1, 2, 8, 6, 8);
  const auto plan = zigzag ? cw::SequenceLayout::create(group, ctxpar::Zigzag{}, prob.cu)
                           : cw::SequenceLayout::create(group, ctxpar::Contiguous{}, prob.cu);
  std::vector<std::int64_t> at{5, 8, T - 1};
  for (int v = 1; v < plan.virtual_count(); ++v) at.push_back(plan.shard_begin(v));
  for (std::int64_t t : at)
    if (t < T)
      prob.p.g[prob.p.gi(static_cast<int>(t), 0)] = -std::numeric_limits<double>::infinity();
  cwt::CaseOptions o;
  o.chunk = 8;
  o.zigzag = zigzag;
  o.initial_states = o.final_state_grads = true;
  const auto want = cwt::oracle(prob, true, true);
  const auto bound = cwt::bounds<Scalar>(prob, want, group.size() * (zigzag ? 2 : 1));
  std::vector<cwt::Range> rows;
  const auto got = scan ? cwt::run_cp<adapter, cw::ScanCompose>(group, prob, o, &rows)
                        : cwt::run_cp<adapter, cw::GatherFold>(group, prob, o, &rows);
  const std::string what = std::string(Product ? "gdp" : "gdn") +
                           (sizeof(Scalar) == 4 ? "/float" : "/double") +
                           (zigzag ? "/zigzag" : "/contiguous") + (scan ? "/scan" : "/gather") +
                           " hard resets vs recurrence";
  return cwt::check_against(what, got, want, bound, rows, prob.T);
}

template <bool Product>
void hard_reset_family() {
  const auto& group = world();
  for (int zig = 0; zig < 2; ++zig) {
    for (int scan = 0; scan < 2; ++scan) {
      CTXPAR_TEST_ALL(group, (hard_resets_match_recurrence<float, Product>(zig, scan)));
      CTXPAR_TEST_ALL(group, (hard_resets_match_recurrence<double, Product>(zig, scan)));
    }
  }
}

// A NaN (or ±Inf) in one input of document 1 of three packed documents: documents 0 and 2 are
// bit-identical to a clean run, on every rank, for both composition policies.
template <class Scalar, bool Product, class Policy>
bool non_finite_stays_in_its_document(int field, double bad, bool zigzag) {
  using adapter = cwt::GdAdapter<Scalar, Product>;
  const auto& group = world();
  const std::int64_t L = 7;
  const std::vector<std::int64_t> lengths{L - 1, L * (group.size() - 1) + 3, 4};
  const auto clean =
      cwt::make_cp_problem(91, cwt::cu_from_lengths(lengths), Product ? 2 : 1, 2, 4, 3, 4);
  auto dirty = clean;
  const int t = static_cast<int>(L);  // inside document 1
  switch (field) {
    case 0:
      dirty.p.q[dirty.p.qi(t, 0, 0)] = bad;
      break;
    case 1:
      dirty.p.k[dirty.p.ki(t, 0, 0, 0)] = bad;
      break;
    case 2:
      dirty.p.v[dirty.p.vi(t, 0, 0, 0)] = bad;
      break;
    case 3:
      dirty.p.g[dirty.p.gi(t, 0)] = bad;
      break;
    default:
      dirty.p.beta[dirty.p.bi(t, 0, 0)] = bad;
      break;
  }
  return cwt::non_finite_stays_in_document_1<adapter, Policy>(clean, dirty, zigzag, field);
}

template <bool Product>
void non_finite_family() {
  const auto& group = world();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (int field = 0; field < 5; ++field) {
    for (int zig = 0; zig < 2; ++zig) {
      CTXPAR_TEST_ALL(group, (non_finite_stays_in_its_document<float, Product, cw::GatherFold>(
                                 field, nan, zig)));
      CTXPAR_TEST_ALL(group, (non_finite_stays_in_its_document<double, Product, cw::ScanCompose>(
                                 field, field == 3 ? inf : -inf, zig)));
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(gated_delta_rule_dg_under_strong_decay) {
  dg_accuracy_family<float, false>();
  dg_accuracy_family<double, false>();
}

BOOST_AUTO_TEST_CASE(gated_delta_product_dg_under_strong_decay) {
  dg_accuracy_family<float, true>();
  dg_accuracy_family<double, true>();
}

BOOST_AUTO_TEST_CASE(gated_delta_rule_hard_resets) {
  hard_reset_family<false>();
}

BOOST_AUTO_TEST_CASE(gated_delta_product_hard_resets) {
  hard_reset_family<true>();
}

BOOST_AUTO_TEST_CASE(gated_delta_rule_non_finite_inputs_stay_in_their_document) {
  non_finite_family<false>();
}

BOOST_AUTO_TEST_CASE(gated_delta_product_non_finite_inputs_stay_in_their_document) {
  non_finite_family<true>();
}
