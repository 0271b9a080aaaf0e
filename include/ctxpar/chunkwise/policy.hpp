/// \file
/// Composition policies and options of the chunkwise CP driver.
#pragma once

#include "ctxpar/chunkwise/summary.hpp"
#include "ctxpar/core/impl/one_of.hpp"

namespace ctxpar::chunkwise {

/// One all-gather of every rank's summaries (`P` summaries of memory per rank); each rank folds
/// the slice it needs sequentially in fp32: forward over `[preceding_start, v)`, backward from
/// `following_stop − 1` down to `v + 1`; an empty slice gives zero (or the user's state).
struct GatherFold {
  /// Name in reports and in the plan's agreement (`ctxpar::fingerprint`).
  static constexpr const char* name = "gather";
};

/// A segmented exclusive prefix scan of summaries over the ranks (`ceil(log2 P)` sendrecv rounds,
/// O(1) summaries of memory), composition as the non-commutative operation; the backward is the
/// same scan in reverse rank order. A summary whose fragment starts (forward) or ends (backward)
/// a sequence resets the scan by carrying `M = 0` (its sequence's initial state or final-state
/// gradient folded into its state part).
struct ScanCompose {
  /// Name in reports and in the plan's agreement (`ctxpar::fingerprint`).
  static constexpr const char* name = "scan";
};

/// True for the two composition policies.
template <class T>
inline constexpr bool is_composition_policy_v =
    ctxpar::impl::is_one_of_v<T, GatherFold, ScanCompose>;

/// Options of a `CpPlan` (fixed at construction, agreed by every rank).
struct DriverOptions {
  SummaryForm form = SummaryForm::packed;  ///< packed (one collective) or unpacked (two)
  bool check_finite = false;               ///< refuse NaN/Inf inputs (costs one pass over them)
};

}  // namespace ctxpar::chunkwise
