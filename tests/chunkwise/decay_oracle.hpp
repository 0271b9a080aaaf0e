// fp64 token-by-token recurrence oracle of the scalar-decay and diagonal-gate families, with its
// hand-written backward, per-element error bounds, and the adapters the generic CP checker uses.
//   S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ   (scalar family: g_t broadcast over the K rows)
//   o_t = scale · S_tᵀ q_t
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "chunkwise/chunkwise_test_support.hpp"
#include "ctxpar/chunkwise/diagonal_gate.hpp"
#include "ctxpar/chunkwise/scalar_decay.hpp"

namespace ctxpar::test::chunkwise {

/// Global inputs of one decay problem (fp64, token-major).
struct DecayProblem {
  std::int64_t T = 0, H = 0, K = 0, V = 0, G = 1;
  bool diagonal = false;
  double scale = 1.0;
  int chunk = 16;
  std::vector<std::int64_t> cu;
  std::vector<double> q, k, v, g, dout, h0, dht;

  std::int64_t N() const { return static_cast<std::int64_t>(cu.size()) - 1; }
};

/// Deterministic problem: q, k, v, dout, h0, dht in [-1, 1); log-gates in [-0.065, -0.005].
inline DecayProblem make_decay_problem(std::int64_t H, std::int64_t K, std::int64_t V,
                                       bool diagonal, std::vector<std::int64_t> cu,
                                       std::uint64_t seed, int chunk) {
  DecayProblem p;
  p.T = cu.back();
  p.H = H;
  p.K = K;
  p.V = V;
  p.G = diagonal ? K : 1;
  p.diagonal = diagonal;
  p.scale = 1.0 / std::sqrt(static_cast<double>(K));
  p.chunk = chunk;
  p.cu = std::move(cu);
  auto fill = [seed](std::vector<double>& x, std::size_t n, std::uint64_t salt) {
    x.resize(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = uniform(seed * 131 + salt, i);
  };
  const std::size_t T = static_cast<std::size_t>(p.T), N = static_cast<std::size_t>(p.N());
  fill(p.q, T * H * K, 1);
  fill(p.k, T * H * K, 2);
  fill(p.v, T * H * V, 3);
  fill(p.g, T * H * p.G, 4);
  for (auto& x : p.g) x = -0.005 - 0.03 * (x + 1.0);  // weak decay: cross-rank state matters
  fill(p.dout, T * H * V, 5);
  fill(p.h0, N * H * K * V, 6);
  fill(p.dht, N * H * K * V, 7);
  return p;
}

/// Oracle outputs plus, for bounds, the per-token magnitude of `⟨|dS_t|, |S_t|⟩` per gate column.
struct DecayOracle {
  Result result;
  std::vector<double> end_term;  ///< `[T, H, G]`
};

/// Runs the fp64 recurrence forward and backward. With `absolute`, every input but the gates is
/// replaced by its absolute value: the result then bounds `Σ|terms|` of every computed quantity.
inline DecayOracle decay_oracle(const DecayProblem& p, bool use_h0, bool use_dht, bool absolute) {
  const std::int64_t T = p.T, H = p.H, K = p.K, V = p.V, G = p.G, N = p.N();
  auto val = [absolute](double x) { return absolute ? std::fabs(x) : x; };
  DecayOracle out;
  Result& r = out.result;
  r.output.assign(static_cast<std::size_t>(T * H * V), 0.0);
  r.final_states.assign(static_cast<std::size_t>(N * H * K * V), 0.0);
  r.initial_state_grads.assign(static_cast<std::size_t>(N * H * K * V), 0.0);
  std::vector<double> dq(static_cast<std::size_t>(T * H * K)), dk(dq.size()),
      dv(static_cast<std::size_t>(T * H * V)), dg(static_cast<std::size_t>(T * H * G), 0.0);
  out.end_term.assign(static_cast<std::size_t>(T * H * G), 0.0);
  auto at = [](std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t nb, std::int64_t nc) {
    return static_cast<std::size_t>((a * nb + b) * nc + c);
  };
  std::vector<double> states;  // S_t for every token of the sequence, [len + 1, K, V]
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t b = p.cu[static_cast<std::size_t>(n)],
                       e = p.cu[static_cast<std::size_t>(n) + 1];
    for (std::int64_t h = 0; h < H; ++h) {
      states.assign(static_cast<std::size_t>((e - b + 1) * K * V), 0.0);
      auto S = [&](std::int64_t t, std::int64_t kk, std::int64_t vv) -> double& {
        return states[static_cast<std::size_t>(((t - b + 1) * K + kk) * V + vv)];
      };
      for (std::int64_t kk = 0; kk < K; ++kk)
        for (std::int64_t vv = 0; vv < V; ++vv)
          S(b - 1, kk, vv) =
              use_h0 ? val(p.h0[static_cast<std::size_t>(((n * H + h) * K + kk) * V + vv)]) : 0.0;
      for (std::int64_t t = b; t < e; ++t) {
        for (std::int64_t kk = 0; kk < K; ++kk) {
          const double a = std::exp(p.g[at(t, h, p.diagonal ? kk : 0, H, G)]);
          for (std::int64_t vv = 0; vv < V; ++vv) {
            S(t, kk, vv) =
                a * S(t - 1, kk, vv) + val(p.k[at(t, h, kk, H, K)]) * val(p.v[at(t, h, vv, H, V)]);
          }
        }
        for (std::int64_t vv = 0; vv < V; ++vv) {
          double o = 0;
          for (std::int64_t kk = 0; kk < K; ++kk) o += S(t, kk, vv) * val(p.q[at(t, h, kk, H, K)]);
          r.output[at(t, h, vv, H, V)] = p.scale * o;
        }
      }
      for (std::int64_t kk = 0; kk < K; ++kk)
        for (std::int64_t vv = 0; vv < V; ++vv)
          r.final_states[static_cast<std::size_t>(((n * H + h) * K + kk) * V + vv)] =
              S(e - 1, kk, vv);
      // Backward: dS is the gradient w.r.t. S_t.
      std::vector<double> dS(static_cast<std::size_t>(K * V), 0.0);
      if (use_dht) {
        for (std::int64_t i = 0; i < K * V; ++i)
          dS[static_cast<std::size_t>(i)] =
              val(p.dht[static_cast<std::size_t>((n * H + h) * K * V + i)]);
      }
      for (std::int64_t t = e - 1; t >= b; --t) {
        for (std::int64_t kk = 0; kk < K; ++kk)
          for (std::int64_t vv = 0; vv < V; ++vv)
            dS[static_cast<std::size_t>(kk * V + vv)] +=
                p.scale * val(p.q[at(t, h, kk, H, K)]) * val(p.dout[at(t, h, vv, H, V)]);
        for (std::int64_t kk = 0; kk < K; ++kk) {
          double acc = 0, acck = 0;
          for (std::int64_t vv = 0; vv < V; ++vv) {
            acc += S(t, kk, vv) * val(p.dout[at(t, h, vv, H, V)]);
            acck += dS[static_cast<std::size_t>(kk * V + vv)] * val(p.v[at(t, h, vv, H, V)]);
          }
          dq[at(t, h, kk, H, K)] = p.scale * acc;
          dk[at(t, h, kk, H, K)] = acck;
        }
        for (std::int64_t vv = 0; vv < V; ++vv) {
          double acc = 0;
          for (std::int64_t kk = 0; kk < K; ++kk)
            acc += dS[static_cast<std::size_t>(kk * V + vv)] * val(p.k[at(t, h, kk, H, K)]);
          dv[at(t, h, vv, H, V)] = acc;
        }
        for (std::int64_t kk = 0; kk < K; ++kk) {
          const std::int64_t gi = p.diagonal ? kk : 0;
          const double a = std::exp(p.g[at(t, h, gi, H, G)]);
          double acc = 0, mag = 0;
          for (std::int64_t vv = 0; vv < V; ++vv) {
            acc += dS[static_cast<std::size_t>(kk * V + vv)] * S(t - 1, kk, vv);
            mag += std::fabs(dS[static_cast<std::size_t>(kk * V + vv)] * S(t, kk, vv));
          }
          dg[at(t, h, gi, H, G)] += a * acc;
          out.end_term[at(t, h, gi, H, G)] += mag;
          for (std::int64_t vv = 0; vv < V; ++vv) dS[static_cast<std::size_t>(kk * V + vv)] *= a;
        }
      }
      for (std::int64_t i = 0; i < K * V; ++i)
        r.initial_state_grads[static_cast<std::size_t>((n * H + h) * K * V + i)] =
            dS[static_cast<std::size_t>(i)];
    }
  }
  r.grads = {{"dq", dq}, {"dk", dk}, {"dv", dv}, {"dg", dg}};
  return out;
}

/// Per-element absolute error bounds of a chunkwise computation of `p` in `Scalar`, summaries in
/// fp32 across `shards` virtual shards: `c·u·Σ|terms|` with `c` counting the longest accumulation
/// (state rows K, chunk length, value rows V, chunk and shard chain steps, and the cumulative
/// log-gate error inside a chunk), plus the fp32 rounding of summaries when more than one shard,
/// plus `cw::decay_products_roundoff_factor·u_p` for tensor-core chunk products of unit roundoff
/// `u_p` (`products_roundoff`).
template <class Scalar>
Result decay_bounds(const DecayProblem& p, bool use_h0, bool use_dht, int shards,
                    double products_roundoff = 0) {
  const DecayOracle mag = decay_oracle(p, use_h0, use_dht, true);
  double gmax = 0;
  // A hard reset (g = −∞) adds no rounding: the chunk's cumulative sums restart after it.
  for (double x : p.g)
    if (std::isfinite(x)) gmax = std::max(gmax, std::fabs(x));
  const double C = p.chunk;
  const double c = 2.0 * (p.K + p.V + C) + 4.0 * (static_cast<double>(p.T) / C + 2.0 * shards) +
                   C * C * gmax + 32.0;
  const double u = unit_roundoff<Scalar>();
  const double e = c * u + (shards > 1 ? 16.0 * unit_roundoff<float>() : 0.0) +
                   cw::decay_products_roundoff_factor * products_roundoff;
  Result b = mag.result;
  auto scale = [e](std::vector<double>& v) {
    for (auto& x : v) x = e * x + 1e-300;
  };
  scale(b.output);
  scale(b.final_states);
  scale(b.initial_state_grads);
  for (int i = 0; i < 3; ++i) scale(b.grads[static_cast<std::size_t>(i)].values);
  // dg is a suffix sum, inside a chunk, of q⊙dq − k⊙dk plus ⟨G, S⟩ at the chunk's end: bound it
  // by the same sums of magnitudes over the longest window a chunk can cover.
  const auto& dq = mag.result.grads[0].values;
  const auto& dk = mag.result.grads[1].values;
  auto& dg = b.grads[3].values;
  const std::int64_t H = p.H, K = p.K, G = p.G;
  for (std::int64_t n = 0; n < p.N(); ++n) {
    const std::int64_t sb = p.cu[static_cast<std::size_t>(n)],
                       se = p.cu[static_cast<std::size_t>(n) + 1];
    for (std::int64_t t = sb; t < se; ++t) {
      const std::int64_t we = std::min<std::int64_t>(se, t + p.chunk);
      for (std::int64_t h = 0; h < H; ++h) {
        for (std::int64_t gi = 0; gi < G; ++gi) {
          const std::int64_t k_lo = p.diagonal ? gi : 0, k_hi = p.diagonal ? gi + 1 : K;
          double sum = 0, end = 0;
          for (std::int64_t i = t; i < we; ++i) {
            for (std::int64_t kk = k_lo; kk < k_hi; ++kk) {
              const std::size_t j = static_cast<std::size_t>((i * H + h) * K + kk);
              sum += std::fabs(p.q[j]) * dq[j] + std::fabs(p.k[j]) * dk[j];
            }
            end = std::max(end, mag.end_term[static_cast<std::size_t>((i * H + h) * G + gi)]);
          }
          dg[static_cast<std::size_t>((t * H + h) * G + gi)] = e * (sum + end) + 1e-300;
        }
      }
    }
  }
  return b;
}

/// Adapter of the decay backends for the generic CP checker.
template <class Scalar, class MemorySpace, bool Diagonal>
struct DecayAdapter {
  using backend = std::conditional_t<Diagonal, cw::DiagonalGateBackend<Scalar, MemorySpace>,
                                     cw::ScalarDecayBackend<Scalar, MemorySpace>>;
  using problem = DecayProblem;
  using inputs_type = typename backend::inputs_type;
  using gradients_type = typename backend::gradients_type;

  static backend make_backend(const problem&, cw::BackendOptions o) { return backend(o); }

  static inputs_type inputs(const problem& p, const std::vector<Range>& rows) {
    const std::size_t H = p.H, K = p.K, V = p.V;
    inputs_type in;
    in.q = upload_rows<decltype(in.q)>(p.q, H * K, rows, "q", H, K);
    in.k = upload_rows<decltype(in.k)>(p.k, H * K, rows, "k", H, K);
    in.v = upload_rows<decltype(in.v)>(p.v, H * V, rows, "v", H, V);
    if constexpr (Diagonal) {
      in.g = upload_rows<decltype(in.g)>(p.g, H * K, rows, "g", H, K);
    } else {
      in.g = upload_rows<decltype(in.g)>(p.g, H, rows, "g", H);
    }
    return in;
  }

  static gradients_type gradients(const problem& p, std::int64_t local) {
    gradients_type gr;
    gr.dq = decltype(gr.dq)("dq", local, p.H, p.K);
    gr.dk = decltype(gr.dk)("dk", local, p.H, p.K);
    gr.dv = decltype(gr.dv)("dv", local, p.H, p.V);
    if constexpr (Diagonal) {
      gr.dg = decltype(gr.dg)("dg", local, p.H, p.K);
    } else {
      gr.dg = decltype(gr.dg)("dg", local, p.H);
    }
    return gr;
  }

  static std::vector<Array> gradient_arrays(const gradients_type& gr) {
    return {{"dq", to_host(gr.dq)},
            {"dk", to_host(gr.dk)},
            {"dv", to_host(gr.dv)},
            {"dg", to_host(gr.dg)}};
  }
};

}  // namespace ctxpar::test::chunkwise
