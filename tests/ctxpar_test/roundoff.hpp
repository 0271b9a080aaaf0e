// Unit roundoffs of the storage types, for the tests' derived error bounds (no Boost, no MPI:
// the oracles include it too).
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

#include "ctxpar/core/storage.hpp"

namespace ctxpar::test {

/// Unit roundoff of a storage type: 2^-8 for bfloat16 (8 significant bits), 2^-11 for IEEE half.
template <class T>
constexpr double unit_roundoff() {
  if constexpr (std::is_same_v<T, ctxpar::bfloat16>)
    return 1.0 / 256;
  else if constexpr (std::is_same_v<T, ctxpar::float16>)
    return 1.0 / 2048;
  else
    return static_cast<double>(std::numeric_limits<T>::epsilon()) / 2;
}

/// The unit roundoffs of a computation on a storage type: every stored value is rounded to
/// `storage`, every operation between loads and stores to `arithmetic` (the compute type's). The
/// same number for float and double; 2^-8 and 2^-24 for bfloat16. `operand`: a product operand
/// rounded once more before it is multiplied (tensor-core products; 0 where none is).
struct Roundoff {
  double storage, arithmetic;
  double operand = 0;
};

/// The roundoffs of storage type `T` (`core/storage.hpp`).
template <class T>
constexpr Roundoff roundoff() {
  return {unit_roundoff<T>(), unit_roundoff<ctxpar::compute_t<T>>()};
}

/// The roundoffs of the tensor-core kernels on storage type `T`: those of `T`, and each product
/// operand (queries, keys, values, softmax weights) rounded once more, to `T` for the 16-bit types
/// and to TF32 (10 fraction bits, 2^-11) for float.
template <class T>
constexpr Roundoff tensor_core_roundoff() {
  return {unit_roundoff<T>(), unit_roundoff<ctxpar::compute_t<T>>(),
          std::is_same_v<T, float> ? 1.0 / 2048 : unit_roundoff<T>()};
}

/// The bound against an exact value `x` of a result stored once in `Storage` after it was computed
/// wider within `b` of `x` (`|y - x| <= b`): rounding y to nearest even adds at most
/// `u·|y| + η <= u·(|x| + b) + η`, u the storage type's unit roundoff and η half its smallest
/// subnormal spacing (2^-25 for float16, 2^-134 for bfloat16: a tiny y loses its relative
/// accuracy there). For float and double storage nothing is rounded again: b.
template <class Storage>
double stored_once_bound(double x, double b) {
  if constexpr (std::is_same_v<Storage, ctxpar::bfloat16> ||
                std::is_same_v<Storage, ctxpar::float16>) {
    const double eta = std::ldexp(1.0, std::is_same_v<Storage, ctxpar::float16> ? -25 : -134);
    return b + unit_roundoff<Storage>() * (std::fabs(x) + b) + eta;
  } else {
    return b;
  }
}

}  // namespace ctxpar::test
