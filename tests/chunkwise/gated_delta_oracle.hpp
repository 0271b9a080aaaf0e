// fp64 token-by-token oracle of the gated delta rule (GDN) and the gated delta product (GDP),
// with its reverse-mode gradient written out by hand. Written for clarity, not speed: it is
// what the chunkwise kernels are checked against, and it is itself checked against central
// finite differences.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "ctxpar_test/harness.hpp"

namespace ctxpar::test::gated_delta {

/// Inputs of one packed problem on one rank (or the whole sequence for the oracle). Layouts,
/// all row-major: q [T, H, K]; k [T, n_h, H, K]; v [T, n_h, H, V]; g [T, H]; beta [T, n_h, H];
/// h0 [N, H, K, V] (empty: zero initial states); cu_seqlens [N + 1] over tokens.
struct Problem {
  int tokens = 0, n_h = 1, heads = 1, key_dim = 1, value_dim = 1;
  double scale = 1;
  std::vector<int> cu_seqlens;
  std::vector<double> q, k, v, g, beta, h0;

  int sequences() const { return static_cast<int>(cu_seqlens.size()) - 1; }
  std::size_t qi(int t, int h, int d) const { return (std::size_t(t) * heads + h) * key_dim + d; }
  std::size_t ki(int t, int j, int h, int d) const {
    return ((std::size_t(t) * n_h + j) * heads + h) * key_dim + d;
  }
  std::size_t vi(int t, int j, int h, int d) const {
    return ((std::size_t(t) * n_h + j) * heads + h) * value_dim + d;
  }
  std::size_t oi(int t, int h, int d) const { return (std::size_t(t) * heads + h) * value_dim + d; }
  std::size_t gi(int t, int h) const { return std::size_t(t) * heads + h; }
  std::size_t bi(int t, int j, int h) const { return (std::size_t(t) * n_h + j) * heads + h; }
  std::size_t si(int n, int h, int a, int b) const {
    return ((std::size_t(n) * heads + h) * key_dim + a) * value_dim + b;
  }
};

/// Deterministic, well-conditioned inputs as a GDN layer produces them: unit-norm keys (the
/// caller's L2 normalisation), beta in (0, 1), log-gates in (-0.4, 0). Entry (t, ...) depends
/// only on (seed, global token index), so a shard and the whole sequence agree.
inline Problem make_problem(std::uint64_t seed, int tokens, int n_h, int heads, int key_dim,
                            int value_dim, std::vector<int> cu_seqlens, bool with_h0,
                            int token_offset = 0) {
  Problem p;
  p.tokens = tokens, p.n_h = n_h, p.heads = heads, p.key_dim = key_dim, p.value_dim = value_dim;
  p.scale = 1.0 / std::sqrt(double(key_dim));
  p.cu_seqlens = std::move(cu_seqlens);
  p.q.resize(std::size_t(tokens) * heads * key_dim);
  p.k.resize(std::size_t(tokens) * n_h * heads * key_dim);
  p.v.resize(std::size_t(tokens) * n_h * heads * value_dim);
  p.g.resize(std::size_t(tokens) * heads);
  p.beta.resize(std::size_t(tokens) * n_h * heads);
  for (int t = 0; t < tokens; ++t) {
    const std::uint64_t gt = std::uint64_t(t + token_offset);
    for (int h = 0; h < heads; ++h) {
      const std::uint64_t base = (gt * 64 + h) * 4096;
      for (int d = 0; d < key_dim; ++d) p.q[p.qi(t, h, d)] = uniform(seed, base + d);
      p.g[p.gi(t, h)] = -0.2 * (1.0 + uniform(seed + 1, base));
      for (int j = 0; j < n_h; ++j) {
        double norm = 0;
        for (int d = 0; d < key_dim; ++d) {
          const double x = uniform(seed + 2, base + 512 * j + d) + 0.1;
          p.k[p.ki(t, j, h, d)] = x;
          norm += x * x;
        }
        for (int d = 0; d < key_dim; ++d) p.k[p.ki(t, j, h, d)] /= std::sqrt(norm);
        for (int d = 0; d < value_dim; ++d)
          p.v[p.vi(t, j, h, d)] = uniform(seed + 3, base + 512 * j + d);
        p.beta[p.bi(t, j, h)] = 0.5 + 0.45 * uniform(seed + 4, base + j);
      }
    }
  }
  if (with_h0) {
    p.h0.resize(std::size_t(p.sequences()) * heads * key_dim * value_dim);
    for (std::size_t i = 0; i < p.h0.size(); ++i) p.h0[i] = 0.5 * uniform(seed + 5, i);
  }
  return p;
}

/// Forward results: o [T, H, V], final states ht [N, H, K, V].
struct Forward {
  std::vector<double> o, ht;
};

/// Gradients, same layouts as the inputs.
struct Gradients {
  std::vector<double> dq, dk, dv, dg, dbeta, dh0;
};

namespace impl {
// One head of one sequence: states[s] is the state after sub-step s (states[0] the initial).
inline void run_head(const Problem& p, int n, int h, std::vector<std::vector<double>>& states) {
  const int K = p.key_dim, V = p.value_dim, b = p.cu_seqlens[n], e = p.cu_seqlens[n + 1];
  std::vector<double> s(std::size_t(K) * V, 0.0);
  if (!p.h0.empty())
    for (int a = 0; a < K; ++a)
      for (int c = 0; c < V; ++c) s[std::size_t(a) * V + c] = p.h0[p.si(n, h, a, c)];
  states.assign(1, s);
  for (int t = b; t < e; ++t) {
    for (int j = 0; j < p.n_h; ++j) {
      const double alpha = j == 0 ? std::exp(p.g[p.gi(t, h)]) : 1.0;
      const double beta = p.beta[p.bi(t, j, h)];
      // S = alpha S; u = beta (v - S^T k); S += k u^T
      for (double& x : s) x *= alpha;
      for (int c = 0; c < V; ++c) {
        double pred = 0;
        for (int a = 0; a < K; ++a) pred += s[std::size_t(a) * V + c] * p.k[p.ki(t, j, h, a)];
        const double u = beta * (p.v[p.vi(t, j, h, c)] - pred);
        for (int a = 0; a < K; ++a) s[std::size_t(a) * V + c] += p.k[p.ki(t, j, h, a)] * u;
      }
      states.push_back(s);
    }
  }
}
}  // namespace impl

/// The recurrence S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T per sub-step,
/// o_t = scale S_t^T q_t read after the last sub-step of each token.
inline Forward forward(const Problem& p) {
  const int K = p.key_dim, V = p.value_dim, H = p.heads;
  Forward f;
  f.o.assign(std::size_t(p.tokens) * H * V, 0.0);
  f.ht.assign(std::size_t(p.sequences()) * H * K * V, 0.0);
  std::vector<std::vector<double>> states;
  for (int n = 0; n < p.sequences(); ++n) {
    for (int h = 0; h < H; ++h) {
      impl::run_head(p, n, h, states);
      for (int t = p.cu_seqlens[n]; t < p.cu_seqlens[n + 1]; ++t) {
        const auto& s = states[std::size_t(t - p.cu_seqlens[n] + 1) * p.n_h];
        for (int c = 0; c < V; ++c) {
          double acc = 0;
          for (int a = 0; a < K; ++a) acc += s[std::size_t(a) * V + c] * p.q[p.qi(t, h, a)];
          f.o[p.oi(t, h, c)] = p.scale * acc;
        }
      }
      for (int a = 0; a < K; ++a)
        for (int c = 0; c < V; ++c) f.ht[p.si(n, h, a, c)] = states.back()[std::size_t(a) * V + c];
    }
  }
  return f;
}

/// Reverse mode of `forward` for L = <do, o> + <dht, ht> (dht may be empty: zero).
///   D_t = dL/dS_t;  S_t = Sbar + k u^T, Sbar = alpha S_{t-1}, u = beta (v - Sbar^T k)
///   du = D^T k, dk = D u - beta Sbar du, dbeta = (v - Sbar^T k).du, dv = beta du,
///   dSbar = D - beta k du^T, dg = <Sbar, dSbar>, D_{t-1} = alpha dSbar (+ q do^T at query reads).
inline Gradients backward(const Problem& p, const std::vector<double>& dout,
                          const std::vector<double>& dht) {
  const int K = p.key_dim, V = p.value_dim, H = p.heads;
  Gradients gr;
  gr.dq.assign(p.q.size(), 0.0);
  gr.dk.assign(p.k.size(), 0.0);
  gr.dv.assign(p.v.size(), 0.0);
  gr.dg.assign(p.g.size(), 0.0);
  gr.dbeta.assign(p.beta.size(), 0.0);
  gr.dh0.assign(std::size_t(p.sequences()) * H * K * V, 0.0);
  std::vector<std::vector<double>> states;
  for (int n = 0; n < p.sequences(); ++n) {
    const int b = p.cu_seqlens[n], e = p.cu_seqlens[n + 1];
    for (int h = 0; h < H; ++h) {
      impl::run_head(p, n, h, states);
      std::vector<double> D(std::size_t(K) * V, 0.0);
      if (!dht.empty())
        for (int a = 0; a < K; ++a)
          for (int c = 0; c < V; ++c) D[std::size_t(a) * V + c] = dht[p.si(n, h, a, c)];
      for (int t = e - 1; t >= b; --t) {
        for (int j = p.n_h - 1; j >= 0; --j) {
          const std::size_t step = std::size_t(t - b) * p.n_h + j;
          const auto& prev = states[step];
          const auto& cur = states[step + 1];
          if (j == p.n_h - 1) {
            // o_t = scale cur^T q_t
            for (int a = 0; a < K; ++a) {
              double acc = 0;
              for (int c = 0; c < V; ++c) {
                acc += cur[std::size_t(a) * V + c] * dout[p.oi(t, h, c)];
                D[std::size_t(a) * V + c] += p.scale * p.q[p.qi(t, h, a)] * dout[p.oi(t, h, c)];
              }
              gr.dq[p.qi(t, h, a)] = p.scale * acc;
            }
          }
          const double alpha = j == 0 ? std::exp(p.g[p.gi(t, h)]) : 1.0;
          const double beta = p.beta[p.bi(t, j, h)];
          std::vector<double> sbar(prev);
          for (double& x : sbar) x *= alpha;
          std::vector<double> du(V, 0.0), r(V, 0.0), u(V, 0.0);
          for (int c = 0; c < V; ++c) {
            double pred = 0, acc = 0;
            for (int a = 0; a < K; ++a) {
              pred += sbar[std::size_t(a) * V + c] * p.k[p.ki(t, j, h, a)];
              acc += D[std::size_t(a) * V + c] * p.k[p.ki(t, j, h, a)];
            }
            r[c] = p.v[p.vi(t, j, h, c)] - pred;
            u[c] = beta * r[c];
            du[c] = acc;
          }
          double dbeta = 0;
          for (int c = 0; c < V; ++c) {
            dbeta += r[c] * du[c];
            gr.dv[p.vi(t, j, h, c)] = beta * du[c];
          }
          gr.dbeta[p.bi(t, j, h)] = dbeta;
          for (int a = 0; a < K; ++a) {
            double acc = 0;
            for (int c = 0; c < V; ++c)
              acc += D[std::size_t(a) * V + c] * u[c] - beta * sbar[std::size_t(a) * V + c] * du[c];
            gr.dk[p.ki(t, j, h, a)] = acc;
          }
          double dg = 0;
          for (int a = 0; a < K; ++a)
            for (int c = 0; c < V; ++c) {
              const std::size_t i = std::size_t(a) * V + c;
              const double dsbar = D[i] - beta * p.k[p.ki(t, j, h, a)] * du[c];
              dg += sbar[i] * dsbar;
              D[i] = alpha * dsbar;
            }
          if (j == 0) gr.dg[p.gi(t, h)] = dg;
        }
      }
      for (int a = 0; a < K; ++a)
        for (int c = 0; c < V; ++c) gr.dh0[p.si(n, h, a, c)] = D[std::size_t(a) * V + c];
    }
  }
  return gr;
}

/// L = <do, o> + <dht, ht> evaluated by the forward oracle (for finite differences).
inline double loss(const Problem& p, const std::vector<double>& dout,
                   const std::vector<double>& dht) {
  const Forward f = forward(p);
  double l = 0;
  for (std::size_t i = 0; i < f.o.size(); ++i) l += f.o[i] * dout[i];
  for (std::size_t i = 0; i < dht.size(); ++i) l += f.ht[i] * dht[i];
  return l;
}

}  // namespace ctxpar::test::gated_delta
