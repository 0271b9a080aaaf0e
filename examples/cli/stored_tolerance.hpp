// The bar for comparing two results that were each rounded once into a storage type: what the
// subcommands' single-rank checks allow for 16-bit outputs.
#pragma once

#include <type_traits>

#include "ctxpar/core/storage.hpp"

namespace ctxpar::cli {

/// The relative difference allowed between two results stored in `Stored` whose wider values
/// differ by at most `tau` (relative): each is rounded once (unit roundoff u: 2^-8 bfloat16, 2^-11
/// float16), so with a, b the wider values ‖n(a) − n(b)‖ ≤ ‖a − b‖ + u‖a‖ + u‖b‖ ≤ (τ + (2 +
/// τ)u)‖b‖ and ‖n(b)‖ ≥ (1 − u)‖b‖. For float and double nothing is rounded again: τ.
template <class Stored>
double stored_tolerance(double tau) {
  if constexpr (ctxpar::is_narrow_storage_v<Stored>) {
    const double u = std::is_same_v<Stored, ctxpar::bfloat16> ? 1.0 / 256 : 1.0 / 2048;
    return (tau + (2 + tau) * u) / (1 - u);
  } else {
    return tau;
  }
}

}  // namespace ctxpar::cli
