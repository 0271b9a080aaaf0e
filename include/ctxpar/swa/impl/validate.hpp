/// \file
/// The input checks of the sliding-window attention step, shared by the single-rank step (which
/// throws at once) and the distributed step (which agrees on them collectively).
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <string>

#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/core/view_checks.hpp"
#include "ctxpar/swa/impl/tensor_core_support.hpp"
#include "ctxpar/swa/options.hpp"
#include "ctxpar/swa/tensors.hpp"

namespace ctxpar::swa::impl {

/// Throws the first violation at once (no communicator: the rank in the message is -1).
struct LocalChecker {
  std::string op;
  template <class E, class A>
  LocalChecker& require(bool ok, const std::string& condition, const E& expected, const A& actual) {
    require_local(ok, op, condition, expected, actual);
    return *this;
  }
};

/// True when every element of the rank-3 `view` is finite. Runs where the view lives and writes
/// only `cell` (no host copy, no allocation), for the reason `first_disorder` gives.
template <class View, class MemorySpace>
bool all_finite(const View& view, const Kokkos::View<std::int64_t, MemorySpace>& cell) {
  using Exec = typename MemorySpace::execution_space;
  Kokkos::deep_copy(cell, std::int64_t(0));
  const auto v = view;
  const auto bad = cell;
  Kokkos::parallel_for(
      "ctxpar::swa::check_finite",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<3>>(
          {0, 0, 0},
          {static_cast<std::int64_t>(v.extent(0)), static_cast<std::int64_t>(v.extent(1)),
           static_cast<std::int64_t>(v.extent(2))}),
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j, const std::int64_t k) {
        if (!ctxpar::compat::isfinite(static_cast<double>(ctxpar::widen(v(i, j, k))))) bad() = 1;
      });
  std::int64_t found = 0;
  Kokkos::deep_copy(Kokkos::View<std::int64_t, Kokkos::HostSpace>(&found), cell);
  return found == 0;
}

/// Index `i` (on the axis `a ++ b`) of the first position not greater than the one before it, or
/// -1 when the axis is strictly increasing. Runs where the positions live (no host copy); `cell` is
/// one caller-owned device word. A plain parallel_for with an atomic minimum, not a
/// parallel_reduce: on the Threads backend a top-level reduction between team kernels makes the
/// backend free and reallocate its per-thread scratch on every call, which would break a plan's
/// no-allocation steady state.
template <class MemorySpace>
std::int64_t first_disorder(const Positions<MemorySpace>& a, const Positions<MemorySpace>& b,
                            const Kokkos::View<std::int64_t, MemorySpace>& cell) {
  using Exec = typename MemorySpace::execution_space;
  const std::int64_t na = static_cast<std::int64_t>(a.extent(0)),
                     n = na + static_cast<std::int64_t>(b.extent(0));
  if (n < 2) return -1;
  Kokkos::deep_copy(cell, n);
  const auto pa = a;
  const auto pb = b;
  const auto first = cell;
  Kokkos::parallel_for(
      "ctxpar::swa::check_positions",
      Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(1, n),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t x = i < na ? pa(i) : pb(i - na);
        const std::int64_t y = i - 1 < na ? pa(i - 1) : pb(i - 1 - na);
        if (!(x > y)) Kokkos::atomic_fetch_min(&first(), i);
      });
  std::int64_t found = n;
  Kokkos::deep_copy(Kokkos::View<std::int64_t, Kokkos::HostSpace>(&found), cell);
  return found < n ? found : -1;
}

/// Position `i` of the axis `a ++ b`, read back to the host.
template <class MemorySpace>
std::int64_t position_at(const Positions<MemorySpace>& a, const Positions<MemorySpace>& b,
                         std::int64_t i) {
  const std::int64_t na = static_cast<std::int64_t>(a.extent(0));
  std::int64_t v = 0;
  Kokkos::deep_copy(Kokkos::View<std::int64_t, Kokkos::HostSpace>(&v),
                    i < na ? Kokkos::subview(a, i) : Kokkos::subview(b, i - na));
  return v;
}

/// The one check of the step's options: the window, the RoPE base and the softmax scale. A plan
/// makes it once, at construction; the single-rank step on every call.
template <class Checker>
void check_options(Checker& chk, const Options& options) {
  chk.require(options.window >= 0, "the window must be non-negative (0 = unlimited)", ">= 0",
              options.window);
  // A base of 0, a negative base or NaN turns every angle into NaN or Inf, and a non-finite scale
  // every score: the step would return NaN everywhere and still "succeed".
  chk.require(std::isfinite(options.rope_base) && options.rope_base > 0.0,
              "options.rope_base must be finite and positive", "a finite base > 0",
              ctxpar::impl::to_text(options.rope_base));
  chk.require(std::isfinite(options.scale), "options.scale must be finite (0 = 1 / sqrt(D))",
              "a finite scale", ctxpar::impl::to_text(options.scale));
  // A value cast from an integer outside the enumeration would select no kernel at all.
  const int kernels = static_cast<int>(options.kernels);
  chk.require(kernels >= static_cast<int>(KernelChoice::automatic) &&
                  kernels <= static_cast<int>(KernelChoice::tensor_core),
              "options.kernels must be a KernelChoice",
              "automatic, portable, host_fused, host_unfused or tensor_core", kernels);
}

/// Shape, id, ordering and (optionally) finiteness checks on one rank's chunk and cache (the
/// options are `check_options`'). Returns
/// false when a shape check failed (later checks would index out of range and are skipped).
/// `cell` is one device word the position check may write (a plan owns one).
template <class Checker, class Scalar, class MemorySpace>
bool check_inputs(Checker& chk, const Chunk<Scalar, MemorySpace>& chunk,
                  const KvBlock<Scalar, MemorySpace>& cache, const Options& options,
                  const Kokkos::View<std::int64_t, MemorySpace>& cell) {
  const auto t = chunk.q.extent(0), hq = chunk.q.extent(1), dim = chunk.q.extent(2);
  const auto hkv = chunk.k.extent(1);
  bool ok = true;
  auto need = [&](bool cond, const std::string& what, const std::string& expected,
                  const std::string& actual) {
    chk.require(cond, what, expected, actual);
    ok = ok && cond;
  };
  using ctxpar::impl::shape_text;
  need(dim % 2 == 0, "the head dimension must be even (RoPE rotates pairs)", "an even D",
       std::to_string(dim));
  need(hkv > 0 && hq % hkv == 0, "query heads must be a multiple of key/value heads (GQA)",
       "Hq % Hkv == 0", std::to_string(hq) + " % " + std::to_string(hkv));
  need(chunk.k.extent(0) == t && chunk.v.extent(0) == t && chunk.k.extent(2) == dim &&
           chunk.v.extent(1) == hkv && chunk.v.extent(2) == dim,
       "q, k and v must have the same tokens and head dimension, k and v the same heads",
       "k, v = [" + std::to_string(t) + ", Hkv, " + std::to_string(dim) + "]",
       "q " + shape_text(chunk.q) + ", k " + shape_text(chunk.k) + ", v " + shape_text(chunk.v));
  need(chunk.pos.extent(0) == t, "one position per chunk token", std::to_string(t),
       std::to_string(chunk.pos.extent(0)));
  need(cache.k.extent(0) == cache.pos.extent(0) && cache.v.extent(0) == cache.pos.extent(0) &&
           (cache.pos.extent(0) == 0 || (cache.k.extent(1) == hkv && cache.v.extent(1) == hkv &&
                                         cache.k.extent(2) == dim && cache.v.extent(2) == dim)),
       "the cache must hold one position per key and match the chunk's heads and head dimension",
       "[" + std::to_string(cache.pos.extent(0)) + ", " + std::to_string(hkv) + ", " +
           std::to_string(dim) + "]",
       "k " + shape_text(cache.k) + ", v " + shape_text(cache.v));
  need(chunk.ids.extent(0) == 0 || chunk.ids.extent(0) == t,
       "ids must be absent or one per chunk token", "0 or " + std::to_string(t),
       std::to_string(chunk.ids.extent(0)));
  need(cache.ids.extent(0) == 0 || cache.ids.extent(0) == cache.pos.extent(0),
       "cache ids must be absent or one per cache key",
       "0 or " + std::to_string(cache.pos.extent(0)), std::to_string(cache.ids.extent(0)));
  if (!ok) return false;
  if (const std::int64_t i = first_disorder(cache.pos, chunk.pos, cell); i > 0) {
    chk.require(false,
                "positions must be strictly increasing along the key/value axis (cache ++ chunk)",
                "position " + std::to_string(i) + " > " +
                    std::to_string(position_at(cache.pos, chunk.pos, i - 1)),
                std::to_string(position_at(cache.pos, chunk.pos, i)));
    return false;
  }
  if (options.check_finite) {
    const bool finite = all_finite(chunk.q, cell) && all_finite(chunk.k, cell) &&
                        all_finite(chunk.v, cell) && all_finite(cache.k, cell) &&
                        all_finite(cache.v, cell);
    chk.require(finite, "inputs must be finite (check_finite is on)", "no NaN or Inf",
                "a NaN or Inf");
    if (!finite) return false;
  }
  return true;
}

/// The same with a device word of its own (the single-rank step, which allocates per call anyway).
template <class Checker, class Scalar, class MemorySpace>
bool check_inputs(Checker& chk, const Chunk<Scalar, MemorySpace>& chunk,
                  const KvBlock<Scalar, MemorySpace>& cache, const Options& options) {
  return check_inputs(chk, chunk, cache, options,
                      Kokkos::View<std::int64_t, MemorySpace>("ctxpar::swa::check_positions"));
}

}  // namespace ctxpar::swa::impl
