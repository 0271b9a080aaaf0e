// An fp64 oracle of the whole GDP layer at P = 1, written for clarity with plain loops: causal
// depthwise conv per sequence → SiLU → split → L2 norm → gates → token-by-token gated delta
// product → y (+ D ⊙ x_V, x_V being householder copy 0 of V after SiLU), and its analytic backward.
// Independent of the library (shares no code with it).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "ctxpar/heads/channel_layout.hpp"  // GdpShape: plain sizes only

namespace heads_test {

struct GdpData {
  std::vector<double> x;                         // [T, C]
  std::vector<double> conv_w, conv_b, dt, alog;  // [Cc, w], [Cc], [H], [H]
  std::vector<double> dy, dz;                    // [T, H·d], [T, d_inner]
  std::vector<double> D;                         // [H], [d_inner] or empty, per the shape's skip
};

struct GdpResult {
  std::vector<double> y, z, y_mag;  // forward; y_mag bounds |terms| of each y
  std::vector<double> dx, dconv_w, dconv_b, ddt, dalog, dD;
};

inline double sigm(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
inline double softplus(double x) {
  return x > 20 ? x : std::log1p(std::exp(x));
}

inline GdpResult gdp_oracle(const ctxpar::heads::GdpShape& s, const std::vector<std::int64_t>& cu,
                            const GdpData& in, double eps, bool backward) {
  const int H = s.nheads, d = s.headdim, G = s.ngroups, N = s.d_state, M = s.householder,
            W = s.conv_width;
  const std::int64_t T = cu.back(), di = s.d_inner(), Cc = s.conv_channels();
  const std::int64_t C = di + Cc + std::int64_t(H) * M + H;
  const std::int64_t b0 = di + Cc, a0 = b0 + std::int64_t(H) * M;
  const double scale = 1.0 / std::sqrt(double(N));
  std::vector<std::int64_t> start(T), stop(T);
  for (std::size_t q = 0; q + 1 < cu.size(); ++q)
    for (std::int64_t t = cu[q]; t < cu[q + 1]; ++t) start[t] = cu[q], stop[t] = cu[q + 1];
  auto X = [&](std::int64_t t, std::int64_t c) { return in.x[t * C + c]; };

  // Conv + SiLU over [V | K | Q] (columns di ... di + Cc of x).
  std::vector<double> pre(T * Cc), act(T * Cc);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = 0; c < Cc; ++c) {
      double v = in.conv_b[c];
      for (int k = 0; k < W; ++k) {
        const std::int64_t src = t - (W - 1) + k;
        if (src >= start[t]) v += in.conv_w[c * W + k] * X(src, di + c);
      }
      pre[t * Cc + c] = v;
      act[t * Cc + c] = v * sigm(v);
    }
  auto vidx = [&](std::int64_t t, int m, int h, int j) { return t * Cc + m * di + h * d + j; };
  auto kidx = [&](std::int64_t t, int m, int g, int n) {
    return t * Cc + M * di + (std::int64_t(m) * G + g) * N + n;
  };
  // Normalised keys (m < M) and queries (m == M), per group.
  std::vector<double> kn(T * (M + 1) * G * N), rn(T * (M + 1) * G);
  for (std::int64_t t = 0; t < T; ++t)
    for (int m = 0; m <= M; ++m)
      for (int g = 0; g < G; ++g) {
        double ss = 0;
        for (int n = 0; n < N; ++n) ss += act[kidx(t, m, g, n)] * act[kidx(t, m, g, n)];
        const double r = 1.0 / std::sqrt(ss + eps);
        rn[(t * (M + 1) + m) * G + g] = r;
        for (int n = 0; n < N; ++n)
          kn[((t * (M + 1) + m) * G + g) * N + n] = act[kidx(t, m, g, n)] * r;
      }
  auto K = [&](std::int64_t t, int m, int g, int n) {
    return kn[((t * (M + 1) + m) * G + g) * N + n];
  };
  std::vector<double> beta(T * M * H), gate(T * H);
  for (std::int64_t t = 0; t < T; ++t) {
    for (int m = 0; m < M; ++m)
      for (int h = 0; h < H; ++h)
        beta[(t * M + m) * H + h] = sigm(X(t, b0 + std::int64_t(m) * H + h));
    for (int h = 0; h < H; ++h)
      gate[t * H + h] = -std::exp(in.alog[h]) * softplus(X(t, a0 + h) + in.dt[h]);
  }

  GdpResult out;
  out.y.assign(T * di, 0.0);
  out.y_mag.assign(T * di, 0.0);
  out.z.assign(T * di, 0.0);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = 0; c < di; ++c) out.z[t * di + c] = X(t, c);

  // Recurrence: states after every sub-step, per head, state S[n][j] (N × d).
  const int hpg = H / G;
  std::vector<double> after(T * M * H * N * d, 0.0);
  auto S = [&](std::int64_t r, int h, int n, int j) -> double& {
    return after[((r * H + h) * N + n) * d + j];
  };
  for (int h = 0; h < H; ++h) {
    const int gh = h / hpg;
    std::vector<double> mag(N * d, 0.0);
    for (std::int64_t t = 0; t < T; ++t) {
      const double alpha = std::exp(gate[t * H + h]);
      if (start[t] == t) std::fill(mag.begin(), mag.end(), 0.0);
      for (int m = 0; m < M; ++m) {
        const std::int64_t r = t * M + m;
        const double b = beta[r * H + h];
        for (int j = 0; j < d; ++j) {
          std::vector<double> prev(N);
          for (int n = 0; n < N; ++n)
            prev[n] = m > 0 ? S(r - 1, h, n, j) : (start[t] == t ? 0.0 : alpha * S(r - 1, h, n, j));
          double ks = 0, kmag = 0;
          for (int n = 0; n < N; ++n)
            ks += K(t, m, gh, n) * prev[n], kmag += std::fabs(K(t, m, gh, n)) * mag[n * d + j];
          const double e = act[vidx(t, m, h, j)] - ks;
          const double emag = std::fabs(act[vidx(t, m, h, j)]) + kmag;
          for (int n = 0; n < N; ++n) {
            S(r, h, n, j) = prev[n] + b * K(t, m, gh, n) * e;
            mag[n * d + j] =
                mag[n * d + j] * (m == 0 ? alpha : 1.0) + b * std::fabs(K(t, m, gh, n)) * emag;
          }
        }
      }
      for (int j = 0; j < d; ++j) {
        double o = 0, om = 0;
        for (int n = 0; n < N; ++n)
          o += K(t, M, gh, n) * S(t * M + M - 1, h, n, j),
              om += std::fabs(K(t, M, gh, n)) * mag[n * d + j];
        out.y[t * di + h * d + j] = scale * o;
        out.y_mag[t * di + h * d + j] = scale * om;
      }
    }
  }
  // Skip term: y(t, h, j) += D · act(V copy 0, h, j).
  const bool has_d = s.skip != ctxpar::heads::SkipTerm::none;
  const bool d_per_head = s.skip == ctxpar::heads::SkipTerm::per_head;
  auto d_index = [&](int h, int j) { return d_per_head ? h : h * d + j; };
  if (has_d)
    for (std::int64_t t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int j = 0; j < d; ++j) {
          const double term = in.D[d_index(h, j)] * act[vidx(t, 0, h, j)];
          out.y[t * di + h * d + j] += term;
          out.y_mag[t * di + h * d + j] += std::fabs(term);
        }
  if (!backward) return out;

  // Backward through the recurrence.
  std::vector<double> dkn(kn.size(), 0.0), dv(T * M * H * d, 0.0), dbeta(T * M * H, 0.0),
      dgate(T * H, 0.0);
  for (int h = 0; h < H; ++h) {
    const int gh = h / hpg;
    std::vector<double> ds(N * d, 0.0);
    for (std::int64_t t = T - 1; t >= 0; --t) {
      if (stop[t] == t + 1) std::fill(ds.begin(), ds.end(), 0.0);
      const double alpha = std::exp(gate[t * H + h]);
      const bool first = start[t] == t;
      const std::int64_t rl = t * M + M - 1;
      for (int n = 0; n < N; ++n)
        for (int j = 0; j < d; ++j) {
          const double go = in.dy[t * di + h * d + j];
          dkn[((t * (M + 1) + M) * G + gh) * N + n] += scale * S(rl, h, n, j) * go;
          ds[n * d + j] += scale * K(t, M, gh, n) * go;
        }
      for (int m = M - 1; m >= 0; --m) {
        const std::int64_t r = t * M + m;
        const double b = beta[r * H + h];
        auto before = [&](int n, int j) {
          return m > 0 ? S(r - 1, h, n, j) : (first ? 0.0 : alpha * S(r - 1, h, n, j));
        };
        std::vector<double> e(d), kd(d);
        for (int j = 0; j < d; ++j) {
          double ks = 0, k2 = 0;
          for (int n = 0; n < N; ++n)
            ks += K(t, m, gh, n) * before(n, j), k2 += K(t, m, gh, n) * ds[n * d + j];
          e[j] = act[vidx(t, m, h, j)] - ks;
          kd[j] = k2;
          dv[(r * H + h) * d + j] = b * k2;
        }
        double db = 0;
        for (int n = 0; n < N; ++n) {
          double de = 0, sk = 0;
          for (int j = 0; j < d; ++j) de += ds[n * d + j] * e[j], sk += before(n, j) * kd[j];
          db += K(t, m, gh, n) * de;
          dkn[((t * (M + 1) + m) * G + gh) * N + n] += b * (de - sk);
        }
        dbeta[r * H + h] = db;
        for (int n = 0; n < N; ++n)
          for (int j = 0; j < d; ++j) ds[n * d + j] -= b * K(t, m, gh, n) * kd[j];
      }
      double da = 0;
      if (!first)
        for (int n = 0; n < N; ++n)
          for (int j = 0; j < d; ++j) da += ds[n * d + j] * S(t * M - 1, h, n, j);
      dgate[t * H + h] = da * alpha;
      for (double& v : ds) v *= alpha;
    }
  }
  // Back to the conv activations, through the L2 norms (and the skip term).
  out.dD.assign(in.D.size(), 0.0);
  std::vector<double> dact(T * Cc, 0.0);
  for (std::int64_t t = 0; t < T; ++t) {
    for (int m = 0; m < M; ++m)
      for (int h = 0; h < H; ++h)
        for (int j = 0; j < d; ++j) dact[vidx(t, m, h, j)] = dv[((t * M + m) * H + h) * d + j];
    if (has_d)
      for (int h = 0; h < H; ++h)
        for (int j = 0; j < d; ++j) {
          const double go = in.dy[t * di + h * d + j];
          dact[vidx(t, 0, h, j)] += in.D[d_index(h, j)] * go;
          out.dD[d_index(h, j)] += go * act[vidx(t, 0, h, j)];
        }
    for (int m = 0; m <= M; ++m)
      for (int g = 0; g < G; ++g) {
        const double r = rn[(t * (M + 1) + m) * G + g];
        double dot = 0;
        for (int n = 0; n < N; ++n) dot += dkn[((t * (M + 1) + m) * G + g) * N + n] * K(t, m, g, n);
        for (int n = 0; n < N; ++n)
          dact[kidx(t, m, g, n)] =
              r * (dkn[((t * (M + 1) + m) * G + g) * N + n] - K(t, m, g, n) * dot);
      }
  }
  out.dx.assign(T * C, 0.0);
  out.dconv_w.assign(Cc * W, 0.0);
  out.dconv_b.assign(Cc, 0.0);
  out.ddt.assign(H, 0.0);
  out.dalog.assign(H, 0.0);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t c = 0; c < Cc; ++c) {
      const double p = pre[t * Cc + c], sg = sigm(p);
      const double dp = dact[t * Cc + c] * sg * (1 + p * (1 - sg));
      out.dconv_b[c] += dp;
      for (int k = 0; k < W; ++k) {
        const std::int64_t src = t - (W - 1) + k;
        if (src >= start[t]) {
          out.dconv_w[c * W + k] += dp * X(src, di + c);
          out.dx[src * C + di + c] += dp * in.conv_w[c * W + k];
        }
      }
    }
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t c = 0; c < di; ++c) out.dx[t * C + c] = in.dz[t * di + c];
    for (int m = 0; m < M; ++m)
      for (int h = 0; h < H; ++h) {
        const double b = beta[(t * M + m) * H + h];
        out.dx[t * C + b0 + std::int64_t(m) * H + h] = dbeta[(t * M + m) * H + h] * b * (1 - b);
      }
    for (int h = 0; h < H; ++h) {
      const double z = X(t, a0 + h) + in.dt[h];
      const double da = -dgate[t * H + h] * std::exp(in.alog[h]) * sigm(z);
      out.dx[t * C + a0 + h] = da;
      out.ddt[h] += da;
      out.dalog[h] += dgate[t * H + h] * gate[t * H + h];
    }
  }
  return out;
}

/// L = Σ dy·y + Σ dz·z of the oracle's forward, for finite differences.
inline double gdp_loss(const ctxpar::heads::GdpShape& s, const std::vector<std::int64_t>& cu,
                       const GdpData& in, double eps) {
  const GdpResult r = gdp_oracle(s, cu, in, eps, false);
  double l = 0;
  for (std::size_t i = 0; i < r.y.size(); ++i) l += in.dy[i] * r.y[i] + in.dz[i] * r.z[i];
  return l;
}

}  // namespace heads_test
