/// \file
/// Run-time options of the sliding-window attention step.
#pragma once

#include <cstdint>

namespace ctxpar::swa {

/// Options shared by the single-rank and the distributed step; every rank must pass the same.
struct Options {
  /// Window `W` in tokens: key `j` is visible to query `i` iff `pos_i - W < pos_j <= pos_i`
  /// (the query's own key counts). `0` means unlimited (plain causal).
  std::int64_t window = 0;
  /// RoPE base: pair `(d, d + D/2)` turns by `pos * base^(-2d/D)`.
  double rope_base = 10000.0;
  /// Softmax scale; `0` means `1 / sqrt(D)`.
  double scale = 0.0;
  /// When true, inputs are scanned for NaN/Inf (a collective check, one pass over the inputs).
  bool check_finite = false;
};

}  // namespace ctxpar::swa
