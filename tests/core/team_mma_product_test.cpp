// The team product on tensor cores (core/impl/team_mma_product.hpp) on the host, where the warps
// are emulated, in NVIDIA's m16n8 layouts and in AMD's MFMA layouts (the source a HIP device
// runs): for bfloat16, float16 and TF32 operands, every wanted element of C is the fp64
// product of the operands rounded to that type within the fp32 summation bound, for plain,
// transposed, lower- and upper-band left operands, edges that are not multiples of the 16×8 tiles,
// accumulation and the lower-output skip; nothing outside C is written; and the result has the
// same bits whether one warp or three compute it.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "ctxpar/core/bfloat16.hpp"
#include "ctxpar/core/float16.hpp"
#include "ctxpar/core/impl/mfma_fragment.hpp"
#include "ctxpar/core/impl/team_mma_product.hpp"

namespace {

using ctxpar::bfloat16;
using ctxpar::float16;
using ctxpar::impl::Band;
using ctxpar::impl::Left;

// The team as the product sees it: a rank and a size. The host runs a warp per thread; calling
// the product once per rank, one after the other, is what a team of that many threads does.
struct SequentialMember {
  int rank, size;
  int team_rank() const { return rank; }
  int team_size() const { return size; }
};

// x as the product reads it: rounded to the operand type (TF32 for float).
template <class Operand>
double rounded(float x) {
  if constexpr (std::is_same_v<Operand, float>)
    return ctxpar::impl::to_tf32(x);
  else
    return Operand::from_float(x).to_float();
}

template <class Operand>
std::string name() {
  if constexpr (std::is_same_v<Operand, float>) return "tf32";
  if constexpr (std::is_same_v<Operand, bfloat16>) return "bfloat16";
  return "float16";
}

struct Case {
  const char* what;
  int m, n, k;
  bool transposed;  // A stored k×m, read through its transpose
  Band band;
  bool accumulate, lower_output;
  float alpha;
};

// Runs one case with `warps` warps of layout `Layout` and checks it; returns the computed C (with
// its padding).
template <class Operand, class Layout>
std::vector<float> run_case(const Case& cs, int warps, std::uint32_t seed, bool& ok) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int lda = cs.transposed ? cs.m + 3 : cs.k + 3, ldb = cs.n + 5, ldc = cs.n + 2;
  const int a_rows = cs.transposed ? cs.k : cs.m;
  std::vector<float> a(static_cast<std::size_t>(a_rows * lda)),
      b(static_cast<std::size_t>(cs.k * ldb));
  for (auto& x : a) x = dist(rng);
  for (auto& x : b) x = dist(rng);
  const auto a_at = [&](int i, int p) -> float& {
    return cs.transposed ? a[static_cast<std::size_t>(p * lda + i)]
                         : a[static_cast<std::size_t>(i * lda + p)];
  };
  // A band operand holds zeros where the band says it does.
  for (int i = 0; i < cs.m; ++i)
    for (int p = 0; p < cs.k; ++p)
      if ((cs.band == Band::lower && p > i) || (cs.band == Band::upper && p < i)) a_at(i, p) = 0;
  std::vector<float> c0(static_cast<std::size_t>(cs.m * ldc));
  for (auto& x : c0) x = dist(rng);
  std::vector<float> c = c0;
  const Left<float> left = cs.transposed ? ctxpar::impl::transposed(a.data(), lda, cs.band)
                                         : ctxpar::impl::rows(a.data(), lda, cs.band);
  for (int rank = 0; rank < warps; ++rank)
    ctxpar::impl::team_mma_gemm<Operand, Layout>(SequentialMember{rank, warps}, cs.m, cs.n, cs.k,
                                                 cs.alpha, left, b.data(), ldb, c.data(), ldc,
                                                 cs.accumulate, cs.lower_output);
  const double u = std::ldexp(1.0, -24), gamma = (cs.k + 3) * u / (1 - (cs.k + 3) * u);
  int wrong = 0;
  for (int i = 0; i < cs.m; ++i) {
    for (int j = 0; j < ldc; ++j) {
      const std::size_t at = static_cast<std::size_t>(i * ldc + j);
      if (j >= cs.n) {  // padding: never written
        if (c[at] != c0[at] && ++wrong <= 5)
          std::cerr << name<Operand>() << " " << cs.what << ": padding (" << i << ", " << j
                    << ") written\n";
        continue;
      }
      if (cs.lower_output && j > i) continue;
      double sum = 0, magnitude = 0;
      for (int p = 0; p < cs.k; ++p) {
        const double term = rounded<Operand>(a_at(i, p)) *
                            rounded<Operand>(b[static_cast<std::size_t>(p * ldb + j)]);
        sum += term;
        magnitude += std::fabs(term);
      }
      const double old = cs.accumulate ? c0[at] : 0.0;
      const double want = old + cs.alpha * sum;
      const double bound = gamma * (std::fabs(cs.alpha) * magnitude + std::fabs(old));
      if (!(std::fabs(c[at] - want) <= bound) && ++wrong <= 5)
        std::cerr << name<Operand>() << " " << cs.what << " with " << warps << " warps: C(" << i
                  << ", " << j << ") = " << c[at] << ", want " << want << " ± " << bound << "\n";
    }
  }
  ok = ok && wrong == 0;
  return c;
}

template <class Operand, class Layout = ctxpar::impl::mma_layout_t<Operand>>
bool all_cases() {
  const Case cases[] = {
      {"plain, ragged edges", 37, 21, 19, false, Band::full, false, false, 1.0f},
      {"transposed, lower output", 64, 64, 128, true, Band::full, false, true, 1.0f},
      {"lower band, accumulated", 40, 24, 40, false, Band::lower, true, false, -0.5f},
      {"upper band", 24, 9, 30, false, Band::upper, false, false, 2.0f},
      {"one element", 1, 1, 1, false, Band::full, true, false, 1.0f},
      // Five column tiles: strips of two tiles and a last one of one, some above the diagonal.
      {"lower output, odd tile count", 40, 40, 24, false, Band::full, true, true, 1.0f},
  };
  bool ok = true;
  std::uint32_t seed = 7;
  for (const Case& cs : cases) {
    const std::vector<float> one = run_case<Operand, Layout>(cs, 1, seed, ok);
    const std::vector<float> three = run_case<Operand, Layout>(cs, 3, seed, ok);
    if (one != three) {
      std::cerr << name<Operand>() << " " << cs.what << ": one warp and three differ\n";
      ok = false;
    }
    ++seed;
  }
  return ok;
}

}  // namespace

BOOST_AUTO_TEST_CASE(bfloat16_team_product_is_the_rounded_operands_product) {
  BOOST_CHECK(all_cases<bfloat16>());
}

BOOST_AUTO_TEST_CASE(float16_team_product_is_the_rounded_operands_product) {
  BOOST_CHECK(all_cases<float16>());
}

BOOST_AUTO_TEST_CASE(tf32_team_product_is_the_rounded_operands_product) {
  BOOST_CHECK(all_cases<float>());
}

// The same cases in AMD's MFMA layouts (16×16 tiles, wavefronts of 64 lanes), as a HIP device
// runs them: IEEE half and bfloat16 16 deep, bfloat16 8 deep (gfx908), TF32 operands in the
// 8-deep fp32 layout.
BOOST_AUTO_TEST_CASE(mfma_team_products_are_the_rounded_operands_products) {
  namespace ci = ctxpar::impl;
  BOOST_CHECK((all_cases<float16, ci::MfmaM16N16K16>()));
  BOOST_CHECK((all_cases<bfloat16, ci::MfmaM16N16K16>()));
  BOOST_CHECK((all_cases<bfloat16, ci::MfmaM16N16K8>()));
  BOOST_CHECK((all_cases<float, ci::MfmaM16N16K8F32>()));
}

// A device team that multiplies on tensor cores is whole warps: the recommended size rounded down
// to a multiple of 32 (never below one warp), within the launch's largest; none fits below 32.
BOOST_AUTO_TEST_CASE(tensor_core_teams_are_whole_warps) {
  using ctxpar::impl::whole_warps;
  BOOST_TEST(whole_warps(256, 1024) == 256);
  BOOST_TEST(whole_warps(100, 1024) == 96);
  BOOST_TEST(whole_warps(20, 1024) == 32);
  BOOST_TEST(whole_warps(1, 64) == 32);
  BOOST_TEST(whole_warps(512, 200) == 192);
  BOOST_TEST(whole_warps(64, 31) == 0);
  // A HIP wavefront is 64 lanes; every other space's warp 32.
  BOOST_TEST(whole_warps(100, 1024, 64) == 64);
  BOOST_TEST(whole_warps(32, 1024, 64) == 64);
  BOOST_TEST(whole_warps(256, 63, 64) == 0);
  BOOST_TEST(ctxpar::impl::team_mma_lanes_v<Kokkos::DefaultHostExecutionSpace> == 32);
  BOOST_TEST(ctxpar::impl::has_team_mma_v<Kokkos::DefaultHostExecutionSpace>);
  BOOST_TEST(!ctxpar::impl::team_mma_by_default_v<Kokkos::DefaultHostExecutionSpace>);
}
