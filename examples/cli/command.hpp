// The contract between the `ctxpar` command-line tool and the files that add subcommands to it.
//
// ADDING A SUBCOMMAND
//   Create `examples/cli/cmd_<name>.cpp` (examples/CMakeLists.txt globs `cmd_*.cpp`; no CMake edit)
//   and, at namespace scope in it:
//
//     namespace {
//     int run_swa(const ctxpar::cli::Args& args, const ctxpar::Group& group) {
//       const auto length = args.get<std::int64_t>("length", 1024);   // optional, with default
//       const auto input = args.get<std::string>("q");                // required: Error if absent
//       const bool zigzag = args.has("zigzag");                       // a flag (no value)
//       ...
//       return 0;                                                     // exit status
//     }
//     }  // namespace
//     CTXPAR_CLI_COMMAND("swa", "sliding-window attention on .npy tensors",
//                        "--q FILE [--length N] [--zigzag]", run_swa);
//
//   * `name` is what the user types after `ctxpar`; `summary` is one line for `ctxpar --help`;
//     `usage` is the synopsis, then (after a blank line) each option with its default and each
//     input and output file with its shape and dtype: `ctxpar <name> --help` prints it. Every
//     `--option` spelled in `usage` is an allowed option, and nothing else is (plus `--help`): the
//     tool rejects an unknown option before the command runs, with the same ctxpar::Error on every
//     rank (argv is identical on every rank under mpirun).
//   * `fn` runs on every rank with the parsed options and a Group over MPI_COMM_WORLD (MPI and
//     Kokkos are initialised). Its return value is the exit status of that rank.
//   * Options: `--key value`, `--key=value`, or `--flag`. A token after `--key` that does not
//     start with `--` is its value (so `--shift -1` works); no positional arguments.
//     `get<T>(key)` is a required option, `get<T>(key, fallback)` an optional one; both throw a
//     ctxpar::Error naming the command and the option when it is missing or does not parse as T
//     (whole token; integers range-checked; bool accepts true/false/1/0). `has(flag)` is true when
//     the flag was given, and throws if a value was attached to it.
//   * Read EVERY option on EVERY rank at the start of `fn`, before the first collective: then a
//     bad option throws the same `UsageError` on every rank, and the tool prints it once and exits
//     with status 2. Any other exception escaping `fn` is printed with its rank and the job is
//     aborted with MPI_Abort (a rank-local failure must not leave the other ranks waiting).
//   * Kokkos sees only `--kokkos-*` options; everything else after the command name is yours.
//
// ADDING A PART TO `ctxpar demo`
//     namespace {
//     bool demo_swa(const ctxpar::Group& group, std::ostream& report) { ...; return all_ok; }
//     }  // namespace
//     CTXPAR_CLI_DEMO_PART("swa", demo_swa);
//
//   * Called collectively on every rank, after the foundation checks, in order of `name`.
//   * Return true iff the checks this rank saw passed; the driver all-reduces the verdicts and
//     prints `PASS`/`FAIL` per part; `ctxpar demo` exits non-zero if any part fails.
//   * Write the readable report to `report`: rank 0's report is printed; another rank's report is
//     printed (prefixed with its rank) only when that rank's verdict is false.
//   * Keep each part to a few seconds on 2 ranks of a 2-core machine (ctest runs the demo at
//     np 1..4, and 5..8 under the `extended` label).
//   * Options for the parts: declare them once with `CTXPAR_CLI_DEMO_OPTIONS("[--seq-len N]")`
//     (they join `ctxpar demo --help` and the allowed options) and read them inside the part with
//     `ctxpar::cli::demo_args().get<std::int64_t>("seq-len", 4096)` — on every rank, before the
//     part's first collective. Parts share one option namespace: reuse a name only with the same
//     meaning.
#pragma once

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/core/error.hpp"

namespace ctxpar::cli {

/// A bad command line (unknown, missing or ill-typed option): the tool prints it and exits with
/// status 2 instead of aborting the job.
class UsageError : public Error {
 public:
  using Error::Error;
};

/// The options given to one subcommand, parsed from `--key value`, `--key=value` and `--flag`.
class Args {
 public:
  /// Parses `tokens` for the subcommand `command`. Throws `ctxpar::Error` on a positional argument,
  /// a repeated option, or an option not in `allowed` (an empty `allowed` accepts any option).
  Args(std::string command, const std::vector<std::string>& tokens,
       const std::set<std::string>& allowed = {})
      : command_(std::move(command)) {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const std::string& token = tokens[i];
      if (token.size() < 3 || token.compare(0, 2, "--") != 0) {
        fail("arguments are options of the form --key value or --flag", "an option", token);
      }
      std::string key = token.substr(2);
      std::string value;
      bool has_value = false;
      const auto eq = key.find('=');
      if (eq != std::string::npos) {
        value = key.substr(eq + 1);
        key = key.substr(0, eq);
        has_value = true;
      } else if (i + 1 < tokens.size() && tokens[i + 1].compare(0, 2, "--") != 0) {
        value = tokens[++i];
        has_value = true;
      }
      if (!allowed.empty() && key != "help" && allowed.count(key) == 0) {
        fail("unknown option --" + key, "one of " + list(allowed), "--" + key);
      }
      if (values_.count(key) != 0) fail("option given twice", "--" + key + " once", "twice");
      values_[key] = Value{value, has_value};
    }
  }

  /// The subcommand these options belong to.
  const std::string& command() const noexcept { return command_; }

  /// True when `--flag` was given. Throws if the flag was given a value.
  bool has(const std::string& flag) const {
    const auto it = values_.find(flag);
    if (it == values_.end()) return false;
    if (it->second.has_value) {
      fail("--" + flag + " is a flag and takes no value", "--" + flag,
           "--" + flag + " " + it->second.text);
    }
    return true;
  }

  /// True when `--key` was given, with or without a value.
  bool given(const std::string& key) const { return values_.count(key) != 0; }

  /// The required option `--key` as a `T`. Throws when it is missing or does not parse.
  template <class T>
  T get(const std::string& key) const {
    const auto it = values_.find(key);
    if (it == values_.end())
      fail("missing required option --" + key, "--" + key + " <value>", "nothing");
    return convert<T>(key, it->second);
  }

  /// The optional option `--key` as a `T`, or `fallback` when absent. Throws when it does not
  /// parse.
  template <class T>
  T get(const std::string& key, const T& fallback) const {
    const auto it = values_.find(key);
    return it == values_.end() ? fallback : convert<T>(key, it->second);
  }

  /// The optional option `--key` as a `T` in `[lo, hi]`, or `fallback` when absent. Throws a
  /// `UsageError` naming the option when it is out of range; `why` says what the range protects.
  template <class T>
  T get_in(const std::string& key, const T& fallback, const T& lo, const T& hi,
           const std::string& why = "") const {
    const T value = get<T>(key, fallback);
    require(key, value >= lo && value <= hi, why.empty() ? "out of range" : why,
            "a value in [" + impl::to_text(lo) + ", " + impl::to_text(hi) + "]", value);
    return value;
  }

  /// Throws a `UsageError` naming `--key` unless `ok`: for checks of an option's value that need
  /// more than a range (a rank that must exist, a size that must divide another).
  template <class Expected, class Actual>
  void require(const std::string& key, bool ok, const std::string& condition,
               const Expected& expected, const Actual& actual) const {
    if (!ok) fail("--" + key + ": " + condition, impl::to_text(expected), impl::to_text(actual));
  }

  /// Overload so that `get<std::string>("k", "text")` works with a string literal.
  std::string get(const std::string& key, const char* fallback) const {
    return get<std::string>(key, std::string(fallback));
  }

  /// The option names given, for diagnostics.
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    for (const auto& kv : values_) out.push_back(kv.first);
    return out;
  }

 private:
  struct Value {
    std::string text;
    bool has_value = false;
  };

  [[noreturn]] void fail(const std::string& condition, const std::string& expected,
                         const std::string& actual) const {
    throw UsageError("ctxpar " + command_, -1, condition, expected, actual);
  }

  static std::string list(const std::set<std::string>& names) {
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "--" : ", --") + n;
    return out;
  }

  template <class T>
  T convert(const std::string& key, const Value& v) const {
    if (!v.has_value)
      fail("option --" + key + " needs a value", "--" + key + " <value>", "--" + key);
    const std::string& s = v.text;
    // `--json=` or `--out ""` is a value left out by mistake (an unset shell variable), never a
    // request for the default: refused by name rather than taken as "not given".
    if (s.empty()) fail("option --" + key + " has an empty value", "--" + key + " <value>", "''");
    if constexpr (std::is_same_v<T, std::string>) {
      return s;
    } else if constexpr (std::is_same_v<T, bool>) {
      if (s == "true" || s == "1") return true;
      if (s == "false" || s == "0") return false;
      fail("option --" + key + " must be a boolean", "true, false, 1 or 0", s);
    } else if constexpr (std::is_integral_v<T>) {
      errno = 0;
      char* end = nullptr;
      long long parsed = 0;
      unsigned long long uparsed = 0;
      bool range_ok = true;
      if constexpr (std::is_signed_v<T>) {
        parsed = std::strtoll(s.c_str(), &end, 10);
        range_ok = parsed >= static_cast<long long>(std::numeric_limits<T>::min()) &&
                   parsed <= static_cast<long long>(std::numeric_limits<T>::max());
      } else {
        range_ok = s.find('-') == std::string::npos;
        uparsed = std::strtoull(s.c_str(), &end, 10);
        range_ok =
            range_ok && uparsed <= static_cast<unsigned long long>(std::numeric_limits<T>::max());
      }
      if (s.empty() || end != s.c_str() + s.size()) {
        fail("option --" + key + " must be an integer", "an integer", s);
      }
      if (errno == ERANGE || !range_ok) {
        fail("option --" + key + " is out of range",
             "an integer in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                 std::to_string(std::numeric_limits<T>::max()) + "]",
             s);
      }
      if constexpr (std::is_signed_v<T>) {
        return static_cast<T>(parsed);
      } else {
        return static_cast<T>(uparsed);
      }
    } else if constexpr (std::is_floating_point_v<T>) {
      errno = 0;
      char* end = nullptr;
      const double parsed = std::strtod(s.c_str(), &end);
      // strtod accepts "nan" and "inf": a non-finite option value (a scale, a RoPE base, a
      // learning rate) only turns every output into NaN, so it is refused here, by name. ERANGE
      // also flags an underflow (1e-320 is a subnormal, finite): only an overflow is refused.
      if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(parsed) ||
          !std::isfinite(static_cast<T>(parsed))) {
        fail("option --" + key + " must be a finite number", "a finite number", s);
      }
      return static_cast<T>(parsed);
    } else {
      static_assert(
          std::is_same_v<T, std::string>,
          "ctxpar::cli::Args::get: T must be std::string, bool, an integer or a floating type");
    }
  }

  std::string command_;
  std::map<std::string, Value> values_;
};

/// A subcommand's entry point: returns the exit status of this rank.
using CommandFn = int (*)(const Args&, const ctxpar::Group&);

/// A part of `ctxpar demo`: returns true iff the checks this rank saw passed.
using DemoFn = bool (*)(const ctxpar::Group&, std::ostream& report);

/// A registered subcommand.
struct Command {
  std::string name;     ///< what the user types after `ctxpar`
  std::string summary;  ///< one line for `--help`
  std::string usage;    ///< the options; every `--option` in it is allowed
  CommandFn fn;         ///< entry point
};

/// A registered part of the demo.
struct DemoPart {
  std::string name;  ///< shown in the report, also the order of the parts
  DemoFn fn;         ///< entry point
};

/// The process-wide registries, built before `main` by the registration macros. Function-local
/// statics, so the order in which translation units initialise does not matter.
inline std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}

/// The registered demo parts, see `commands()`.
inline std::vector<DemoPart>& demo_parts() {
  static std::vector<DemoPart> all;
  return all;
}

/// Extra options of `ctxpar demo` declared by demo parts (usage fragments such as
/// `"[--seq-len N] [--heads H]"`), appended to the demo's own usage.
inline std::vector<std::string>& demo_option_usages() {
  static std::vector<std::string> all;
  return all;
}

/// The options of the running `ctxpar demo`, set by the demo while its parts run.
inline const Args*& current_demo_args() {
  static const Args* args = nullptr;
  return args;
}

/// The options `ctxpar demo` was given, for a demo part (read them on every rank, before the
/// part's first collective). Only valid while a demo part runs.
inline const Args& demo_args() {
  if (current_demo_args() == nullptr) {
    throw Error("ctxpar::cli::demo_args", -1, "only available while a demo part runs",
                "a call from a CTXPAR_CLI_DEMO_PART function", "a call outside the demo");
  }
  return *current_demo_args();
}

/// Registers a subcommand, a demo part or demo options from a static object's constructor.
struct Registrar {
  /// Registers the subcommand `name`.
  Registrar(const char* name, const char* summary, const char* usage, CommandFn fn) {
    commands().push_back(Command{name, summary, usage, fn});
  }
  /// Registers the demo part `name`.
  Registrar(const char* name, DemoFn fn) { demo_parts().push_back(DemoPart{name, fn}); }
  /// Declares extra options of `ctxpar demo` (a usage fragment).
  explicit Registrar(const char* demo_options) { demo_option_usages().push_back(demo_options); }
};

/// The option names spelled `--name` in a usage string.
inline std::set<std::string> options_in_usage(const std::string& usage) {
  std::set<std::string> out;
  for (std::size_t i = usage.find("--"); i != std::string::npos; i = usage.find("--", i)) {
    std::size_t j = i + 2;
    while (j < usage.size() && (std::isalnum(static_cast<unsigned char>(usage[j])) ||
                                usage[j] == '-' || usage[j] == '_')) {
      ++j;
    }
    if (j > i + 2) out.insert(usage.substr(i + 2, j - i - 2));
    i = j;
  }
  return out;
}

/// A subcommand's whole usage: its own, plus the demo options the demo parts declared for `demo`.
inline std::string full_usage(const Command& c) {
  std::string usage = c.usage;
  if (c.name == "demo") {
    for (const auto& extra : demo_option_usages()) usage += " " + extra;
  }
  return usage;
}

/// Looks up a registered subcommand; nullptr when there is none.
inline const Command* find_command(const std::string& name) {
  for (const auto& c : commands()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

/// Writes the tool's help: usage line and every subcommand with its summary, sorted by name.
inline void print_help(std::ostream& out) {
  std::vector<Command> sorted = commands();
  std::sort(sorted.begin(), sorted.end(),
            [](const Command& a, const Command& b) { return a.name < b.name; });
  std::size_t width = 4;
  for (const auto& c : sorted) width = std::max(width, c.name.size());
  out << "usage: mpirun -np P ctxpar <command> [options]\n"
         "       ctxpar <command> --help    options of one command\n\n"
         "commands:\n";
  for (const auto& c : sorted) {
    out << "  " << c.name << std::string(width + 2 - c.name.size(), ' ') << c.summary << "\n";
  }
}

/// Writes one subcommand's usage.
inline void print_usage(std::ostream& out, const Command& c) {
  out << "ctxpar " << c.name << ": " << c.summary << "\n\nusage: mpirun -np P ctxpar " << c.name
      << " " << full_usage(c) << "\n";
}

/// What the tool was asked to do: show help (`command == nullptr` or `help`), or run `command`.
struct Invocation {
  const Command* command = nullptr;  ///< the subcommand, or nullptr for the tool's help
  bool help = false;                 ///< print help/usage instead of running
  std::unique_ptr<Args> args;        ///< the parsed options when running
};

/// Interprets argv (without the program name). Deterministic, so every rank agrees; throws
/// `ctxpar::Error` for an unknown command or a bad option.
inline Invocation parse_invocation(const std::vector<std::string>& tokens) {
  Invocation inv;
  if (tokens.empty() || tokens[0] == "--help" || tokens[0] == "-h" || tokens[0] == "help") {
    inv.help = true;
    if (tokens.size() > 1 && tokens[0] == "help") inv.command = find_command(tokens[1]);
    if (tokens.size() > 1 && tokens[0] == "help" && inv.command == nullptr) {
      throw UsageError("ctxpar", -1, "unknown command", "a command listed by ctxpar --help",
                       tokens[1]);
    }
    return inv;
  }
  inv.command = find_command(tokens[0]);
  if (inv.command == nullptr) {
    throw UsageError("ctxpar", -1, "unknown command", "a command listed by ctxpar --help",
                     tokens[0]);
  }
  const std::vector<std::string> rest(tokens.begin() + 1, tokens.end());
  if (std::find(rest.begin(), rest.end(), "--help") != rest.end()) {
    inv.help = true;
    return inv;
  }
  inv.args =
      std::make_unique<Args>(inv.command->name, rest, options_in_usage(full_usage(*inv.command)));
  return inv;
}

}  // namespace ctxpar::cli

#define CTXPAR_CLI_CONCAT_IMPL(a, b) a##b
#define CTXPAR_CLI_CONCAT(a, b) CTXPAR_CLI_CONCAT_IMPL(a, b)

/// Registers the subcommand `name` (a string literal) run by `fn` (a `ctxpar::cli::CommandFn`).
#define CTXPAR_CLI_COMMAND(name, summary, usage, fn)                                         \
  namespace {                                                                                \
  [[maybe_unused]] const ::ctxpar::cli::Registrar CTXPAR_CLI_CONCAT(ctxpar_cli_command_,     \
                                                                    __LINE__){name, summary, \
                                                                              usage, fn};    \
  }

/// Declares extra options of `ctxpar demo` for the demo parts, e.g. `"[--seq-len N] [--zigzag]"`;
/// a part reads them with `ctxpar::cli::demo_args()`.
#define CTXPAR_CLI_DEMO_OPTIONS(usage)                                                        \
  namespace {                                                                                 \
  [[maybe_unused]] const ::ctxpar::cli::Registrar CTXPAR_CLI_CONCAT(ctxpar_cli_demo_options_, \
                                                                    __LINE__){usage};         \
  }

/// Registers the demo part `name` (a string literal) run by `fn` (a `ctxpar::cli::DemoFn`).
#define CTXPAR_CLI_DEMO_PART(name, fn)                                                     \
  namespace {                                                                              \
  [[maybe_unused]] const ::ctxpar::cli::Registrar CTXPAR_CLI_CONCAT(ctxpar_cli_demo_part_, \
                                                                    __LINE__){name, fn};   \
  }
