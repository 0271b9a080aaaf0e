// Non-finite values in a distributed result against the single-rank one: the subcommands' checks
// call a result "equal" only when both have the same non-finite pattern, element by element.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ctxpar/core/storage.hpp"

namespace ctxpar::cli {

/// How non-finite values of a result compare with those of the reference.
struct NonFinite {
  std::int64_t in_result = 0;     ///< NaN or ±Inf elements in the distributed result
  std::int64_t in_reference = 0;  ///< NaN or ±Inf elements in the single-rank result
  std::int64_t mismatched = 0;  ///< elements where the two differ in kind (finite, NaN, +Inf, -Inf)

  /// Adds the elements of `result` and `reference` (same length) to the counts.
  template <class A, class B>
  void add(const std::vector<A>& result, const std::vector<B>& reference) {
    const std::size_t n = std::min(result.size(), reference.size());
    for (std::size_t i = 0; i < n; ++i) {
      const int a = kind(static_cast<double>(ctxpar::widen(result[i]))),
                b = kind(static_cast<double>(ctxpar::widen(reference[i])));
      in_result += a != 0;
      in_reference += b != 0;
      mismatched += a != b;
    }
    // A length difference is a mismatch of every element the shorter one lacks.
    mismatched += static_cast<std::int64_t>(std::max(result.size(), reference.size()) - n);
  }

  /// True when the two results have the same non-finite pattern.
  bool same_pattern() const noexcept { return mismatched == 0; }

 private:
  static int kind(double x) {
    if (std::isnan(x)) return 1;
    if (std::isinf(x)) return x > 0 ? 2 : 3;
    return 0;
  }
};

}  // namespace ctxpar::cli
