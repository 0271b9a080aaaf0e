/// \file
/// Run-time dispatch of the host kernels to an instruction set (`core/host_isa.hpp`).
///
/// A host kernel writes its body once, as a generic callable of the vector width
/// (`std::integral_constant<int, Bytes>`), and runs it through `with_host_isa`. Each instruction
/// set has one entry function carrying GCC's `target` attribute and `flatten`: every call inside
/// the body (vector helpers, tile products, Kokkos accessors) is inlined into the entry and so
/// compiled for that instruction set, with vectors of its width, while the translation unit keeps
/// its own flags. The body must therefore not call itself or anything the compiler cannot inline.
///
/// The instruction set comes from the calling thread's `HostIsaScope` (a plan opens one around
/// each call with the set its ranks agreed on), else from the process's request.
#pragma once

#include <type_traits>

#include "ctxpar/core/host_isa.hpp"

#if CTXPAR_HOST_SIMD && (defined(__GNUC__) || defined(__clang__))
#define CTXPAR_FLATTEN __attribute__((flatten))
#else
#define CTXPAR_FLATTEN
#endif

namespace ctxpar::impl {

/// The vector width, in bytes, a kernel body is instantiated for.
template <int Bytes>
using SimdWidth = std::integral_constant<int, Bytes>;

/// The widest vector any instruction set of this binary uses, in bytes (for sizing scratch).
inline constexpr int max_simd_bytes = CTXPAR_HOST_ISA_DISPATCH ? 64 : CTXPAR_SIMD_BYTES;

/// The vector width, in bytes, `with_host_isa(isa, ...)` instantiates its body for.
inline int host_isa_bytes(HostIsa isa) {
#if CTXPAR_HOST_ISA_DISPATCH
  if (isa == HostIsa::avx512) return 64;
  if (isa == HostIsa::avx2) return 32;
#endif
  (void)isa;
  return CTXPAR_SIMD_BYTES;
}

/// The instruction set of the process when no scope is open: the request when it is valid and
/// runs here, else the widest this CPU runs (plans report the forced set's errors; kernels called
/// outside a plan do not check).
inline HostIsa process_host_isa() {
  bool forced = false, valid = true;
  const char* env = nullptr;
  const HostIsa isa = requested_host_isa_value(forced, valid, env);
  return valid && host_isa_runs_here(isa) ? isa : detected_host_isa();
}

/// The calling thread's open scope: -1 none, else a `HostIsa`.
inline int& host_isa_scope_cell() {
  thread_local int cell = -1;
  return cell;
}

/// The instruction set kernels launched from this thread run at now.
inline HostIsa active_host_isa() {
  const int scoped = host_isa_scope_cell();
  return scoped >= 0 ? static_cast<HostIsa>(scoped) : process_host_isa();
}

/// Makes `isa` the calling thread's instruction set until the scope ends (scopes nest).
class HostIsaScope {
 public:
  explicit HostIsaScope(HostIsa isa) : previous_(host_isa_scope_cell()) {
    host_isa_scope_cell() = static_cast<int>(isa);
  }
  ~HostIsaScope() { host_isa_scope_cell() = previous_; }
  HostIsaScope(const HostIsaScope&) = delete;
  HostIsaScope& operator=(const HostIsaScope&) = delete;

 private:
  int previous_;
};

/// `body(SimdWidth<CTXPAR_SIMD_BYTES>)` compiled with the translation unit's flags.
template <class Body>
CTXPAR_FLATTEN void run_at_baseline(const Body& body) {
  body(SimdWidth<CTXPAR_SIMD_BYTES>{});
}

#if CTXPAR_HOST_ISA_DISPATCH
/// `body(SimdWidth<32>)` compiled for AVX2 + FMA.
template <class Body>
__attribute__((target("avx2,fma"), flatten)) void run_at_avx2(const Body& body) {
  body(SimdWidth<32>{});
}

/// `body(SimdWidth<64>)` compiled for AVX-512 (F, BW, DQ, VL) with AVX2 + FMA.
template <class Body>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma"), flatten)) void run_at_avx512(
    const Body& body) {
  body(SimdWidth<64>{});
}
#endif

/// Runs `body` at `isa` (a set this binary does not carry runs at the baseline).
template <class Body>
inline void with_host_isa(HostIsa isa, const Body& body) {
#if CTXPAR_HOST_ISA_DISPATCH
  if (isa == HostIsa::avx512) {
    run_at_avx512(body);
    return;
  }
  if (isa == HostIsa::avx2) {
    run_at_avx2(body);
    return;
  }
#endif
  (void)isa;
  run_at_baseline(body);
}

/// Runs `kernel.template run<Bytes>(item)`: through `with_host_isa(isa, ...)` when `Host` (the
/// execution space takes the host SIMD kernels), at the default width elsewhere (device spaces,
/// portable builds). The one `operator()` of every dispatched kernel.
template <bool Host, class Kernel, class Item>
KOKKOS_INLINE_FUNCTION void run_kernel(HostIsa isa, const Kernel& kernel, const Item& item) {
  if constexpr (Host) {
    with_host_isa(isa, [&](auto width) { kernel.template run<decltype(width)::value>(item); });
  } else {
    (void)isa;
    kernel.template run<CTXPAR_SIMD_BYTES>(item);
  }
}

}  // namespace ctxpar::impl
