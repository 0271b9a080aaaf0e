/// \file
/// Transition structures of chunkwise recurrences: the compile-time shape of `M` in a summary
/// `S_out = M·S_in + dS`, so that messages and compositions are the minimum for each family.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

#include "ctxpar/core/impl/one_of.hpp"

namespace ctxpar::chunkwise {

/// `A_t = I` (plain linear attention): `M` is the identity and carries no floats.
struct IdentityTransition {
  /// Name used in reports and plan fingerprints.
  static constexpr const char* name = "identity";
  /// Stable numeric id (plan fingerprints).
  static constexpr int id = 0;
  /// Floats of `M` per head for key dimension `k`.
  KOKKOS_INLINE_FUNCTION static constexpr std::int64_t m_size(std::int64_t /*k*/) { return 0; }
};

/// `A_t = a_t·I` (RetNet, Mamba2/SSD, Lightning): `M` is one scalar per head.
struct ScalarTransition {
  /// Name used in reports and plan fingerprints.
  static constexpr const char* name = "scalar";
  /// Stable numeric id (plan fingerprints).
  static constexpr int id = 1;
  /// Floats of `M` per head for key dimension `k`.
  KOKKOS_INLINE_FUNCTION static constexpr std::int64_t m_size(std::int64_t /*k*/) { return 1; }
};

/// `A_t = diag(α_t)` (GLA): `M` is a `K`-vector per head.
struct DiagonalTransition {
  /// Name used in reports and plan fingerprints.
  static constexpr const char* name = "diagonal";
  /// Stable numeric id (plan fingerprints).
  static constexpr int id = 2;
  /// Floats of `M` per head for key dimension `k`.
  KOKKOS_INLINE_FUNCTION static constexpr std::int64_t m_size(std::int64_t k) { return k; }
};

/// `A_t` a general `K×K` matrix (gated delta rule and product): `M` is dense, row-major.
struct DenseTransition {
  /// Name used in reports and plan fingerprints.
  static constexpr const char* name = "dense";
  /// Stable numeric id (plan fingerprints).
  static constexpr int id = 3;
  /// Floats of `M` per head for key dimension `k`.
  KOKKOS_INLINE_FUNCTION static constexpr std::int64_t m_size(std::int64_t k) { return k * k; }
};

/// True for the four transition tags.
template <class T>
inline constexpr bool is_transition_v =
    ctxpar::impl::is_one_of_v<T, IdentityTransition, ScalarTransition, DiagonalTransition,
                              DenseTransition>;

/// Floats of `M` per head in a *scan record*. A segmented scan resets a composition by zeroing
/// `M`, which the identity cannot express, so the identity travels as a scalar there (1 float).
template <class Transition>
KOKKOS_INLINE_FUNCTION constexpr std::int64_t scan_m_size(std::int64_t k) {
  return std::is_same_v<Transition, IdentityTransition> ? 1 : Transition::m_size(k);
}

/// The structure used for scan records: identity travels as scalar, the rest as themselves.
template <class Transition>
using scan_transition_t = std::conditional_t<std::is_same_v<Transition, IdentityTransition>,
                                             ScalarTransition, Transition>;

}  // namespace ctxpar::chunkwise
