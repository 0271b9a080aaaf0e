// Mask expressions against brute force: every atom, every pair under && and ||, and every
// left- and right-nested triple, evaluated inside a Kokkos kernel over all (query, key) pairs of a
// packed stream and compared with the definitions written out as plain host code.
#include <Kokkos_Core.hpp>

#include <array>
#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "ctxpar/expr/mask.hpp"
#include "ctxpar_test/harness.hpp"

namespace {

namespace mask = ctxpar::mask;
using mask::Token;

// Three packed documents of lengths 5, 1 and 8, so windows cross document borders.
std::vector<Token> stream() {
  std::vector<Token> tokens;
  const std::array<int, 3> lengths{5, 1, 8};
  std::int64_t pos = 0;
  for (int s = 0; s < 3; ++s)
    for (int i = 0; i < lengths[s]; ++i) tokens.push_back(Token{pos++, s});
  return tokens;
}

using Oracle = std::function<bool(const Token&, const Token&)>;

// One atom: a mask value and its definition, written independently of the library.
template <class M>
struct Atom {
  M mask;
  Oracle oracle;
  std::string name;
};

std::vector<std::int64_t> windows() {
  return {0, 1, 2, 3, 7, 100};
}

// Evaluates `m` for every pair inside a kernel on `Exec` and counts disagreements with `oracle`.
template <class Exec, class M>
bool agrees(const M& m, const Oracle& oracle, const std::string& name) {
  const auto host = stream();
  const int n = static_cast<int>(host.size());
  Kokkos::View<Token*, typename Exec::memory_space> tokens("tokens", n);
  auto mirror = Kokkos::create_mirror_view(tokens);
  for (int i = 0; i < n; ++i) mirror(i) = host[i];
  Kokkos::deep_copy(tokens, mirror);
  Kokkos::View<int*, typename Exec::memory_space> verdict("verdict", n * n);
  Kokkos::parallel_for(
      "ctxpar::test::mask", Kokkos::RangePolicy<Exec>(0, n * n),
      KOKKOS_LAMBDA(int i) { verdict(i) = m(tokens(i / n), tokens(i % n)) ? 1 : 0; });
  auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), verdict);
  for (int i = 0; i < n * n; ++i) {
    const Token& q = host[i / n];
    const Token& k = host[i % n];
    if ((got(i) != 0) != oracle(q, k)) {
      BOOST_TEST_MESSAGE(name << " disagrees at q=(" << q.pos << "," << q.seq << ") k=(" << k.pos
                              << "," << k.seq << "): mask " << got(i) << ", oracle "
                              << oracle(q, k));
      return false;
    }
  }
  return true;
}

// Calls f(atom) for every atom of every kind (the sliding window once per tested width).
template <class F>
void for_each_atom(F&& f) {
  f(Atom<mask::Causal>{mask::causal(),
                       [](const Token& q, const Token& k) { return k.pos <= q.pos; }, "causal"});
  for (auto w : windows()) {
    f(Atom<mask::SlidingWindow>{
        mask::sliding_window(w),
        [w](const Token& q, const Token& k) { return w == 0 || k.pos > q.pos - w; },
        "sliding_window(" + std::to_string(w) + ")"});
  }
  f(Atom<mask::SameSequence>{mask::same_sequence(),
                             [](const Token& q, const Token& k) { return q.seq == k.seq; },
                             "same_sequence"});
  f(Atom<mask::All>{mask::all(), [](const Token&, const Token&) { return true; }, "all"});
}

template <class T>
constexpr bool small_and_trivial = std::is_trivially_copyable_v<T> && sizeof(T) <= 32;

}  // namespace

BOOST_AUTO_TEST_SUITE(expr_mask)

BOOST_AUTO_TEST_CASE_TEMPLATE(atoms_pairs_and_triples, Exec, ctxpar::test::execution_spaces) {
  int checked = 0;
  bool ok = true;
  for_each_atom([&](const auto& a) {
    ok = agrees<Exec>(a.mask, a.oracle, a.name) && ok;
    ++checked;
    for_each_atom([&](const auto& b) {
      ok = agrees<Exec>(
               a.mask && b.mask,
               [&](const Token& q, const Token& k) { return a.oracle(q, k) && b.oracle(q, k); },
               a.name + " && " + b.name) &&
           ok;
      ok = agrees<Exec>(
               a.mask || b.mask,
               [&](const Token& q, const Token& k) { return a.oracle(q, k) || b.oracle(q, k); },
               a.name + " || " + b.name) &&
           ok;
      checked += 2;
    });
  });
  BOOST_TEST_MESSAGE("checked " << checked << " masks");
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

// Triples on one backend only: the predicate does not depend on the backend (atoms and pairs run
// on every backend above), and 2 x 4^3 mask types per backend dominate this file's compile time.
BOOST_AUTO_TEST_CASE(nested_triples) {
  using Exec = Kokkos::DefaultHostExecutionSpace;
  bool ok = true;
  // The triple's first atom walks every kind; the inner pair covers every kind twice, so every
  // nesting shape of (kind, kind, kind) is built at least once.
  for_each_atom([&](const auto& a) {
    for_each_atom([&](const auto& b) {
      for_each_atom([&](const auto& c) {
        const auto& oa = a.oracle;
        const auto& ob = b.oracle;
        const auto& oc = c.oracle;
        ok = agrees<Exec>(
                 (a.mask && b.mask) || c.mask,
                 [&](const Token& q, const Token& k) { return (oa(q, k) && ob(q, k)) || oc(q, k); },
                 "(a && b) || c") &&
             ok;
        ok = agrees<Exec>(
                 a.mask && (b.mask || c.mask),
                 [&](const Token& q, const Token& k) { return oa(q, k) && (ob(q, k) || oc(q, k)); },
                 "a && (b || c)") &&
             ok;
      });
    });
  });
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(precedence_matches_builtin, Exec, ctxpar::test::execution_spaces) {
  // `&&` binds tighter than `||` for masks exactly as for bool.
  const auto m = mask::causal() && mask::sliding_window(3) || mask::same_sequence();
  static_assert(
      std::is_same_v<std::remove_const_t<decltype(m)>,
                     mask::Or<mask::And<mask::Causal, mask::SlidingWindow>, mask::SameSequence>>);
  const bool ok = agrees<Exec>(
      m,
      [](const Token& q, const Token& k) {
        return (k.pos <= q.pos && k.pos > q.pos - 3) || q.seq == k.seq;
      },
      "causal && window(3) || same_sequence");
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE(composed_masks_are_small_and_trivially_copyable) {
  using Typical = decltype(mask::causal() && mask::sliding_window(4) && mask::same_sequence());
  static_assert(ctxpar::mask::is_mask_v<Typical>);
  static_assert(!ctxpar::mask::is_mask_v<bool>);
  static_assert(!ctxpar::mask::is_mask_v<Token>);
  static_assert(std::is_trivially_copyable_v<Typical>);
  // By-value nodes: at most one 8-byte slot per leaf (the window width; empty atoms pad).
  BOOST_TEST(sizeof(Typical) <= 3 * sizeof(std::int64_t));
  BOOST_TEST(small_and_trivial<decltype(mask::all() || mask::causal())>);
  BOOST_TEST(small_and_trivial<decltype((mask::causal() || mask::all()) &&
                                        (mask::sliding_window(1) || mask::same_sequence()))>);
  BOOST_TEST(std::is_trivially_copyable_v<mask::SlidingWindow>);
  BOOST_TEST(sizeof(mask::SlidingWindow) == sizeof(std::int64_t));
}

BOOST_AUTO_TEST_SUITE_END()
