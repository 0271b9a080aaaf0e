// The fp64 oracle of sliding-window attention, written for clarity: RoPE (rotate-half) at absolute
// positions, then one materialised masked softmax per query head over the whole token axis, and
// the analytic backward of the same. Independent of the library (no Kokkos, no shared code).
#pragma once

#include <Eigen/Dense>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ctxpar_test/roundoff.hpp"

namespace ctxpar::test::swa {

/// A dense token-major tensor [tokens, heads, dim] in fp64.
struct Tensor {
  std::int64_t tokens = 0, heads = 0, dim = 0;
  std::vector<double> data;
  Tensor() = default;
  Tensor(std::int64_t t, std::int64_t h, std::int64_t d)
      : tokens(t), heads(h), dim(d), data(t * h * d, 0.0) {}
  double& operator()(std::int64_t i, std::int64_t h, std::int64_t d) {
    return data[(i * heads + h) * dim + d];
  }
  double operator()(std::int64_t i, std::int64_t h, std::int64_t d) const {
    return data[(i * heads + h) * dim + d];
  }
};

/// The problem on the whole token axis.
struct Problem {
  Tensor q, k, v;
  std::vector<std::int64_t> pos;
  std::vector<std::int32_t> ids;  // empty: one document
  std::int64_t window = 0;        // 0: unlimited
  double base = 10000.0;
  double scale = 0.0;  // 0: 1/sqrt(D)
  double effective_scale() const { return scale != 0.0 ? scale : 1.0 / std::sqrt(double(q.dim)); }
  bool visible(std::int64_t i, std::int64_t j) const {
    if (pos[j] > pos[i]) return false;
    if (window > 0 && pos[i] - pos[j] >= window) return false;
    if (!ids.empty() && ids[i] != ids[j]) return false;
    return true;
  }
};

/// Rotate-half RoPE of one token's head vector at `position`; `inverse` applies the transpose.
inline void rope(double* x, std::int64_t dim, std::int64_t position, double base, bool inverse) {
  const std::int64_t half = dim / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    const double angle = double(position) * std::pow(base, -2.0 * double(i) / double(dim));
    const double c = std::cos(angle), s = inverse ? -std::sin(angle) : std::sin(angle);
    const double a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
}

inline Tensor rotated(const Tensor& x, const std::vector<std::int64_t>& pos, double base,
                      bool inverse) {
  Tensor y = x;
  for (std::int64_t i = 0; i < x.tokens; ++i)
    for (std::int64_t h = 0; h < x.heads; ++h) rope(&y(i, h, 0), x.dim, pos[i], base, inverse);
  return y;
}

/// Forward results and the intermediates the backward and the error bounds need.
struct Forward {
  Tensor out;
  Tensor q_rot, k_rot;
  std::vector<Eigen::MatrixXd> probs;  // per query head, [T, T], zero where masked
};

inline Eigen::MatrixXd head_matrix(const Tensor& x, std::int64_t h) {
  Eigen::MatrixXd m(x.tokens, x.dim);
  for (std::int64_t i = 0; i < x.tokens; ++i)
    for (std::int64_t d = 0; d < x.dim; ++d) m(i, d) = x(i, h, d);
  return m;
}

inline Forward forward(const Problem& p) {
  Forward f;
  const std::int64_t T = p.q.tokens, Hq = p.q.heads, Hkv = p.k.heads, D = p.q.dim;
  f.q_rot = rotated(p.q, p.pos, p.base, false);
  f.k_rot = rotated(p.k, p.pos, p.base, false);
  f.out = Tensor(T, Hq, D);
  const double scale = p.effective_scale();
  for (std::int64_t h = 0; h < Hq; ++h) {
    const std::int64_t hk = h / (Hq / Hkv);
    const Eigen::MatrixXd Q = head_matrix(f.q_rot, h), K = head_matrix(f.k_rot, hk),
                          V = head_matrix(p.v, hk);
    Eigen::MatrixXd S = scale * Q * K.transpose();
    Eigen::MatrixXd P = Eigen::MatrixXd::Zero(T, T);
    for (std::int64_t i = 0; i < T; ++i) {
      double m = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = 0; j < T; ++j)
        if (p.visible(i, j)) m = std::max(m, S(i, j));
      if (m == -std::numeric_limits<double>::infinity()) continue;  // no visible key: zeros
      double l = 0;
      for (std::int64_t j = 0; j < T; ++j)
        if (p.visible(i, j)) l += (P(i, j) = std::exp(S(i, j) - m));
      P.row(i) /= l;
    }
    const Eigen::MatrixXd O = P * V;
    for (std::int64_t i = 0; i < T; ++i)
      for (std::int64_t d = 0; d < D; ++d) f.out(i, h, d) = O(i, d);
    f.probs.push_back(std::move(P));
  }
  return f;
}

/// Gradients of sum(dout .* out) with respect to the raw q, k, v.
struct Backward {
  Tensor dq, dk, dv;
};

inline Backward backward(const Problem& p, const Forward& f, const Tensor& dout) {
  const std::int64_t T = p.q.tokens, Hq = p.q.heads, Hkv = p.k.heads, D = p.q.dim;
  const double scale = p.effective_scale();
  Tensor dq_rot(T, Hq, D), dk_rot(T, Hkv, D);
  Backward b{Tensor(T, Hq, D), Tensor(T, Hkv, D), Tensor(T, Hkv, D)};
  for (std::int64_t h = 0; h < Hq; ++h) {
    const std::int64_t hk = h / (Hq / Hkv);
    const Eigen::MatrixXd Q = head_matrix(f.q_rot, h), K = head_matrix(f.k_rot, hk),
                          V = head_matrix(p.v, hk);
    const Eigen::MatrixXd dO = head_matrix(dout, h), O = head_matrix(f.out, h);
    const Eigen::MatrixXd& P = f.probs[static_cast<std::size_t>(h)];
    const Eigen::MatrixXd dP = dO * V.transpose();
    const Eigen::VectorXd delta = (dO.array() * O.array()).rowwise().sum();
    const Eigen::MatrixXd dS = (P.array() * (dP.colwise() - delta).array()).matrix();
    const Eigen::MatrixXd dQ = scale * dS * K, dK = scale * dS.transpose() * Q,
                          dV = P.transpose() * dO;
    for (std::int64_t i = 0; i < T; ++i)
      for (std::int64_t d = 0; d < D; ++d) {
        dq_rot(i, h, d) = dQ(i, d);
        dk_rot(i, hk, d) += dK(i, d);
        b.dv(i, hk, d) += dV(i, d);
      }
  }
  b.dq = rotated(dq_rot, p.pos, p.base, true);
  b.dk = rotated(dk_rot, p.pos, p.base, true);
  return b;
}

/// Per-element absolute error bounds for a computation whose stored values (rotated queries and
/// keys, the output, the gradients) are rounded with unit roundoff `us` and whose arithmetic
/// (products, sums, the softmax) rounds with `ua` (`us = ua = u` for float and double; for the
/// 16-bit types the kernels compute in fp32: `us` = 2^-8 or 2^-11, `ua` = 2^-24), from first-order
/// perturbation (doubled for the second-order terms):
/// - each score carries at most (D ua + 4 us) scale sum_d |q_d||k_d| (a dot product of length D
///   plus the rounding of the stored rotated inputs); the softmax turns a score error e into a
///   relative weight error of at most 2e, and the row sum of n terms adds (n + 8) ua: together
///   eps_p per weight;
/// - every other dot product or sum of length m carries (m + 8) ua relative to the sum of |terms|,
///   and a term that reads a stored rotated query or key 2 us more;
/// - the output is rounded once to storage (4 us of its magnitude);
/// - dS = P (dP - delta) inherits eps_p, the error of dP and of delta (including the forward error
///   of the output it is computed from);
/// - the inverse rotation and the final store add 4 us of the magnitudes and mix each pair
///   (d, d + D/2);
/// - a product operand rounded once more (`uo`, tensor-core products: the queries, keys, values
///   and output gradients, and the weights P and dS before they multiply) adds 2 uo to the
///   relative error of each product: the scores, P·V, dO·Vᵀ, dS·K, dSᵀ·Q and Pᵀ·dO.
struct Bounds {
  Tensor out, dq, dk, dv;
};

inline Bounds bounds(const Problem& p, const Forward& f, const Tensor& dout,
                     const ctxpar::test::Roundoff& r) {
  const double us = r.storage, ua = r.arithmetic, uo = r.operand;
  const std::int64_t T = p.q.tokens, Hq = p.q.heads, Hkv = p.k.heads, D = p.q.dim;
  const double scale = p.effective_scale();
  Bounds b{Tensor(T, Hq, D), Tensor(T, Hq, D), Tensor(T, Hkv, D), Tensor(T, Hkv, D)};
  Tensor dq_rot(T, Hq, D), dk_rot(T, Hkv, D), dq_mag(T, Hq, D), dk_mag(T, Hkv, D);
  for (std::int64_t h = 0; h < Hq; ++h) {
    const std::int64_t hk = h / (Hq / Hkv);
    const Eigen::MatrixXd Q = head_matrix(f.q_rot, h).cwiseAbs(),
                          K = head_matrix(f.k_rot, hk).cwiseAbs();
    const Eigen::MatrixXd V = head_matrix(p.v, hk).cwiseAbs(), dO = head_matrix(dout, h).cwiseAbs();
    const Eigen::MatrixXd O = head_matrix(f.out, h).cwiseAbs();
    const Eigen::MatrixXd& P = f.probs[static_cast<std::size_t>(h)];
    const Eigen::MatrixXd QK = scale * Q * K.transpose();
    const Eigen::MatrixXd dOV = dO * V.transpose();
    for (std::int64_t i = 0; i < T; ++i) {
      double n = 0, qk = 0;
      for (std::int64_t j = 0; j < T; ++j)
        if (p.visible(i, j)) {
          n += 1;
          qk = std::max(qk, QK(i, j));
        }
      const double eps_p = 2.0 * (D * ua + 4 * us + 2 * uo) * qk + (n + 8) * ua;
      const double eps_dot = (D + n + 8) * ua;
      double delta_abs = 0, delta_err = 0;
      for (std::int64_t d = 0; d < D; ++d) {
        double sv = 0;
        for (std::int64_t j = 0; j < T; ++j) sv += P(i, j) * V(j, d);
        b.out(i, h, d) = 2.0 * ((eps_p + eps_dot + 2 * uo) * sv + 4 * us * O(i, d));
        delta_abs += dO(i, d) * O(i, d);
        delta_err += dO(i, d) * b.out(i, h, d);
      }
      delta_err += eps_dot * delta_abs;
      for (std::int64_t j = 0; j < T; ++j) {
        if (!p.visible(i, j)) continue;
        const double ds = P(i, j) * (dOV(i, j) + delta_abs);
        const double ds_err = P(i, j) * (eps_p * (dOV(i, j) + delta_abs) +
                                         (eps_dot + 2 * uo) * dOV(i, j) + delta_err);
        for (std::int64_t d = 0; d < D; ++d) {
          dq_rot(i, h, d) += 2.0 * scale * (ds_err + ds * (eps_dot + 2 * us + 2 * uo)) * K(j, d);
          dk_rot(j, hk, d) +=
              2.0 * scale * (ds_err + ds * (eps_dot + (T * Hq / Hkv + 8) * ua + 2 * us + 2 * uo)) *
              Q(i, d);
          dq_mag(i, h, d) += scale * ds * K(j, d);
          dk_mag(j, hk, d) += scale * ds * Q(i, d);
          b.dv(j, hk, d) += 2.0 * P(i, j) * dO(i, d) * (eps_p + eps_dot + (T + 8) * ua + 2 * uo);
        }
      }
    }
  }
  auto unrotate = [&](const Tensor& err, const Tensor& mag, Tensor& out) {
    for (std::int64_t i = 0; i < err.tokens; ++i)
      for (std::int64_t h = 0; h < err.heads; ++h)
        for (std::int64_t d = 0; d < D; ++d) {
          const std::int64_t partner = d < D / 2 ? d + D / 2 : d - D / 2;
          out(i, h, d) =
              err(i, h, d) + err(i, h, partner) + 4 * us * (mag(i, h, d) + mag(i, h, partner));
        }
  };
  unrotate(dq_rot, dq_mag, b.dq);
  unrotate(dk_rot, dk_mag, b.dk);
  return b;
}

/// `bounds` for a computation that stores and computes with the same unit roundoff `u`.
inline Bounds bounds(const Problem& p, const Forward& f, const Tensor& dout, double u) {
  return bounds(p, f, dout, ctxpar::test::Roundoff{u, u});
}

}  // namespace ctxpar::test::swa
