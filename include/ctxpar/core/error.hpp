/// \file
/// The one exception type of ctxpar.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace ctxpar {

/// Thrown for every precondition violation. Carries the operator that refused the input, the rank
/// on which the violation was first seen, and the expected and actual values, so that a message
/// read on any rank says what to fix. Collective checks (see `ctxpar::Preconditions`) make every
/// rank throw the same `Error`.
class Error : public std::runtime_error {
 public:
  /// \param op        the operator, e.g. `"ctxpar::swa::forward"`
  /// \param rank      the rank that saw the violation (-1 when no communicator is involved)
  /// \param condition what must hold, in words
  /// \param expected  the expected value, printed
  /// \param actual    the value found, printed
  Error(std::string op, int rank, std::string condition, std::string expected, std::string actual)
      : std::runtime_error(format(op, rank, condition, expected, actual)),
        op_(std::move(op)),
        rank_(rank),
        condition_(std::move(condition)),
        expected_(std::move(expected)),
        actual_(std::move(actual)) {}

  /// The operator that refused its input.
  const std::string& op() const noexcept { return op_; }
  /// The rank on which the violation was seen (-1 when local, without a communicator).
  int rank() const noexcept { return rank_; }
  /// What must hold, in words.
  const std::string& condition() const noexcept { return condition_; }
  /// The expected value, printed.
  const std::string& expected() const noexcept { return expected_; }
  /// The value found, printed.
  const std::string& actual() const noexcept { return actual_; }

 private:
  static std::string format(const std::string& op, int rank, const std::string& condition,
                            const std::string& expected, const std::string& actual) {
    std::ostringstream out;
    out << op << ": ";
    if (rank >= 0) out << "on rank " << rank << ": ";
    out << condition << " (expected " << expected << ", got " << actual << ")";
    return out.str();
  }

  std::string op_;
  int rank_;
  std::string condition_;
  std::string expected_;
  std::string actual_;
};

namespace impl {
/// Prints any streamable value for an error message.
template <class T>
std::string to_text(const T& value) {
  std::ostringstream out;
  out << value;
  return out.str();
}
}  // namespace impl

/// Throws a local `Error` (no communicator involved) when `ok` is false. For checks on one rank's
/// data that other ranks must also learn about, use `ctxpar::Preconditions` instead.
template <class Expected, class Actual>
void require_local(bool ok, const std::string& op, const std::string& condition,
                   const Expected& expected, const Actual& actual) {
  if (!ok) throw Error(op, -1, condition, impl::to_text(expected), impl::to_text(actual));
}

}  // namespace ctxpar
