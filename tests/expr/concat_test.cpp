// The concatenation and flatten nodes (`ctxpar::expr::concat`, `ctxpar::expr::flatten`): bitwise
// against the same arithmetic written by hand in the same type and within the fp64 bound of the
// contraction they carry; one kernel per assign (the point of the nodes: a record of parts of
// different shapes in one launch); extent checks; and the aliasing rule (a part may update its own
// columns in place, never read the other part's, nor its own through a broadcast or a reshape).
#include <Kokkos_Core.hpp>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

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

bool refused(const std::string& message, const std::string& needle) {
  return message.find("ctxpar::") != std::string::npos && message.find(needle) != std::string::npos;
}

}  // namespace

// The shape of a composed summary record: [n, r·c + r·r] = concat(flatten(m·d + e), flatten(m·m2))
// with r, c chosen so neither part's width divides the other's. Every element is checked: the
// state columns against the hand-written accumulation (bitwise) and the fp64 product (bound), the
// transition columns likewise; then the rank-1 and rank-3 forms of concat against hand loops.
BOOST_AUTO_TEST_CASE_TEMPLATE(concat_of_flattened_contractions, Case, ctxpar::test::cases) {
  using T = typename Case::scalar_type;
  using M = typename Case::memory_space;
  const typename Case::execution_space space;
  const std::int64_t n = 3, r = 5, c = 3, width = r * c + r * r;
  const double u = ctxpar::test::unit_roundoff<T>();
  const auto m = filled<Case>("m", 11, n, r, r), m2 = filled<Case>("m2", 12, n, r, r);
  const auto d = filled<Case>("d", 13, n, r, c), e = filled<Case>("e", 14, n, r, c);
  Kokkos::View<T**, M> out("out", n, width);
  const int kernels = kernels_launched_by([&] {
    ctxpar::assign(
        space, out,
        ex::concat(ex::flatten(ex::contract(m, d, e)), ex::flatten(ex::contract(m, m2))));
  });
  bool ok = kernels == 1;
  const auto hm = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m);
  const auto hm2 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), m2);
  const auto hd = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d);
  const auto he = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), e);
  const auto ho = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  // Entry (x, j) of the record by hand in T, and in fp64 (value or magnitude).
  auto by_hand = [&](std::int64_t x, std::int64_t j) {
    T acc = 0;
    if (j < r * c) {
      acc = he(x, j / c, j % c);
      for (std::int64_t l = 0; l < r; ++l) acc += hm(x, j / c, l) * hd(x, l, j % c);
    } else {
      const std::int64_t i = (j - r * c) / r, k = (j - r * c) % r;
      for (std::int64_t l = 0; l < r; ++l) acc += hm(x, i, l) * hm2(x, l, k);
    }
    return acc;
  };
  auto exact = [&](std::int64_t f, bool magnitude) {
    const std::int64_t x = f / width, j = f % width;
    auto term = [&](double t) { return magnitude ? std::abs(t) : t; };
    double acc = 0;
    if (j < r * c) {
      acc = term(double(he(x, j / c, j % c)));
      for (std::int64_t l = 0; l < r; ++l) acc += term(double(hm(x, j / c, l)) * hd(x, l, j % c));
    } else {
      const std::int64_t i = (j - r * c) / r, k = (j - r * c) % r;
      for (std::int64_t l = 0; l < r; ++l) acc += term(double(hm(x, i, l)) * hm2(x, l, k));
    }
    return acc;
  };
  for (std::int64_t x = 0; x < n; ++x)
    for (std::int64_t j = 0; j < width; ++j) ok = ok && by_hand(x, j) == ho(x, j);
  ok = ctxpar::test::all_close(
           "concat(flatten(m·d + e), flatten(m·m2))", n * width,
           [&](std::int64_t f) { return double(ho(f / width, f % width)); },
           [&](std::int64_t f) { return exact(f, false); },
           [&](std::int64_t f) { return (r + 1.0) * u * exact(f, true); },
           [&](std::int64_t f) {
             return "row " + std::to_string(f / width) + " column " + std::to_string(f % width);
           }) &&
       ok;

  // Rank 1 (a scalar-scaled part and a flattened matrix) and rank 3 (along the last axis).
  Kokkos::View<T*, M> a1("a1", 4), out1("out1", 4 + r * c);
  Kokkos::deep_copy(a1, T(0.75));
  ctxpar::assign(space, out1,
                 ex::concat(ex::view(a1) * T(2),
                            ex::flatten(Kokkos::subview(d, 1, Kokkos::ALL, Kokkos::ALL))));
  Kokkos::View<T***, M> out3("out3", n, r, c + r);
  ctxpar::assign(space, out3, ex::concat(ex::view(d) - ex::view(e), m));
  const auto h1 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out1);
  const auto h3 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out3);
  for (std::int64_t j = 0; j < 4 + r * c; ++j)
    ok = ok && h1(j) == (j < 4 ? T(0.75) * T(2) : hd(1, (j - 4) / c, (j - 4) % c));
  for (std::int64_t x = 0; x < n; ++x)
    for (std::int64_t i = 0; i < r; ++i)
      for (std::int64_t j = 0; j < c + r; ++j)
        ok = ok && h3(x, i, j) == (j < c ? T(hd(x, i, j) - he(x, i, j)) : hm(x, i, j - c));
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

// Empty parts: a record whose second part has no columns is its first part (the identity summary
// has no transition); an empty record launches nothing.
BOOST_AUTO_TEST_CASE_TEMPLATE(concat_with_empty_parts, Exec, ctxpar::test::execution_spaces) {
  const Exec space;
  using M = typename Exec::memory_space;
  Kokkos::View<float**, M> a("a", 3, 4), none("none", 3, 0), out("out", 3, 4), empty("empty", 0, 4),
      half("half", 0, 2);
  Kokkos::deep_copy(a, 1.5f);
  bool ok = kernels_launched_by([&] { ctxpar::assign(space, out, ex::concat(a, none)); }) == 1;
  ok =
      kernels_launched_by([&] { ctxpar::assign(space, empty, ex::concat(half, half)); }) == 0 && ok;
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) ok = ok && h(i, j) == 1.5f;
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(concat_extents, Exec, ctxpar::test::execution_spaces) {
  const Exec space;
  using M = typename Exec::memory_space;
  Kokkos::View<float**, M> a("a", 3, 4), b("b", 2, 4), c("c", 3, 2), out("out", 3, 5);
  Kokkos::View<float***, M> cube("cube", 3, 2, 2);
  bool ok =
      refused(error_of([&] { (void)ex::concat(a, b); }), "same extents except along the last");
  ok = refused(error_of([&] { (void)ex::concat(a, b); }), "[3, 4]") && ok;
  // 4 + 2 columns into 5.
  ok = refused(error_of([&] { ctxpar::assign(space, out, ex::concat(a, c)); }), "extents") && ok;
  // flatten(cube) is [3, 4]: it concatenates with a [3, 2] part into [3, 6], not [3, 5].
  ok = refused(error_of([&] { ctxpar::assign(space, out, ex::concat(ex::flatten(cube), c)); }),
               "extents") &&
       ok;
  ok = error_of([&] { (void)ex::concat(ex::flatten(cube), c); }) == "no ctxpar::Error" && ok;
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

// A record updated in place: each part reads its own columns at the element written (allowed and
// correct); reading the other part's columns, or its own through a broadcast or another index map,
// is refused before the launch.
BOOST_AUTO_TEST_CASE_TEMPLATE(concat_aliasing, Exec, ctxpar::test::execution_spaces) {
  const Exec space;
  using M = typename Exec::memory_space;
  using Part = Kokkos::View<float**, Kokkos::LayoutStride, M>;
  const std::int64_t rows = 3, w = 4;
  Kokkos::View<float**, M> record("record", rows, 2 * w), other("other", rows, w);
  const Part left = Kokkos::subview(record, Kokkos::ALL, std::make_pair(std::int64_t{0}, w));
  const Part right = Kokkos::subview(record, Kokkos::ALL, std::make_pair(w, 2 * w));
  ctxpar::assign(space, left, 1.0f);
  ctxpar::assign(space, right, 2.0f);
  ctxpar::assign(space, other, 3.0f);
  bool ok = error_of([&] {
              ctxpar::assign(space, record,
                             ex::concat(ex::view(left) * 2.0f, ex::view(right) + ex::view(other)));
            }) == "no ctxpar::Error";
  // The parts swapped: each would read columns another thread writes.
  ok = refused(error_of([&] { ctxpar::assign(space, record, ex::concat(right, left)); }),
               "overlapping") &&
       ok;
  ok = refused(error_of([&] { ctxpar::assign(space, record, ex::concat(other, left)); }),
               "overlapping") &&
       ok;
  // Own columns, but one element broadcast over the row.
  const Kokkos::View<float*, Kokkos::LayoutStride, M> first_column =
      Kokkos::subview(record, Kokkos::ALL, 0);
  ok =
      refused(error_of([&] {
                ctxpar::assign(space, record, ex::concat(ex::broadcast<1>(first_column, w), other));
              }),
              "overlapping") &&
      ok;
  // flatten in place: the destination read through its own [rows, 2, w] map is index-local ...
  Kokkos::View<float***, Kokkos::LayoutStride, M> as_cube(
      record.data(), Kokkos::LayoutStride(rows, 2 * w, 2, w, w, 1));
  ok = error_of([&] { ctxpar::assign(space, record, ex::flatten(ex::view(as_cube) + 1.0f)); }) ==
           "no ctxpar::Error" &&
       ok;
  // ... and through a transposed one [rows, w, 2] it is not.
  Kokkos::View<float***, Kokkos::LayoutStride, M> transposed(
      record.data(), Kokkos::LayoutStride(rows, 2 * w, w, 1, 2, w));
  ok = refused(error_of([&] { ctxpar::assign(space, record, ex::flatten(transposed)); }),
               "overlapping") &&
       ok;
  space.fence();
  // After (2·1, 2 + 3) and +1: left = 3, right = 6.
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), record);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < 2 * w; ++j) ok = ok && h(i, j) == (j < w ? 3.0f : 6.0f);
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}
