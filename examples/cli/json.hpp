// A small JSON writer for the `ctxpar` tool's machine-readable output: timings and per-rank byte
// counters (gathered to rank 0), so benchmarks and scripts never scrape the human report.
#pragma once

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar/core/error.hpp"
#include "files.hpp"

namespace ctxpar::cli {

/// A JSON value: null, bool, number (int64 or double), string, array or object. Object keys keep
/// their insertion order so the output reads in the order it was built.
class Json {
 public:
  /// null
  Json() = default;
  /// a boolean
  Json(bool b) : kind_(Kind::boolean), bool_(b) {}  // NOLINT(google-explicit-constructor)
  /// an integer
  Json(int i) : kind_(Kind::integer), int_(i) {}  // NOLINT(google-explicit-constructor)
  /// an integer
  Json(std::int64_t i) : kind_(Kind::integer), int_(i) {}  // NOLINT(google-explicit-constructor)
  /// a floating-point number (NaN and infinities are written as null: JSON has no spelling for
  /// them)
  Json(double d) : kind_(Kind::number), double_(d) {}  // NOLINT(google-explicit-constructor)
  /// a string
  Json(std::string s) : kind_(Kind::string), string_(std::move(s)) {}  // NOLINT
  /// a string
  Json(const char* s) : kind_(Kind::string), string_(s) {}  // NOLINT(google-explicit-constructor)

  /// An empty array.
  static Json array() {
    Json j;
    j.kind_ = Kind::array;
    return j;
  }
  /// An empty object.
  static Json object() {
    Json j;
    j.kind_ = Kind::object;
    return j;
  }

  /// Appends to an array.
  Json& push_back(Json value) {
    require_local(kind_ == Kind::array, "ctxpar::cli::Json", "push_back needs an array", "array",
                  "another kind");
    items_.push_back(std::move(value));
    return *this;
  }

  /// The member `key` of an object, created (null) if absent.
  Json& operator[](const std::string& key) {
    require_local(kind_ == Kind::object, "ctxpar::cli::Json", "operator[] needs an object",
                  "object", "another kind");
    for (auto& m : members_) {
      if (m.first == key) return m.second;
    }
    members_.emplace_back(key, Json());
    return members_.back().second;
  }

  /// Writes the value with `indent` spaces per level (0: one line).
  void dump(std::ostream& out, int indent = 2, int level = 0) const {
    const std::string pad =
        indent > 0 ? std::string(static_cast<std::size_t>(indent * (level + 1)), ' ') : "";
    const std::string close_pad =
        indent > 0 ? std::string(static_cast<std::size_t>(indent * level), ' ') : "";
    const char* nl = indent > 0 ? "\n" : "";
    switch (kind_) {
      case Kind::null:
        out << "null";
        break;
      case Kind::boolean:
        out << (bool_ ? "true" : "false");
        break;
      case Kind::integer:
        out << int_;
        break;
      case Kind::number:
        if (std::isfinite(double_)) {
          std::ostringstream s;
          s << std::setprecision(std::numeric_limits<double>::max_digits10) << double_;
          out << s.str();
        } else {
          out << "null";
        }
        break;
      case Kind::string:
        write_string(out, string_);
        break;
      case Kind::array:
        if (items_.empty()) {
          out << "[]";
          break;
        }
        out << "[" << nl;
        for (std::size_t i = 0; i < items_.size(); ++i) {
          out << pad;
          items_[i].dump(out, indent, level + 1);
          out << (i + 1 < items_.size() ? "," : "") << nl;
        }
        out << close_pad << "]";
        break;
      case Kind::object:
        if (members_.empty()) {
          out << "{}";
          break;
        }
        out << "{" << nl;
        for (std::size_t i = 0; i < members_.size(); ++i) {
          out << pad;
          write_string(out, members_[i].first);
          out << (indent > 0 ? ": " : ":");
          members_[i].second.dump(out, indent, level + 1);
          out << (i + 1 < members_.size() ? "," : "") << nl;
        }
        out << close_pad << "}";
        break;
    }
  }

  /// The value as text.
  std::string str(int indent = 2) const {
    std::ostringstream s;
    dump(s, indent);
    return s.str();
  }

 private:
  enum class Kind { null, boolean, integer, number, string, array, object };

  static void write_string(std::ostream& out, const std::string& s) {
    out << '"';
    for (unsigned char c : s) {
      switch (c) {
        case '"':
          out << "\\\"";
          break;
        case '\\':
          out << "\\\\";
          break;
        case '\n':
          out << "\\n";
          break;
        case '\t':
          out << "\\t";
          break;
        case '\r':
          out << "\\r";
          break;
        default:
          if (c < 0x20) {
            out << "\\u" << std::hex << std::setw(4) << std::setfill('0') << static_cast<int>(c)
                << std::dec << std::setfill(' ');
          } else {
            out << c;
          }
      }
    }
    out << '"';
  }

  Kind kind_ = Kind::null;
  bool bool_ = false;
  std::int64_t int_ = 0;
  double double_ = 0;
  std::string string_;
  std::vector<Json> items_;
  std::vector<std::pair<std::string, Json>> members_;
};

/// Collective: every rank's traffic counters (calls, bytes sent and received per collective kind),
/// as an array indexed by rank, valid on rank 0 (null elsewhere).
inline Json gather_traffic(const Group& group) {
  constexpr int kinds = static_cast<int>(CollectiveKind::count_);
  std::vector<std::int64_t> mine(3 * kinds);
  for (int k = 0; k < kinds; ++k) {
    const Traffic& t = group.traffic(static_cast<CollectiveKind>(k));
    mine[3 * k] = t.calls;
    mine[3 * k + 1] = t.bytes_sent;
    mine[3 * k + 2] = t.bytes_received;
  }
  std::vector<std::int64_t> all(group.rank() == 0 ? mine.size() * group.size() : 0);
  MPI_Gather(mine.data(), 3 * kinds, MPI_INT64_T, all.data(), 3 * kinds, MPI_INT64_T, 0,
             group.mpi_comm());
  if (group.rank() != 0) return Json();
  Json ranks = Json::array();
  for (int r = 0; r < group.size(); ++r) {
    Json entry = Json::object();
    entry["rank"] = r;
    for (int k = 0; k < kinds; ++k) {
      const std::int64_t* t = &all[static_cast<std::size_t>(r * 3 * kinds + 3 * k)];
      if (t[0] == 0) continue;
      Json kind = Json::object();
      kind["calls"] = t[0];
      kind["bytes_sent"] = t[1];
      kind["bytes_received"] = t[2];
      entry[to_string(static_cast<CollectiveKind>(k))] = kind;
    }
    ranks.push_back(entry);
  }
  return ranks;
}

/// Collective: each rank's `seconds` for one timed step, as an array indexed by rank on rank 0
/// (null elsewhere).
inline Json gather_seconds(const Group& group, double seconds) {
  std::vector<double> all(static_cast<std::size_t>(group.rank() == 0 ? group.size() : 0));
  MPI_Gather(&seconds, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, group.mpi_comm());
  if (group.rank() != 0) return Json();
  Json out = Json::array();
  for (double s : all) out.push_back(s);
  return out;
}

/// Collective, before the run: throws the same `ctxpar::Error` on every rank, naming `--json`,
/// unless `path` can be written (a regular file or a new one, in a writable directory). An empty
/// `path` means no JSON was asked for.
inline void check_json_path(const Group& group, const std::string& op, const std::string& path) {
  const std::string problem = path.empty() ? "" : why_not_output_file(path);
  Preconditions chk(group, op);
  chk.require(problem.empty(), "--json " + path + ": " + problem,
              "a writable regular file, or a new file in a writable directory", problem);
  chk.agree();
}

/// Collective: rank 0 writes `value` to `path` through a fresh temporary renamed into place (every
/// write and the close checked), together with the files rank 0 already staged in `with` (if
/// given): all of them or none. Every rank throws the same `ctxpar::Error`, naming `--json`, when
/// that fails. Checked with `check_json_path` before the run.
inline void write_json(const Group& group, const std::string& op, const std::string& path,
                       const Json& value, StagedFiles* with = nullptr) {
  std::string problem;
  if (group.rank() == 0) {
    std::ostringstream out;
    value.dump(out);
    out << "\n";
    StagedFiles own;
    StagedFiles& staged = with != nullptr ? *with : own;
    problem = staged.stage(path, out.str());
    if (problem.empty()) problem = staged.commit();
    staged.discard();
  }
  Preconditions chk(group, op);
  chk.require(problem.empty(), "--json " + path + ": cannot write the JSON", "the file written",
              problem);
  chk.agree();
}

}  // namespace ctxpar::cli
