/// \file
/// The gates of the gated recurrences, in one place for every engine and layer: the in-chunk
/// cumulative log-gate with its compensation (hard resets included), the decays formed from it,
/// and the gate activations (sigmoid, softplus). All are device functions.
///
/// Each engine keeps the exponential its results were fixed with: the gated delta kernels and
/// the GDP layer's gates take the library's `fast_exp` (whose vector form gives the same bits on
/// the host fast paths), the scalar-decay / diagonal-gate kernels the library `exp`. The decay
/// helpers therefore take the exponential as a policy (`FastExp`, `LibraryExp`) instead of
/// choosing one for both, which would change one engine's bits.
#pragma once

#include <Kokkos_Core.hpp>

#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/impl/fast_exp.hpp"

namespace ctxpar::impl {

/// The library `exp` (`compat::exp`) as a decay policy.
struct LibraryExp {
  /// `exp(x)`.
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T x) const {
    return compat::exp(x);
  }
};

/// The library's own `fast_exp` as a decay policy (the library `exp` for doubles).
struct FastExp {
  /// `fast_exp(x)`.
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T x) const {
    return fast_exp(x);
  }
};

/// Whether a log-gate is a hard reset (`−∞`: the state before it is forgotten).
template <class T>
KOKKOS_INLINE_FUNCTION bool is_hard_reset(T log_gate) {
  return log_gate < T(0) && !compat::isfinite(log_gate);
}

/// The cumulative log-gate `γ` of one chunk, compensated: `sum + lo` carries the rounding error
/// of every addition (two-sum), so that a decay `γ_i − γ_j` formed from both parts errs by
/// `u·|γ_i − γ_j|` as the recurrence does, not by `u·(|γ_i| + |γ_j|)`. A hard reset restarts
/// both parts at 0.
template <class T>
struct CompensatedLogGate {
  T sum = T(0);  ///< the rounded cumulative sum
  T lo = T(0);   ///< the rounding errors of `sum`, accumulated
  /// Adds the next log-gate; true when it was a hard reset (then `sum = lo = 0`).
  KOKKOS_INLINE_FUNCTION bool add(T log_gate) {
    if (is_hard_reset(log_gate)) {
      sum = T(0);
      lo = T(0);
      return true;
    }
    // Two-sum: `sum + x` exactly equals `s + err`; the errors accumulate in `lo`.
    const T s = sum + log_gate, xs = s - sum;
    lo += (sum - (s - xs)) + (log_gate - xs);
    sum = s;
    return false;
  }
};

/// The log-decay `γ_i − γ_j` from both parts of two compensated cumulative sums (`hi + lo`).
/// Either side may be a host vector type (the same operations lane by lane).
template <class T, class U>
KOKKOS_INLINE_FUNCTION auto compensated_difference(const T& hi_i, const T& lo_i, const U& hi_j,
                                                   const U& lo_j) {
  return (hi_i - hi_j) + (lo_i - lo_j);
}

/// The decay `exp(log_decay)` through `Exp` where `live` (no hard reset in between), exactly 0
/// elsewhere, so that no decay is ever formed from `−∞ − (−∞)`.
template <class Exp, class T>
KOKKOS_INLINE_FUNCTION T gated_decay(bool live, T log_decay) {
  return live ? Exp{}(log_decay) : T(0);
}

/// `1/(1 + e^−x)` for `x ≥ 0`, `e^x/(1 + e^x)` below (no overflow of `e^−x`). One `fast_exp` of
/// `−|x|` serves both sides and the side is chosen after it, so a random sign costs no
/// mispredicted branch around the `exp` (the same bits as evaluating the chosen side alone); the
/// vector form `simd_sigmoid` (heads/impl/layer_kernels.hpp) gives the same bits.
template <class T>
KOKKOS_INLINE_FUNCTION T sigmoid(T x) {
  const T e = fast_exp(x >= T(0) ? -x : x);
  const T one_plus = T(1) + e;
  return (x >= T(0) ? T(1) : e) / one_plus;
}

/// `log(1 + e^x)`, and `x` itself above 20: short by `log1p(e^−x) < e^−20 ≈ 2·10⁻⁹`, below half
/// an ulp of a float there (for doubles the cut-off's own error).
template <class T>
KOKKOS_INLINE_FUNCTION T softplus(T x) {
  return x > T(20) ? x : compat::log1p(compat::exp(x));
}

/// SiLU'(x) = s·(1 + x·(1 − s)) with s = `sigmoid(x)`.
template <class T>
KOKKOS_INLINE_FUNCTION T silu_grad(T x) {
  const T s = sigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}

}  // namespace ctxpar::impl
