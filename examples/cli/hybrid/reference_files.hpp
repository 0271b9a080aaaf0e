// The single-rank reference of `ctxpar hybrid` kept on disk: a P = 1 run with
// `--save-reference DIR` writes every step's layer outputs, input gradients, weight gradients and
// loss; a P > 1 run with `--reference DIR` reads back only its own rows instead of running the
// whole sequence again on every rank. At a million tokens the in-process reference would hold
// the whole sequence's activations on every rank; through files each job holds one copy, and the
// reference runs once, as its own job.
//
// DIR/reference.txt says which run wrote the files (every option that changes the values) and
// lists the weight gradients; each `[L, cols]` matrix is a raw little-endian fp64 row-major file
// `step<k>.<name>.f64`, read by runs of consecutive tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "command.hpp"
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

inline std::string matrix_path(const std::string& dir, int step, const std::string& name) {
  return (std::filesystem::path(dir) / ("step" + std::to_string(step) + "." + name + ".f64"))
      .string();
}

[[noreturn]] inline void reference_fail(const std::string& dir, const std::string& what,
                                        const std::string& expected, const std::string& actual) {
  throw UsageError("ctxpar hybrid", -1, "--reference " + dir + ": " + what, expected, actual);
}

inline void write_matrix(const std::string& path, const Matrix& m) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(m.data.data()),
          static_cast<std::streamsize>(m.data.size() * sizeof(double)));
  if (!f) throw UsageError("ctxpar hybrid", -1, "cannot write " + path, "a writable file", path);
}

// Rows `tokens` (ascending runs are read with one seek each) of the `[rows, cols]` file `path`.
inline Matrix read_rows(const std::string& dir, const std::string& path, std::int64_t rows,
                        std::int64_t cols, const std::vector<std::int64_t>& tokens) {
  std::ifstream f(path, std::ios::binary);
  if (!f) reference_fail(dir, "missing " + path, "the file the reference run wrote", "none");
  f.seekg(0, std::ios::end);
  const std::int64_t size = static_cast<std::int64_t>(f.tellg());
  const std::int64_t row_bytes = cols * static_cast<std::int64_t>(sizeof(double));
  if (size != rows * row_bytes)
    reference_fail(dir, path + " has the wrong size", std::to_string(rows * row_bytes) + " bytes",
                   std::to_string(size) + " bytes");
  Matrix m(static_cast<std::int64_t>(tokens.size()), cols);
  std::size_t j = 0;
  while (j < tokens.size()) {
    std::size_t end = j + 1;
    while (end < tokens.size() && tokens[end] == tokens[end - 1] + 1) ++end;
    f.seekg(tokens[j] * row_bytes);
    f.read(reinterpret_cast<char*>(m.data.data() + j * static_cast<std::size_t>(cols)),
           static_cast<std::streamsize>((end - j) * static_cast<std::size_t>(row_bytes)));
    if (!f) reference_fail(dir, "cannot read " + path, "readable", "a short read");
    j = end;
  }
  return m;
}

}  // namespace detail

/// Writes the reference directory's description and the gradient list; rank 0 of a P = 1 run.
inline void write_reference_key(const std::string& dir, const ReferenceKey& key,
                                const std::map<std::string, Matrix>& grads) {
  std::filesystem::create_directories(dir);
  const std::string path = (std::filesystem::path(dir) / "reference.txt").string();
  std::ofstream f(path, std::ios::trunc);
  f << detail::reference_magic << "\n";
  for (const auto& [k, v] : key) f << "option " << k << " " << v << "\n";
  for (const auto& [name, g] : grads)
    f << "grad " << name << " " << g.rows << " " << g.cols << "\n";
  if (!f) throw UsageError("ctxpar hybrid", -1, "cannot write " + path, "a writable file", path);
}

/// Writes one step: the whole-sequence layer outputs and input gradients, the weight gradients,
/// the loss and the layer times (appended to the description).
inline void write_reference_step(const std::string& dir, int step, const ReferenceStep& s) {
  const std::pair<const char*, const Matrix*> rows[] = {{"x1", &s.x1},   {"x2", &s.x2},
                                                        {"x3", &s.x3},   {"dx0", &s.dx0},
                                                        {"dx1", &s.dx1}, {"dx2", &s.dx2}};
  for (const auto& [name, m] : rows) detail::write_matrix(detail::matrix_path(dir, step, name), *m);
  for (const auto& [name, g] : s.grads)
    detail::write_matrix(detail::matrix_path(dir, step, "grad." + name), g);
  std::ofstream f((std::filesystem::path(dir) / "reference.txt").string(), std::ios::app);
  std::ostringstream loss;
  loss.precision(17);
  loss << s.loss;
  f << "loss " << step << " " << loss.str() << "\n";
  for (std::size_t l = 0; l < s.layer_seconds.size(); ++l)
    f << "time " << step << " " << l << " " << s.layer_seconds[l] << "\n";
}

/// Reads step `step` for the rank holding `tokens`, after checking that the directory was written
/// by a run with the same `key` (a mismatch names the option). Throws `UsageError`.
inline ReferenceStep read_reference_step(const std::string& dir, const ReferenceKey& key, int step,
                                         std::int64_t length, std::int64_t width,
                                         const std::vector<std::int64_t>& tokens) {
  std::ifstream f((std::filesystem::path(dir) / "reference.txt").string());
  std::string line;
  if (!f || !std::getline(f, line) || line != detail::reference_magic)
    detail::reference_fail(dir, "not a reference directory",
                           "reference.txt written by `ctxpar hybrid --save-reference` at P = 1",
                           f ? "another file" : "no reference.txt");
  std::map<std::string, std::string> options;
  std::map<std::string, std::pair<std::int64_t, std::int64_t>> grad_shapes;
  std::map<int, double> losses;
  std::map<int, std::vector<double>> times;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string kind, name;
    in >> kind >> name;
    if (kind == "option") {
      std::string value;
      in >> value;
      options[name] = value;
    } else if (kind == "grad") {
      std::int64_t r = 0, c = 0;
      in >> r >> c;
      grad_shapes[name] = {r, c};
    } else if (kind == "loss") {
      double v = 0;
      in >> v;
      losses[std::stoi(name)] = v;
    } else if (kind == "time") {
      std::size_t l = 0;
      double v = 0;
      in >> l >> v;
      std::vector<double>& t = times[std::stoi(name)];
      t.resize(std::max(t.size(), l + 1));
      t[l] = v;
    }
  }
  for (const auto& [k, v] : key) {
    const auto it = options.find(k);
    const std::string have = it == options.end() ? "absent" : it->second;
    if (have != v) detail::reference_fail(dir, "written with another --" + k, v, have);
  }
  const auto loss = losses.find(step);
  if (loss == losses.end())
    detail::reference_fail(dir, "has no step " + std::to_string(step),
                           "a reference run with at least this many --steps", "fewer steps");
  ReferenceStep s;
  s.loss = loss->second;
  s.layer_seconds = times[step];
  Matrix* rows[] = {&s.x1, &s.x2, &s.x3, &s.dx0, &s.dx1, &s.dx2};
  const char* names[] = {"x1", "x2", "x3", "dx0", "dx1", "dx2"};
  for (int i = 0; i < 6; ++i)
    *rows[i] =
        detail::read_rows(dir, detail::matrix_path(dir, step, names[i]), length, width, tokens);
  for (const auto& [name, shape] : grad_shapes) {
    std::vector<std::int64_t> all(static_cast<std::size_t>(shape.first));
    for (std::int64_t i = 0; i < shape.first; ++i) all[static_cast<std::size_t>(i)] = i;
    s.grads[name] = detail::read_rows(dir, detail::matrix_path(dir, step, "grad." + name),
                                      shape.first, shape.second, all);
  }
  return s;
}

}  // namespace ctxpar::cli::hybrid
