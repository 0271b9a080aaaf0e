// The single-rank reference of `ctxpar hybrid` kept on disk: a P = 1 run with
// `--save-reference DIR` writes every step's layer outputs, input gradients, weight gradients and
// loss; a P > 1 run with `--reference DIR` reads back only its own rows instead of running the
// whole sequence again on every rank. At a million tokens the in-process reference would hold
// the whole sequence's activations on every rank; through files each job holds one copy, and the
// reference runs once, as its own job.
//
// DIR/reference.txt says which run wrote the files (every option that changes the values) and
// lists the weight gradients; each `[L, cols]` matrix is a raw little-endian fp64 row-major file
// `step<k>.<name>.f64`, read by runs of consecutive tokens. Every file goes through files.hpp: the
// saving run stages them all and renames them together at the end (a failed run leaves none);
// the reading run parses reference.txt strictly, checks it against the model before the run, and
// reads only regular files of exactly the size the model implies.
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "command.hpp"
#include "files.hpp"
#include "hybrid/host_math.hpp"

namespace ctxpar::cli::hybrid {

/// One step of the reference: the rows a rank compares against, the weight gradients, the loss.
struct ReferenceStep {
  Matrix x1, x2, x3, dx0, dx1, dx2;     ///< this rank's rows, in the order of its tokens
  std::map<std::string, Matrix> grads;  ///< every weight's gradient (whole)
  double loss = 0;                      ///< the loss of the step
  /// Each layer's forward + backward seconds in the run that wrote the files (a P = 1 run alone
  /// on the machine: the solo T(1) of the CP efficiency); empty for an in-process reference.
  std::vector<double> layer_seconds;
};

/// The reference directory's description: the options that fix the values, in order.
using ReferenceKey = std::vector<std::pair<std::string, std::string>>;

namespace detail {

inline const char* const reference_magic = "ctxpar-hybrid-reference 1";

inline std::string matrix_name(int step, const std::string& name) {
  return "step" + std::to_string(step) + "." + name + ".f64";
}

[[noreturn]] inline void reference_fail(const std::string& dir, const std::string& what,
                                        const std::string& expected, const std::string& actual) {
  throw UsageError("ctxpar hybrid", -1, "--reference " + dir + ": " + what, expected, actual);
}

// Whole-token integer in [lo, hi]; false otherwise (no sign wrap, no trailing text).
inline bool parse_int(const std::string& text, std::int64_t lo, std::int64_t hi,
                      std::int64_t& value) {
  if (text.empty() || text.size() > 19 ||
      text.find_first_not_of("0123456789", text[0] == '-' ? 1 : 0) != std::string::npos ||
      text == "-")
    return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno == ERANGE || end != text.c_str() + text.size() || v < lo || v > hi) return false;
  value = v;
  return true;
}

// Whole-token number (NaN and Inf included: a diverged reference run saves them, and the checks
// then fail); false otherwise.
inline bool parse_number(const std::string& text, double& value) {
  if (text.empty()) return false;
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size();
}

// Rows `tokens` (ascending runs are read with one call each) of the `[rows, cols]` file `name` in
// `dir`: a regular file whose size is exactly what the model implies, checked before reading.
inline Matrix read_rows(const std::string& dir, const std::string& name, std::int64_t rows,
                        std::int64_t cols, const std::vector<std::int64_t>& tokens) {
  const std::string path = (std::filesystem::path(dir) / name).string();
  const InputFile f(path);
  if (!f.problem().empty())
    reference_fail(dir, name + ": " + f.problem(), "the regular file `--save-reference` wrote",
                   f.problem());
  const std::int64_t row_bytes = cols * static_cast<std::int64_t>(sizeof(double));
  if (f.size() != rows * row_bytes)
    reference_fail(dir, name + " has the wrong size",
                   std::to_string(rows * row_bytes) + " bytes ([" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "] doubles)",
                   std::to_string(f.size()) + " bytes");
  Matrix m(static_cast<std::int64_t>(tokens.size()), cols);
  std::size_t j = 0;
  while (j < tokens.size()) {
    std::size_t end = j + 1;
    while (end < tokens.size() && tokens[end] == tokens[end - 1] + 1) ++end;
    if (!f.read_at(tokens[j] * row_bytes, m.data.data() + j * static_cast<std::size_t>(cols),
                   (end - j) * static_cast<std::size_t>(row_bytes)))
      reference_fail(dir, "cannot read " + name, "readable", "a short read");
    j = end;
  }
  return m;
}

}  // namespace detail

/// Checked before the run: `dir` must be a writable directory (or creatable as one) whose
/// `reference.txt`, if present, is a regular file. Empty when it can be written, else why not.
inline std::string why_not_reference_dir(const std::string& dir) {
  std::string problem = why_not_output_dir(dir);
  if (problem.empty() && std::filesystem::is_directory(dir)) {
    const std::string txt = (std::filesystem::path(dir) / "reference.txt").string();
    struct stat st;
    if (::stat(txt.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      problem = "reference.txt " + why_not_output_file(txt);
  }
  return problem;
}

/// The files of a reference run, staged as temporaries in the directory while the steps run and
/// renamed into place together by `files().commit()` after `finish()`: a failed run leaves no
/// reference behind. Rank 0 of a P = 1 run.
class ReferenceWriter {
 public:
  explicit ReferenceWriter(std::string dir) : dir_(std::move(dir)) {}

  /// The description and the gradient list (first step).
  void key(const ReferenceKey& key, const std::map<std::string, Matrix>& grads) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) fail("cannot create the directory: " + ec.message());
    text_ << detail::reference_magic << "\n";
    for (const auto& [k, v] : key) text_ << "option " << k << " " << v << "\n";
    for (const auto& [name, g] : grads)
      text_ << "grad " << name << " " << g.rows << " " << g.cols << "\n";
  }

  /// One step: the whole-sequence layer outputs and input gradients, the weight gradients, the
  /// loss and the layer times.
  void step(int step, const ReferenceStep& s) {
    const std::pair<const char*, const Matrix*> rows[] = {{"x1", &s.x1},   {"x2", &s.x2},
                                                          {"x3", &s.x3},   {"dx0", &s.dx0},
                                                          {"dx1", &s.dx1}, {"dx2", &s.dx2}};
    for (const auto& [name, m] : rows) matrix(detail::matrix_name(step, name), *m);
    for (const auto& [name, g] : s.grads) matrix(detail::matrix_name(step, "grad." + name), g);
    std::ostringstream loss;
    loss.precision(17);
    loss << s.loss;
    text_ << "loss " << step << " " << loss.str() << "\n";
    for (std::size_t l = 0; l < s.layer_seconds.size(); ++l)
      text_ << "time " << step << " " << l << " " << s.layer_seconds[l] << "\n";
  }

  /// Stages reference.txt (last, so that it only names files that exist).
  void finish() {
    const std::string problem =
        files_.stage((std::filesystem::path(dir_) / "reference.txt").string(), text_.str());
    if (!problem.empty()) fail(problem);
  }

  /// The staged files, to commit (with the JSON, if any).
  StagedFiles& files() noexcept { return files_; }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw UsageError("ctxpar hybrid", -1, "--save-reference " + dir_ + ": " + why,
                     "every reference file written", why);
  }

  void matrix(const std::string& name, const Matrix& m) {
    const std::string problem =
        files_.stage((std::filesystem::path(dir_) / name).string(),
                     reinterpret_cast<const char*>(m.data.data()), m.data.size() * sizeof(double));
    if (!problem.empty()) fail(problem);
  }

  std::string dir_;
  std::ostringstream text_;
  StagedFiles files_;
};

/// What reference.txt says: the options of the run that wrote it, the gradient list, each step's
/// loss and layer times.
struct ReferenceIndex {
  std::map<std::string, std::string> options;                                ///< option -> value
  std::map<std::string, std::pair<std::int64_t, std::int64_t>> grad_shapes;  ///< rows, cols
  std::map<std::int64_t, double> losses;                                     ///< step -> loss
  std::map<std::int64_t, std::vector<double>> times;  ///< step -> seconds per layer
};

/// Reads DIR/reference.txt (a regular file), strictly: a malformed line is named by its number.
/// Checks that it was written by a run with the same `key` (a mismatch names the option, and
/// `key_hint` says which options a reference must share), that its gradient list is the model's
/// `grads` (name, rows, cols), and that it has `steps` steps. Throws `UsageError`.
inline ReferenceIndex read_reference_index(
    const std::string& dir, const ReferenceKey& key,
    const std::map<std::string, std::pair<std::int64_t, std::int64_t>>& grads, int layers,
    int steps, const std::string& key_hint) {
  const std::string path = (std::filesystem::path(dir) / "reference.txt").string();
  const InputFile f(path);
  if (!f.problem().empty())
    detail::reference_fail(dir, "not a reference directory (reference.txt: " + f.problem() + ")",
                           "reference.txt written by `ctxpar hybrid --save-reference` at P = 1",
                           f.problem());
  // A few lines per step: far below this unless the file is not what it claims.
  constexpr std::int64_t max_size = std::int64_t(64) << 20;
  if (f.size() > max_size)
    detail::reference_fail(dir, "reference.txt is too large", "at most 64 MiB",
                           std::to_string(f.size()) + " bytes");
  std::string text(static_cast<std::size_t>(f.size()), '\0');
  if (!f.read_at(0, text.data(), text.size()))
    detail::reference_fail(dir, "cannot read reference.txt", "readable", "a short read");
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != detail::reference_magic)
    detail::reference_fail(dir, "not a reference directory",
                           "reference.txt written by `ctxpar hybrid --save-reference` at P = 1",
                           "another file");
  ReferenceIndex x;
  constexpr std::int64_t int_max = std::numeric_limits<int>::max();
  for (int number = 2; std::getline(in, line); ++number) {
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string word; words >> word;) w.push_back(word);
    const std::string at = "reference.txt line " + std::to_string(number) + ": ";
    auto bad = [&](const std::string& what, const std::string& expected) {
      detail::reference_fail(dir, at + what, expected, line);
    };
    const std::string kind = w.empty() ? "" : w[0];
    std::int64_t a = 0, b = 0;
    double v = 0;
    if (kind == "option") {
      if (w.size() != 3) bad("malformed option line", "option NAME VALUE");
      if (!x.options.emplace(w[1], w[2]).second) bad("option " + w[1] + " given twice", "once");
    } else if (kind == "grad") {
      if (w.size() != 4 || !detail::parse_int(w[2], 1, int_max, a) ||
          !detail::parse_int(w[3], 1, int_max, b))
        bad("malformed grad line", "grad NAME ROWS COLS (positive integers)");
      if (!x.grad_shapes.emplace(w[1], std::make_pair(a, b)).second)
        bad("grad " + w[1] + " given twice", "once");
    } else if (kind == "loss") {
      if (w.size() != 3 || !detail::parse_int(w[1], 1, int_max, a) ||
          !detail::parse_number(w[2], v))
        bad("malformed loss line", "loss STEP VALUE (STEP >= 1)");
      if (!x.losses.emplace(a, v).second) bad("loss of step " + w[1] + " given twice", "once");
    } else if (kind == "time") {
      if (w.size() != 4 || !detail::parse_int(w[1], 1, int_max, a) ||
          !detail::parse_int(w[2], 0, layers - 1, b) || !detail::parse_number(w[3], v) ||
          !(v >= 0 && v < 1e12))
        bad("malformed time line", "time STEP LAYER SECONDS (STEP >= 1, LAYER in [0, " +
                                       std::to_string(layers - 1) + "], SECONDS finite and >= 0)");
      std::vector<double>& t = x.times[a];
      t.resize(static_cast<std::size_t>(layers), -1.0);
      if (t[static_cast<std::size_t>(b)] >= 0)
        bad("time of step " + w[1] + " layer " + w[2] + " given twice", "once");
      t[static_cast<std::size_t>(b)] = v;
    } else {
      bad("unknown line", "option, grad, loss or time lines");
    }
  }
  for (const auto& [k, v] : key) {
    const auto it = x.options.find(k);
    const std::string have = it == x.options.end() ? "absent" : it->second;
    if (have != v)
      detail::reference_fail(dir, "written with another --" + k + " (" + key_hint + ")", v, have);
  }
  // The gradient list must be the model's, shape by shape: a file's size is then checked against
  // a shape that is known to be right.
  for (const auto& [name, shape] : grads) {
    const auto it = x.grad_shapes.find(name);
    const std::string want = std::to_string(shape.first) + " x " + std::to_string(shape.second);
    if (it == x.grad_shapes.end())
      detail::reference_fail(dir, "reference.txt lists no gradient of " + name, want, "none");
    if (it->second != shape)
      detail::reference_fail(
          dir, "reference.txt: the gradient of " + name + " has the wrong shape", want,
          std::to_string(it->second.first) + " x " + std::to_string(it->second.second));
  }
  if (x.grad_shapes.size() != grads.size())
    detail::reference_fail(dir, "reference.txt lists gradients the model does not have",
                           std::to_string(grads.size()) + " gradients",
                           std::to_string(x.grad_shapes.size()));
  for (int step = 1; step <= steps; ++step) {
    if (x.losses.count(step) == 0)
      detail::reference_fail(dir, "has no step " + std::to_string(step),
                             "a reference run with at least " + std::to_string(steps) + " --steps",
                             "fewer steps");
    const auto t = x.times.find(step);
    if (t != x.times.end())
      for (double seconds : t->second)
        if (seconds < 0)
          detail::reference_fail(
              dir, "reference.txt: step " + std::to_string(step) + " lacks a layer time",
              "one time line per layer", "fewer");
  }
  return x;
}

/// Reads step `step` (checked by `read_reference_index`) for the rank holding `tokens`: each file
/// must be a regular file of exactly the size the model implies. Throws `UsageError`.
inline ReferenceStep read_reference_step(const std::string& dir, const ReferenceIndex& index,
                                         int step, std::int64_t length, std::int64_t width,
                                         const std::vector<std::int64_t>& tokens) {
  ReferenceStep s;
  s.loss = index.losses.at(step);
  const auto t = index.times.find(step);
  if (t != index.times.end()) s.layer_seconds = t->second;
  Matrix* rows[] = {&s.x1, &s.x2, &s.x3, &s.dx0, &s.dx1, &s.dx2};
  const char* names[] = {"x1", "x2", "x3", "dx0", "dx1", "dx2"};
  for (int i = 0; i < 6; ++i)
    *rows[i] = detail::read_rows(dir, detail::matrix_name(step, names[i]), length, width, tokens);
  for (const auto& [name, shape] : index.grad_shapes) {
    std::vector<std::int64_t> all(static_cast<std::size_t>(shape.first));
    for (std::int64_t i = 0; i < shape.first; ++i) all[static_cast<std::size_t>(i)] = i;
    s.grads[name] = detail::read_rows(dir, detail::matrix_name(step, "grad." + name), shape.first,
                                      shape.second, all);
  }
  return s;
}

}  // namespace ctxpar::cli::hybrid
