// Numerics of the scalar-decay and diagonal-gate families at the extremes, on every rank at every
// rank count, against the fp64 token-by-token recurrence:
// - dg under strong decay (log-gates down to −30) is as accurate as dq and dk of the same run;
// - a log-decay of −∞ (hard reset) inside a chunk, at a chunk start and at a rank boundary gives
//   what the recurrence gives, with no NaN;
// - a NaN in one packed document's inputs never reaches another document's results.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "chunkwise/chunkwise_test_support.hpp"
#include "chunkwise/decay_oracle.hpp"
#include "chunkwise/numerics_support.hpp"

namespace cwt = ctxpar::test::chunkwise;
namespace cw = ctxpar::chunkwise;
using ctxpar::test::world;

namespace {

using mem = Kokkos::DefaultHostExecutionSpace::memory_space;

// dg against the fp64 recurrence with log-gates uniform in [lo, hi], one sequence split over the
// ranks (T = 96, chunk 16: the shape), within the bound of dg_as_accurate_as_dq_dk
// (numerics_support.hpp) of dq's and dk's errors in the same run.
template <class Scalar, bool Diagonal>
bool dg_is_as_accurate_as_dq_dk(double lo, double hi, std::uint64_t seed) {
  using adapter = cwt::DecayAdapter<Scalar, mem, Diagonal>;
  auto prob = cwt::make_decay_problem(2, 8, 6, Diagonal, {0, 96}, seed, 16);
  for (std::size_t i = 0; i < prob.g.size(); ++i)
    prob.g[i] = lo + (hi - lo) * 0.5 * (ctxpar::test::uniform(seed * 7 + 3, i) + 1.0);
  // The oracle sees the inputs the kernels see (rounded to Scalar): dg's sensitivity to g is
  // |g|·u relative (up to 30u at g = −30), far above dq's and dk's, and not the algorithm's error.
  for (auto* x : {&prob.q, &prob.k, &prob.v, &prob.g, &prob.dout, &prob.h0, &prob.dht})
    for (auto& e : *x) e = static_cast<double>(static_cast<Scalar>(e));
  cwt::CaseOptions o;
  o.chunk = 16;
  o.initial_states = o.final_state_grads = true;
  const auto oracle = cwt::decay_oracle(prob, true, true, false).result;
  std::vector<cwt::Range> rows;
  const auto got = cwt::run_cp<adapter, cw::GatherFold>(world(), prob, o, &rows);
  return cwt::dg_as_accurate_as_dq_dk(got, oracle, rows, prob.T,
                                      std::string(Diagonal ? "diagonal" : "scalar") +
                                          (sizeof(Scalar) == 4 ? " fp32" : " fp64") + " g in [" +
                                          std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

template <class Scalar, bool Diagonal>
void dg_accuracy_family() {
  const auto& group = world();
  // Weak gates: a 16-token chunk spreads over at most 24 e-folds, so the diagonal family takes
  // its factored path; the others take it too.
  CTXPAR_TEST_ALL(group, (dg_is_as_accurate_as_dq_dk<Scalar, Diagonal>(-1.5, 0, 70)));
  CTXPAR_TEST_ALL(group, (dg_is_as_accurate_as_dq_dk<Scalar, Diagonal>(-5, 0, 71)));
  CTXPAR_TEST_ALL(group, (dg_is_as_accurate_as_dq_dk<Scalar, Diagonal>(-20, -5, 72)));
  CTXPAR_TEST_ALL(group, (dg_is_as_accurate_as_dq_dk<Scalar, Diagonal>(-30, -10, 73)));
}

// Hard resets: g = −∞ at token 5 (inside the first chunk), 16 (a chunk start), the first token of
// every rank's shard, and the last token; in the diagonal family only in some channels. Outputs,
// final states and every gradient must equal the recurrence within its error bound (so finite).
template <class Scalar, bool Diagonal>
bool hard_resets_match_recurrence(bool zigzag, cw::SummaryForm form, bool scan) {
  using adapter = cwt::DecayAdapter<Scalar, mem, Diagonal>;
  const auto& group = world();
  const std::int64_t T = 24 * group.size() + 5;
  auto prob = cwt::make_decay_problem(2, 8, 6, Diagonal, cwt::cu_from_lengths({T - 9, 9}), 81, 8);
  const auto plan = zigzag ? cw::SequenceLayout::create(group, ctxpar::Zigzag{}, prob.cu)
                           : cw::SequenceLayout::create(group, ctxpar::Contiguous{}, prob.cu);
  std::vector<std::int64_t> at{5, 16, T - 1};
  for (int v = 1; v < plan.virtual_count(); ++v) at.push_back(plan.shard_begin(v));
  const double inf = std::numeric_limits<double>::infinity();
  for (std::int64_t t : at) {
    if (t >= T) continue;
    for (std::int64_t h = 0; h < prob.H; ++h)
      for (std::int64_t gi = 0; gi < prob.G; ++gi)
        if (gi % 3 != 2) prob.g[static_cast<std::size_t>((t * prob.H + h) * prob.G + gi)] = -inf;
  }
  cwt::CaseOptions o;
  o.chunk = 8;
  o.zigzag = zigzag;
  o.form = form;
  o.initial_states = o.final_state_grads = true;
  const auto oracle = cwt::decay_oracle(prob, true, true, false).result;
  const auto bound = cwt::decay_bounds<Scalar>(prob, true, true, group.size() * (zigzag ? 2 : 1));
  std::vector<cwt::Range> rows;
  const auto got = scan ? cwt::run_cp<adapter, cw::ScanCompose>(group, prob, o, &rows)
                        : cwt::run_cp<adapter, cw::GatherFold>(group, prob, o, &rows);
  const std::string what = std::string(Diagonal ? "diagonal" : "scalar") +
                           (sizeof(Scalar) == 4 ? "/float" : "/double") +
                           (zigzag ? "/zigzag" : "/contiguous") + (scan ? "/scan" : "/gather") +
                           " hard resets vs recurrence";
  return cwt::check_against(what, got, oracle, bound, rows, prob.T);
}

template <bool Diagonal>
void hard_reset_family() {
  const auto& group = world();
  for (int zig = 0; zig < 2; ++zig) {
    for (int scan = 0; scan < 2; ++scan) {
      const auto form = scan ? cw::SummaryForm::unpacked : cw::SummaryForm::packed;
      CTXPAR_TEST_ALL(group, (hard_resets_match_recurrence<float, Diagonal>(zig, form, scan)));
      CTXPAR_TEST_ALL(group, (hard_resets_match_recurrence<double, Diagonal>(zig, form, scan)));
    }
  }
}

// A NaN (or ±Inf) in one input of document 1 of three packed documents: documents 0 and 2 must
// be bit-identical to a clean run (outputs, final states, every gradient, initial-state
// gradients), on every rank, for both composition policies — the documents' summaries meet in
// the composition, where 0·NaN would leak. Document 1's results may be non-finite.
template <class Scalar, bool Diagonal, class Policy>
bool non_finite_stays_in_its_document(int field, double bad, bool zigzag) {
  using adapter = cwt::DecayAdapter<Scalar, mem, Diagonal>;
  const auto& group = world();
  const std::int64_t L = 7;
  // Document 1 spans the rank borders; documents 0 and 2 start and end next to them.
  const std::vector<std::int64_t> lengths{L - 1, L * (group.size() - 1) + 3, 4};
  const auto clean =
      cwt::make_decay_problem(2, 4, 3, Diagonal, cwt::cu_from_lengths(lengths), 91, 4);
  auto dirty = clean;
  const std::int64_t t = L;  // inside document 1
  std::vector<double>* target[4] = {&dirty.q, &dirty.k, &dirty.v, &dirty.g};
  const std::int64_t per_token = field == 2 ? dirty.V : field == 3 ? dirty.G : dirty.K;
  (*target[field])[static_cast<std::size_t>(t * dirty.H * per_token)] = bad;
  return cwt::non_finite_stays_in_document_1<adapter, Policy>(clean, dirty, zigzag, field);
}

template <bool Diagonal>
void non_finite_family() {
  const auto& group = world();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (int field = 0; field < 4; ++field) {
    for (int zig = 0; zig < 2; ++zig) {
      CTXPAR_TEST_ALL(group, (non_finite_stays_in_its_document<float, Diagonal, cw::GatherFold>(
                                 field, nan, zig)));
      CTXPAR_TEST_ALL(group, (non_finite_stays_in_its_document<double, Diagonal, cw::ScanCompose>(
                                 field, field == 3 ? inf : -inf, zig)));
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(scalar_dg_under_strong_decay) {
  dg_accuracy_family<float, false>();
  dg_accuracy_family<double, false>();
}

BOOST_AUTO_TEST_CASE(diagonal_dg_under_strong_decay) {
  dg_accuracy_family<float, true>();
  dg_accuracy_family<double, true>();
}

BOOST_AUTO_TEST_CASE(scalar_hard_resets) {
  hard_reset_family<false>();
}

BOOST_AUTO_TEST_CASE(diagonal_hard_resets) {
  hard_reset_family<true>();
}

BOOST_AUTO_TEST_CASE(scalar_non_finite_inputs_stay_in_their_document) {
  non_finite_family<false>();
}

BOOST_AUTO_TEST_CASE(diagonal_non_finite_inputs_stay_in_their_document) {
  non_finite_family<true>();
}
