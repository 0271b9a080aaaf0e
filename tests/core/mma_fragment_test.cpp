// The tensor-core fragment layouts (core/impl/mma_fragment.hpp: NVIDIA's; core/impl/
// mfma_fragment.hpp: AMD's) and the 16-bit storage types (core/bfloat16.hpp, core/float16.hpp) on
// the host: each layout covers its matrix once with register pairs of adjacent elements and puts
// the elements where the vendor's ISA documents them, the per-lane loads and stores around the
// host emulation of each product give A·B + C within the fp32 summation bound of an fp64 product
// of the same inputs, and both roundings agree with a nearest-value search in double.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ctxpar/core/bfloat16.hpp"
#include "ctxpar/core/float16.hpp"
#include "ctxpar/core/impl/mfma_fragment.hpp"
#include "ctxpar/core/impl/mma_fragment.hpp"
#include "ctxpar/core/impl/warp_lanes.hpp"

namespace {

using ctxpar::bfloat16;
using ctxpar::float16;
using L = ctxpar::impl::MmaM16N8K16;

// How often each element of a rows×cols matrix is named by (row(lane, i), col(lane, i)) over
// every lane (of `lanes`) and element; true when each is named exactly once.
template <class Row, class Col>
bool covers_once(int rows, int cols, int per_lane, Row row, Col col, int lanes = L::lanes) {
  std::vector<int> seen(static_cast<std::size_t>(rows * cols), 0);
  for (int lane = 0; lane < lanes; ++lane)
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

// Every finite non-negative half as (value, bits), in increasing order, decoded from the IEEE
// definition in double.
std::vector<std::pair<double, std::uint16_t>> positive_halves() {
  std::vector<std::pair<double, std::uint16_t>> all;
  for (std::uint16_t b = 0; b < 0x7c00u; ++b) {
    const int exponent = b >> 10, fraction = b & 0x3ff;
    const double v = exponent == 0 ? std::ldexp(double(fraction), -24)
                                   : std::ldexp(1.0 + fraction / 1024.0, exponent - 15);
    all.emplace_back(v, b);
  }
  return all;
}

// The half nearest to x (ties to the even pattern; past 65504 the next value is 2^16 = inf),
// found by a search over every half.
std::uint16_t nearest_half(float x, const std::vector<std::pair<double, std::uint16_t>>& halves) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000u : 0u;
  const double m = std::fabs(double(x));
  const auto above =
      std::lower_bound(halves.begin(), halves.end(), std::make_pair(m, std::uint16_t(0)));
  if (above != halves.end() && above->first == m) return sign | above->second;
  const auto below = above - 1;  // m > 0 here, and 0 is the first half
  const double hi = above == halves.end() ? 65536.0 : above->first;
  const std::uint16_t hi_bits = above == halves.end() ? 0x7c00u : above->second;
  const double d_lo = m - below->first, d_hi = hi - m;
  if (d_lo < d_hi) return sign | below->second;
  if (d_hi < d_lo) return sign | hi_bits;
  return sign | (below->second % 2 == 0 ? below->second : hi_bits);
}

// The value a product input stands for.
double value_of(float x) {
  return x;
}
template <class T>
double value_of(T x) {
  return x.to_float();
}

// Loads A (row-major, leading dimension lda) and B (stored column by column, ldb) into every
// lane's fragments by `Layout`, runs the emulated product on C (row-major, ldc), stores D, and
// counts the elements of D farther than γ_{k+1}·(|C| + Σ|A||B|), u = 2^-24, from the fp64 product
// of the same inputs (the first five are printed).
template <class Layout, class T>
int emulated_product_errors(const std::vector<T>& a, int lda, const std::vector<T>& kt, int ldb,
                            const std::vector<float>& c0, int ldc) {
  ctxpar::impl::Fragment<T, Layout::a_per_lane> fa[Layout::lanes];
  ctxpar::impl::Fragment<T, Layout::b_per_lane> fb[Layout::lanes];
  float fc[Layout::lanes][Layout::c_per_lane];
  for (int lane = 0; lane < Layout::lanes; ++lane) {
    ctxpar::impl::load_a<Layout>(lane, a.data(), lda, fa[lane]);
    ctxpar::impl::load_b<Layout>(lane, kt.data(), ldb, fb[lane]);
    for (int i = 0; i < Layout::c_per_lane; ++i)
      fc[lane][i] =
          c0[static_cast<std::size_t>(Layout::c_row(lane, i) * ldc + Layout::c_col(lane, i))];
  }
  ctxpar::impl::emulate_warp_mma<Layout>(fc, fa, fb);
  std::vector<float> d(static_cast<std::size_t>(Layout::m * ldc), 0.0f);
  for (int lane = 0; lane < Layout::lanes; ++lane)
    for (int i = 0; i < Layout::c_per_lane; ++i)
      d[static_cast<std::size_t>(Layout::c_row(lane, i) * ldc + Layout::c_col(lane, i))] =
          fc[lane][i];
  const double u = std::ldexp(1.0, -24), gamma = (Layout::k + 1) * u / (1 - (Layout::k + 1) * u);
  int wrong = 0;
  for (int r = 0; r < Layout::m; ++r)
    for (int j = 0; j < Layout::n; ++j) {
      const double c = c0[static_cast<std::size_t>(r * ldc + j)];
      double exact = c, magnitude = std::fabs(c);
      for (int p = 0; p < Layout::k; ++p) {
        const double prod = value_of(a[static_cast<std::size_t>(r * lda + p)]) *
                            value_of(kt[static_cast<std::size_t>(j * ldb + p)]);
        exact += prod;
        magnitude += std::fabs(prod);
      }
      const double got = d[static_cast<std::size_t>(r * ldc + j)];
      if (!(std::fabs(got - exact) <= gamma * magnitude) && ++wrong <= 5)
        std::cout << "D(" << r << ", " << j << ") = " << got << ", want " << exact << " ± "
                  << gamma * magnitude << "\n";
    }
  return wrong;
}

// The element types of the tensor-core product.
using sixteen_bit_types = std::tuple<bfloat16, float16>;

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

// results_as_a places each result where the A layout expects that (row, column): lane by lane,
// element i of the A fragment is the result at (a_row, a_col), taken from the left or right 16×8
// tile by the layouts alone.
BOOST_AUTO_TEST_CASE(two_results_form_the_a_fragment_of_their_tile) {
  bool ok = true;
  for (int lane = 0; lane < L::lanes; ++lane) {
    float left[4], right[4];
    for (int i = 0; i < L::c_per_lane; ++i) {
      // Integer-valued (exact in bfloat16) and unique per (row, column) of the 16×16 tile.
      left[i] = float(L::c_row(lane, i) * 16 + L::c_col(lane, i));
      right[i] = float(L::c_row(lane, i) * 16 + 8 + L::c_col(lane, i));
    }
    ctxpar::impl::Fragment<bfloat16, 8> a;
    ctxpar::impl::results_as_a(left, right, a);
    for (int i = 0; i < L::a_per_lane; ++i)
      ok = ok && a[i].to_float() == float(L::a_row(lane, i) * 16 + L::a_col(lane, i));
  }
  BOOST_TEST(ok);
}

// ldmatrix.x4 with the lane addresses LdMatrixX4 gives delivers exactly the fragments load_a and
// load_b read, for a strided A tile and for both 8-column halves of a 16-wide B tile.
BOOST_AUTO_TEST_CASE(ldmatrix_addresses_deliver_the_fragments) {
  using X4 = ctxpar::impl::LdMatrixX4;
  const int ld = 24;  // 16 used columns and a pad, as a shared-memory tile has
  std::vector<bfloat16> tile(static_cast<std::size_t>(16 * ld));
  for (std::size_t i = 0; i < tile.size(); ++i)
    tile[i] = bfloat16{static_cast<std::uint16_t>(i + 1)};  // unique patterns
  const bfloat16* a_rows[32];
  const bfloat16* b_rows[32];
  for (int lane = 0; lane < L::lanes; ++lane) {
    a_rows[lane] = tile.data() + X4::a_row(lane) * ld + X4::a_col(lane);
    b_rows[lane] = tile.data() + X4::b_col(lane) * ld + X4::b_row(lane);
  }
  ctxpar::impl::Fragment<bfloat16, 8> got_a[32], got_b[32];
  ctxpar::impl::emulate_ldmatrix_x4(a_rows, got_a);
  ctxpar::impl::emulate_ldmatrix_x4(b_rows, got_b);
  bool ok = true;
  for (int lane = 0; lane < L::lanes; ++lane) {
    ctxpar::impl::Fragment<bfloat16, 8> a;
    ctxpar::impl::Fragment<bfloat16, 4> b_left, b_right;
    ctxpar::impl::load_a(lane, tile.data(), ld, a);
    ctxpar::impl::load_b(lane, tile.data(), ld, b_left);
    ctxpar::impl::load_b(lane, tile.data() + 8 * ld, ld, b_right);
    // Word by word: the loads pack each pair as the instruction does (even element low).
    for (int j = 0; j < 4; ++j) ok = ok && got_a[lane].word[j] == a.word[j];
    for (int j = 0; j < 2; ++j)
      ok =
          ok && got_b[lane].word[j] == b_left.word[j] && got_b[lane].word[2 + j] == b_right.word[j];
  }
  BOOST_TEST(ok);
}

// ldmatrix.x4.trans with the lane addresses LdMatrixX4 gives for a row-stored B tile delivers
// exactly what load_b_rows reads, for both 8-column halves; and warp_ldmatrix_b (the kernels'
// warp-level load) gives the same for both storage orders.
BOOST_AUTO_TEST_CASE(ldmatrix_trans_addresses_deliver_the_row_stored_b_fragments) {
  using X4 = ctxpar::impl::LdMatrixX4;
  const int ld = 24;
  std::vector<bfloat16> tile(static_cast<std::size_t>(16 * ld));
  for (std::size_t i = 0; i < tile.size(); ++i)
    tile[i] = bfloat16{static_cast<std::uint16_t>(i + 1)};
  const bfloat16* rows[32];
  for (int lane = 0; lane < L::lanes; ++lane)
    rows[lane] = tile.data() + X4::bt_row(lane) * ld + X4::bt_col(lane);
  ctxpar::impl::Fragment<bfloat16, 8> got[32];
  ctxpar::impl::emulate_ldmatrix_x4_trans(rows, got);
  // Sized by WarpLanes::count, as the kernels' are: 32 here (one thread runs the warp), 1 in
  // nvcc's device pass, which parses this host code too.
  constexpr int count = ctxpar::impl::WarpLanes::count;
  ctxpar::impl::Fragment<bfloat16, 4> rows_left[count], rows_right[count], cols_left[count],
      cols_right[count];
  const ctxpar::impl::WarpLanes lanes{0};
  ctxpar::impl::warp_ldmatrix_b<true>(lanes, tile.data(), ld, rows_left, rows_right);
  ctxpar::impl::warp_ldmatrix_b<false>(lanes, tile.data(), ld, cols_left, cols_right);
  bool ok = true;
  for (int lane = 0; lane < L::lanes; ++lane) {
    ctxpar::impl::Fragment<bfloat16, 4> left, right, col_left, col_right;
    ctxpar::impl::load_b_rows(lane, tile.data(), ld, left);
    ctxpar::impl::load_b_rows(lane, tile.data() + 8, ld, right);
    ctxpar::impl::load_b(lane, tile.data(), ld, col_left);
    ctxpar::impl::load_b(lane, tile.data() + 8 * ld, ld, col_right);
    for (int j = 0; j < 2; ++j) {
      ok = ok && got[lane].word[j] == left.word[j] && got[lane].word[2 + j] == right.word[j];
      ok = ok && rows_left[lane].word[j] == left.word[j] &&
           rows_right[lane].word[j] == right.word[j];
      ok = ok && cols_left[lane].word[j] == col_left.word[j] &&
           cols_right[lane].word[j] == col_right.word[j];
    }
  }
  BOOST_TEST(ok);
}

// The TF32 layout: coverage once, and the placement the PTX ISA documents for lane 5 (group 1,
// position 1): A (1,1), (9,1), (1,5), (9,5); B (1,1), (5,1).
BOOST_AUTO_TEST_CASE(tf32_layout_covers_its_matrices_once_as_documented) {
  using T = ctxpar::impl::MmaM16N8K8Tf32;
  BOOST_TEST(covers_once(T::m, T::k, T::a_per_lane, T::a_row, T::a_col));
  BOOST_TEST(covers_once(T::k, T::n, T::b_per_lane, T::b_row, T::b_col));
  const int a5[4][2] = {{1, 1}, {9, 1}, {1, 5}, {9, 5}};
  const int b5[2][2] = {{1, 1}, {5, 1}};
  bool documented = true;
  for (int i = 0; i < 4; ++i)
    documented = documented && T::a_row(5, i) == a5[i][0] && T::a_col(5, i) == a5[i][1];
  for (int i = 0; i < 2; ++i)
    documented = documented && T::b_row(5, i) == b5[i][0] && T::b_col(5, i) == b5[i][1];
  BOOST_TEST(documented);
}

// to_tf32 against the nearest of the two TF32 values around x in double, ties away from zero.
BOOST_AUTO_TEST_CASE(tf32_rounds_to_nearest_ties_away) {
  std::mt19937 rng(13);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  int wrong = 0;
  for (int trial = 0; trial < 200000; ++trial) {
    // Every fourth trial lands exactly halfway, the case the rounding direction decides.
    std::uint32_t u = any_bits(rng);
    if (trial % 4 == 0) u = (u & ~0x1fffu) | 0x1000u;
    float x = 0;
    std::memcpy(&x, &u, sizeof x);
    if (!std::isfinite(x)) continue;
    const std::uint32_t down_bits = u & ~0x1fffu, up_bits = down_bits + 0x2000u;
    float down = 0, up = 0;
    std::memcpy(&down, &down_bits, sizeof down);
    std::memcpy(&up, &up_bits, sizeof up);
    // Past the largest finite TF32 the next value is 2^128 (inf).
    const double hi = std::isinf(up) ? std::ldexp(std::signbit(x) ? -1.0 : 1.0, 128) : double(up);
    const double d_down = std::fabs(double(x) - double(down)), d_up = std::fabs(hi - double(x));
    const float want = d_down < d_up ? down : up;
    const float got = ctxpar::impl::to_tf32(x);
    if (!(got == want || (std::isinf(got) && std::isinf(want) && got == want)) && ++wrong <= 5)
      std::cout << "to_tf32(" << x << ") = " << got << ", want " << want << "\n";
  }
  BOOST_TEST(wrong == 0);
  BOOST_TEST(ctxpar::impl::to_tf32(1.0f + std::ldexp(1.0f, -11)) == 1.0f + std::ldexp(1.0f, -10));
  BOOST_TEST(std::isnan(ctxpar::impl::to_tf32(std::numeric_limits<float>::quiet_NaN())));
}

BOOST_AUTO_TEST_CASE(tf32_loads_emulated_product_and_stores_give_a_times_b_plus_c) {
  using T = ctxpar::impl::MmaM16N8K8Tf32;
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  const int lda = T::k + 3, ldb = T::k + 1, ldc = T::n + 2;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> a(static_cast<std::size_t>(T::m * lda)),
        kt(static_cast<std::size_t>(T::n * ldb));
    for (auto& x : a) x = ctxpar::impl::to_tf32(value(rng));
    for (auto& x : kt) x = ctxpar::impl::to_tf32(value(rng));
    std::vector<float> c0(static_cast<std::size_t>(T::m * ldc));
    for (auto& x : c0) x = value(rng);
    BOOST_TEST(emulated_product_errors<T>(a, lda, kt, ldb, c0, ldc) == 0);
  }
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

BOOST_AUTO_TEST_CASE(float16_rounds_to_nearest_even_subnormals_included) {
  const auto halves = positive_halves();
  std::mt19937 rng(9);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  // Random bit patterns land mostly far outside the half range; the second half of the trials
  // draws exponents inside it (subnormals and the overflow edge included).
  std::uniform_int_distribution<int> exponent(-30, 17);
  std::uniform_real_distribution<float> fraction(1.0f, 2.0f);
  int wrong = 0;
  for (int trial = 0; trial < 400000; ++trial) {
    float x = 0;
    if (trial % 2 == 0) {
      const std::uint32_t u = any_bits(rng);
      std::memcpy(&x, &u, sizeof x);
      if (std::isnan(x)) continue;
    } else {
      x = std::ldexp(fraction(rng), exponent(rng)) * (trial % 4 == 1 ? 1.0f : -1.0f);
    }
    const std::uint16_t got = float16::from_float(x).bits;
    const std::uint16_t want =
        std::isinf(x) ? (std::signbit(x) ? 0xfc00u : 0x7c00u) : nearest_half(x, halves);
    if (got != want && ++wrong <= 5)
      std::cout << "float16 of " << x << ": 0x" << std::hex << got << ", nearest 0x" << want
                << std::dec << "\n";
  }
  BOOST_TEST(wrong == 0);
  // The edges: halfway between 65504 and 2^16 goes to the even pattern (inf), just below it to
  // 65504; halfway between 0 and the smallest subnormal to 0; NaN stays NaN.
  BOOST_TEST(float16::from_float(65520.0f).bits == 0x7c00u);
  BOOST_TEST(float16::from_float(65519.99f).bits == 0x7bffu);
  BOOST_TEST(float16::from_float(std::ldexp(1.0f, -25)).bits == 0u);
  BOOST_TEST(float16::from_float(std::ldexp(1.5f, -25)).bits == 1u);
  BOOST_TEST(std::isnan(float16::from_float(std::numeric_limits<float>::quiet_NaN()).to_float()));
  // Every half converts to a float and back unchanged (NaNs aside), and to its decoded value.
  bool round_trip = true;
  for (const auto& [value, b] : halves) {
    for (int negative = 0; negative < 2; ++negative) {
      const std::uint16_t sign = negative ? 0x8000u : 0u;
      const float16 v{static_cast<std::uint16_t>(b | sign)};
      round_trip = round_trip && double(v.to_float()) == (sign ? -value : value) &&
                   float16::from_float(v.to_float()).bits == v.bits;
    }
  }
  BOOST_TEST(round_trip);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(per_lane_loads_emulated_product_and_stores_give_a_times_b_plus_c, T,
                              sixteen_bit_types) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  // Tiles inside larger row-major arrays (leading dimensions past the tile) to exercise strides.
  const int lda = L::k + 3, ldb = L::k + 5, ldc = L::n + 2;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<T> a(static_cast<std::size_t>(L::m * lda)),
        kt(static_cast<std::size_t>(L::n * ldb));  // B(p, j) = kt[j·ldb + p]
    for (auto& x : a) x = T::from_float(value(rng));
    for (auto& x : kt) x = T::from_float(value(rng));
    std::vector<float> c0(static_cast<std::size_t>(L::m * ldc));
    for (auto& x : c0) x = value(rng);
    BOOST_TEST(emulated_product_errors<L>(a, lda, kt, ldb, c0, ldc) == 0);
  }
}

// AMD's MFMA layouts: each covers its matrices once, 16-bit elements in adjacent register pairs,
// and lane 21 (row / column 5 of its quarter 1) holds what AMD's matrix instruction calculator
// documents for each instruction: `v_mfma_f32_16x16x16f16` and `_16x16x16bf16_1k` A (5, 4..7), B
// (4..7, 5); `_16x16x8bf16` A (5, 2..3), B (2..3, 5); two `_16x16x4f32` A (5, 1) and (5, 5), B (1,
// 5) and (5, 5); and D rows 4..7 of column 5 for all.
template <class M>
bool mfma_layout_as_documented(const int (&a21)[M::a_per_lane][2]) {
  bool ok = covers_once(M::m, M::k, M::a_per_lane, M::a_row, M::a_col, M::lanes) &&
            covers_once(M::k, M::n, M::b_per_lane, M::b_row, M::b_col, M::lanes) &&
            covers_once(M::m, M::n, M::c_per_lane, M::c_row, M::c_col, M::lanes);
  for (int i = 0; i < M::a_per_lane; ++i) {
    ok = ok && M::a_row(21, i) == a21[i][0] && M::a_col(21, i) == a21[i][1];
    ok = ok && M::b_row(21, i) == a21[i][1] && M::b_col(21, i) == a21[i][0];
  }
  for (int i = 0; i < M::c_per_lane; ++i)
    ok = ok && M::c_row(21, i) == 4 + i && M::c_col(21, i) == 5;
  return ok;
}

BOOST_AUTO_TEST_CASE(mfma_layouts_cover_their_matrices_once_as_documented) {
  namespace ci = ctxpar::impl;
  const int k16[4][2] = {{5, 4}, {5, 5}, {5, 6}, {5, 7}};
  const int k8[2][2] = {{5, 2}, {5, 3}};
  const int f32[2][2] = {{5, 1}, {5, 5}};
  BOOST_TEST(mfma_layout_as_documented<ci::MfmaM16N16K16>(k16));
  BOOST_TEST(mfma_layout_as_documented<ci::MfmaM16N16K8>(k8));
  BOOST_TEST(mfma_layout_as_documented<ci::MfmaM16N16K8F32>(f32));
  // Which layout each operand type takes on a host compilation (no gfx908 target).
  BOOST_TEST((std::is_same_v<ci::mfma_layout_t<float16>, ci::MfmaM16N16K16>));
  BOOST_TEST((std::is_same_v<ci::mfma_layout_t<bfloat16>, ci::MfmaM16N16K16>));
  BOOST_TEST((std::is_same_v<ci::mfma_layout_t<float>, ci::MfmaM16N16K8F32>));
  BOOST_TEST(ci::is_mfma_layout_v<ci::MfmaM16N16K8>);
  BOOST_TEST(!ci::is_mfma_layout_v<ci::MmaM16N8K16>);
}

// The per-lane loads, the emulated MFMA product and the stores give A·B + C for each MFMA layout
// and operand type within the fp32 summation bound of the fp64 product of the same inputs.
template <class M, class T>
int mfma_product_errors(std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  const int lda = M::k + 3, ldb = M::k + 5, ldc = M::n + 2;
  const auto operand = [&]() {
    if constexpr (std::is_same_v<T, float>)
      return ctxpar::impl::to_tf32(value(rng));
    else
      return T::from_float(value(rng));
  };
  int wrong = 0;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<T> a(static_cast<std::size_t>(M::m * lda)),
        kt(static_cast<std::size_t>(M::n * ldb));
    for (auto& x : a) x = operand();
    for (auto& x : kt) x = operand();
    std::vector<float> c0(static_cast<std::size_t>(M::m * ldc));
    for (auto& x : c0) x = value(rng);
    wrong += emulated_product_errors<M>(a, lda, kt, ldb, c0, ldc);
  }
  return wrong;
}

BOOST_AUTO_TEST_CASE(mfma_loads_emulated_product_and_stores_give_a_times_b_plus_c) {
  namespace ci = ctxpar::impl;
  BOOST_TEST((mfma_product_errors<ci::MfmaM16N16K16, float16>(31)) == 0);
  BOOST_TEST((mfma_product_errors<ci::MfmaM16N16K16, bfloat16>(32)) == 0);
  BOOST_TEST((mfma_product_errors<ci::MfmaM16N16K8, bfloat16>(33)) == 0);
  BOOST_TEST((mfma_product_errors<ci::MfmaM16N16K8F32, float>(34)) == 0);
}

BOOST_AUTO_TEST_SUITE_END()
