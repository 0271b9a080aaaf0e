// The fp64 gated delta oracle's hand-written gradient against central finite differences, on tiny
// shapes (GDN and GDP with 1..3 householder steps, two packed sequences, initial states and a
// final-state gradient). Every rank runs the same check; the verdict is agreed.
#include <boost/test/unit_test.hpp>

#include "chunkwise/gated_delta_oracle.hpp"

namespace gd = ctxpar::test::gated_delta;

namespace {

// Central difference of L along one input entry. With step h the truncation error is
// h^2/6 |L'''| and the rounding error about 2 u |L| / h; h = 1e-5 balances both near 1e-10 for
// these O(1) losses, so 1e-7 (absolute, plus 1e-7 relative) can only be exceeded by a wrong
// analytic gradient.
double central_difference(gd::Problem p, std::vector<double> gd::Problem::*field, std::size_t i,
                          const std::vector<double>& dout, const std::vector<double>& dht) {
  const double h = 1e-5;
  const double x = (p.*field)[i];
  (p.*field)[i] = x + h;
  const double up = gd::loss(p, dout, dht);
  (p.*field)[i] = x - h;
  const double down = gd::loss(p, dout, dht);
  return (up - down) / (2 * h);
}

bool check_field(const gd::Problem& p, std::vector<double> gd::Problem::*field,
                 const std::vector<double>& analytic, const std::vector<double>& dout,
                 const std::vector<double>& dht, const char* name) {
  return ctxpar::test::all_close(
      name, static_cast<std::int64_t>(analytic.size()), [&](std::int64_t i) { return analytic[i]; },
      [&](std::int64_t i) { return central_difference(p, field, std::size_t(i), dout, dht); },
      [&](std::int64_t i) { return 1e-7 * (1 + std::fabs(analytic[i])); },
      [&](std::int64_t i) { return std::string(name) + "[" + std::to_string(i) + "]"; });
}

}  // namespace

BOOST_AUTO_TEST_CASE(oracle_gradients_match_finite_differences) {
  const auto& world = ctxpar::test::world();
  bool ok = true;
  for (int n_h = 1; n_h <= 3; ++n_h) {
    for (bool with_h0 : {false, true}) {
      gd::Problem p = gd::make_problem(11 + n_h, 5, n_h, 2, 3, 2, {0, 2, 5}, with_h0);
      if (!with_h0) p.h0.assign(std::size_t(2) * 2 * 3 * 2, 0.0);  // differentiate at zero
      std::vector<double> dout(std::size_t(5) * 2 * 2), dht(std::size_t(2) * 2 * 3 * 2);
      for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = ctxpar::test::uniform(99, i);
      for (std::size_t i = 0; i < dht.size(); ++i) dht[i] = ctxpar::test::uniform(98, i);
      const gd::Gradients gr = gd::backward(p, dout, dht);
      ok = check_field(p, &gd::Problem::q, gr.dq, dout, dht, "dq") && ok;
      ok = check_field(p, &gd::Problem::k, gr.dk, dout, dht, "dk") && ok;
      ok = check_field(p, &gd::Problem::v, gr.dv, dout, dht, "dv") && ok;
      ok = check_field(p, &gd::Problem::g, gr.dg, dout, dht, "dg") && ok;
      ok = check_field(p, &gd::Problem::beta, gr.dbeta, dout, dht, "dbeta") && ok;
      ok = check_field(p, &gd::Problem::h0, gr.dh0, dout, dht, "dh0") && ok;
    }
  }
  CTXPAR_TEST_ALL(world, ok);
}

// The oracle is not vacuous: a single sub-step with known numbers, worked by hand.
BOOST_AUTO_TEST_CASE(oracle_single_step_by_hand) {
  gd::Problem p;
  p.tokens = 1, p.n_h = 1, p.heads = 1, p.key_dim = 2, p.value_dim = 1, p.scale = 1;
  p.cu_seqlens = {0, 1};
  p.q = {1.0, 2.0};
  p.k = {0.6, 0.8};
  p.v = {3.0};
  p.g = {std::log(0.5)};
  p.beta = {0.25};
  p.h0 = {1.0, -1.0};  // S0 = [1; -1]
  // Sbar = 0.5 S0 = [0.5; -0.5]; pred = 0.3 - 0.4 = -0.1; u = 0.25 (3 + 0.1) = 0.775
  // S1 = [0.5 + 0.6 u; -0.5 + 0.8 u] = [0.965; 0.12]; o = 0.965 + 0.24 = 1.205
  const gd::Forward f = gd::forward(p);
  CTXPAR_TEST_ALL(ctxpar::test::world(), std::fabs(f.o[0] - 1.205) < 1e-12);
}
