/// \file
/// The compute ceiling: Eigen SGEMM (fp32, one thread) in GFLOP/s, measured in the same run as the
/// kernel it is compared with, so the ratio survives a noisy machine.
#pragma once

#include <Eigen/Core>

#include <cmath>
#include <stdexcept>
#include <string>

#include "common/timing.hpp"

namespace ctxpar::bench {

/// Result of one SGEMM ceiling measurement.
struct SgemmCeiling {
  /// Matrix size (n × n times n × n).
  int n = 0;
  /// GFLOP/s from the median repeat, counting 2·n³ flops.
  double gflops = 0;
  /// GFLOP/s from the fastest repeat.
  double best_gflops = 0;
  /// The repeats.
  Timing timing;
};

/// Measures C = A·B for n × n float matrices on one thread with Eigen (restoring Eigen's thread
/// count afterwards). Checks one entry against a plain double-precision dot product so a broken
/// build cannot report a fast wrong ceiling.
inline SgemmCeiling sgemm_ceiling(int n = 1024, int repeats = 5) {
  const int saved_threads = Eigen::nbThreads();
  Eigen::setNbThreads(1);
  Eigen::MatrixXf a(n, n), b(n, n), c(n, n);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < n; ++i) {
      a(i, j) = static_cast<float>(std::sin(0.37 * i + 1.1 * j));
      b(i, j) = static_cast<float>(std::cos(0.53 * i - 0.7 * j));
    }
  }
  SgemmCeiling out;
  out.n = n;
  out.timing = time_it([&] { c.noalias() = a * b; }, 1, repeats);
  Eigen::setNbThreads(saved_threads);
  double expected = 0, magnitude = 0;
  const int row = n / 3, col = n / 2;
  for (int k = 0; k < n; ++k) {
    expected += double(a(row, k)) * double(b(k, col));
    magnitude += std::fabs(double(a(row, k)) * double(b(k, col)));
  }
  if (!(std::fabs(double(c(row, col)) - expected) <= 2.0 * n * 0x1p-24 * magnitude)) {
    throw std::runtime_error("ctxpar::bench::sgemm_ceiling: wrong product at n=" +
                             std::to_string(n));
  }
  const double flops = 2.0 * double(n) * double(n) * double(n);
  out.gflops = flops / out.timing.median_s * 1e-9;
  out.best_gflops = flops / out.timing.min_s * 1e-9;
  return out;
}

/// Same-run SGEMM ceiling in GFLOP/s (fp32, one thread, median of the repeats). Benchmarks print
/// it next to their own GFLOP/s and report the ratio.
inline double sgemm_gflops(int n = 1024, int repeats = 5) {
  return sgemm_ceiling(n, repeats).gflops;
}

}  // namespace ctxpar::bench
