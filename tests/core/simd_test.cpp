// The host vector helpers' lane reductions: the register halving of simd_sum adds the same pairs
// in the same order as the pairwise tree through memory that the plain-array stand-in (nvcc,
// device passes, portable builds) runs, so both give the same bits; simd_max_lane is exact.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "ctxpar/core/impl/fast_exp.hpp"
#include "ctxpar/core/impl/simd.hpp"
#include "ctxpar_test/harness.hpp"

using ctxpar::test::world;

namespace {

// The pairwise tree the portable path runs: halves added until one lane is left.
template <class T>
T tree_sum(std::vector<T> x) {
  for (std::size_t w = x.size() / 2; w > 0; w /= 2)
    for (std::size_t i = 0; i < w; ++i) x[i] += x[i + w];
  return x[0];
}

// Lanes of mixed magnitude and sign, so that another summation order changes the bits.
template <class T>
bool reductions_match(std::uint32_t seed) {
  using ctxpar::impl::Simd;
  constexpr int lanes = Simd<T>::lanes;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-20, 20);
  bool ok = true;
  int order_sensitive = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<T> x(lanes);
    for (auto& v : x) v = static_cast<T>(std::ldexp(mantissa(gen), exponent(gen)));
    const auto v = ctxpar::impl::simd_load(x.data());
    const T sum = ctxpar::impl::simd_sum<T>(v);
    ok = ok && sum == tree_sum(x);
    T left = T(0), largest = x[0];
    for (T e : x) {
      left += e;
      largest = e > largest ? e : largest;
    }
    order_sensitive += left != tree_sum(x);
    ok = ok && ctxpar::impl::simd_max_lane<T>(v) == largest;
  }
  // The inputs must be able to tell summation orders apart, or the check above proves nothing.
  return ok && (lanes < 4 || order_sensitive > 100);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(core_simd)

BOOST_AUTO_TEST_CASE(lane_sum_is_the_pairwise_tree_and_max_is_exact) {
  CTXPAR_TEST_ALL(world(), reductions_match<float>(7) && reductions_match<double>(11));
}

// fast_exp and its vector form agree on the edges too: NaN stays NaN (with a defined conversion
// and shift: the sanitizer stage checks it), infinities clamp, arguments below -87 flush to zero.
BOOST_AUTO_TEST_CASE(fast_exp_edges_match_the_vector_form) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  bool ok = true;
  for (const float x : {nan, -nan, inf, -inf, 0.0f, -87.5f, 88.5f, 1.0f, -20.0f}) {
    const float s = ctxpar::impl::fast_exp(x);
    float lanes[ctxpar::impl::Simd<float>::lanes];
    ctxpar::impl::simd_store(lanes, ctxpar::impl::simd_exp(ctxpar::impl::simd_broadcast<float>(x)));
    ok = ok && (std::isnan(x) ? std::isnan(s) && std::isnan(lanes[0]) : s == lanes[0]);
  }
  ok = ok && ctxpar::impl::fast_exp(-inf) == 0.0f && ctxpar::impl::fast_exp(0.0f) == 1.0f;
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_SUITE_END()
