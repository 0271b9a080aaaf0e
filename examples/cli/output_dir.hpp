// The `--out` directory of a subcommand: checked before the run, written only after it, so a
// failed run leaves no half-written output directory behind.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/preconditions.hpp"
#include "files.hpp"
#include "json.hpp"
#include "npy.hpp"

namespace ctxpar::cli {

/// The files a subcommand writes to `--out`. Construct it (collectively) before the run: it
/// checks that the directory exists or can be created, so an unwritable `--out` stops the run
/// before any work. Files are kept in memory on rank 0 and written by `commit()` at the end.
class OutputDir {
 public:
  /// Collective. Throws the same `ctxpar::Error` on every rank, naming `--out`, when `dir` is not
  /// a writable directory and cannot be created as one.
  OutputDir(const Group& group, std::string op, std::string dir)
      : group_(group), op_(std::move(op)), dir_(std::move(dir)) {
    Preconditions chk(group_, op_);
    const std::string problem = why_not_output_dir(dir_);
    chk.require(problem.empty(), "--out " + dir_ + ": " + problem,
                "a writable directory, or a path where one can be created", problem);
    chk.agree();
  }

  /// The directory, as given.
  const std::string& path() const noexcept { return dir_; }

  /// Adds `name` (e.g. "o.npy") to the files written by `commit()`. Only rank 0's are kept.
  void add(const std::string& name, NpyArray array) {
    if (group_.rank() == 0) files_[name] = npy_bytes(array);
  }

  /// Adds a JSON file (rank 0's value is written; other ranks may pass a null value).
  void add(const std::string& name, const Json& value) {
    if (group_.rank() != 0) return;
    std::ostringstream out;
    value.dump(out);
    out << "\n";
    files_[name] = out.str();
  }

  /// Collective: rank 0 creates the directory and writes every file under a fresh temporary name,
  /// then renames them all; on any failure none of them is left in `--out`. Throws the same
  /// `ctxpar::Error` on every rank when that fails.
  void commit() {
    std::string problem;
    if (group_.rank() == 0) problem = write_all();
    Preconditions chk(group_, op_);
    chk.require(problem.empty(), "--out " + dir_ + ": cannot write the outputs",
                "every file written", problem);
    chk.agree();
  }

 private:
  static std::string npy_bytes(const NpyArray& array) {
    // write_npy writes to a path; a temporary name in memory would need a second writer.
    std::ostringstream out;
    write_npy(out, array);
    return out.str();
  }

  // Every file staged first, then all renamed: a failure anywhere leaves none of them, and a
  // directory this run created is removed again.
  std::string write_all() const {
    namespace fs = std::filesystem;
    std::error_code ec;
    const bool existed = fs::exists(dir_, ec);
    fs::create_directories(dir_, ec);
    if (ec) return "cannot create the directory: " + ec.message();
    StagedFiles staged;
    std::string problem;
    for (const auto& [name, bytes] : files_) {
      problem = staged.stage(dir_ + "/" + name, bytes);
      if (!problem.empty()) break;
    }
    if (problem.empty()) problem = staged.commit();
    staged.discard();
    if (!problem.empty() && !existed) fs::remove(dir_, ec);
    return problem;
  }

  Group group_;
  std::string op_, dir_;
  std::map<std::string, std::string> files_;
};

}  // namespace ctxpar::cli
