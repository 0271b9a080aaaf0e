// The batched contraction node (`ctxpar::expr::contract`) against plain fp64 loops, within the
// error bound of a length-L dot product; bitwise against the same accumulation written by hand in
// the same type; one kernel per assign; extent checks; and its aliasing rule (factors may not
// touch the destination, the addend may at the element written).
#include <Kokkos_Core.hpp>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <string>

#include "ctxpar/expr/expr.hpp"
#include "ctxpar_test/harness.hpp"
#include "expr/expr_test_support.hpp"

namespace {

namespace ex = ctxpar::expr;
using ctxpar::test::uniform;
using ctxpar::test::expr::error_of;
using ctxpar::test::expr::kernels_launched_by;

// A rank-3 view [n, r, c] of the case's memory space filled from (seed, flat index).
template <class Case>
Kokkos::View<typename Case::scalar_type***, typename Case::memory_space> filled(
    const std::string& label, std::uint64_t seed, std::int64_t n, std::int64_t r, std::int64_t c) {
  Kokkos::View<typename Case::scalar_type***, typename Case::memory_space> v(label, n, r, c);
  auto h = Kokkos::create_mirror_view(v);
  std::int64_t flat = 0;
  for (std::int64_t a = 0; a < n; ++a)
    for (std::int64_t b = 0; b < r; ++b)
      for (std::int64_t d = 0; d < c; ++d)
        h(a, b, d) = static_cast<typename Case::scalar_type>(uniform(seed, flat++));
  Kokkos::deep_copy(v, h);
  return v;
}

}  // namespace

// out = c + a·b (batched, rank 3) and a·b, with L = 1, 7, 33 (a length that is not a power of
// two, and one term): fp64 bound, and bitwise equal to the hand-written accumulation.
BOOST_AUTO_TEST_CASE_TEMPLATE(batched_contraction, Case, ctxpar::test::cases) {
  using T = typename Case::scalar_type;
  using Exec = typename Case::execution_space;
  const Exec space;
  bool ok = true;
  const double u = ctxpar::test::unit_roundoff<T>();
  for (std::int64_t l : {1, 7, 33}) {
    const std::int64_t n = 3, r = 4, c = 5;
    const auto a = filled<Case>("a", 100 + l, n, r, l), b = filled<Case>("b", 200 + l, n, l, c);
    const auto init = filled<Case>("init", 300 + l, n, r, c);
    Kokkos::View<T***, typename Case::memory_space> out("out", n, r, c), plain("plain", n, r, c);
    const int kernels =
        kernels_launched_by([&] { ctxpar::assign(space, out, ex::contract(a, b, init)); });
    ok = ok && kernels == 1;
    ctxpar::assign(space, plain, ex::contract(a, b));
    space.fence();
    const auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
    const auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
    const auto hi = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), init);
    const auto ho = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
    const auto hp = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), plain);
    for (int with_init = 0; with_init < 2; ++with_init) {
      auto exact = [&](std::int64_t f, bool magnitude) {
        const std::int64_t x = f / (r * c), y = (f / c) % r, z = f % c;
        double acc =
            with_init ? (magnitude ? std::abs(double(hi(x, y, z))) : double(hi(x, y, z))) : 0;
        for (std::int64_t q = 0; q < l; ++q) {
          const double t = double(ha(x, y, q)) * double(hb(x, q, z));
          acc += magnitude ? std::abs(t) : t;
        }
        return acc;
      };
      ok = ctxpar::test::all_close(
               "contract" + std::string(with_init ? " + init" : "") + " L=" + std::to_string(l),
               n * r * c,
               [&](std::int64_t f) {
                 const std::int64_t x = f / (r * c), y = (f / c) % r, z = f % c;
                 return with_init ? double(ho(x, y, z)) : double(hp(x, y, z));
               },
               [&](std::int64_t f) { return exact(f, false); },
               [&](std::int64_t f) { return (l + 1.0) * u * exact(f, true); },
               [&](std::int64_t f) { return "flat index " + std::to_string(f); }) &&
           ok;
    }
    // The documented accumulation order, written by hand in T.
    for (std::int64_t x = 0; x < n; ++x)
      for (std::int64_t y = 0; y < r; ++y)
        for (std::int64_t z = 0; z < c; ++z) {
          T acc = hi(x, y, z);
          for (std::int64_t q = 0; q < l; ++q) acc += ha(x, y, q) * hb(x, q, z);
          ok = ok && acc == ho(x, y, z);
        }
  }
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

// Rank 2, expression operands (a broadcast and a sum), a scalar addend, strided views.
BOOST_AUTO_TEST_CASE_TEMPLATE(matrix_contraction_of_expressions, Exec,
                              ctxpar::test::execution_spaces) {
  const Exec space;
  using M = typename Exec::memory_space;
  const std::int64_t r = 3, l = 4, c = 6;
  Kokkos::View<double**, M> a("a", r, l), big("big", c, 2 * l), out("out", r, c);
  Kokkos::View<double*, M> row("row", c);
  Kokkos::parallel_for(
      Kokkos::RangePolicy<Exec>(space, 0, 1), KOKKOS_LAMBDA(int) {
        for (int i = 0; i < r; ++i)
          for (int q = 0; q < l; ++q) a(i, q) = 0.25 * (i + 1) - 0.5 * q;
        for (int j = 0; j < c; ++j) {
          row(j) = 0.125 * j - 0.3;
          for (int q = 0; q < 2 * l; ++q) big(j, q) = 0.1 * q + 0.05 * j - 0.2;
        }
      });
  // b(q, j) = big(j, 2q) (a strided transposed view) + row(j) broadcast over q.
  Kokkos::View<double**, Kokkos::LayoutStride, M> strided(big.data(),
                                                          Kokkos::LayoutStride(l, 2, c, 2 * l));
  ctxpar::assign(
      space, out,
      ex::contract(ex::view(a) * 2.0, ex::view(strided) + ex::broadcast<0>(row, l), 1.5));
  space.fence();
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  auto hbig = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), big);
  auto hrow = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), row);
  auto ho = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  bool ok = true;
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t j = 0; j < c; ++j) {
      double acc = 1.5;
      for (std::int64_t q = 0; q < l; ++q) acc += (ha(i, q) * 2.0) * (hbig(j, 2 * q) + hrow(j));
      ok = ok && acc == ho(i, j);
    }
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(contraction_extents_and_aliasing, Exec,
                              ctxpar::test::execution_spaces) {
  const Exec space;
  using M = typename Exec::memory_space;
  Kokkos::View<float***, M> a("a", 2, 3, 3), b("b", 2, 3, 3), wrong_l("wrong_l", 2, 4, 3),
      wrong_n("wrong_n", 3, 3, 3), out("out", 2, 3, 3), small("small", 2, 3, 2);
  auto refused = [](const std::string& message, const std::string& needle) {
    return message.find("ctxpar::") != std::string::npos &&
           message.find(needle) != std::string::npos;
  };
  bool ok = true;
  ok = refused(error_of([&] { (void)ex::contract(a, wrong_l); }), "same N and L") && ok;
  ok = refused(error_of([&] { (void)ex::contract(a, wrong_n); }), "same N and L") && ok;
  ok = refused(error_of([&] { (void)ex::contract(a, b, small); }), "the addend must have") && ok;
  ok =
      refused(error_of([&] { ctxpar::assign(space, small, ex::contract(a, b)); }), "extents") && ok;
  // A factor that is the destination would read elements already overwritten.
  ok =
      refused(error_of([&] { ctxpar::assign(space, a, ex::contract(a, b)); }), "overlapping") && ok;
  ok =
      refused(error_of([&] { ctxpar::assign(space, b, ex::contract(a, b)); }), "overlapping") && ok;
  // The addend is read at the element written: accumulating in place is fine, and correct.
  ctxpar::assign(space, a, 1.0f);
  ctxpar::assign(space, b, 2.0f);
  ctxpar::assign(space, out, 0.5f);
  ok = error_of([&] { ctxpar::assign(space, out, ex::contract(a, b, out)); }) ==
           "no ctxpar::Error" &&
       ok;
  // ... but not through a different index map of the destination.
  Kokkos::View<float***, Kokkos::LayoutStride, M> transposed(
      out.data(), Kokkos::LayoutStride(2, 9, 3, 1, 3, 3));
  ok = refused(error_of([&] { ctxpar::assign(space, out, ex::contract(a, b, transposed)); }),
               "overlapping") &&
       ok;
  space.fence();
  auto ho = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  for (int x = 0; x < 2; ++x)
    for (int y = 0; y < 3; ++y)
      for (int z = 0; z < 3; ++z) ok = ok && ho(x, y, z) == 6.5f;
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}
