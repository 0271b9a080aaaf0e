/// \file
/// The instruction set the host kernels run at, chosen at run time.
///
/// A binary built without an architecture flag still carries the host SIMD kernels at every width
/// its compiler can emit for the target (x86-64 with GCC or clang: the translation unit's own
/// flags, AVX2 + FMA and AVX-512), each compiled for its instruction set through function-level
/// target attributes (`core/impl/isa_dispatch.hpp`). Every plan picks one when it is built: the
/// widest this CPU runs, or the one forced by `force_host_isa` or the environment variable
/// `CTXPAR_HOST_ISA` (`baseline`, `avx2`, `avx512` or `auto`), agreed across its ranks (the
/// narrowest every rank runs; a forced set a rank cannot run is an error on every rank), so the
/// bitwise guarantees between rank counts hold within a job. Results are bitwise reproducible
/// within one instruction set; two sets may round differently (vector width changes the order of
/// lane reductions, AVX2 contracts products into FMAs).
#pragma once

#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "ctxpar/core/impl/enum_name.hpp"
#include "ctxpar/core/impl/simd.hpp"

/// 1 when the host kernels are compiled at several widths with run-time dispatch: x86-64 hosts
/// with GCC or clang vector extensions, in optimised builds. Without optimisation (`-O0`, e.g. a
/// Debug or sanitizer build) `flatten` does not inline the body into its entry, so wide vectors
/// would cross calls between functions compiled for different instruction sets (different ABIs)
/// and the register pins of the tile products could not be honoured: such builds carry the
/// baseline only.
#if CTXPAR_HOST_SIMD && defined(__OPTIMIZE__) && (defined(__x86_64__) || defined(_M_X64)) && \
    (defined(__GNUC__) || defined(__clang__))
#define CTXPAR_HOST_ISA_DISPATCH 1
#else
#define CTXPAR_HOST_ISA_DISPATCH 0
#endif

namespace ctxpar {

/// An instruction set of the host kernels, narrowest first.
enum class HostIsa : int {
  baseline = 0,  ///< the translation unit's own flags (SSE2 on a default x86-64 build)
  avx2 = 1,      ///< AVX2 + FMA, 32-byte vectors
  avx512 = 2,    ///< AVX-512 F/BW/DQ/VL, 64-byte vectors
};

/// The name of `isa` as `CTXPAR_HOST_ISA` and the tools spell it.
inline const char* host_isa_name(HostIsa isa) {
  static constexpr const char* names[] = {"baseline", "avx2", "avx512"};
  return ctxpar::impl::enum_name(isa, names, "baseline");
}

/// Parses a name of `host_isa_name`; false for anything else (`auto` included).
inline bool parse_host_isa(std::string_view text, HostIsa& isa) {
  for (HostIsa candidate : {HostIsa::baseline, HostIsa::avx2, HostIsa::avx512}) {
    if (text == host_isa_name(candidate)) {
      isa = candidate;
      return true;
    }
  }
  return false;
}

/// True when this binary carries the host kernels compiled for `isa`.
inline bool host_isa_compiled(HostIsa isa) {
  return isa == HostIsa::baseline || CTXPAR_HOST_ISA_DISPATCH;
}

/// True when `isa` is compiled in and this CPU (and its operating system) runs it.
inline bool host_isa_runs_here(HostIsa isa) {
  if (!host_isa_compiled(isa)) return false;
#if CTXPAR_HOST_ISA_DISPATCH
  if (isa == HostIsa::avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == HostIsa::avx512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
           host_isa_runs_here(HostIsa::avx2);
#endif
  return true;
}

/// The widest compiled instruction set this CPU runs.
inline HostIsa detected_host_isa() {
  for (HostIsa isa : {HostIsa::avx512, HostIsa::avx2})
    if (host_isa_runs_here(isa)) return isa;
  return HostIsa::baseline;
}

namespace impl {
/// The value `force_host_isa` set: -1 none, else a `HostIsa`.
inline std::atomic<int>& forced_host_isa_cell() {
  static std::atomic<int> cell{-1};
  return cell;
}
}  // namespace impl

/// Forces the instruction set of plans built from now on in this process (`std::nullopt`: back
/// to `CTXPAR_HOST_ISA`, or to detection when that is unset). Takes precedence over the
/// environment. For reproducing results across machines and for tests.
inline void force_host_isa(std::optional<HostIsa> isa) {
  impl::forced_host_isa_cell().store(isa ? static_cast<int>(*isa) : -1);
}

/// What this process asks of the plans it builds.
struct HostIsaRequest {
  HostIsa isa = HostIsa::baseline;  ///< the forced set, else the detected one
  bool forced = false;              ///< by `force_host_isa` or `CTXPAR_HOST_ISA`
  bool valid = true;                ///< false: `CTXPAR_HOST_ISA` names no instruction set
  std::string source;               ///< "detected", "force_host_isa" or "CTXPAR_HOST_ISA=<value>"
};

namespace impl {
/// The request without its description (no allocation: kernel launches outside a plan read it).
/// `valid` is false when `CTXPAR_HOST_ISA` names no instruction set; `env` receives its value.
inline HostIsa requested_host_isa_value(bool& forced, bool& valid, const char*& env) {
  forced = false;
  valid = true;
  env = nullptr;
  const int cell = forced_host_isa_cell().load();
  if (cell >= 0) {
    forced = true;
    return static_cast<HostIsa>(cell);
  }
  const char* value = std::getenv("CTXPAR_HOST_ISA");
  if (value != nullptr && *value != '\0' && std::string_view(value) != "auto") {
    HostIsa isa = HostIsa::baseline;
    forced = true;
    env = value;
    valid = parse_host_isa(value, isa);
    return isa;
  }
  return detected_host_isa();
}
}  // namespace impl

/// The instruction set this process asks for: `force_host_isa`, else `CTXPAR_HOST_ISA` (unset,
/// empty or `auto`: detection), else the widest this CPU runs.
inline HostIsaRequest requested_host_isa() {
  HostIsaRequest request;
  const char* env = nullptr;
  request.isa = impl::requested_host_isa_value(request.forced, request.valid, env);
  request.source = !request.forced  ? "detected"
                   : env != nullptr ? std::string("CTXPAR_HOST_ISA=") + env
                                    : "force_host_isa";
  return request;
}

}  // namespace ctxpar
