/// \file
/// A tiny JSON writer for benchmark results: one flat record per case, each carrying the machine
/// description (CPU model, build type, Kokkos backend, threads, ranks), written as a JSON array.
#pragma once

#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/timing.hpp"
#include "ctxpar/core/impl/isa_dispatch.hpp"

#ifndef CTXPAR_BENCH_BUILD_TYPE
/// The CMake build type the benchmark was compiled with (set by bench/common/CMakeLists.txt).
#define CTXPAR_BENCH_BUILD_TYPE "unknown"
#endif
#ifndef CTXPAR_BENCH_NATIVE
/// 1 when benchmarks are compiled with -march=native (CMake option CTXPAR_BENCH_NATIVE).
#define CTXPAR_BENCH_NATIVE 0
#endif

namespace ctxpar::bench {

/// Escapes `text` as a JSON string literal (with the quotes).
inline std::string json_string(const std::string& text) {
  std::ostringstream out;
  out << '"';
  for (const char c : text) {
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
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out << "\\u" << std::hex << std::setw(4) << std::setfill('0') << int(c) << std::dec;
        } else {
          out << c;
        }
    }
  }
  out << '"';
  return out.str();
}

/// Formats a number for JSON; NaN and infinities (not representable) become null.
inline std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  std::ostringstream out;
  out << std::setprecision(10) << value;
  return out.str();
}

/// The machine a benchmark ran on, as recorded with every case.
struct Machine {
  /// CPU model name from /proc/cpuinfo.
  std::string cpu;
  /// The widest x86 vector extension the CPU reports (avx512f, avx2, avx, sse2 or none): virtual
  /// machines sold under one model name differ here, and every compute ceiling with them.
  std::string simd;
  /// CMake build type.
  std::string build_type;
  /// Kokkos default execution space name (the backend).
  std::string backend;
  /// Concurrency of the default execution space (threads per rank on host backends).
  int threads = 1;
  /// MPI ranks of the run.
  int ranks = 1;
  /// Whether the benchmark binary was compiled with -march=native.
  bool native = false;
  /// The instruction set the host kernels run at (chosen at run time: core/host_isa.hpp), which
  /// with or without -march=native is what the kernel figures measured.
  std::string host_isa;
  /// 1-minute load average when the run started (a shared machine's noise, for the record).
  double load_average = -1;
};

/// Reads the CPU model name ("model name" in /proc/cpuinfo), or "unknown".
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) break;
      auto first = line.find_first_not_of(" \t", colon + 1);
      return first == std::string::npos ? std::string() : line.substr(first);
    }
  }
  return "unknown";
}

/// The widest x86 vector extension among the CPU's flags in /proc/cpuinfo, or "none".
inline std::string cpu_simd() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::string word;
    int widest = 0;  // index into `names`
    const char* names[] = {"none", "sse2", "avx", "avx2", "avx512f"};
    while (words >> word)
      for (int i = 1; i < 5; ++i)
        if (word == names[i]) widest = std::max(widest, i);
    return names[widest];
  }
  return "none";
}

/// The 1-minute load average from /proc/loadavg, or -1.
inline double load_average() {
  std::ifstream in("/proc/loadavg");
  double value = -1;
  in >> value;
  return in ? value : -1;
}

/// Describes this run. Needs Kokkos initialised; reads the rank count when MPI is initialised.
inline Machine this_machine(MPI_Comm comm = MPI_COMM_WORLD) {
  Machine m;
  m.cpu = cpu_model();
  m.simd = cpu_simd();
  m.build_type = CTXPAR_BENCH_BUILD_TYPE;
  m.backend = Kokkos::DefaultExecutionSpace::name();
  m.threads = Kokkos::DefaultExecutionSpace().concurrency();
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) MPI_Comm_size(comm, &m.ranks);
  m.native = CTXPAR_BENCH_NATIVE != 0;
  m.host_isa = ctxpar::host_isa_name(ctxpar::impl::process_host_isa());
  m.load_average = load_average();
  return m;
}

/// One benchmark case: ordered key/value fields, written as one flat JSON object.
class Record {
 public:
  /// A record for case `name` of benchmark `benchmark`.
  Record(const std::string& benchmark, const std::string& name) {
    set("benchmark", benchmark);
    set("case", name);
  }
  /// Sets a numeric field.
  Record& set(const std::string& key, double value) { return raw(key, json_number(value)); }
  /// Sets an integer field.
  Record& set(const std::string& key, std::int64_t value) {
    return raw(key, std::to_string(value));
  }
  /// Sets an integer field.
  Record& set(const std::string& key, int value) { return set(key, std::int64_t{value}); }
  /// Sets a boolean field.
  Record& set(const std::string& key, bool value) { return raw(key, value ? "true" : "false"); }
  /// Sets a string field.
  Record& set(const std::string& key, const std::string& value) {
    return raw(key, json_string(value));
  }
  /// Sets a string field.
  Record& set(const std::string& key, const char* value) { return set(key, std::string(value)); }
  /// Sets `key_median_s`, `key_min_s`, `key_max_s` and `key_repeats` from a timing.
  Record& set(const std::string& key, const Timing& t) {
    set(key + "_median_s", t.median_s);
    set(key + "_min_s", t.min_s);
    set(key + "_max_s", t.max_s);
    return set(key + "_repeats", t.repeats);
  }
  /// The record as a JSON object, with the machine description under "machine".
  std::string to_json(const Machine& m) const {
    std::ostringstream out;
    out << "{";
    for (const auto& [key, value] : fields_) out << json_string(key) << ": " << value << ", ";
    out << "\"machine\": {\"cpu\": " << json_string(m.cpu) << ", \"simd\": " << json_string(m.simd)
        << ", \"build_type\": " << json_string(m.build_type)
        << ", \"backend\": " << json_string(m.backend) << ", \"threads\": " << m.threads
        << ", \"ranks\": " << m.ranks << ", \"native\": " << (m.native ? "true" : "false")
        << ", \"host_isa\": " << json_string(m.host_isa)
        << ", \"load_average\": " << json_number(m.load_average) << "}}";
    return out.str();
  }

 private:
  Record& raw(const std::string& key, std::string value) {
    for (auto& field : fields_) {
      if (field.first == key) {
        field.second = std::move(value);
        return *this;
      }
    }
    fields_.emplace_back(key, std::move(value));
    return *this;
  }
  std::vector<std::pair<std::string, std::string>> fields_;
};

/// Collects records and writes them as a JSON array (one object per case).
class Report {
 public:
  /// A report for `machine`.
  explicit Report(Machine machine) : machine_(std::move(machine)) {}
  /// Appends one case.
  void add(const Record& record) { records_.push_back(record); }
  /// The whole report as JSON text.
  std::string to_json() const {
    std::ostringstream out;
    out << "[\n";
    for (std::size_t i = 0; i < records_.size(); ++i)
      out << "  " << records_[i].to_json(machine_) << (i + 1 < records_.size() ? ",\n" : "\n");
    out << "]\n";
    return out.str();
  }
  /// Writes the report to `path`; throws std::runtime_error when the file cannot be written.
  void write(const std::string& path) const {
    std::ofstream out(path);
    out << to_json();
    if (!out) throw std::runtime_error("ctxpar::bench::Report: cannot write " + path);
  }
  /// The machine every record is tagged with.
  const Machine& machine() const { return machine_; }

 private:
  Machine machine_;
  std::vector<Record> records_;
};

}  // namespace ctxpar::bench
