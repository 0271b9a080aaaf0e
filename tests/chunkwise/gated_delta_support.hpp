// Helpers of the gated delta tests: Kokkos views from oracle arrays, the backends' inputs for a
// problem, and relative-L2 comparisons that report the worst element.
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "chunkwise/gated_delta_oracle.hpp"
#include "ctxpar/chunkwise/gated_delta_product.hpp"
#include "ctxpar/chunkwise/gated_delta_rule.hpp"

namespace ctxpar::test::gated_delta {

template <class Scalar, class MemorySpace, class View>
View to_view(const std::vector<double>& x, const std::string& label, std::size_t e0, std::size_t e1,
             std::size_t e2 = KOKKOS_INVALID_INDEX, std::size_t e3 = KOKKOS_INVALID_INDEX) {
  using mutable_view = typename View::non_const_type;
  mutable_view v(label, e0, e1, e2, e3);
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < x.size(); ++i) h.data()[i] = static_cast<Scalar>(x[i]);
  Kokkos::deep_copy(v, h);
  return v;
}

template <class View>
std::vector<double> to_vector(const View& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<double> out(v.span());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(h.data()[i]);
  return out;
}

/// Backend, inputs and gradient views of one family for a problem.
template <class Scalar, class MemorySpace, bool Product>
struct Family;

template <class Scalar, class MemorySpace>
struct Family<Scalar, MemorySpace, false> {
  using backend = ::ctxpar::chunkwise::GatedDeltaRuleBackend<Scalar, MemorySpace>;
  using inputs = ::ctxpar::chunkwise::GatedDeltaRuleInputs<Scalar, MemorySpace>;
  using gradients = ::ctxpar::chunkwise::GatedDeltaRuleGradients<Scalar, MemorySpace>;
  static backend make(int /*n_h*/, ::ctxpar::chunkwise::BackendOptions o) { return backend(o); }
  static inputs make_inputs(const Problem& p) {
    const std::size_t T = p.tokens, H = p.heads, K = p.key_dim, V = p.value_dim;
    inputs in;
    in.q = to_view<Scalar, MemorySpace, decltype(in.q)>(p.q, "q", T, H, K);
    in.k = to_view<Scalar, MemorySpace, decltype(in.k)>(p.k, "k", T, H, K);
    in.v = to_view<Scalar, MemorySpace, decltype(in.v)>(p.v, "v", T, H, V);
    in.g = to_view<Scalar, MemorySpace, decltype(in.g)>(p.g, "g", T, H);
    in.beta = to_view<Scalar, MemorySpace, decltype(in.beta)>(p.beta, "beta", T, H);
    return in;
  }
  static gradients make_gradients(const Problem& p) {
    const std::size_t T = p.tokens, H = p.heads, K = p.key_dim, V = p.value_dim;
    return {decltype(gradients::dq)("dq", T, H, K), decltype(gradients::dk)("dk", T, H, K),
            decltype(gradients::dv)("dv", T, H, V), decltype(gradients::dg)("dg", T, H),
            decltype(gradients::dbeta)("dbeta", T, H)};
  }
};

template <class Scalar, class MemorySpace>
struct Family<Scalar, MemorySpace, true> {
  using backend = ::ctxpar::chunkwise::GatedDeltaProductBackend<Scalar, MemorySpace>;
  using inputs = ::ctxpar::chunkwise::GatedDeltaProductInputs<Scalar, MemorySpace>;
  using gradients = ::ctxpar::chunkwise::GatedDeltaProductGradients<Scalar, MemorySpace>;
  static backend make(int n_h, ::ctxpar::chunkwise::BackendOptions o) { return backend(n_h, o); }
  static inputs make_inputs(const Problem& p) {
    const std::size_t T = p.tokens, N = p.n_h, H = p.heads, K = p.key_dim, V = p.value_dim;
    inputs in;
    in.q = to_view<Scalar, MemorySpace, decltype(in.q)>(p.q, "q", T, H, K);
    in.k = to_view<Scalar, MemorySpace, decltype(in.k)>(p.k, "k", T, N, H, K);
    in.v = to_view<Scalar, MemorySpace, decltype(in.v)>(p.v, "v", T, N, H, V);
    in.g = to_view<Scalar, MemorySpace, decltype(in.g)>(p.g, "g", T, H);
    in.beta = to_view<Scalar, MemorySpace, decltype(in.beta)>(p.beta, "beta", T, N, H);
    return in;
  }
  static gradients make_gradients(const Problem& p) {
    const std::size_t T = p.tokens, N = p.n_h, H = p.heads, K = p.key_dim, V = p.value_dim;
    return {decltype(gradients::dq)("dq", T, H, K), decltype(gradients::dk)("dk", T, N, H, K),
            decltype(gradients::dv)("dv", T, N, H, V), decltype(gradients::dg)("dg", T, H),
            decltype(gradients::dbeta)("dbeta", T, N, H)};
  }
};

/// Relative L2 error ‖a − e‖ / ‖e‖ (absolute when ‖e‖ = 0), with the worst element printed when
/// it exceeds `bound`.
inline bool rel_l2_close(const std::string& what, const std::vector<double>& a,
                         const std::vector<double>& e, double bound, std::size_t offset = 0) {
  double num = 0, den = 0, worst = -1;
  std::size_t at = 0;
  bool sizes = a.size() >= offset + e.size();
  for (std::size_t i = 0; sizes && i < e.size(); ++i) {
    const double d = a[offset + i] - e[i];
    num += d * d;
    den += e[i] * e[i];
    if (std::fabs(d) > worst) worst = std::fabs(d), at = i;
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  const bool ok = sizes && rel <= bound && std::isfinite(rel);
  if (std::getenv("CTXPAR_GD_REPORT"))
    std::cerr << what << ": " << rel << " (bound " << bound << ")\n";
  if (!ok) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::cerr << "[rank " << rank << "] " << what << ": relative L2 error " << rel << " > bound "
              << bound << "; worst element " << at << ": got " << (sizes ? a[offset + at] : 0.0)
              << ", expected " << (e.empty() ? 0.0 : e[at]) << (sizes ? "" : " (size mismatch)")
              << "\n";
  }
  return ok;
}

/// The relative L2 bound used for every gated delta comparison: the longest chain of rounded
/// operations one output depends on inside a chunk is the forward substitution and the products
/// with X (C·n_h terms each), the key contraction (K) and the value block (V); transitions are
/// contractions (|α| ≤ 1, eigenvalues of I − βkkᵀ in [0, 1]), so chunk-to-chunk errors add rather
/// than grow, and a relative L2 error within `factor · (C·n_h + K + V) · u` follows, with `factor`
/// 8 for the forward and 16 for the backward (which runs the chain twice).
template <class Scalar>
double rel_bound(int chunk_rows, int key_dim, int value_dim, double factor) {
  return factor * double(chunk_rows + key_dim + value_dim) * unit_roundoff<Scalar>();
}

}  // namespace ctxpar::test::gated_delta
