// The gated delta rule / product in the form the generic CP checker (chunkwise_test_support.hpp)
// expects: a global problem, the adapter of both backends, the fp64 oracle as a Result and the
// normwise per-element bounds. Shared by the CP and the numerics tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "chunkwise/chunkwise_test_support.hpp"
#include "chunkwise/gated_delta_support.hpp"

namespace ctxpar::test::chunkwise {

namespace gd = ::ctxpar::test::gated_delta;

// A global problem in the form the generic CP checker expects.
struct GdCpProblem {
  std::int64_t T = 0, H = 0, K = 0, V = 0;
  int n_h = 1, chunk = 16;
  std::vector<std::int64_t> cu;
  std::vector<double> h0, dout, dht;
  gd::Problem p;  // the oracle's view of the same inputs (h0 filled)
};

inline GdCpProblem make_cp_problem(std::uint64_t seed, const std::vector<std::int64_t>& cu, int n_h,
                                   int H, int K, int V, int chunk) {
  GdCpProblem c;
  c.T = cu.back(), c.H = H, c.K = K, c.V = V, c.n_h = n_h, c.chunk = chunk, c.cu = cu;
  c.p = gd::make_problem(seed, static_cast<int>(c.T), n_h, H, K, V,
                         std::vector<int>(cu.begin(), cu.end()), true);
  c.h0 = c.p.h0;
  const std::size_t N = cu.size() - 1;
  c.dout.resize(std::size_t(c.T) * H * V);
  c.dht.resize(N * H * K * V);
  for (std::size_t i = 0; i < c.dout.size(); ++i) c.dout[i] = ctxpar::test::uniform(seed + 21, i);
  for (std::size_t i = 0; i < c.dht.size(); ++i)
    c.dht[i] = 0.5 * ctxpar::test::uniform(seed + 22, i);
  return c;
}

template <class Scalar, bool Product,
          class MemorySpace = Kokkos::DefaultHostExecutionSpace::memory_space>
struct GdAdapter {
  using family = gd::Family<Scalar, MemorySpace, Product>;
  using backend = typename family::backend;
  using problem = GdCpProblem;

  static backend make_backend(const problem& p, cw::BackendOptions o) {
    return family::make(p.n_h, o);
  }

  static typename backend::inputs_type inputs(const problem& p, const std::vector<Range>& rows) {
    using in_t = typename backend::inputs_type;
    in_t in;
    const std::size_t H = p.H, K = p.K, V = p.V, N = p.n_h;
    in.q = upload_rows<decltype(in.q)>(p.p.q, H * K, rows, "q", H, K);
    in.g = upload_rows<decltype(in.g)>(p.p.g, H, rows, "g", H);
    if constexpr (Product) {
      in.k = upload_rows<decltype(in.k)>(p.p.k, N * H * K, rows, "k", N, H, K);
      in.v = upload_rows<decltype(in.v)>(p.p.v, N * H * V, rows, "v", N, H, V);
      in.beta = upload_rows<decltype(in.beta)>(p.p.beta, N * H, rows, "beta", N, H);
    } else {
      in.k = upload_rows<decltype(in.k)>(p.p.k, H * K, rows, "k", H, K);
      in.v = upload_rows<decltype(in.v)>(p.p.v, H * V, rows, "v", H, V);
      in.beta = upload_rows<decltype(in.beta)>(p.p.beta, H, rows, "beta", H);
    }
    return in;
  }

  static typename backend::gradients_type gradients(const problem& p, std::int64_t local) {
    gd::Problem shape = p.p;
    shape.tokens = static_cast<int>(local);
    return family::make_gradients(shape);
  }

  static std::vector<Array> gradient_arrays(const typename backend::gradients_type& g) {
    return {{"dq", to_host(g.dq)},
            {"dk", to_host(g.dk)},
            {"dv", to_host(g.dv)},
            {"dg", to_host(g.dg)},
            {"dbeta", to_host(g.dbeta)}};
  }
};

// The fp64 recurrence on the whole problem, in the checker's Result form.
inline Result oracle(const GdCpProblem& c, bool with_h0, bool with_dht) {
  gd::Problem p = c.p;
  if (!with_h0) p.h0.assign(p.h0.size(), 0.0);
  const gd::Forward f = gd::forward(p);
  const gd::Gradients g = gd::backward(p, c.dout, with_dht ? c.dht : std::vector<double>{});
  Result r;
  r.output = f.o;
  r.final_states = f.ht;
  r.initial_state_grads = g.dh0;
  r.grads = {{"dq", g.dq}, {"dk", g.dk}, {"dv", g.dv}, {"dg", g.dg}, {"dbeta", g.dbeta}};
  return r;
}

// The normwise bounds of the results, relative to each tensor's 2-norm: ‖err‖₂ ≤ ε‖x‖₂ with
// ε = 8 (C·n_h + K + V) u forward and twice that backward (see gated_delta_support.hpp), plus
// (16 + 4·shards) u_fp32 for the fp32 summaries and fold across shards. With tensor-core chunk
// products (unit roundoff u_p) add `cw::products_roundoff_factor`·u_p over the chunks of the
// longest sequence, each shard's piece (two in a zigzag layout) starting a chunk of its own; no
// decay is assumed.
struct Epsilons {
  double forward = 0, backward = 0;
};

template <class Scalar>
Epsilons epsilons(const GdCpProblem& c, int shards,
                  cw::ChunkProducts products = cw::ChunkProducts::exact) {
  const double fp32 = (16.0 + 4.0 * shards) * ctxpar::test::unit_roundoff<float>();
  const int rows = c.chunk * c.n_h;
  const double up = cw::products_unit_roundoff(products);
  std::int64_t longest = 0;
  for (std::size_t i = 1; i < c.cu.size(); ++i) longest = std::max(longest, c.cu[i] - c.cu[i - 1]);
  const double chain = double(cw::chained_chunks(longest, c.chunk, 2 * shards));
  return {gd::rel_bound<Scalar>(rows, int(c.K), int(c.V), 8) + fp32 +
              cw::products_roundoff_factor(false, chain) * up,
          gd::rel_bound<Scalar>(rows, int(c.K), int(c.V), 16) + fp32 +
              cw::products_roundoff_factor(true, chain) * up};
}

// Per-element bounds. The gated delta recurrence has no useful componentwise bound (the
// I − βkkᵀ factors cancel signs), so each element gets the normwise bound of its tensor
// (`epsilons`): ‖err‖₂ ≤ ε‖x‖₂ implies |err_i| ≤ ε‖x‖₂.
template <class Scalar>
Result bounds(const GdCpProblem& c, const Result& want, int shards,
              cw::ChunkProducts products = cw::ChunkProducts::exact) {
  const Epsilons eps = epsilons<Scalar>(c, shards, products);
  auto fill = [](std::vector<double>& v, double e) {
    double n2 = 0;
    for (double x : v) n2 += x * x;
    const double b = e * std::sqrt(n2) + 1e-300;
    for (auto& x : v) x = b;
  };
  Result b = want;
  fill(b.output, eps.forward);
  fill(b.final_states, eps.forward);
  fill(b.initial_state_grads, eps.backward);
  for (auto& a : b.grads) fill(a.values, eps.backward);
  return b;
}

// The normwise bound itself on whole results (a single-rank run's): every tensor's
// ‖got − want‖₂ ≤ ε‖want‖₂, which the per-element bounds only imply (a sign error in a state pass
// can stay within every element's). Prints each miss.
inline bool normwise_within(const std::string& what, const Result& got, const Result& want,
                            const Epsilons& eps) {
  bool ok = true;
  auto check = [&](const std::string& name, const std::vector<double>& a,
                   const std::vector<double>& e, double eps_x) {
    double d2 = 0, n2 = 0;
    for (std::size_t i = 0; i < e.size(); ++i) {
      const double d = (i < a.size() ? a[i] : HUGE_VAL) - e[i];
      d2 += d * d;
      n2 += e[i] * e[i];
    }
    if (a.size() == e.size() && std::sqrt(d2) <= eps_x * std::sqrt(n2)) return;
    ok = false;
    std::cerr << what << " " << name << ": normwise error " << std::sqrt(d2 / n2) << " > bound "
              << eps_x << "\n";
  };
  check("output", got.output, want.output, eps.forward);
  // States as `check_against` takes them: compared where the run was asked for them.
  if (!got.final_states.empty())
    check("final states", got.final_states, want.final_states, eps.forward);
  if (!got.initial_state_grads.empty())
    check("initial state grads", got.initial_state_grads, want.initial_state_grads, eps.backward);
  for (std::size_t i = 0; i < want.grads.size() && i < got.grads.size(); ++i)
    check(want.grads[i].name, got.grads[i].values, want.grads[i].values, eps.backward);
  return ok;
}

}  // namespace ctxpar::test::chunkwise
