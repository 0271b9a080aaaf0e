// The gates module (core/impl/gates.hpp) and the conv's windowed dot (core/impl/causal_conv.hpp),
// run in kernels of the default execution space and checked against plain long-double loops:
// the compensated cumulative log-gate (hard resets included) carries its rounding error, so
// `sum + lo` is the exact sum to second order; the decays formed from both parts err by
// u·|γ_i − γ_j| and are exactly 0 across a reset; sigmoid and softplus are within a few ulps;
// the windowed dot adds the counted taps in order.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ctxpar/core/host_mirror.hpp"
#include "ctxpar/core/impl/causal_conv.hpp"
#include "ctxpar/core/impl/gates.hpp"
#include "ctxpar_test/harness.hpp"

using ctxpar::test::uniform;
using ctxpar::test::unit_roundoff;

namespace {

using exec = Kokkos::DefaultExecutionSpace;
using mem = exec::memory_space;

// The log-gates of one chunk: strong decays (|γ| in the hundreds) with a hard reset at `reset`.
std::vector<float> chunk_gates(int n, int reset) {
  std::vector<float> g(n);
  for (int t = 0; t < n; ++t) g[t] = static_cast<float>(15.0 * (uniform(17, t) - 1.0));  // [-30, 0)
  g[reset] = -std::numeric_limits<float>::infinity();
  return g;
}

// Per token: sum, lo and last reset of the compensated cumulative sum; per pair (i, j ≤ i): the
// decay through each exponential.
template <class Exp>
struct CumsumKernel {
  Kokkos::View<const float*, mem> g;
  Kokkos::View<float*, mem> sum, lo, decays;
  Kokkos::View<int*, mem> reset;
  int n;
  KOKKOS_INLINE_FUNCTION void operator()(int) const {
    ctxpar::impl::CompensatedLogGate<float> gamma;
    int last = -1;
    for (int t = 0; t < n; ++t) {
      if (gamma.add(g(t))) last = t;
      sum(t) = gamma.sum;
      lo(t) = gamma.lo;
      reset(t) = last;
    }
    for (int i = 0; i < n; ++i)
      for (int j = 0; j <= i; ++j)
        decays(i * n + j) = ctxpar::impl::gated_decay<Exp>(
            reset(i) <= j, ctxpar::impl::compensated_difference(sum(i), lo(i), sum(j), lo(j)));
  }
};

template <class Exp>
void check_cumsum(const char* name) {
  const int n = 64, at = 23;
  const auto g_host = chunk_gates(n, at);
  Kokkos::View<float*, mem> g("g", n), sum("sum", n), lo("lo", n), decays("decays", n * n);
  Kokkos::View<int*, mem> reset("reset", n);
  auto staged = ctxpar::impl::host_mirror(g);
  for (int t = 0; t < n; ++t) staged(t) = g_host[t];
  Kokkos::deep_copy(g, staged);
  Kokkos::parallel_for("gates_test::cumsum", Kokkos::RangePolicy<exec>(0, 1),
                       CumsumKernel<Exp>{g, sum, lo, decays, reset, n});
  const auto hs = ctxpar::impl::host_copy(sum), hl = ctxpar::impl::host_copy(lo),
             hd = ctxpar::impl::host_copy(decays);
  const auto hr = ctxpar::impl::host_copy(reset);

  // The long-double reference, restarted at the reset.
  const long double u = unit_roundoff<float>();
  std::vector<long double> exact(n), magnitude(n);
  long double acc = 0, mag = 0;
  for (int t = 0; t < n; ++t) {
    if (t == at) {
      acc = mag = 0;
    } else {
      acc += g_host[t];
      mag += std::fabs(static_cast<long double>(g_host[t]));
    }
    exact[t] = acc;
    magnitude[t] = mag;
  }
  for (int t = 0; t < n; ++t) {
    BOOST_TEST_CONTEXT(name << " token " << t) {
      BOOST_TEST(hr(t) == (t >= at ? at : -1));
      // Second order only: the rounding of the first-order errors the compensation carries.
      const long double bound = 2 * n * n * u * u * magnitude[t];
      const long double error = std::fabs((static_cast<long double>(hs(t)) + hl(t)) - exact[t]);
      BOOST_TEST(error <= bound, "compensated error " << double(error) << " > " << double(bound));
    }
  }
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j <= i; ++j) {
      BOOST_TEST_CONTEXT(name << " decay (" << i << ", " << j << ")") {
        const float d = hd(i * n + j);
        if (i >= at && j < at) {
          BOOST_TEST(d == 0.0f);  // across the reset: exactly 0, never exp(−∞ − (−∞))
          continue;
        }
        const long double x = exact[i] - exact[j], want = std::exp(x);
        if (want < 1e-30L) continue;  // below float's normal range (fast_exp flushes at e^-87)
        // The log-decay errs by u·|x| plus second order; the exponential adds a few ulps.
        const long double bound =
            4 * u * (1 + std::fabs(x)) + 4 * n * n * u * u * (magnitude[i] + magnitude[j]);
        const long double rel = std::fabs(d - want) / want;
        BOOST_TEST(rel <= bound, "relative error " << double(rel) << " > " << double(bound));
      }
    }
  }
}

template <class T>
struct ActivationKernel {
  Kokkos::View<const T*, mem> x;
  Kokkos::View<T*, mem> s, sp;
  KOKKOS_INLINE_FUNCTION void operator()(int i) const {
    s(i) = ctxpar::impl::sigmoid(x(i));
    sp(i) = ctxpar::impl::softplus(x(i));
  }
};

template <class T>
void check_activations() {
  std::vector<T> xs;
  for (int i = -400; i <= 400; ++i) xs.push_back(static_cast<T>(i) / T(10));  // [-40, 40]
  for (int i = 0; i < 200; ++i) xs.push_back(static_cast<T>(3.0 * uniform(5, i)));
  const int n = static_cast<int>(xs.size());
  Kokkos::View<T*, mem> x("x", n), s("s", n), sp("sp", n);
  auto staged = ctxpar::impl::host_mirror(x);
  for (int i = 0; i < n; ++i) staged(i) = xs[i];
  Kokkos::deep_copy(x, staged);
  Kokkos::parallel_for("gates_test::activations", Kokkos::RangePolicy<exec>(0, n),
                       ActivationKernel<T>{x, s, sp});
  const auto hs = ctxpar::impl::host_copy(s), hsp = ctxpar::impl::host_copy(sp);
  const long double u = unit_roundoff<T>();
  for (int i = 0; i < n; ++i) {
    const long double v = xs[i];
    const long double sig = 1 / (1 + std::exp(-v)), soft = std::log1p(std::exp(v));
    BOOST_TEST_CONTEXT("x = " << double(v)) {
      // fast_exp is within about two ulps; the sum and the quotient add one each.
      BOOST_TEST(std::fabs(hs(i) - sig) <= 6 * u * sig);
      // log1p does not amplify the exp's error (y/((1 + y)·log1p(y)) <= 1). Above 20 the result
      // is x, short of log1p(e^x) by log1p(e^-x) < e^-x: below half an ulp of a float there, the
      // cut-off's own error for a double.
      const long double cut = v > 20 ? std::exp(-v) : 0;
      BOOST_TEST(std::fabs(hsp(i) - soft) <= 4 * u * soft + cut);
    }
  }
}

struct DotKernel {
  Kokkos::View<const double*, mem> w, in;
  Kokkos::View<double*, mem> out;
  int width;
  KOKKOS_INLINE_FUNCTION void operator()(int first) const {
    // Odd taps do not count: the dot must skip them, not add them.
    out(first) = ctxpar::impl::causal_window_dot(
        0.5, first, width, [&](int k) { return w(k); }, [&](int k) { return in(k); },
        [](int k) { return k % 2 == 0; });
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(compensated_cumulative_log_gate_and_decays_match_long_double) {
  check_cumsum<ctxpar::impl::LibraryExp>("library exp");
  check_cumsum<ctxpar::impl::FastExp>("fast_exp");
}

BOOST_AUTO_TEST_CASE(gate_sigmoid_and_softplus_match_long_double) {
  check_activations<float>();
  check_activations<double>();
}

BOOST_AUTO_TEST_CASE(causal_window_dot_adds_the_counted_taps_in_order) {
  const int width = 7;
  std::vector<double> wv(width), iv(width);
  for (int k = 0; k < width; ++k) {
    wv[k] = uniform(3, k);
    iv[k] = uniform(4, k);
  }
  Kokkos::View<double*, mem> w("w", width), in("in", width), out("out", width + 1);
  auto hw = ctxpar::impl::host_mirror(w), hi = ctxpar::impl::host_mirror(in);
  for (int k = 0; k < width; ++k) {
    hw(k) = wv[k];
    hi(k) = iv[k];
  }
  Kokkos::deep_copy(w, hw);
  Kokkos::deep_copy(in, hi);
  Kokkos::parallel_for("gates_test::dot", Kokkos::RangePolicy<exec>(0, width + 1),
                       DotKernel{w, in, out, width});
  const auto ho = ctxpar::impl::host_copy(out);
  for (int first = 0; first <= width; ++first) {
    double want = 0.5;  // the same additions in the same order: the same bits
    for (int k = first; k < width; ++k)
      if (k % 2 == 0) want += wv[k] * iv[k];
    BOOST_TEST(ho(first) == want, "first tap " << first);
  }
}
