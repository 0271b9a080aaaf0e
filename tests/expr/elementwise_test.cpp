// Element-wise expressions against plain loops: exact equality where the expression is the same
// arithmetic in the same type, an error bound from the fp64 values where it is a function or a
// composite. Also: one kernel per assign, broadcasting along every axis, extent checks, and the
// aliasing rule.
#include <Kokkos_Core.hpp>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "ctxpar/expr/expr.hpp"
#include "ctxpar_test/harness.hpp"
#include "expr/expr_test_support.hpp"

namespace {

namespace ex = ctxpar::expr;
using ctxpar::test::uniform;
using ctxpar::test::expr::error_of;
using ctxpar::test::expr::kernels_launched_by;

// A rank-1..3 view of the case's memory space filled with `g(uniform(seed, flat index))`.
template <class Case, class DataType, class G>
auto make_view(const std::string& label, std::uint64_t seed, G g, std::int64_t n0,
               std::int64_t n1 = -1, std::int64_t n2 = -1) {
  using View = Kokkos::View<DataType, typename Case::memory_space>;
  using T = typename Case::scalar_type;
  View v;
  if constexpr (View::rank == 1) v = View(label, n0);
  if constexpr (View::rank == 2) v = View(label, n0, n1);
  if constexpr (View::rank == 3) v = View(label, n0, n1, n2);
  auto h = Kokkos::create_mirror_view(v);
  std::int64_t flat = 0;
  if constexpr (View::rank == 1)
    for (std::int64_t i = 0; i < n0; ++i) h(i) = static_cast<T>(g(uniform(seed, flat++)));
  if constexpr (View::rank == 2)
    for (std::int64_t i = 0; i < n0; ++i)
      for (std::int64_t j = 0; j < n1; ++j) h(i, j) = static_cast<T>(g(uniform(seed, flat++)));
  if constexpr (View::rank == 3)
    for (std::int64_t i = 0; i < n0; ++i)
      for (std::int64_t j = 0; j < n1; ++j)
        for (std::int64_t k = 0; k < n2; ++k) h(i, j, k) = static_cast<T>(g(uniform(seed, flat++)));
  Kokkos::deep_copy(v, h);
  return v;
}

double identity(double x) {
  return x;
}

template <class View>
auto host(const View& v) {
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
}

// Flat-index comparison of a rank-1 host view.
template <class H>
bool check_1d(const std::string& what, const H& got, std::function<double(std::int64_t)> want,
              std::function<double(std::int64_t)> bound) {
  return ctxpar::test::all_close(
      what, static_cast<std::int64_t>(got.extent(0)), [&](std::int64_t i) { return got(i); }, want,
      bound, [](std::int64_t i) { return "(" + std::to_string(i) + ")"; });
}

// Rank-2 comparison; `want(i, j)` and `bound(i, j)`.
template <class H, class W, class B>
bool check_2d(const std::string& what, const H& got, W want, B bound) {
  const std::int64_t n1 = static_cast<std::int64_t>(got.extent(1));
  const std::int64_t n = static_cast<std::int64_t>(got.extent(0)) * n1;
  return ctxpar::test::all_close(
      what, n, [&](std::int64_t f) { return got(f / n1, f % n1); },
      [&](std::int64_t f) { return want(f / n1, f % n1); },
      [&](std::int64_t f) { return bound(f / n1, f % n1); },
      [&](std::int64_t f) {
        return "(" + std::to_string(f / n1) + ", " + std::to_string(f % n1) + ")";
      });
}

// Rank-3 comparison.
template <class H, class W, class B>
bool check_3d(const std::string& what, const H& got, W want, B bound) {
  const std::int64_t n1 = static_cast<std::int64_t>(got.extent(1));
  const std::int64_t n2 = static_cast<std::int64_t>(got.extent(2));
  const std::int64_t n = static_cast<std::int64_t>(got.extent(0)) * n1 * n2;
  auto split = [=](std::int64_t f, std::int64_t& i, std::int64_t& j, std::int64_t& k) {
    i = f / (n1 * n2);
    j = (f / n2) % n1;
    k = f % n2;
  };
  return ctxpar::test::all_close(
      what, n,
      [&](std::int64_t f) {
        std::int64_t i, j, k;
        split(f, i, j, k);
        return got(i, j, k);
      },
      [&](std::int64_t f) {
        std::int64_t i, j, k;
        split(f, i, j, k);
        return want(i, j, k);
      },
      [&](std::int64_t f) {
        std::int64_t i, j, k;
        split(f, i, j, k);
        return bound(i, j, k);
      },
      [&](std::int64_t f) {
        std::int64_t i, j, k;
        split(f, i, j, k);
        return "(" + std::to_string(i) + ", " + std::to_string(j) + ", " + std::to_string(k) + ")";
      });
}

// Same-arithmetic comparisons are exact unless the compiler may contract a*b+c into an FMA
// (then the two sides may round differently, by at most one rounding of each product).
template <class T>
double same_arithmetic_bound(double magnitude) {
#ifdef __FMA__
  return 4 * ctxpar::test::unit_roundoff<T>() * magnitude;
#else
  (void)magnitude;
  return 0.0;
#endif
}

}  // namespace

BOOST_AUTO_TEST_SUITE(expr_elementwise)

BOOST_AUTO_TEST_CASE_TEMPLATE(arithmetic_matches_plain_loop_all_ranks, Case, ctxpar::test::cases) {
  using T = typename Case::scalar_type;
  using Exec = typename Case::execution_space;
  const Exec space;
  bool ok = true;
  // Odd, unit and empty extents.
  for (std::int64_t n : {0, 1, 17, 257}) {
    auto a = make_view<Case, T*>("a", 1, identity, n);
    auto b = make_view<Case, T*>("b", 2, identity, n);
    auto c = make_view<Case, T*>(
        "c", 3, [](double x) { return 1.5 + x; }, n);
    Kokkos::View<T*, typename Case::memory_space> out("out", n);
    ctxpar::assign(space, out, ex::view(a) + ex::view(b) * c - ex::view(a) / c + 0.5 * ex::view(b));
    space.fence();
    auto ha = host(a), hb = host(b), hc = host(c), ho = host(out);
    ok = check_1d(
             "a + b*c - a/c + 0.5*b", ho,
             [&](std::int64_t i) {
               return T(T(ha(i) + hb(i) * hc(i)) - ha(i) / hc(i)) + T(0.5) * hb(i);
             },
             [&](std::int64_t) { return same_arithmetic_bound<T>(8.0); }) &&
         ok;
  }
  {
    auto a = make_view<Case, T**>("a", 4, identity, 5, 7);
    auto b = make_view<Case, T**>("b", 5, identity, 5, 7);
    Kokkos::View<T**, typename Case::memory_space> out("out", 5, 7);
    ctxpar::assign(space, out, -(ex::view(a) * b) - 3 * ex::view(a));
    space.fence();
    auto ha = host(a), hb = host(b), ho = host(out);
    ok = check_2d(
             "-(a*b) - 3a", ho,
             [&](std::int64_t i, std::int64_t j) {
               return -(ha(i, j) * hb(i, j)) - T(3) * ha(i, j);
             },
             [&](std::int64_t, std::int64_t) { return same_arithmetic_bound<T>(4.0); }) &&
         ok;
  }
  {
    auto a = make_view<Case, T***>("a", 6, identity, 3, 4, 5);
    auto b = make_view<Case, T***>(
        "b", 7, [](double x) { return 2 + x; }, 3, 4, 5);
    Kokkos::View<T***, typename Case::memory_space> out("out", 3, 4, 5);
    ctxpar::assign(space, out, ex::view(a) / b + a);
    space.fence();
    auto ha = host(a), hb = host(b), ho = host(out);
    ok = check_3d(
             "a/b + a", ho,
             [&](std::int64_t i, std::int64_t j, std::int64_t k) {
               return T(ha(i, j, k) / hb(i, j, k)) + ha(i, j, k);
             },
             [&](std::int64_t, std::int64_t, std::int64_t) { return 0.0; }) &&
         ok;
  }
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(functions_within_error_bounds, Case, ctxpar::test::cases) {
  using T = typename Case::scalar_type;
  using Exec = typename Case::execution_space;
  const Exec space;
  const double u = ctxpar::test::unit_roundoff<T>();
  const std::int64_t n = 301;
  using View = Kokkos::View<T*, typename Case::memory_space>;
  View out("out", n);
  bool ok = true;
  // Each function is checked against its fp64 definition; the bounds count the roundings of the
  // formula (libm functions within 1 ulp = 2u each), with a factor 2 of slack.
  auto wide = make_view<Case, T*>(
      "wide", 11, [](double x) { return 12 * x; }, n);
  auto unit = make_view<Case, T*>(
      "unit", 12, [](double x) { return 0.95 * x; }, n);
  auto positive = make_view<Case, T*>(
      "positive", 13, [](double x) { return 0.05 + 4 * (1 + x); }, n);
  auto extreme = make_view<Case, T*>(
      "extreme", 14, [](double x) { return 800 * x; }, n);
  auto hw = host(wide), hu = host(unit), hp = host(positive), hx = host(extreme);

  auto expect = [&](const std::string& what, auto expr, auto hin, auto f, double roundings) {
    ctxpar::assign(space, out, expr);
    space.fence();
    auto ho = host(out);
    return check_1d(
        what, ho, [&](std::int64_t i) { return f(double(hin(i))); },
        [&](std::int64_t i) {
          // Below the normal range only absolute accuracy exists: allow the smallest normal.
          return 2 * roundings * u * std::fabs(f(double(hin(i)))) +
                 double(std::numeric_limits<T>::min());
        });
  };
  ok = expect(
           "exp", ex::exp(wide), hw, [](double x) { return std::exp(x); }, 2) &&
       ok;
  ok = expect(
           "log1p", ex::log1p(unit), hu, [](double x) { return std::log1p(x); }, 2) &&
       ok;
  ok = expect(
           "sigmoid", ex::sigmoid(wide), hw, [](double x) { return 1 / (1 + std::exp(-x)); }, 4) &&
       ok;
  // Includes |x| up to 800, where a naive log(1 + exp(x)) overflows in float and in double.
  for (auto [name, in, hin] :
       {std::make_tuple("softplus", wide, hw), std::make_tuple("softplus(extreme)", extreme, hx)}) {
    ok = expect(
             name, ex::softplus(in), hin,
             [](double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); }, 5) &&
         ok;
  }
  ok = expect(
           "silu", ex::silu(wide), hw, [](double x) { return x / (1 + std::exp(-x)); }, 4) &&
       ok;
  ok = expect(
           "rsqrt", ex::rsqrt(positive), hp, [](double x) { return 1 / std::sqrt(x); }, 3) &&
       ok;
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(gate_with_broadcast_bias, Case, ctxpar::test::cases) {
  // g[t, h] = exp(-exp(A_log[h]) * softplus(a[t, h] + dt_bias[h])), the gated-delta decay.
  using T = typename Case::scalar_type;
  const typename Case::execution_space space;
  const double u = ctxpar::test::unit_roundoff<T>();
  const std::int64_t tokens = 37, heads = 6;
  auto a_log = make_view<Case, T*>("A_log", 21, identity, heads);
  auto dt_bias = make_view<Case, T*>("dt_bias", 22, identity, heads);
  auto a = make_view<Case, T**>(
      "a", 23, [](double x) { return 3 * x; }, tokens, heads);
  Kokkos::View<T**, typename Case::memory_space> g("g", tokens, heads);
  ctxpar::assign(space, g,
                 ex::exp(-ex::exp(ex::broadcast<0>(a_log, tokens)) *
                         ex::softplus(ex::view(a) + ex::broadcast<0>(dt_bias, tokens))));
  space.fence();
  const auto hl = host(a_log);
  const auto hb = host(dt_bias);
  const auto ha = host(a);
  const auto hg = host(g);
  auto softplus = [](double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); };
  const bool ok = check_2d(
      "gate", hg,
      [&](std::int64_t t, std::int64_t h) {
        return std::exp(-std::exp(double(hl(h))) * softplus(double(ha(t, h)) + double(hb(h))));
      },
      [&](std::int64_t t, std::int64_t h) {
        // Perturbation of p = e^A * softplus(a + b): the sum rounds (u(|a|+|b|), passed through
        // softplus' slope <= 1), softplus (5 roundings), exp (2u), the product (u); then
        // exp(-p) multiplies its relative error by |p| and adds 2u. Factor 2 of slack.
        const double ea = std::exp(double(hl(h)));
        const double sp = softplus(double(ha(t, h)) + double(hb(h)));
        const double p = ea * sp;
        const double dp =
            ea * (u * (std::fabs(ha(t, h)) + std::fabs(hb(h))) + 10 * u * sp) + 3 * u * p;
        const double gv = std::exp(-p);
        return 2 * (gv * dp + 2 * u * gv);
      });
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(rope_and_silu_gate_rank3, Case, ctxpar::test::cases) {
  // RoPE-like rotation of the first half with cos/sin tables [T, D/2] broadcast over heads, and a
  // SiLU-gated product; the same arithmetic as the loops below, so equality is exact.
  using T = typename Case::scalar_type;
  const typename Case::execution_space space;
  const std::int64_t tokens = 9, heads = 3, half = 4;
  auto x1 = make_view<Case, T***>("x1", 31, identity, tokens, heads, half);
  auto x2 = make_view<Case, T***>("x2", 32, identity, tokens, heads, half);
  auto cs = make_view<Case, T**>("cos", 33, identity, tokens, half);
  auto sn = make_view<Case, T**>("sin", 34, identity, tokens, half);
  Kokkos::View<T***, typename Case::memory_space> out("out", tokens, heads, half);
  ctxpar::assign(
      space, out,
      ex::view(x1) * ex::broadcast<1>(cs, heads) - ex::view(x2) * ex::broadcast<1>(sn, heads));
  space.fence();
  const auto h1 = host(x1);
  const auto h2 = host(x2);
  const auto hc = host(cs);
  const auto hs = host(sn);
  const auto ho = host(out);
  bool ok = check_3d(
      "rope", ho,
      [&](std::int64_t t, std::int64_t h, std::int64_t d) {
        return T(h1(t, h, d) * hc(t, d)) - T(h2(t, h, d) * hs(t, d));
      },
      [&](std::int64_t, std::int64_t, std::int64_t) { return same_arithmetic_bound<T>(2.0); });
  ctxpar::assign(space, out, ex::silu(x1) * x2);
  space.fence();
  auto hg = host(out);
  ok = check_3d(
           "silu(x1) * x2", hg,
           [&](std::int64_t t, std::int64_t h, std::int64_t d) {
             const T x = h1(t, h, d);
             return T(x / (T(1) + T(std::exp(-x)))) * h2(t, h, d);
           },
           [&](std::int64_t t, std::int64_t h, std::int64_t d) {
             // Same formula except libm's exp in the loop vs the Kokkos one: both within 1 ulp.
             const double x = h1(t, h, d);
             return 8 * ctxpar::test::unit_roundoff<T>() *
                    std::fabs(x / (1 + std::exp(-x)) * double(h2(t, h, d)));
           }) &&
       ok;
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(broadcast_along_every_axis, Case, ctxpar::test::cases) {
  using T = typename Case::scalar_type;
  using M = typename Case::memory_space;
  const typename Case::execution_space space;
  bool ok = true;
  auto v = make_view<Case, T*>("v", 41, identity, 5);
  auto m = make_view<Case, T**>("m", 42, identity, 4, 5);
  const auto hv = host(v);
  const auto hm = host(m);
  auto exact = [](auto...) { return 0.0; };
  Kokkos::View<T**, M> r0("r0", 3, 5), r1("r1", 5, 3);
  ctxpar::assign(space, r0, ex::broadcast<0>(v, 3));
  ctxpar::assign(space, r1, ex::broadcast<1>(v, 3));
  Kokkos::View<T***, M> s0("s0", 2, 4, 5), s1("s1", 4, 2, 5), s2("s2", 4, 5, 2);
  ctxpar::assign(space, s0, ex::broadcast<0>(m, 2));
  ctxpar::assign(space, s1, ex::broadcast<1>(m, 2));
  ctxpar::assign(space, s2, ex::broadcast<2>(m, 2));
  // A broadcast of a broadcast: [5] -> [3, 5] -> [3, 2, 5].
  Kokkos::View<T***, M> s01("s01", 3, 2, 5);
  ctxpar::assign(space, s01, ex::broadcast<1>(ex::broadcast<0>(v, 3), 2));
  space.fence();
  ok = check_2d(
           "broadcast<0>", host(r0), [&](std::int64_t, std::int64_t j) { return hv(j); }, exact) &&
       ok;
  ok = check_2d(
           "broadcast<1>", host(r1), [&](std::int64_t i, std::int64_t) { return hv(i); }, exact) &&
       ok;
  ok = check_3d(
           "broadcast<0> rank 3", host(s0),
           [&](std::int64_t, std::int64_t j, std::int64_t k) { return hm(j, k); }, exact) &&
       ok;
  ok = check_3d(
           "broadcast<1> rank 3", host(s1),
           [&](std::int64_t i, std::int64_t, std::int64_t k) { return hm(i, k); }, exact) &&
       ok;
  ok = check_3d(
           "broadcast<2> rank 3", host(s2),
           [&](std::int64_t i, std::int64_t j, std::int64_t) { return hm(i, j); }, exact) &&
       ok;
  ok = check_3d(
           "broadcast of broadcast", host(s01),
           [&](std::int64_t, std::int64_t, std::int64_t k) { return hv(k); }, exact) &&
       ok;
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(fill_copy_and_cast, Case, ctxpar::test::cases) {
  using T = typename Case::scalar_type;
  using M = typename Case::memory_space;
  const typename Case::execution_space space;
  auto a = make_view<Case, T**>("a", 51, identity, 6, 7);
  Kokkos::View<T**, M> copy("copy", 6, 7), filled("filled", 6, 7);
  Kokkos::View<double**, M> wide("wide", 6, 7);
  ctxpar::assign(space, copy, a);
  ctxpar::assign(space, filled, 2.25);
  ctxpar::assign(space, wide, ex::cast<double>(a) * 3.0);
  space.fence();
  auto ha = host(a);
  auto exact = [](auto...) { return 0.0; };
  bool ok = check_2d(
      "copy", host(copy), [&](std::int64_t i, std::int64_t j) { return ha(i, j); }, exact);
  ok = check_2d(
           "fill", host(filled), [](std::int64_t, std::int64_t) { return 2.25; }, exact) &&
       ok;
  ok = check_2d(
           "cast", host(wide),
           [&](std::int64_t i, std::int64_t j) { return double(ha(i, j)) * 3.0; }, exact) &&
       ok;
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(one_kernel_per_assign, Exec, ctxpar::test::execution_spaces) {
  using M = typename Exec::memory_space;
  Kokkos::View<float**, M> a("a", 8, 3), out("out", 8, 3);
  Kokkos::View<float*, M> bias("bias", 3);
  const Exec space;
  auto e = ex::exp(-ex::exp(ex::broadcast<0>(bias, 8)) *
                   ex::softplus(ex::view(a) + ex::broadcast<0>(bias, 8))) *
               ex::silu(a) / ex::rsqrt(ex::sigmoid(a) + 1.0f) -
           ex::log1p(ex::sigmoid(a));
  const int kernels = kernels_launched_by([&] { ctxpar::assign(space, out, e); });
  BOOST_TEST_MESSAGE("kernels per assign: " << kernels);
  CTXPAR_TEST_ALL(ctxpar::test::world(), kernels == 1);
  // Empty destinations launch nothing.
  Kokkos::View<float**, M> none("none", 0, 3);
  const int empty =
      kernels_launched_by([&] { ctxpar::assign(space, none, ex::view(none) * 2.0f); });
  CTXPAR_TEST_ALL(ctxpar::test::world(), empty == 0);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(extent_mismatches_throw, Exec, ctxpar::test::execution_spaces) {
  using M = typename Exec::memory_space;
  const Exec space;
  Kokkos::View<double**, M> a("a", 4, 3), b("b", 4, 2), out("out", 3, 3);
  Kokkos::View<double*, M> v("v", 3);
  const std::string plus = error_of([&] { (void)(ex::view(a) + b); });
  bool ok = plus.find("ctxpar::expr::operator+") != std::string::npos &&
            plus.find("[4, 3]") != std::string::npos && plus.find("[4, 2]") != std::string::npos;
  const std::string dst = error_of([&] { ctxpar::assign(space, out, ex::view(a) * 2.0); });
  ok = ok && dst.find("ctxpar::assign") != std::string::npos &&
       dst.find("[3, 3]") != std::string::npos;
  const std::string bc = error_of([&] { ctxpar::assign(space, a, ex::broadcast<0>(v, 5)); });
  ok = ok && bc.find("ctxpar::assign") != std::string::npos &&
       bc.find("[5, 3]") != std::string::npos;
  if (!ok) BOOST_TEST_MESSAGE(plus << "\n" << dst << "\n" << bc);
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(aliasing_rule, Exec, ctxpar::test::execution_spaces) {
  using M = typename Exec::memory_space;
  const Exec space;
  const auto all = Kokkos::ALL;
  bool ok = true;
  // Index-local reads of dst through the same map are fine: a = 2a + 1.
  Kokkos::View<double*, M> a("a", 16);
  ctxpar::assign(space, a, 3.0);
  ctxpar::assign(space, a, 2.0 * ex::view(a) + 1.0);
  space.fence();
  auto ha = host(a);
  for (int i = 0; i < 16; ++i) ok = ok && ha(i) == 7.0;
  // Disjoint pieces of one allocation are fine.
  auto lo = Kokkos::subview(a, std::make_pair(0, 8));
  auto hi = Kokkos::subview(a, std::make_pair(8, 16));
  ctxpar::assign(space, lo, ex::view(hi) + 1.0);
  space.fence();
  ha = host(a);
  for (int i = 0; i < 8; ++i) ok = ok && ha(i) == 8.0;

  auto refused = [](const std::string& message) {
    return message.find("ctxpar::assign") != std::string::npos &&
           message.find("destination's memory") != std::string::npos;
  };
  // A shifted view of dst reads other elements than the one written.
  auto shifted = Kokkos::subview(a, std::make_pair(1, 9));
  ok = refused(error_of([&] { ctxpar::assign(space, lo, ex::view(shifted) * 2.0); })) && ok;
  // Broadcasting a row of dst into dst reads one element for many writes.
  Kokkos::View<double**, M> m("m", 4, 5);
  auto row = Kokkos::subview(m, 0, all);
  ok = refused(error_of([&] { ctxpar::assign(space, m, ex::broadcast<0>(row, 4) + 1.0); })) && ok;
  // Even below an index-local node, a broadcast of dst's memory is refused.
  ok = refused(error_of(
           [&] { ctxpar::assign(space, m, ex::view(m) * ex::exp(ex::broadcast<0>(row, 4))); })) &&
       ok;
  // A transposed view of the same memory: same span, other map.
  Kokkos::View<double**, Kokkos::LayoutLeft, M> sq("sq", 4, 4);
  Kokkos::View<double**, Kokkos::LayoutRight, M, Kokkos::MemoryUnmanaged> sq_t(sq.data(), 4, 4);
  ok = refused(error_of([&] { ctxpar::assign(space, sq, ex::view(sq_t) + 1.0); })) && ok;
  // ... while the destination itself, index-locally, is fine.
  ok = error_of([&] { ctxpar::assign(space, sq, ex::view(sq) + 1.0); }) == "no ctxpar::Error" && ok;
  // A strided column ends at its last element: memory right after it (here the tail of the same
  // allocation, as a packed summary record's M column followed by a temporary) is not read.
  Kokkos::View<double*, M> packed("packed", 4 * 5 + 4);
  Kokkos::View<double**, Kokkos::LayoutRight, M, Kokkos::MemoryUnmanaged> records(packed.data(), 4,
                                                                                  5);
  auto column = Kokkos::subview(records, all, 4);  // elements 4, 9, 14, 19
  Kokkos::View<double*, M, Kokkos::MemoryUnmanaged> after(packed.data() + 20, 4);
  ctxpar::assign(space, packed, 1.0);
  ok = error_of([&] { ctxpar::assign(space, after, ex::view(column) + 1.0); }) ==
           "no ctxpar::Error" &&
       ok;
  space.fence();
  auto hp = host(packed);
  for (int i = 20; i < 24; ++i) ok = ok && hp(i) == 2.0;
  // ... but a column that does reach into the destination is still refused.
  Kokkos::View<double*, M, Kokkos::MemoryUnmanaged> overlapping(packed.data() + 19, 4);
  ok = refused(error_of([&] { ctxpar::assign(space, overlapping, ex::view(column) + 1.0); })) && ok;
  space.fence();
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE(nodes_are_small_trivially_copyable_values) {
  using V = Kokkos::View<float*>;
  using Sum = decltype(ex::view(V()) + ex::view(V()));
  static_assert(ex::is_expression_v<Sum>);
  static_assert(!ex::is_expression_v<V>);
  // Nodes hold their views and nothing else: two views, no hidden state.
  BOOST_TEST(sizeof(Sum) == 2 * sizeof(V));
  using Scaled = decltype(ex::exp(V()) * 2.0f);
  BOOST_TEST(sizeof(Scaled) <= sizeof(V) + sizeof(float) + alignof(V));
}

BOOST_AUTO_TEST_SUITE_END()
