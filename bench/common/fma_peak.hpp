/// \file
/// The core's arithmetic ceiling: fp32 fused multiply-adds in registers on one thread, in the
/// vector width the host kernels use (`ctxpar::impl::simd_t<float>`). No load, no store, enough
/// independent chains to hide the FMA latency: the GFLOP/s no kernel of this build can exceed
/// on one thread. Eigen's SGEMM is a reference below it (packing, loads, edge tiles).
#pragma once

#include <stdexcept>

#include "common/timing.hpp"
#include "ctxpar/core/impl/simd.hpp"

namespace ctxpar::bench {

/// Result of one FMA-peak measurement.
struct FmaPeak {
  /// fp32 lanes per vector and independent FMA chains.
  int lanes = 0, chains = 0;
  /// GFLOP/s from the median repeat, counting 2 flops per lane per FMA.
  double gflops = 0;
  /// GFLOP/s from the fastest repeat.
  double best_gflops = 0;
  /// The repeats.
  Timing timing;
};

namespace detail {

/// `iterations` rounds of `Chains` independent `x = x * m + a` in registers; returns their sum so
/// the work is observable. `m` and `a` keep every chain bounded (the fixed point of x·m + a).
template <int Chains>
__attribute__((noinline)) float fma_chains(long iterations, float m, float a) {
  using simd = ctxpar::impl::simd_t<float>;
  simd x[Chains];
  for (int c = 0; c < Chains; ++c) x[c] = ctxpar::impl::simd_broadcast<float>(0.01f * c);
  const simd mv = ctxpar::impl::simd_broadcast<float>(m);
  const simd av = ctxpar::impl::simd_broadcast<float>(a);
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < Chains; ++c) x[c] = x[c] * mv + av;
  simd sum = x[0];
  for (int c = 1; c < Chains; ++c) sum = sum + x[c];
  return ctxpar::impl::simd_sum<float>(sum);
}

}  // namespace detail

/// Measures the fp32 FMA peak on the calling thread (about 0.1 s per repeat on a 2020s core).
/// Checks the chains' sum against its fixed point so a miscompiled loop cannot report a ceiling.
inline FmaPeak fma_peak_ceiling(int repeats = 5) {
  constexpr int chains = 12;  // covers latency 4 × 2 FMA ports with room to spare
  const long iterations = 1L << 23;
  const float m = 0.5f, a = 1.0f;  // x → 2
  float result = 0;
  FmaPeak out;
  out.lanes = ctxpar::impl::Simd<float>::lanes;
  out.chains = chains;
  out.timing = time_it([&] { result = detail::fma_chains<chains>(iterations, m, a); }, 1, repeats);
  const float expected = 2.0f * chains * out.lanes;
  if (!(result > 0.999f * expected && result < 1.001f * expected))
    throw std::runtime_error("ctxpar::bench::fma_peak_ceiling: wrong chain sum");
  const double flops = 2.0 * out.lanes * chains * double(iterations);
  out.gflops = flops / out.timing.median_s * 1e-9;
  out.best_gflops = flops / out.timing.min_s * 1e-9;
  return out;
}

}  // namespace ctxpar::bench
