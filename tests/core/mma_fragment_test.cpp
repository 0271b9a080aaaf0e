// The tensor-core fragment layout (core/impl/mma_fragment.hpp) and the bfloat16 storage type
// (core/bfloat16.hpp) on the host: each layout covers its matrix once with register pairs of
// adjacent elements, the per-lane loads and stores around the host emulation of the m16n8k16
// product give A·B + C within the fp32 summation bound of an fp64 product of the same bfloat16
// inputs, and the bfloat16 rounding agrees with a nearest-value search in double.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "ctxpar/core/bfloat16.hpp"
#include "ctxpar/core/impl/mma_fragment.hpp"

namespace {

using ctxpar::bfloat16;
using L = ctxpar::impl::MmaM16N8K16;

// How often each element of a rows×cols matrix is named by (row(lane, i), col(lane, i)) over
// every lane and element; true when each is named exactly once.
template <class Row, class Col>
bool covers_once(int rows, int cols, int per_lane, Row row, Col col) {
  std::vector<int> seen(static_cast<std::size_t>(rows * cols), 0);
  for (int lane = 0; lane < L::lanes; ++lane)
    for (int i = 0; i < per_lane; ++i) {
      const int r = row(lane, i), c = col(lane, i);
      if (r < 0 || r >= rows || c < 0 || c >= cols) return false;
      ++seen[static_cast<std::size_t>(r * cols + c)];
    }
  for (int s : seen)
    if (s != 1) return false;
  return true;
}

// The bfloat16 nearest to x found by comparing the two candidates around it in double (ties to
// the even bit pattern); independent of the library's carry trick.
std::uint16_t nearest_bfloat16(float x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  const std::uint16_t down = static_cast<std::uint16_t>(u >> 16);
  const std::uint16_t up = static_cast<std::uint16_t>(down + 1);
  const double dx = x, lo = bfloat16{down}.to_float();
  const float up_value = bfloat16{up}.to_float();
  // Past the largest finite bfloat16, `up` is the infinity: rounding then compares against the
  // value one step beyond `down` (2^128 in magnitude), as IEEE overflow does.
  const double hi =
      std::isinf(up_value)
          ? lo + (lo - double(bfloat16{static_cast<std::uint16_t>(down - 1)}.to_float()))
          : double(up_value);
  const double d_down = std::fabs(lo - dx), d_up = std::fabs(hi - dx);
  if (d_down < d_up) return down;
  if (d_up < d_down) return up;
  return (down % 2 == 0) ? down : up;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(core_mma_fragment)

BOOST_AUTO_TEST_CASE(each_layout_covers_its_matrix_once_in_adjacent_register_pairs) {
  BOOST_TEST(covers_once(L::m, L::k, L::a_per_lane, L::a_row, L::a_col));
  BOOST_TEST(covers_once(L::k, L::n, L::b_per_lane, L::b_row, L::b_col));
  BOOST_TEST(covers_once(L::m, L::n, L::c_per_lane, L::c_row, L::c_col));
  // A 32-bit register holds elements 2j and 2j+1: adjacent columns of A, adjacent rows of B.
  bool pairs = true;
  for (int lane = 0; lane < L::lanes; ++lane) {
    for (int j = 0; j < L::a_per_lane / 2; ++j)
      pairs = pairs && L::a_row(lane, 2 * j) == L::a_row(lane, 2 * j + 1) &&
              L::a_col(lane, 2 * j) % 2 == 0 &&
              L::a_col(lane, 2 * j + 1) == L::a_col(lane, 2 * j) + 1;
    for (int j = 0; j < L::b_per_lane / 2; ++j)
      pairs = pairs && L::b_col(lane, 2 * j) == L::b_col(lane, 2 * j + 1) &&
              L::b_row(lane, 2 * j) % 2 == 0 &&
              L::b_row(lane, 2 * j + 1) == L::b_row(lane, 2 * j) + 1;
  }
  BOOST_TEST(pairs);
  // The placement the PTX ISA documents for lane 5 (group 1, position 1 in its group), which a
  // self-consistent but different layout would pass the checks above with: A (row, col) ×8,
  // B (row, col) ×4, C (row, col) ×4.
  const int a5[8][2] = {{1, 2}, {1, 3}, {9, 2}, {9, 3}, {1, 10}, {1, 11}, {9, 10}, {9, 11}};
  const int b5[4][2] = {{2, 1}, {3, 1}, {10, 1}, {11, 1}};
  const int c5[4][2] = {{1, 2}, {1, 3}, {9, 2}, {9, 3}};
  bool documented = true;
  for (int i = 0; i < 8; ++i)
    documented = documented && L::a_row(5, i) == a5[i][0] && L::a_col(5, i) == a5[i][1];
  for (int i = 0; i < 4; ++i) {
    documented = documented && L::b_row(5, i) == b5[i][0] && L::b_col(5, i) == b5[i][1];
    documented = documented && L::c_row(5, i) == c5[i][0] && L::c_col(5, i) == c5[i][1];
  }
  BOOST_TEST(documented);
}

BOOST_AUTO_TEST_CASE(bfloat16_rounds_to_nearest_even) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  int wrong = 0;
  for (int trial = 0; trial < 200000; ++trial) {
    std::uint32_t u = any_bits(rng);
    float x = 0;
    std::memcpy(&x, &u, sizeof x);
    if (std::isnan(x)) continue;
    const std::uint16_t got = bfloat16::from_float(x).bits;
    const std::uint16_t want = nearest_bfloat16(x);
    if (got != want && ++wrong <= 5)
      std::cout << "bfloat16 of bits 0x" << std::hex << u << ": 0x" << got << ", nearest 0x" << want
                << std::dec << "\n";
  }
  BOOST_TEST(wrong == 0);
  // Halfway cases go to the even pattern: 1 + 2^-8 lies between 1 (even) and 1 + 2^-7 (odd).
  BOOST_TEST(bfloat16::from_float(1.0f + std::ldexp(1.0f, -8)).to_float() == 1.0f);
  BOOST_TEST(bfloat16::from_float(1.0f + 3 * std::ldexp(1.0f, -8)).to_float() ==
             1.0f + std::ldexp(1.0f, -6));
  // Special values.
  const float inf = std::numeric_limits<float>::infinity();
  BOOST_TEST(bfloat16::from_float(inf).to_float() == inf);
  BOOST_TEST(bfloat16::from_float(-inf).to_float() == -inf);
  BOOST_TEST(std::isnan(bfloat16::from_float(std::numeric_limits<float>::quiet_NaN()).to_float()));
  BOOST_TEST(std::isinf(bfloat16::from_float(std::numeric_limits<float>::max()).to_float()));
  BOOST_TEST(std::signbit(bfloat16::from_float(-0.0f).to_float()));
  // Every bfloat16 converts to a float and back unchanged (NaNs aside).
  bool round_trip = true;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const bfloat16 v{static_cast<std::uint16_t>(b)};
    if (!std::isnan(v.to_float()))
      round_trip = round_trip && bfloat16::from_float(v.to_float()).bits == v.bits;
  }
  BOOST_TEST(round_trip);
}

BOOST_AUTO_TEST_CASE(per_lane_loads_emulated_product_and_stores_give_a_times_b_plus_c) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  // Tiles inside larger row-major arrays (leading dimensions past the tile) to exercise strides.
  const int lda = L::k + 3, ldb = L::k + 5, ldc = L::n + 2;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<bfloat16> a(static_cast<std::size_t>(L::m * lda)),
        kt(static_cast<std::size_t>(L::n * ldb));  // B(p, j) = kt[j·ldb + p]
    for (auto& x : a) x = bfloat16::from_float(value(rng));
    for (auto& x : kt) x = bfloat16::from_float(value(rng));
    std::vector<float> c0(static_cast<std::size_t>(L::m * ldc));
    for (auto& x : c0) x = value(rng);

    bfloat16 fa[32][8], fb[32][4];
    float fc[32][4];
    for (int lane = 0; lane < L::lanes; ++lane) {
      ctxpar::impl::load_a(lane, a.data(), lda, fa[lane]);
      ctxpar::impl::load_b(lane, kt.data(), ldb, fb[lane]);
      for (int i = 0; i < L::c_per_lane; ++i)
        fc[lane][i] = c0[static_cast<std::size_t>(L::c_row(lane, i) * ldc + L::c_col(lane, i))];
    }
    ctxpar::impl::emulate_warp_mma(fc, fa, fb);
    std::vector<float> d(static_cast<std::size_t>(L::m * ldc), 0.0f);
    for (int lane = 0; lane < L::lanes; ++lane)
      ctxpar::impl::store_c(lane, fc[lane], d.data(), ldc);

    // fp64 reference of the same bfloat16 inputs; bound γ_{k+1}·(|C| + Σ|A||B|), u = 2^-24.
    const double u = std::ldexp(1.0, -24), gamma = (L::k + 1) * u / (1 - (L::k + 1) * u);
    int wrong = 0;
    for (int r = 0; r < L::m; ++r)
      for (int j = 0; j < L::n; ++j) {
        const double c = c0[static_cast<std::size_t>(r * ldc + j)];
        double exact = c, magnitude = std::fabs(c);
        for (int p = 0; p < L::k; ++p) {
          const double prod = double(a[static_cast<std::size_t>(r * lda + p)].to_float()) *
                              double(kt[static_cast<std::size_t>(j * ldb + p)].to_float());
          exact += prod;
          magnitude += std::fabs(prod);
        }
        const double got = d[static_cast<std::size_t>(r * ldc + j)];
        if (!(std::fabs(got - exact) <= gamma * magnitude) && ++wrong <= 5)
          std::cout << "D(" << r << ", " << j << ") = " << got << ", want " << exact << " ± "
                    << gamma * magnitude << "\n";
      }
    BOOST_TEST(wrong == 0);
  }
}

BOOST_AUTO_TEST_SUITE_END()
