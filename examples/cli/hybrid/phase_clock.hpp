// Where the `ctxpar hybrid` stack spends its time outside communication, split into the phases a
// CP-efficiency figure needs: host<->device staging of the layers' operands, the demo's own
// re-layouts and its host projections. Time inside communication is not here: the library's
// collectives time their MPI calls themselves (`Traffic::seconds` of each `Group`), and the stack
// reads it from its groups. Plain process-wide accumulators: the layers take differences around
// what they measure.
#pragma once

#include <chrono>

namespace ctxpar::cli::hybrid {

/// Process-wide phase accumulators, in seconds.
struct PhaseClock {
  static inline double staging = 0;   ///< uploads/downloads of layer operands
  static inline double relayout = 0;  ///< the demo's re-layout all-to-alls (incl. their packing)
  static inline double glue = 0;      ///< host projections (the matmuls of the layers' glue)
};

/// Adds the wall time of its scope to one accumulator.
class PhaseScope {
 public:
  /// Starts timing into `sink`.
  explicit PhaseScope(double& sink) : sink_(sink), start_(std::chrono::steady_clock::now()) {}
  ~PhaseScope() {
    sink_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  double& sink_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ctxpar::cli::hybrid
