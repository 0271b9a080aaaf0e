// Host-side dense helpers of the `ctxpar hybrid` demo: the glue around the three context-parallel
// operators (projections, residual adds, gates, L2 norm, the loss) is token-local, so it runs on
// each rank's rows with plain loops in fp64 and needs no communication.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "hybrid/phase_clock.hpp"

namespace ctxpar::cli::hybrid {

/// A row-major `[rows, cols]` matrix of doubles on the host.
struct Matrix {
  std::int64_t rows = 0;     ///< rows (tokens, or input features of a weight)
  std::int64_t cols = 0;     ///< columns
  std::vector<double> data;  ///< `rows · cols` values, row-major

  Matrix() = default;
  /// A zero matrix.
  Matrix(std::int64_t r, std::int64_t c)
      : rows(r), cols(c), data(static_cast<std::size_t>(r * c), 0.0) {}
  /// Element `(i, j)`.
  double& operator()(std::int64_t i, std::int64_t j) {
    return data[static_cast<std::size_t>(i * cols + j)];
  }
  /// Element `(i, j)`.
  double operator()(std::int64_t i, std::int64_t j) const {
    return data[static_cast<std::size_t>(i * cols + j)];
  }
};

/// Deterministic value in [-1, 1) from `(seed, index)` (splitmix64), the same on every rank.
inline double uniform(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + index + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/// A weight `[in, out]` with entries uniform in `[-gain, gain) / sqrt(in)`.
inline Matrix init_weight(std::uint64_t seed, std::int64_t in, std::int64_t out,
                          double gain = 1.0) {
  Matrix w(in, out);
  const double s = gain / std::sqrt(static_cast<double>(in));
  for (std::size_t i = 0; i < w.data.size(); ++i) w.data[i] = s * uniform(seed, i);
  return w;
}

/// `a · w`: `[n, in] · [in, out] → [n, out]`.
inline Matrix matmul(const Matrix& a, const Matrix& w) {
  const PhaseScope timed(PhaseClock::glue);
  Matrix out(a.rows, w.cols);
  for (std::int64_t i = 0; i < a.rows; ++i)
    for (std::int64_t k = 0; k < a.cols; ++k) {
      const double x = a(i, k);
      if (x == 0) continue;
      for (std::int64_t j = 0; j < w.cols; ++j) out(i, j) += x * w(k, j);
    }
  return out;
}

/// `dy · wᵀ` added into `dx`: the input gradient of `matmul`.
inline void add_matmul_bt(const Matrix& dy, const Matrix& w, Matrix& dx) {
  const PhaseScope timed(PhaseClock::glue);
  for (std::int64_t i = 0; i < dy.rows; ++i)
    for (std::int64_t k = 0; k < w.rows; ++k) {
      double s = 0;
      for (std::int64_t j = 0; j < w.cols; ++j) s += dy(i, j) * w(k, j);
      dx(i, k) += s;
    }
}

/// `aᵀ · dy` added into `dw`: the weight gradient of `matmul` over this rank's rows.
inline void add_matmul_at(const Matrix& a, const Matrix& dy, Matrix& dw) {
  const PhaseScope timed(PhaseClock::glue);
  for (std::int64_t i = 0; i < a.rows; ++i)
    for (std::int64_t k = 0; k < a.cols; ++k) {
      const double x = a(i, k);
      if (x == 0) continue;
      for (std::int64_t j = 0; j < dy.cols; ++j) dw(k, j) += x * dy(i, j);
    }
}

/// `a += b` element-wise.
inline void add_into(Matrix& a, const Matrix& b) {
  for (std::size_t i = 0; i < a.data.size(); ++i) a.data[i] += b.data[i];
}

/// Logistic sigmoid.
inline double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

/// `log(sigmoid(x))`, stable for large `|x|`.
inline double log_sigmoid(double x) {
  return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
}

/// Normalises each `width`-wide group of every row to unit L2 norm (`eps` under the root); keeps
/// the norms for the backward.
inline Matrix l2_normalize(const Matrix& a, std::int64_t width, double eps,
                           std::vector<double>& norms) {
  Matrix out(a.rows, a.cols);
  const std::int64_t groups = a.cols / width;
  norms.assign(static_cast<std::size_t>(a.rows * groups), 0.0);
  for (std::int64_t i = 0; i < a.rows; ++i)
    for (std::int64_t g = 0; g < groups; ++g) {
      double s = eps;
      for (std::int64_t j = 0; j < width; ++j) s += a(i, g * width + j) * a(i, g * width + j);
      const double n = std::sqrt(s);
      norms[static_cast<std::size_t>(i * groups + g)] = n;
      for (std::int64_t j = 0; j < width; ++j) out(i, g * width + j) = a(i, g * width + j) / n;
    }
  return out;
}

/// Backward of `l2_normalize`: `dr = (dk − k (k·dk)) / |r|`, from the normalised `k` and its norms.
inline Matrix l2_normalize_backward(const Matrix& k, const Matrix& dk, std::int64_t width,
                                    const std::vector<double>& norms) {
  Matrix dr(k.rows, k.cols);
  const std::int64_t groups = k.cols / width;
  for (std::int64_t i = 0; i < k.rows; ++i)
    for (std::int64_t g = 0; g < groups; ++g) {
      double dot = 0;
      for (std::int64_t j = 0; j < width; ++j) dot += k(i, g * width + j) * dk(i, g * width + j);
      const double n = norms[static_cast<std::size_t>(i * groups + g)];
      for (std::int64_t j = 0; j < width; ++j)
        dr(i, g * width + j) = (dk(i, g * width + j) - k(i, g * width + j) * dot) / n;
    }
  return dr;
}

/// Columns `[from, from + width)` of `a`.
inline Matrix columns(const Matrix& a, std::int64_t from, std::int64_t width) {
  Matrix out(a.rows, width);
  for (std::int64_t i = 0; i < a.rows; ++i)
    for (std::int64_t j = 0; j < width; ++j) out(i, j) = a(i, from + j);
  return out;
}

/// Writes `b` into columns `[from, from + b.cols)` of `a`.
inline void set_columns(Matrix& a, std::int64_t from, const Matrix& b) {
  for (std::int64_t i = 0; i < a.rows; ++i)
    for (std::int64_t j = 0; j < b.cols; ++j) a(i, from + j) = b(i, j);
}

}  // namespace ctxpar::cli::hybrid
