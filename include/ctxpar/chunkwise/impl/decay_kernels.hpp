/// \file
/// Chunkwise kernels shared by the scalar-decay and diagonal-gate backends (`A_t = exp(g_t)·I` and
/// `A_t = diag(exp(g_t))`). The gate is read through a `[T, H, G]` view with `G = 1` (scalar) or
/// `G = K` (diagonal); key index `k` uses gate column `Diagonal ? k : 0`.
///
/// Per chunk (tokens `b..e-1`, cumulative log-gates `γ_i` inside the chunk, `γ_last = γ_{e-1}`):
/// - `M_c = exp(γ_last)` (per gate column), `dS_c = Σ_j exp(γ_last − γ_j) k_j v_jᵀ`;
/// - `o_i = scale·(exp(γ_i) ⊙ S_c)ᵀ q_i + scale·Σ_{j≤i} (Σ_k q_ik k_jk exp(γ_ik − γ_jk)) v_j`;
/// decay ratios are always `exp(γ_i − γ_j)`, never quotients of products.
/// Backward (G_c = gradient w.r.t. the chunk's end state, D_c = Σ_i exp(γ_i) ⊙ q'_i do_iᵀ):
/// `G_{c-1} = exp(γ_last) ⊙ G_c + D_c`. `dg_t` sums the contributions of the (source, sink) pairs
/// whose decay spans token `t`: query `i ≥ t` with key `j < t` inside the chunk, the incoming state
/// reaching query `i ≥ t`, key `j < t` reaching the end state, and the incoming state reaching the
/// end state. Every such term carries its decay, so strong decay cannot make them cancel (the
/// identity `dγ_i = q_i ⊙ dq_i − k_i ⊙ dk_i` does: its undecayed `j = i` terms cancel exactly).
///
/// Hard resets (`g_t = −∞`): the cumulative sum restarts after `t` (`γ_t = 0`), `reset` records the
/// last reset at or before each token, and every decay goes through
/// `decay_ratio`/`decay_from_start`, which give exactly 0 across a reset (never `−∞ − (−∞)`);
/// `logm` of such a chunk is `−∞`.
///
/// Precision: `γ_i − γ_j` formed from two rounded cumulative sums errs by `u·(|γ_i| + |γ_j|)`,
/// which under strong decay (|γ| in the hundreds within a chunk) is far more than the `u·|γ_i −
/// γ_j|` of the recurrence. The cumulative sum is compensated (`gamma_lo` keeps its rounding
/// error), and the backward forms every decay from both parts (`precise_ratio`,
/// `precise_from_start`); the forward keeps the one-part decays, so its results are bitwise those
/// of the uncompensated sum.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar/chunkwise/impl/chunk_product.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/impl/gates.hpp"
#include "ctxpar/core/impl/isa_dispatch.hpp"
#include "ctxpar/core/impl/tile_product.hpp"
#include "ctxpar/core/team_size.hpp"
#include "ctxpar/core/workspace.hpp"

namespace ctxpar::chunkwise::impl {

/// What the decay backends keep between their four methods. Views only.
template <class Scalar, class MemorySpace>
struct DecaySaved {
  /// `[T, H, D]` read-only inputs.
  using input_view = Kokkos::View<const Scalar***, Kokkos::LayoutRight, MemorySpace>;
  /// Working arrays in the activation type.
  using work3 = Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace>;
  /// `[chunks, H, K, V]` working arrays.
  using work4 = Kokkos::View<Scalar****, Kokkos::LayoutRight, MemorySpace>;
  /// Integer tables.
  using table = Kokkos::View<std::int64_t*, MemorySpace>;

  input_view q, k, v, g;  ///< the inputs; `g` as `[T, H, G]`
  double scale = 1.0;     ///< resolved output scale
  /// How the chunk products multiply (resolved: never `automatic`).
  ctxpar::chunkwise::ChunkProducts products = ctxpar::chunkwise::ChunkProducts::exact;
  int chunk = 64;  ///< tokens per chunk (the scratch size of the tiled kernels)
  std::int64_t chunks = 0;
  std::vector<std::int64_t> host_seq_chunk;  ///< first chunk of each local sequence (+ end)
  table chunk_begin, chunk_end, token_chunk, seq_chunk, seq_ordinal, seq_starts, seq_ends;
  work3 gamma;  ///< `[T, H, G]` cumulative log-gates inside each chunk, restarted at hard resets
  /// `[T, H, G]` local index of the last hard reset (`g = −∞`) at or before each token inside
  /// its chunk, or -1.
  Kokkos::View<std::int64_t***, Kokkos::LayoutRight, MemorySpace> reset;
  work3 gamma_lo;  ///< `[T, H, G]` rounding error of `gamma` (compensated summation)
  work3 logm;      ///< `[chunks, H, G]` log of each chunk's transition
  work4 ds;        ///< `[chunks, H, K, V]` zero-state chunk updates
  work4 states;    ///< `[chunks, H, K, V]` incoming state of each chunk
  work4 dmat;      ///< `[chunks, H, K, V]` `D_c`
  work4 gend;      ///< `[chunks, H, K, V]` gradient w.r.t. each chunk's end state
};

// ---- kernels ------------------------------------------------------------------------------------

/// Decay `exp(γ_later − γ_earlier)` between two tokens of one chunk (`earlier ≤ later`): 0 when a
/// hard reset lies in `(earlier, later]`, where the difference would be `−∞ − (−∞)`.
template <class Gamma, class Reset>
KOKKOS_INLINE_FUNCTION typename Gamma::non_const_value_type decay_ratio(
    const Gamma& gamma, const Reset& reset, std::int64_t later, std::int64_t earlier,
    std::int64_t h, std::int64_t gi) {
  using value = typename Gamma::non_const_value_type;
  return ctxpar::impl::gated_decay<ctxpar::impl::LibraryExp>(
      reset(later, h, gi) <= earlier, value(gamma(later, h, gi) - gamma(earlier, h, gi)));
}

/// Decay from the chunk's incoming state to token `i`: 0 after a hard reset in the chunk.
template <class Gamma, class Reset>
KOKKOS_INLINE_FUNCTION typename Gamma::non_const_value_type decay_from_start(
    const Gamma& gamma, const Reset& reset, std::int64_t i, std::int64_t h, std::int64_t gi) {
  using value = typename Gamma::non_const_value_type;
  return ctxpar::impl::gated_decay<ctxpar::impl::LibraryExp>(reset(i, h, gi) < 0,
                                                             value(gamma(i, h, gi)));
}

/// `decay_ratio` with the compensated cumulative log-gates (`gamma + lo`).
template <class Gamma, class Reset>
KOKKOS_INLINE_FUNCTION typename Gamma::non_const_value_type precise_ratio(
    const Gamma& gamma, const Gamma& lo, const Reset& reset, std::int64_t later,
    std::int64_t earlier, std::int64_t h, std::int64_t gi) {
  using value = typename Gamma::non_const_value_type;
  return ctxpar::impl::gated_decay<ctxpar::impl::LibraryExp>(
      reset(later, h, gi) <= earlier,
      value(ctxpar::impl::compensated_difference(gamma(later, h, gi), lo(later, h, gi),
                                                 gamma(earlier, h, gi), lo(earlier, h, gi))));
}

/// `decay_from_start` with the compensated cumulative log-gates.
template <class Gamma, class Reset>
KOKKOS_INLINE_FUNCTION typename Gamma::non_const_value_type precise_from_start(
    const Gamma& gamma, const Gamma& lo, const Reset& reset, std::int64_t i, std::int64_t h,
    std::int64_t gi) {
  using value = typename Gamma::non_const_value_type;
  return ctxpar::impl::gated_decay<ctxpar::impl::LibraryExp>(reset(i, h, gi) < 0,
                                                             value(gamma(i, h, gi) + lo(i, h, gi)));
}

/// A decay kernel as Kokkos launches it: `Kernel` (whose `run<Bytes>` is the kernel at
/// `Bytes`-wide vectors), the instruction set of the host fast path, chosen on the launching
/// thread, and the one `operator()` that runs `Kernel::run` at it on each work item `Item` (an
/// index, or a team member). `ExecutionSpace` decides whether the host fast path applies.
template <class Kernel, class ExecutionSpace, class Item>
struct IsaDispatched : Kernel {
  /// The instruction set of the host fast path, chosen on the launching thread.
  HostIsa isa = ctxpar::impl::active_host_isa();
  KOKKOS_FUNCTION void operator()(const Item& item) const {
    ctxpar::impl::run_kernel<ctxpar::impl::uses_host_fast_path_v<ExecutionSpace>>(
        isa, static_cast<const Kernel&>(*this), item);
  }
};

template <class Scalar, class MemorySpace>
struct GammaKernel {
  using saved = DecaySaved<Scalar, MemorySpace>;
  typename saved::input_view g;
  typename saved::table chunk_begin, chunk_end;
  typename saved::work3 gamma, logm;
  decltype(saved::reset) reset;
  typename saved::work3 gamma_lo;
  std::int64_t heads, width;
  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(std::int64_t i) const {
    const std::int64_t gi = i % width, h = (i / width) % heads, c = i / (width * heads);
    ctxpar::impl::CompensatedLogGate<Scalar> cumulative;
    Scalar minus_inf = 0;
    std::int64_t last_reset = -1;
    for (std::int64_t t = chunk_begin(c); t < chunk_end(c); ++t) {
      const Scalar x = g(t, h, gi);
      if (cumulative.add(x)) {  // −∞: the state before t is forgotten
        last_reset = t;
        minus_inf = x;
      }
      gamma(t, h, gi) = cumulative.sum;
      gamma_lo(t, h, gi) = cumulative.lo;
      reset(t, h, gi) = last_reset;
    }
    logm(c, h, gi) = last_reset < 0 ? cumulative.sum : minus_inf;
  }
};

// The team tile product (core/impl/tile_product.hpp) and the host instruction-set dispatch
// (core/impl/isa_dispatch.hpp).
namespace gd = ::ctxpar::impl;

/// What a team of a chunk-team kernel (league rank `c·H + h`) owns: chunk `c` of head `h`, whose
/// tokens are `b..last` (`n` of them).
struct ChunkTeam {
  std::int64_t c, b, last;
  int h, n;
};

/// The `ChunkTeam` of league rank `rank` over `heads` heads.
template <class Table>
KOKKOS_INLINE_FUNCTION ChunkTeam chunk_team(int rank, int heads, const Table& chunk_begin,
                                            const Table& chunk_end) {
  const std::int64_t c = rank / heads, b = chunk_begin(c), last = chunk_end(c) - 1;
  return {c, b, last, rank % heads, static_cast<int>(last - b + 1)};
}

template <class Scalar, class ExecutionSpace>
using decay_scratch =
    Kokkos::View<Scalar*, typename ExecutionSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;

/// Rows of the diagonal family's score sub-blocks. A reference log-gate inside each block keeps
/// both factors of `exp(γ_i − γ_j) = exp(γ_i − ref)·exp(ref − γ_j)` at most 1, so neither
/// overflows however strong the gates are; the blocks on the diagonal are formed directly.
inline constexpr int decay_sub_block = 16;

/// Largest spread of a chunk's log-gates (in e-folds) for which the diagonal family factors its
/// scores around one reference for the whole chunk.
inline constexpr double decay_factor_limit = 30.0;

/// The products of the diagonal family's operands factored around a reference log-gate
/// (`exp(γ − ref)·q` and `exp(ref − γ)·k`, with factors up to `e^±decay_factor_limit`, or down to
/// nothing within a sub-block): `float16` cannot hold them (past 65504 they become infinite, and
/// the scores NaN), so under `float16` products these run exact; the other operand types have
/// fp32's range.
KOKKOS_INLINE_FUNCTION ctxpar::chunkwise::ChunkProducts factored_products(
    ctxpar::chunkwise::ChunkProducts products) {
  return products == ctxpar::chunkwise::ChunkProducts::float16
             ? ctxpar::chunkwise::ChunkProducts::exact
             : products;
}

// dS_c = K̃ᵀ V (k̃_j = exp(γ_last − γ_j) ⊙ k_j), one team per (chunk, head), as a tiled product
// reading V in place (rows of one head are H·V apart).
template <class Scalar, class ExecutionSpace, class MemorySpace, bool Diagonal>
struct ChunkUpdateTiles {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  using scratch = decay_scratch<Scalar, ExecutionSpace>;
  using saved = DecaySaved<Scalar, MemorySpace>;
  typename saved::input_view k, v;
  typename saved::table chunk_begin, chunk_end;
  typename saved::work3 gamma;
  typename saved::work4 ds;
  decltype(saved::reset) reset;
  int heads, kdim, vdim, chunk;
  /// How the products multiply (`DecaySaved::products`).
  ctxpar::chunkwise::ChunkProducts products = ctxpar::chunkwise::ChunkProducts::exact;
  /// Team-scratch level of the launch (`scratch_level`: 0 where the scratch fits, set there).
  int level = 1;

  static std::size_t scratch_bytes(int C, int K) { return scratch::shmem_size(std::size_t(C) * K); }

  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(const member_type& team) const {
    const int H = heads, K = kdim, V = vdim;
    const ChunkTeam ct = chunk_team(team.league_rank(), H, chunk_begin, chunk_end);
    const std::int64_t c = ct.c, b = ct.b, last = ct.last;
    const int h = ct.h, n = ct.n;
    scratch kt(team.team_scratch(level), std::size_t(chunk) * K);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](int j) {
      const Scalar* kj = &k(b + j, h, 0);
      const Scalar w = decay_ratio(gamma, reset, last, b + j, h, 0);
      for (int d = 0; d < K; ++d) {
        const Scalar wd = Diagonal ? decay_ratio(gamma, reset, last, b + j, h, d) : w;
        kt[static_cast<long>(j) * K + d] = wd * kj[d];
      }
    });
    team.team_barrier();
    gd::chunk_product<Bytes>(products, team, K, V, n, Scalar(1), gd::transposed(kt.data(), K),
                             &v(b, h, 0), H * V, &ds(c, h, 0, 0), V, false);
  }
};

/// Columns one work item keeps in registers (one 64-byte line of fp32).
inline constexpr int register_block = 16;
/// State values one chain work item carries on a device: a register block of one key row.
/// Threads run over the items, so a warp's loads of one chunk term are contiguous.
inline constexpr int device_chain_capacity = register_block;
/// State values one chain work item carries on a host thread: whole key rows, about 4 KiB of
/// fp32. A host thread walks its item's chunks one after the other; with a 16-column item each
/// chunk's term would be one cache line 64 KiB (K·V·4 bytes) from the last, which the prefetcher
/// does not follow, so once the terms outgrow the cache every line was a demand miss (×13 per
/// token from T = 512 to 8192 at K = V = 128). Whole rows make each chunk's term one contiguous
/// run.
inline constexpr int host_chain_capacity = 1024;

/// The values a chain work item carries on `ExecutionSpace`'s path: whole rows on the host fast
/// path, 16 columns of a row otherwise (the device order, which the portable build runs on the
/// host).
template <class ExecutionSpace>
inline constexpr int chain_capacity_v =
    ctxpar::impl::uses_host_fast_path_v<ExecutionSpace> ? host_chain_capacity
                                                        : device_chain_capacity;

/// How a chain splits one (sequence, head) state `[K, V]` into work items of at most `Capacity`
/// values: `rows` key rows of `width` columns each (`rows` > 1 only when `width` is all of V, so
/// an item's values are contiguous in every chunk term).
struct ChainTiling {
  std::int64_t rows = 1, width = 1, row_blocks = 0, column_blocks = 0;
  /// The tiling of a `[kdim, vdim]` state into items of at most `capacity` values.
  static ChainTiling of(std::int64_t kdim, std::int64_t vdim, int capacity) {
    ChainTiling t;
    t.width = vdim < capacity ? vdim : capacity;
    t.rows = t.width == vdim
                 ? std::max<std::int64_t>(1, std::min<std::int64_t>(kdim, capacity / vdim))
                 : 1;
    t.row_blocks = (kdim + t.rows - 1) / t.rows;
    t.column_blocks = (vdim + t.width - 1) / t.width;
    return t;
  }
  /// Work items over `seqs` sequences of `heads` heads.
  std::int64_t items(std::int64_t seqs, std::int64_t heads) const {
    return seqs * heads * row_blocks * column_blocks;
  }
};

/// Work item of a chain kernel: sequence `s`, head `h`, the `rows` key rows from `kk0`, and in
/// each the `w` state columns from `v0`. Its values are held row after row, `w` per row, so value
/// `q` is row `q / w`, column `q % w`; and since `rows` > 1 only when `w` is all of V, value `q`
/// also sits `q` elements after the item's first value in every `[K, V]` chunk term.
struct ChainItem {
  std::int64_t v0, kk0, h, s;
  int rows, w;
};

/// Calls `f(q)` for every value `q < n` of a work item carrying at most `Capacity` values. At a
/// device's capacity (`register_block`) the loop is unrolled, so every `x[q]` of the caller's
/// `Scalar x[Capacity]` has a constant index and the carried values stay in registers (a loop
/// over run-time rows and columns indexes them and puts the array in local memory); the host's
/// whole rows are a plain loop.
template <int Capacity, class F>
KOKKOS_FORCEINLINE_FUNCTION void for_each_slot(int n, F&& f) {
  if constexpr (Capacity <= register_block) {
    CTXPAR_UNROLL
    for (int q = 0; q < Capacity; ++q)
      if (q < n) f(q);
  } else {
    for (int q = 0; q < n; ++q) f(q);
  }
}

/// One chunk of one row of a chain: the `w` carried columns `x` are first kept in `keep` (apply
/// mode; null otherwise), then carried across the chunk, `x ← m·x + d`.
template <class Scalar>
KOKKOS_INLINE_FUNCTION void chain_step(Scalar* x, int w, Scalar m, const Scalar* d, Scalar* keep) {
  if (keep) {
    for (int j = 0; j < w; ++j) keep[j] = x[j];
  }
  for (int j = 0; j < w; ++j) x[j] = m * x[j] + d[j];
}

/// What the chain kernels of both directions share: the sequence tables, the chunk transitions,
/// the shape, tiling and mode, the chunk terms `d` carried into the kept states `keep`, the
/// chain's start, and the carry across one chunk. One work item per (sequence, head, block of
/// state values; `ChainTiling`), carrying at most `Capacity` values (`chain_capacity_v`).
template <class Scalar, class MemorySpace, bool Diagonal, int Capacity>
struct ChainKernelBase {
  using saved = DecaySaved<Scalar, MemorySpace>;
  static constexpr int capacity = Capacity;
  typename saved::table seq_chunk, seq_ordinal, seq_starts, seq_ends;
  typename saved::work3 logm;
  Kokkos::View<float**, Kokkos::LayoutStride, MemorySpace> summary_state;
  std::int64_t s_lo, heads, kdim, vdim;
  ChainTiling tiling;
  bool apply;
  /// `[chunks, H, K, V]` what each chunk adds (`dS_c` forward, `D_c` backward) and, in apply
  /// mode, where each chunk's incoming carry is kept (its start state forward, its end-state
  /// gradient backward).
  typename saved::work4 d, keep;
  /// Apply mode: the rank's fp32 boundary (`s_in` forward, `ds_out` backward), added to the start
  /// of local sequence `edge_seq`, and the per-sequence starts (initial states forward,
  /// final-state gradients backward), added where that start of the sequence lies on this rank.
  const_state_view<MemorySpace> edge;
  const_sequence_states_view<Scalar, MemorySpace> seq_start;
  std::int64_t edge_seq;
  bool have_edge, have_seq_start;

  /// Apply mode: the chain starts from `edge_view` at sequence `at` and from `starts`.
  void start_from(const const_state_view<MemorySpace>& edge_view, std::int64_t at,
                  const const_sequence_states_view<Scalar, MemorySpace>& starts) {
    edge = edge_view;
    edge_seq = at;
    seq_start = starts;
    have_edge = is_given(edge_view);
    have_seq_start = is_given(starts);
  }
  /// Work item `i` of the chain (first sequence `s_lo`).
  KOKKOS_INLINE_FUNCTION ChainItem item(std::int64_t i) const {
    const std::int64_t cb = i % tiling.column_blocks,
                       rb = (i / tiling.column_blocks) % tiling.row_blocks;
    const std::int64_t hs = i / (tiling.column_blocks * tiling.row_blocks);
    const std::int64_t v0 = cb * tiling.width, kk0 = rb * tiling.rows;
    const int w = static_cast<int>(vdim - v0 < tiling.width ? vdim - v0 : tiling.width);
    const int rows = static_cast<int>(kdim - kk0 < tiling.rows ? kdim - kk0 : tiling.rows);
    return {v0, kk0, hs % heads, s_lo + hs / heads, rows, w};
  }
  /// Work item `i` and its carried values at the chain's start, into `x`: zero in summary mode;
  /// in apply mode the boundary and the sequence's start where `own(s)` says that start lies on
  /// this rank (`seq_starts` forward, `seq_ends` backward).
  KOKKOS_INLINE_FUNCTION ChainItem start(std::int64_t i, Scalar* x,
                                         const typename saved::table& own) const {
    const ChainItem it = item(i);
    const bool edge_here = apply && it.s == edge_seq && have_edge;
    const bool start_here = apply && have_seq_start && own(it.s) != 0;
    const std::int64_t ordinal = start_here ? seq_ordinal(it.s) : 0;
    for_each_slot<Capacity>(it.rows * it.w, [&](int q) {
      const std::int64_t kk = it.kk0 + q / it.w, vv = it.v0 + q % it.w;
      Scalar v = 0;
      if (edge_here) v = static_cast<Scalar>(edge(it.h, kk, vv));
      if (start_here) v += seq_start(ordinal, it.h, kk, vv);
      x[q] = v;
    });
    return it;
  }
  /// Chunk `c` of item `it`'s carry: `x ← exp(logm_c)·x + d_c`, keeping `x` first in `keep_c` in
  /// apply mode. On the host, row by row (one exponential per row); at a device's capacity,
  /// value by value with constant indices (`for_each_slot`), the row's exponential taken where a
  /// row starts.
  KOKKOS_INLINE_FUNCTION void carry(Scalar* x, const ChainItem& it, std::int64_t c) const {
    Scalar m = Diagonal ? Scalar(0) : compat::exp(logm(c, it.h, 0));
    if constexpr (Capacity <= register_block) {
      const Scalar* dc = &d(c, it.h, it.kk0, it.v0);
      Scalar* kc = apply ? &keep(c, it.h, it.kk0, it.v0) : nullptr;
      for_each_slot<Capacity>(it.rows * it.w, [&](int q) {
        if (Diagonal && q % it.w == 0) m = compat::exp(logm(c, it.h, it.kk0 + q / it.w));
        if (kc) kc[q] = x[q];
        x[q] = m * x[q] + dc[q];
      });
    } else {
      for (int r = 0; r < it.rows; ++r) {
        if (Diagonal) m = compat::exp(logm(c, it.h, it.kk0 + r));
        chain_step(x + r * it.w, it.w, m, &d(c, it.h, it.kk0 + r, it.v0),
                   apply ? &keep(c, it.h, it.kk0 + r, it.v0) : nullptr);
      }
    }
  }
  /// Calls `f(row, column, value)` for every carried value of `it` in `x`, at its place in the
  /// state.
  template <class F>
  KOKKOS_INLINE_FUNCTION void for_each_value(const ChainItem& it, const Scalar* x, F&& f) const {
    for_each_slot<Capacity>(it.rows * it.w,
                            [&](int q) { f(it.kk0 + q / it.w, it.v0 + q % it.w, x[q]); });
  }
  /// Summary mode: the carried values as the fp32 summary state.
  KOKKOS_INLINE_FUNCTION void write_summary(const ChainItem& it, const Scalar* x) const {
    for_each_value(it, x, [&](std::int64_t kk, std::int64_t vv, Scalar value) {
      summary_state(it.h, kk * vdim + vv) = static_cast<float>(value);
    });
  }
};

// Chains whole local sequences [s_lo, s_hi) over their chunks, forward (d = dS_c, keep = S_c).
// Mode "summary": start from zero, write the fp32 summary state. Mode "apply": start from s_in /
// initial states, save every chunk's incoming state, write final states of sequences that end
// here.
template <class Scalar, class MemorySpace, bool Diagonal, int Capacity>
struct ChainForwardKernel : ChainKernelBase<Scalar, MemorySpace, Diagonal, Capacity> {
  sequence_states_view<Scalar, MemorySpace> finals;
  bool have_finals;
  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(std::int64_t i) const {
    Scalar state[Capacity];
    const ChainItem it = this->start(i, state, this->seq_starts);
    for (std::int64_t c = this->seq_chunk(it.s); c < this->seq_chunk(it.s + 1); ++c)
      this->carry(state, it, c);
    if (!this->apply) {
      this->write_summary(it, state);
    } else if (have_finals && this->seq_ends(it.s) != 0) {
      const std::int64_t ordinal = this->seq_ordinal(it.s);
      this->for_each_value(it, state, [&](std::int64_t kk, std::int64_t vv, Scalar value) {
        finals(ordinal, it.h, kk, vv) = value;
      });
    }
  }
};

// Transition of local sequence s (product of its chunks' exp(logm), summed in log space).
template <class Scalar, class MemorySpace>
struct SequenceTransitionKernel {
  using saved = DecaySaved<Scalar, MemorySpace>;
  typename saved::table seq_chunk;
  typename saved::work3 logm;
  Kokkos::View<float**, Kokkos::LayoutStride, MemorySpace> transition;
  std::int64_t s, width;
  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(std::int64_t i) const {
    const std::int64_t gi = i % width, h = i / width;
    Scalar total = 0;
    for (std::int64_t c = seq_chunk(s); c < seq_chunk(s + 1); ++c) total += logm(c, h, gi);
    transition(h, gi) = static_cast<float>(compat::exp(total));
  }
};

/// Of a diagonal-family chunk (tokens `b..b+n-1`, head `h`, `K` gate columns): the largest spread
/// of its log-gates around its first token into `spread`, and into `resets` 1 when it holds a hard
/// reset (factors around a reference are meaningless across one), 0 otherwise.
template <class Scalar, class Member, class Gamma, class Reset>
KOKKOS_INLINE_FUNCTION void gate_spread(const Member& team, const Gamma& gamma, const Reset& reset,
                                        std::int64_t b, int n, int h, int K, Scalar& spread,
                                        int& resets) {
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(team, n),
      [&](int j, Scalar& m) {
        for (int d = 0; d < K; ++d) {
          const Scalar x = gamma(b + j, h, d) - gamma(b, h, d);
          const Scalar ax = x < 0 ? -x : x;
          if (ax > m) m = ax;
        }
      },
      Kokkos::Max<Scalar>(spread));
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(team, K),
      [&](int d, int& m) {
        if (reset(b + n - 1, h, d) >= 0) m = 1;
      },
      Kokkos::Max<int>(resets));
}

/// S_cᵀ and G_cᵀ (`[V, K]`, into `sT` and `gT`) of chunk `c`, head `h`: the contiguous right
/// operands of the gradients' state products.
template <class Member, class Work4, class Scalar>
KOKKOS_INLINE_FUNCTION void transpose_states(const Member& team, const Work4& states,
                                             const Work4& gend, std::int64_t c, int h, int K, int V,
                                             Scalar* sT, Scalar* gT) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, K), [&](int p) {
    const Scalar* srow = &states(c, h, p, 0);
    const Scalar* grow = &gend(c, h, p, 0);
    for (int d = 0; d < V; ++d) {
      sT[static_cast<long>(d) * K + p] = srow[d];
      gT[static_cast<long>(d) * K + p] = grow[d];
    }
  });
}

// Outputs of one (chunk, head): O = (Q'Kᵀ ⊙ decay, lower) V + (exp(γ) ⊙ Q') S_c with Q' = scale·Q,
// as tiled products writing the output rows in place.
template <class Scalar, class ExecutionSpace, class MemorySpace, bool Diagonal>
struct OutputTiles {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  using scratch = decay_scratch<Scalar, ExecutionSpace>;
  using saved = DecaySaved<Scalar, MemorySpace>;
  typename saved::input_view q, k, v;
  typename saved::table chunk_begin, chunk_end;
  typename saved::work3 gamma;
  typename saved::work4 states;
  token_view<Scalar, MemorySpace> out;
  Scalar scale;
  int heads, kdim, vdim, chunk;
  decltype(saved::reset) reset;
  /// How the products multiply (`DecaySaved::products`).
  ctxpar::chunkwise::ChunkProducts products = ctxpar::chunkwise::ChunkProducts::exact;
  /// Team-scratch level of the launch (`scratch_level`: 0 where the scratch fits, set there).
  int level = 1;

  static std::size_t scratch_bytes(int C, int K) {
    // qs, qh, Kᵀ (or the factored query rows), factored Kᵀ | P | one sub-block of factored keys
    return 4 * scratch::shmem_size(std::size_t(C) * K) + scratch::shmem_size(std::size_t(C) * C) +
           scratch::shmem_size(std::size_t(K) * decay_sub_block);
  }

  /// The diagonal family's scores `P_ij = Σ_k qs_ik k_jk exp(γ_ik − γ_jk)` (j ≤ i, `n` rows).
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void diagonal_scores(const member_type& team, std::int64_t b, int h, int n,
                                              const scratch& qs, const scratch& aux,
                                              const scratch& kt, const scratch& P,
                                              const scratch& bt) const {
    const int K = kdim, C = chunk;
    // Spread of the chunk's log-gates around its first token: within decay_factor_limit one
    // reference for the whole chunk keeps both factors in [e^-limit, e^limit] (no overflow, no
    // subnormals), so the scores are one product like the scalar family's. Stronger gates take
    // the sub-block path.
    Scalar spread = 0;
    // Factors around a reference are meaningless across a hard reset: such chunks form every
    // score directly (0 across the reset).
    int resets = 0;
    gate_spread(team, gamma, reset, b, n, h, K, spread, resets);
    if (resets > 0) {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](int i) {
        const long ik = static_cast<long>(i) * K;
        for (int j = 0; j <= i; ++j) {
          const Scalar* kj = &k(b + j, h, 0);
          Scalar acc = 0;
          for (int d = 0; d < K; ++d)
            acc += qs[ik + d] * kj[d] * decay_ratio(gamma, reset, b + i, b + j, h, d);
          P[static_cast<long>(i) * C + j] = acc;
        }
      });
    } else if (spread <= Scalar(decay_factor_limit)) {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](int i) {
        const Scalar* ki = &k(b + i, h, 0);
        for (int d = 0; d < K; ++d) {
          const Scalar x = gamma(b + i, h, d) - gamma(b, h, d);
          aux[static_cast<long>(i) * K + d] = qs[static_cast<long>(i) * K + d] * compat::exp(x);
          kt[static_cast<long>(d) * C + i] = ki[d] * compat::exp(-x);
        }
      });
      team.team_barrier();
      gd::chunk_product<Bytes>(factored_products(products), team, n, n, K, Scalar(1),
                               gd::rows(aux.data(), K), kt.data(), C, P.data(), C, false, true);
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](int i) {
        for (int j = i + 1; j < n; ++j) P[static_cast<long>(i) * C + j] = Scalar(0);
      });
    } else {
      sub_block_scores<Bytes>(team, b, h, n, qs, aux, P, bt);
    }
  }

  /// `diagonal_scores` under gates too strong for one reference: a reference per sub-block of
  /// decay_sub_block keys (its last token) for the rows below it, the rows inside it formed
  /// directly.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void sub_block_scores(const member_type& team, std::int64_t b, int h,
                                               int n, const scratch& qs, const scratch& aux,
                                               const scratch& P, const scratch& bt) const {
    const int K = kdim, C = chunk;
    for (int j0 = 0; j0 < n; j0 += decay_sub_block) {
      const int j1 = j0 + decay_sub_block < n ? j0 + decay_sub_block : n;
      const std::int64_t ref = b + j1 - 1;
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, j0, n), [&](int i) {
        const long ik = static_cast<long>(i) * K;
        if (i >= j1) {
          for (int d = 0; d < K; ++d)
            aux[ik + d] = qs[ik + d] * compat::exp(gamma(b + i, h, d) - gamma(ref, h, d));
          return;
        }
        for (int j = j0; j <= i; ++j) {
          const Scalar* kj = &k(b + j, h, 0);
          Scalar acc = 0;
          for (int d = 0; d < K; ++d)
            acc += qs[ik + d] * kj[d] * compat::exp(gamma(b + i, h, d) - gamma(b + j, h, d));
          P[static_cast<long>(i) * C + j] = acc;
        }
      });
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, j0, j1), [&](int j) {
        const Scalar* kj = &k(b + j, h, 0);
        for (int d = 0; d < K; ++d)
          bt[static_cast<long>(d) * decay_sub_block + j - j0] =
              kj[d] * compat::exp(gamma(ref, h, d) - gamma(b + j, h, d));
      });
      team.team_barrier();
      if (j1 < n)
        gd::chunk_product<Bytes>(factored_products(products), team, n - j1, j1 - j0, K, Scalar(1),
                                 gd::rows(aux.data() + static_cast<long>(j1) * K, K), bt.data(),
                                 decay_sub_block, P.data() + static_cast<long>(j1) * C + j0, C,
                                 false);
      team.team_barrier();
    }
  }

  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(const member_type& team) const {
    const int H = heads, K = kdim, V = vdim, C = chunk;
    const ChunkTeam ct = chunk_team(team.league_rank(), H, chunk_begin, chunk_end);
    const std::int64_t c = ct.c, b = ct.b;
    const int h = ct.h, n = ct.n;
    const auto& sp = team.team_scratch(level);
    scratch qs(sp, std::size_t(C) * K), qh(sp, std::size_t(C) * K), aux(sp, std::size_t(C) * K),
        kt(sp, std::size_t(K) * C), P(sp, std::size_t(C) * C),
        bt(sp, std::size_t(K) * decay_sub_block);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](int i) {
      const Scalar* qi = &q(b + i, h, 0);
      const Scalar* ki = &k(b + i, h, 0);
      // One loop per output: the row-wise ones vectorise on a host; only Kᵀ scatters.
      Scalar* qs_row = qs.data() + static_cast<long>(i) * K;
      Scalar* qh_row = qh.data() + static_cast<long>(i) * K;
      for (int d = 0; d < K; ++d) qs_row[d] = scale * qi[d];
      if constexpr (Diagonal) {
        for (int d = 0; d < K; ++d)
          qh_row[d] = decay_from_start(gamma, reset, b + i, h, d) * qs_row[d];
      } else {
        const Scalar gs = decay_from_start(gamma, reset, b + i, h, 0);
        for (int d = 0; d < K; ++d) qh_row[d] = gs * qs_row[d];
        // Kᵀ, the contiguous operand of the score product.
        for (int d = 0; d < K; ++d) aux[static_cast<long>(d) * C + i] = ki[d];
      }
      for (int j = 0; j < n; ++j) P[static_cast<long>(i) * C + j] = Scalar(0);
    });
    team.team_barrier();
    if constexpr (!Diagonal) {
      gd::chunk_product<Bytes>(products, team, n, n, K, Scalar(1), gd::rows(qs.data(), K),
                               aux.data(), C, P.data(), C, false, true);
      team.team_barrier();
      // Decays as exp(γ_i − γ_j); the products above the diagonal inside a tile are cleared
      // because the next product reads P as a lower band.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](int i) {
        for (int j = 0; j < n; ++j) {
          const long ij = static_cast<long>(i) * C + j;
          P[ij] = j <= i ? P[ij] * decay_ratio(gamma, reset, b + i, b + j, h, 0) : Scalar(0);
        }
      });
    } else {
      diagonal_scores<Bytes>(team, b, h, n, qs, aux, kt, P, bt);
    }
    team.team_barrier();
    Scalar* o = &out(b, h, 0);
    gd::chunk_product<Bytes>(products, team, n, V, n, Scalar(1),
                             gd::rows(P.data(), C, gd::Band::lower), &v(b, h, 0), H * V, o, H * V,
                             false);
    team.team_barrier();
    gd::chunk_product<Bytes>(products, team, n, V, K, Scalar(1), gd::rows(qh.data(), K),
                             &states(c, h, 0, 0), V, o, H * V, true);
  }
};

// D_c = Σ_i exp(γ_i) ⊙ (scale·q_i) do_iᵀ
template <class Scalar, class MemorySpace, bool Diagonal>
struct QueryOutputKernel {
  using saved = DecaySaved<Scalar, MemorySpace>;
  typename saved::input_view q;
  const_token_view<Scalar, MemorySpace> dout;
  typename saved::table chunk_begin, chunk_end;
  typename saved::work3 gamma;
  typename saved::work4 dmat;
  Scalar scale;
  std::int64_t heads, kdim, vdim;
  decltype(saved::reset) reset;
  typename saved::work3 gamma_lo;
  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(std::int64_t i) const {
    const std::int64_t kk = i % kdim, h = (i / kdim) % heads, c = i / (kdim * heads);
    Scalar* row = &dmat(c, h, kk, 0);
    for (std::int64_t vv = 0; vv < vdim; ++vv) row[vv] = 0;
    for (std::int64_t t = chunk_begin(c); t < chunk_end(c); ++t) {
      const Scalar w =
          scale * q(t, h, kk) * precise_from_start(gamma, gamma_lo, reset, t, h, Diagonal ? kk : 0);
      const Scalar* d = &dout(t, h, 0);
      for (std::int64_t vv = 0; vv < vdim; ++vv) row[vv] += w * d[vv];
    }
  }
};

// Chains local sequences backward over their chunks (d = D_c, keep = G_c). Mode "summary": zero at
// the end, writes γ. Mode "apply": starts from ds_out (last sequence) or the final-state
// gradients, saves every chunk's end gradient, writes ds_in and initial-state gradients.
template <class Scalar, class MemorySpace, bool Diagonal, int Capacity>
struct ChainBackwardKernel : ChainKernelBase<Scalar, MemorySpace, Diagonal, Capacity> {
  sequence_states_view<Scalar, MemorySpace> initial_grads;
  state_view<MemorySpace> ds_in;
  bool have_initial_grads, have_ds_in;
  /// The kernel at `Bytes`-wide vectors, work items as in ChainForwardKernel.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(std::int64_t i) const {
    Scalar grad[Capacity];
    const ChainItem it = this->start(i, grad, this->seq_ends);
    for (std::int64_t c = this->seq_chunk(it.s + 1) - 1; c >= this->seq_chunk(it.s); --c)
      this->carry(grad, it, c);
    if (!this->apply) {
      this->write_summary(it, grad);
      return;
    }
    const bool boundary = it.s == 0 && have_ds_in;
    const bool initial = have_initial_grads && this->seq_starts(it.s) != 0;
    const std::int64_t ordinal = initial ? this->seq_ordinal(it.s) : 0;
    this->for_each_value(it, grad, [&](std::int64_t kk, std::int64_t vv, Scalar value) {
      if (boundary) ds_in(it.h, kk, vv) = static_cast<float>(value);
      if (initial) initial_grads(ordinal, it.h, kk, vv) = value;
    });
  }
};

// No instruction-set dispatch of its own: it runs only as the fallback inside
// DiagonalGradientTiles::run, which inlines it at that kernel's instruction set.
template <class Scalar, class MemorySpace, bool Diagonal>
struct GradientRowKernel {
  using saved = DecaySaved<Scalar, MemorySpace>;
  typename saved::input_view q, k, v;
  const_token_view<Scalar, MemorySpace> dout;
  typename saved::table chunk_begin, chunk_end, token_chunk;
  typename saved::work3 gamma;
  typename saved::work4 states, gend;
  token_view<Scalar, MemorySpace> dq, dk, dv;
  Scalar scale;
  std::int64_t heads, kdim, vdim;
  decltype(saved::reset) reset;
  typename saved::work3 gamma_lo;

  KOKKOS_INLINE_FUNCTION Scalar decay(std::int64_t later, std::int64_t earlier, std::int64_t h,
                                      std::int64_t kk) const {
    return precise_ratio(gamma, gamma_lo, reset, later, earlier, h, Diagonal ? kk : 0);
  }

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t h = i % heads, t = i / heads, c = token_chunk(t);
    const std::int64_t b = chunk_begin(c), last = chunk_end(c) - 1;
    Scalar* dqt = &dq(t, h, 0);
    Scalar* dkt = &dk(t, h, 0);
    Scalar* dvt = &dv(t, h, 0);
    const Scalar* dot = &dout(t, h, 0);
    const Scalar* kt = &k(t, h, 0);
    const Scalar* vt = &v(t, h, 0);
    // dq_t = scale·(exp(γ_t) ⊙ S_c do_t + Σ_{j≤t} exp(γ_t − γ_j) ⊙ k_j (do_t·v_j))
    for (std::int64_t kk = 0; kk < kdim; ++kk) {
      const Scalar* srow = &states(c, h, kk, 0);
      Scalar acc = 0;
      for (std::int64_t vv = 0; vv < vdim; ++vv) acc += srow[vv] * dot[vv];
      dqt[kk] = acc * precise_from_start(gamma, gamma_lo, reset, t, h, Diagonal ? kk : 0);
    }
    for (std::int64_t j = b; j <= t; ++j) {
      const Scalar* vj = &v(j, h, 0);
      const Scalar* kj = &k(j, h, 0);
      Scalar dov = 0;
      for (std::int64_t vv = 0; vv < vdim; ++vv) dov += dot[vv] * vj[vv];
      for (std::int64_t kk = 0; kk < kdim; ++kk) dqt[kk] += decay(t, j, h, kk) * kj[kk] * dov;
    }
    for (std::int64_t kk = 0; kk < kdim; ++kk) dqt[kk] *= scale;
    // dk_t = Σ_{i≥t} exp(γ_i − γ_t) ⊙ q'_i (do_i·v_t) + exp(γ_last − γ_t) ⊙ G_c v_t
    // dv_t = Σ_{i≥t} (Σ_k q'_ik k_tk exp(γ_ik − γ_tk)) do_i + Σ_k exp(γ_last,k − γ_t,k) k_tk G_c[k]
    for (std::int64_t vv = 0; vv < vdim; ++vv) dvt[vv] = 0;
    for (std::int64_t kk = 0; kk < kdim; ++kk) {
      const Scalar* grow = &gend(c, h, kk, 0);
      const Scalar d = decay(last, t, h, kk);
      Scalar acc = 0;
      for (std::int64_t vv = 0; vv < vdim; ++vv) acc += grow[vv] * vt[vv];
      dkt[kk] = acc * d;
      const Scalar w = d * kt[kk];
      for (std::int64_t vv = 0; vv < vdim; ++vv) dvt[vv] += w * grow[vv];
    }
    for (std::int64_t ii = t; ii <= last; ++ii) {
      const Scalar* di = &dout(ii, h, 0);
      const Scalar* qi = &q(ii, h, 0);
      Scalar dov = 0;
      for (std::int64_t vv = 0; vv < vdim; ++vv) dov += di[vv] * vt[vv];
      Scalar score = 0;
      for (std::int64_t kk = 0; kk < kdim; ++kk) {
        const Scalar qd = scale * qi[kk] * decay(ii, t, h, kk);
        dkt[kk] += qd * dov;
        score += qd * kt[kk];
      }
      for (std::int64_t vv = 0; vv < vdim; ++vv) dvt[vv] += score * di[vv];
    }
  }
};

// Scalar decay gradients of one (chunk, head) as tiled products (L_tj = exp(γ_t − γ_j) for j ≤ t,
// λ_t = exp(γ_last − γ_t), D = (dO Vᵀ) ⊙ L, P = (Q'Kᵀ) ⊙ L, Q' = scale·Q):
//   dQ = scale·(D K + diag(Γ) dO S_cᵀ),  dK = Dᵀ Q' + diag(λ) V G_cᵀ,  dV = Pᵀ dO + diag(λ) K G_c.
// dg_t = Σ_{i≥t} Σ_{j<t} X_ij + Σ_{i≥t} a_i + Σ_{j<t} e_j + m with the pair contributions
// X_ij = D_ij·(Q'Kᵀ)_ij (j < i), a_i = q_i·(dQ's state part), e_j = k_j·(dK's state part) and
// m = exp(γ_last)⟨G_c, S_c⟩: a row prefix and a column suffix of X, O(C²) like the scores.
template <class Scalar, class ExecutionSpace, class MemorySpace>
struct ScalarGradientTiles {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  using scratch = decay_scratch<Scalar, ExecutionSpace>;
  using saved = DecaySaved<Scalar, MemorySpace>;
  typename saved::input_view q, k, v;
  const_token_view<Scalar, MemorySpace> dout;
  typename saved::table chunk_begin, chunk_end;
  typename saved::work3 gamma;
  typename saved::work4 states, gend;
  token_view<Scalar, MemorySpace> dq, dk, dv;
  Scalar scale;
  int heads, kdim, vdim, chunk;
  decltype(saved::reset) reset;
  typename saved::work3 gamma_lo;
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace, Kokkos::MemoryUnmanaged> dg;  // [T,H,1]
  /// How the products multiply (`DecaySaved::products`).
  ctxpar::chunkwise::ChunkProducts products = ctxpar::chunkwise::ChunkProducts::exact;
  /// Team-scratch level of the launch (`scratch_level`: 0 where the scratch fits, set there).
  int level = 1;

  static std::size_t scratch_bytes(int C, int K, int V) {
    // kT vT | D P X | dO·Γ, V·λ | K·λ | S_cᵀ, G_cᵀ | a e
    return scratch::shmem_size(std::size_t(K) * C) + 3 * scratch::shmem_size(std::size_t(V) * C) +
           3 * scratch::shmem_size(std::size_t(C) * C) + scratch::shmem_size(std::size_t(C) * K) +
           2 * scratch::shmem_size(std::size_t(V) * K) + 2 * scratch::shmem_size(std::size_t(C));
  }

  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(const member_type& team) const {
    const int H = heads, K = kdim, V = vdim, C = chunk;
    const ChunkTeam ct = chunk_team(team.league_rank(), H, chunk_begin, chunk_end);
    const std::int64_t c = ct.c, b = ct.b, last = ct.last;
    const int h = ct.h, n = ct.n;
    const auto& sp = team.team_scratch(level);
    scratch kT(sp, std::size_t(K) * C), vT(sp, std::size_t(V) * C), D(sp, std::size_t(C) * C),
        P(sp, std::size_t(C) * C), dog(sp, std::size_t(C) * V), vl(sp, std::size_t(C) * V),
        kl(sp, std::size_t(C) * K), sT(sp, std::size_t(V) * K), gT(sp, std::size_t(V) * K),
        X(sp, std::size_t(C) * C), av(sp, std::size_t(C)), ev(sp, std::size_t(C));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](int t) {
      const Scalar* kt = &k(b + t, h, 0);
      const Scalar* vt = &v(b + t, h, 0);
      const Scalar* dt = &dout(b + t, h, 0);
      const Scalar big = precise_from_start(gamma, gamma_lo, reset, b + t, h, 0);
      const Scalar lam = precise_ratio(gamma, gamma_lo, reset, last, b + t, h, 0);
      // The transposed copies scatter on their own; the row-wise ones vectorise on a host.
      for (int d = 0; d < K; ++d) kT[static_cast<long>(d) * C + t] = kt[d];
      for (int d = 0; d < V; ++d) vT[static_cast<long>(d) * C + t] = vt[d];
      Scalar* kl_row = kl.data() + static_cast<long>(t) * K;
      Scalar* dog_row = dog.data() + static_cast<long>(t) * V;
      Scalar* vl_row = vl.data() + static_cast<long>(t) * V;
      for (int d = 0; d < K; ++d) kl_row[d] = lam * kt[d];
      for (int d = 0; d < V; ++d) {
        dog_row[d] = big * dt[d];
        vl_row[d] = lam * vt[d];
      }
    });
    transpose_states(team, states, gend, c, h, K, V, sT.data(), gT.data());
    team.team_barrier();
    gd::chunk_product<Bytes>(products, team, n, n, V, Scalar(1), gd::rows(&dout(b, h, 0), H * V),
                             vT.data(), C, D.data(), C, false, true);
    gd::chunk_product<Bytes>(products, team, n, n, K, scale, gd::rows(&q(b, h, 0), H * K),
                             kT.data(), C, P.data(), C, false, true);
    team.team_barrier();
    // Both are read as bands next, so everything above the diagonal is cleared. X_tj (j < t) is
    // the pair's contribution to every dg it straddles, then its exclusive row prefix over j.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](int t) {
      Scalar run = 0;
      for (int j = 0; j < n; ++j) {
        const long tj = static_cast<long>(t) * C + j;
        const Scalar l =
            j <= t ? precise_ratio(gamma, gamma_lo, reset, b + t, b + j, h, 0) : Scalar(0);
        const Scalar x = j < t ? D[tj] * P[tj] * l : Scalar(0);
        X[tj] = run;
        run += x;
        D[tj] = j <= t ? D[tj] * l : Scalar(0);
        P[tj] = j <= t ? P[tj] * l : Scalar(0);
      }
    });
    team.team_barrier();
    Scalar* dqc = &dq(b, h, 0);
    Scalar* dkc = &dk(b, h, 0);
    Scalar* dvc = &dv(b, h, 0);
    // The state parts first: dg needs them on their own.
    gd::chunk_product<Bytes>(products, team, n, K, V, scale, gd::rows(dog.data(), V), sT.data(), K,
                             dqc, H * K, false);
    gd::chunk_product<Bytes>(products, team, n, K, V, Scalar(1), gd::rows(vl.data(), V), gT.data(),
                             K, dkc, H * K, false);
    gd::chunk_product<Bytes>(products, team, n, V, n, Scalar(1),
                             gd::transposed(P.data(), C, gd::Band::upper), &dout(b, h, 0), H * V,
                             dvc, H * V, false);
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](int t) {
      const Scalar* qt = &q(b + t, h, 0);
      const Scalar* kt = &k(b + t, h, 0);
      Scalar a = 0, e = 0;
      for (int d = 0; d < K; ++d) {
        a += qt[d] * dqc[static_cast<long>(t) * H * K + d];
        e += kt[d] * dkc[static_cast<long>(t) * H * K + d];
      }
      av[t] = a;
      ev[t] = e;
    });
    Scalar m = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, K),
        [&](int p, Scalar& acc) {
          const Scalar* srow = &states(c, h, p, 0);
          const Scalar* grow = &gend(c, h, p, 0);
          for (int d = 0; d < V; ++d) acc += grow[d] * srow[d];
        },
        m);
    m *= precise_from_start(gamma, gamma_lo, reset, last, h, 0);
    team.team_barrier();
    gd::chunk_product<Bytes>(products, team, n, K, n, scale, gd::rows(D.data(), C, gd::Band::lower),
                             &k(b, h, 0), H * K, dqc, H * K, true);
    gd::chunk_product<Bytes>(products, team, n, K, n, scale,
                             gd::transposed(D.data(), C, gd::Band::upper), &q(b, h, 0), H * K, dkc,
                             H * K, true);
    gd::chunk_product<Bytes>(products, team, n, V, K, Scalar(1), gd::rows(kl.data(), K),
                             &gend(c, h, 0, 0), V, dvc, H * V, true);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](int t) {
      Scalar x = m;
      for (int i = t; i < n; ++i) x += X[static_cast<long>(i) * C + t] + av[i];
      for (int j = 0; j < t; ++j) x += ev[j];
      dg(b + t, h, 0) = x;
    });
  }
};

// Diagonal-gate gradients of one (chunk, head). When the chunk's log-gates spread over at most
// decay_factor_limit e-folds around its first token b and it holds no hard reset, every decay
// factors as exp(γ_td − γ_jd) = e_td·f_jd (e = exp(γ − γ_b), f = 1/e, both within
// [e^-limit, e^limit]), and with D = (dO Vᵀ) masked to j ≤ t and P = ((e⊙Q')(f⊙K)ᵀ) masked
// likewise:
//   dQ = scale·(e ⊙ D(f⊙K) + Γ ⊙ dO S_cᵀ),  dK = f ⊙ Dᵀ(e⊙Q') + λ ⊙ V G_cᵀ,
//   dV = Pᵀ dO + (λ⊙K) G_c,
// all as tiled products. Otherwise the team runs the row kernel over the chunk's tokens. dg is
// formed per gate column from the straddling pairs as in ScalarGradientTiles (gate_gradient).
template <class Scalar, class ExecutionSpace, class MemorySpace>
struct DiagonalGradientTiles {
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;
  using scratch = decay_scratch<Scalar, ExecutionSpace>;
  GradientRowKernel<Scalar, MemorySpace, true> row;  // the inputs, outputs, and the fallback
  int chunk;
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace, Kokkos::MemoryUnmanaged> dg;  // [T,H,K]
  /// How the products multiply (`DecaySaved::products`).
  ctxpar::chunkwise::ChunkProducts products = ctxpar::chunkwise::ChunkProducts::exact;
  /// Team-scratch level of the launch (`scratch_level`: 0 where the scratch fits, set there).
  int level = 1;

  static std::size_t scratch_bytes(int C, int K, int V) {
    // kf qe kl tq ts tk tg | kfT | vT | D P | S_cᵀ G_cᵀ
    return 7 * scratch::shmem_size(std::size_t(C) * K) + scratch::shmem_size(std::size_t(K) * C) +
           scratch::shmem_size(std::size_t(V) * C) + 2 * scratch::shmem_size(std::size_t(C) * C) +
           2 * scratch::shmem_size(std::size_t(V) * K);
  }

  // dg_td = Σ_{i≥t} Σ_{j<t} D_ij·w(i, j, d) + Σ_{i≥t} a_id + Σ_{j<t} e_jd + m_d, per gate column: w
  // the pair's weight q'_id k_jd exp(γ_id − γ_jd), a_id = q'_id Γ_id (dO S_cᵀ)_id, e_jd = k_jd λ_jd
  // (V G_cᵀ)_jd, m_d = exp(γ_last,d) ⟨G_c, S_c⟩_d. D holds dO Vᵀ below the diagonal, ts = dO S_cᵀ,
  // tg = V G_cᵀ; acc is C×K.
  template <class Weight>
  KOKKOS_FUNCTION void gate_gradient(const member_type& team, std::int64_t c, int h, std::int64_t b,
                                     int n, const scratch& D, const scratch& ts, const scratch& tg,
                                     const scratch& acc, const Weight& weight) const {
    const int K = static_cast<int>(row.kdim), V = static_cast<int>(row.vdim), C = chunk;
    const std::int64_t last = b + n - 1;
    const auto& gamma = row.gamma;
    const auto& lo = row.gamma_lo;
    const auto& reset = row.reset;
    // One work item per block of register_block gate columns: the inner loops run over contiguous
    // columns (vectorised on the host), the row prefixes stay in registers.
    const int blocks = (K + register_block - 1) / register_block;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, blocks), [&](int blk) {
      const int d0 = blk * register_block, w = K - d0 < register_block ? K - d0 : register_block;
      for (int t = 0; t < n; ++t)
        for (int jj = 0; jj < w; ++jj) acc[static_cast<long>(t) * K + d0 + jj] = Scalar(0);
      for (int i = 1; i < n; ++i) {
        Scalar run[register_block];  // Σ_{j<t} of row i, per column
        for (int jj = 0; jj < w; ++jj) run[jj] = Scalar(0);
        for (int t = 1; t <= i; ++t) {
          const Scalar dv = D[static_cast<long>(i) * C + t - 1];
          Scalar* at = &acc[static_cast<long>(t) * K + d0];
          for (int jj = 0; jj < w; ++jj) {
            run[jj] += dv * weight(i, t - 1, d0 + jj);
            at[jj] += run[jj];
          }
        }
      }
      for (int d = d0; d < d0 + w; ++d) {
        Scalar m = 0;
        for (int p = 0; p < V; ++p) m += row.gend(c, h, d, p) * row.states(c, h, d, p);
        m *= precise_from_start(gamma, lo, reset, last, h, d);
        Scalar a = 0;
        for (int t = n - 1; t >= 0; --t) {
          a += row.scale * precise_from_start(gamma, lo, reset, b + t, h, d) * row.q(b + t, h, d) *
               ts[static_cast<long>(t) * K + d];
          acc[static_cast<long>(t) * K + d] += a;
        }
        Scalar e = 0;
        for (int t = 0; t < n; ++t) {
          dg(b + t, h, d) = acc[static_cast<long>(t) * K + d] + e + m;
          e += precise_ratio(gamma, lo, reset, last, b + t, h, d) * row.k(b + t, h, d) *
               tg[static_cast<long>(t) * K + d];
        }
      }
    });
  }

  /// The kernel at `Bytes`-wide vectors.
  template <int Bytes>
  KOKKOS_INLINE_FUNCTION void run(const member_type& team) const {
    const int H = static_cast<int>(row.heads), K = static_cast<int>(row.kdim),
              V = static_cast<int>(row.vdim), C = chunk;
    const ChunkTeam ct = chunk_team(team.league_rank(), H, row.chunk_begin, row.chunk_end);
    const std::int64_t c = ct.c, b = ct.b, last = ct.last;
    const int h = ct.h, n = ct.n;
    const auto& gamma = row.gamma;
    const auto& reset = row.reset;
    Scalar spread = 0;
    int resets = 0;
    gate_spread(team, gamma, reset, b, n, h, K, spread, resets);
    const bool direct = resets > 0 || spread > Scalar(decay_factor_limit);
    // γ_t − γ_b from both parts of the compensated sum (the factors' reference is token b).
    auto relative = [&](std::int64_t t, int d) {
      return ctxpar::impl::compensated_difference(gamma(t, h, d), row.gamma_lo(t, h, d),
                                                  gamma(b, h, d), row.gamma_lo(b, h, d));
    };
    if (direct)
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](int t) { row((b + t) * H + h); });
    const auto& sp = team.team_scratch(level);
    scratch kf(sp, std::size_t(C) * K), qe(sp, std::size_t(C) * K), kl(sp, std::size_t(C) * K),
        tq(sp, std::size_t(C) * K), ts(sp, std::size_t(C) * K), tk(sp, std::size_t(C) * K),
        tg(sp, std::size_t(C) * K), kfT(sp, std::size_t(K) * C), vT(sp, std::size_t(V) * C),
        D(sp, std::size_t(C) * C), P(sp, std::size_t(C) * C), sT(sp, std::size_t(V) * K),
        gT(sp, std::size_t(V) * K);
    const Scalar scale = row.scale;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](int t) {
      const Scalar* kt = &row.k(b + t, h, 0);
      const Scalar* qt = &row.q(b + t, h, 0);
      const Scalar* vt = &row.v(b + t, h, 0);
      for (int d = 0; !direct && d < K; ++d) {
        const long td = static_cast<long>(t) * K + d;
        const Scalar x = relative(b + t, d);
        const Scalar f = compat::exp(-x);
        kf[td] = f * kt[d];
        kfT[static_cast<long>(d) * C + t] = f * kt[d];
        qe[td] = compat::exp(x) * scale * qt[d];
        kl[td] = precise_ratio(gamma, row.gamma_lo, reset, last, b + t, h, d) * kt[d];
      }
      for (int d = 0; d < V; ++d) vT[static_cast<long>(d) * C + t] = vt[d];
    });
    transpose_states(team, row.states, row.gend, c, h, K, V, sT.data(), gT.data());
    team.team_barrier();
    const Scalar* dO = &row.dout(b, h, 0);
    gd::chunk_product<Bytes>(products, team, n, n, V, Scalar(1), gd::rows(dO, H * V), vT.data(), C,
                             D.data(), C, false, true);
    if (!direct)
      gd::chunk_product<Bytes>(factored_products(products), team, n, n, K, Scalar(1),
                               gd::rows(qe.data(), K), kfT.data(), C, P.data(), C, false, true);
    gd::chunk_product<Bytes>(products, team, n, K, V, Scalar(1), gd::rows(dO, H * V), sT.data(), K,
                             ts.data(), K, false);
    gd::chunk_product<Bytes>(products, team, n, K, V, Scalar(1), gd::rows(&row.v(b, h, 0), H * V),
                             gT.data(), K, tg.data(), K, false);
    team.team_barrier();
    if (direct) {
      gate_gradient(team, c, h, b, n, D, ts, tg, tq, [&](int i, int j, int d) {
        return scale * row.q(b + i, h, d) * row.k(b + j, h, d) *
               precise_ratio(gamma, row.gamma_lo, reset, b + i, b + j, h, d);
      });
      return;
    }
    // Read as bands next: everything above the diagonal is cleared.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](int t) {
      for (int j = t + 1; j < n; ++j) {
        D[static_cast<long>(t) * C + j] = Scalar(0);
        P[static_cast<long>(t) * C + j] = Scalar(0);
      }
    });
    team.team_barrier();
    Scalar* dvc = &row.dv(b, h, 0);
    gd::chunk_product<Bytes>(factored_products(products), team, n, K, n, Scalar(1),
                             gd::rows(D.data(), C, gd::Band::lower), kf.data(), K, tq.data(), K,
                             false);
    gd::chunk_product<Bytes>(factored_products(products), team, n, K, n, Scalar(1),
                             gd::transposed(D.data(), C, gd::Band::upper), qe.data(), K, tk.data(),
                             K, false);
    gd::chunk_product<Bytes>(products, team, n, V, n, Scalar(1),
                             gd::transposed(P.data(), C, gd::Band::upper), dO, H * V, dvc, H * V,
                             false);
    team.team_barrier();
    gd::chunk_product<Bytes>(products, team, n, V, K, Scalar(1), gd::rows(kl.data(), K),
                             &row.gend(c, h, 0, 0), V, dvc, H * V, true);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](int t) {
      Scalar* dq = &row.dq(b + t, h, 0);
      Scalar* dk = &row.dk(b + t, h, 0);
      for (int d = 0; d < K; ++d) {
        const long td = static_cast<long>(t) * K + d;
        const Scalar x = relative(b + t, d);
        dq[d] = scale * (compat::exp(x) * tq[td] +
                         precise_from_start(gamma, row.gamma_lo, reset, b + t, h, d) * ts[td]);
        dk[d] = compat::exp(-x) * tk[td] +
                precise_ratio(gamma, row.gamma_lo, reset, last, b + t, h, d) * tg[td];
      }
    });
    team.team_barrier();
    gate_gradient(team, c, h, b, n, D, ts, tg, tq, [&](int i, int j, int d) {
      return qe[static_cast<long>(i) * K + d] * kf[static_cast<long>(j) * K + d];
    });
  }
};

// ---- the four methods, shared by both decay families
// ---------------------------------------------

template <class ExecutionSpace>
auto range(const ExecutionSpace& space, std::int64_t n) {
  return Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n);
}

/// A team per (chunk, head) running `Functor` with `scratch` bytes of team scratch at `level`
/// (`scratch_level`), of the size `chunk_team_size` gives (whole warps on a device where the
/// products are not `exact`).
template <class Functor, class ExecutionSpace>
Kokkos::TeamPolicy<ExecutionSpace> chunk_teams(const ExecutionSpace& space, std::int64_t league,
                                               std::size_t scratch, int level,
                                               ctxpar::chunkwise::ChunkProducts products) {
  const auto probe = Kokkos::TeamPolicy<ExecutionSpace>(space, static_cast<int>(league), 1)
                         .set_scratch_size(level, Kokkos::PerTeam(scratch));
  Kokkos::TeamPolicy<ExecutionSpace> policy(
      space, static_cast<int>(league),
      gd::chunk_team_size<Functor>(probe, products != ctxpar::chunkwise::ChunkProducts::exact,
                                   "ctxpar::chunkwise::decay"));
  return policy.set_scratch_size(level, Kokkos::PerTeam(scratch));
}

/// Launches `kernel`, dispatched (`IsaDispatched`), over `n` work items. Its views' execution
/// space decides whether the host fast path applies.
template <class ExecutionSpace, class Kernel>
void launch_items(const ExecutionSpace& space, const char* label, std::int64_t n,
                  const Kernel& kernel) {
  using dispatched =
      IsaDispatched<Kernel, typename Kernel::saved::table::execution_space, std::int64_t>;
  Kokkos::parallel_for(label, range(space, n), dispatched{kernel});
}

/// Launches `kernel`, dispatched (`IsaDispatched`), with a team per (chunk, head) (`league` of
/// them, nothing when there are none) and `scratch` bytes of team scratch each, at level 0 where
/// they fit (`scratch_level`, written to the kernel's `level`), else 1; its products multiplying
/// as `products` says.
template <class ExecutionSpace, class Kernel>
void launch_chunk_teams(const ExecutionSpace& space, const char* label, std::int64_t league,
                        std::size_t scratch, Kernel kernel,
                        ctxpar::chunkwise::ChunkProducts products) {
  using dispatched = IsaDispatched<Kernel, ExecutionSpace,
                                   typename Kokkos::TeamPolicy<ExecutionSpace>::member_type>;
  if (league <= 0) return;
  kernel.level = ctxpar::impl::scratch_level<ExecutionSpace>(scratch);
  Kokkos::parallel_for(label,
                       chunk_teams<dispatched>(space, league, scratch, kernel.level, products),
                       dispatched{kernel});
}

/// Builds the chunk tables of `seqs` into `saved` (chunks never cross a local sequence).
template <class Scalar, class MemorySpace>
void build_chunk_tables(DecaySaved<Scalar, MemorySpace>& saved, const LocalSequences& seqs,
                        int chunk) {
  std::vector<std::int64_t> cb, ce, sc, tc(static_cast<std::size_t>(seqs.length())), so, st, se;
  for (int s = 0; s < seqs.count(); ++s) {
    sc.push_back(static_cast<std::int64_t>(cb.size()));
    so.push_back(seqs.ordinals[static_cast<std::size_t>(s)]);
    st.push_back(seqs.starts_here(s) ? 1 : 0);
    se.push_back(seqs.ends_here(s) ? 1 : 0);
    for (std::int64_t b = seqs.begin(s); b < seqs.end(s); b += chunk) {
      const std::int64_t e = b + chunk < seqs.end(s) ? b + chunk : seqs.end(s);
      for (std::int64_t t = b; t < e; ++t)
        tc[static_cast<std::size_t>(t)] = static_cast<std::int64_t>(cb.size());
      cb.push_back(b);
      ce.push_back(e);
    }
  }
  sc.push_back(static_cast<std::int64_t>(cb.size()));
  saved.chunks = static_cast<std::int64_t>(cb.size());
  saved.chunk = chunk;
  saved.host_seq_chunk = sc;
  // Re-uploaded every call (the values may change), reallocated only when a length changes.
  using ctxpar::impl::upload;
  upload(cb, saved.chunk_begin, "ctxpar::chunkwise::decay::chunk_begin");
  upload(ce, saved.chunk_end, "ctxpar::chunkwise::decay::chunk_end");
  upload(tc, saved.token_chunk, "ctxpar::chunkwise::decay::token_chunk");
  upload(sc, saved.seq_chunk, "ctxpar::chunkwise::decay::seq_chunk");
  upload(so, saved.seq_ordinal, "ctxpar::chunkwise::decay::seq_ordinal");
  upload(st, saved.seq_starts, "ctxpar::chunkwise::decay::seq_starts");
  upload(se, saved.seq_ends, "ctxpar::chunkwise::decay::seq_ends");
}

/// The forward and backward chain kernels at `ExecutionSpace`'s work-item capacity.
template <class ExecutionSpace, class Scalar, class MemorySpace, bool Diagonal>
using ForwardChain =
    ChainForwardKernel<Scalar, MemorySpace, Diagonal, chain_capacity_v<ExecutionSpace>>;
template <class ExecutionSpace, class Scalar, class MemorySpace, bool Diagonal>
using BackwardChain =
    ChainBackwardKernel<Scalar, MemorySpace, Diagonal, chain_capacity_v<ExecutionSpace>>;

/// A chain kernel of either direction over `saved` with its shared fields set: the sequence
/// tables, the chunk transitions, the shape, the first sequence, the mode, and the chunk terms
/// `d` it carries into `keep`.
template <class Chain, class Scalar, class MemorySpace>
Chain make_chain(const DecaySaved<Scalar, MemorySpace>& saved, std::int64_t s_lo, bool apply,
                 const typename DecaySaved<Scalar, MemorySpace>::work4& d,
                 const typename DecaySaved<Scalar, MemorySpace>::work4& keep) {
  Chain chain{};
  chain.seq_chunk = saved.seq_chunk;
  chain.seq_ordinal = saved.seq_ordinal;
  chain.seq_starts = saved.seq_starts;
  chain.seq_ends = saved.seq_ends;
  chain.logm = saved.logm;
  chain.s_lo = s_lo;
  chain.heads = saved.q.extent(1);
  chain.kdim = saved.q.extent(2);
  chain.vdim = saved.v.extent(2);
  chain.tiling = ChainTiling::of(chain.kdim, chain.vdim, Chain::capacity);
  chain.apply = apply;
  chain.d = d;
  chain.keep = keep;
  return chain;
}

/// The summary of local sequence `s`, the first or the last: its chain (`Chain`, the direction)
/// from zero in summary mode, into `summary.state`, and the product of its chunks' transitions.
template <class Chain, class ExecutionSpace, class Scalar, class MemorySpace>
void summarize_sequence(const ExecutionSpace& space, const DecaySaved<Scalar, MemorySpace>& saved,
                        const typename DecaySaved<Scalar, MemorySpace>::work4& d, std::int64_t s,
                        const SummaryViews<MemorySpace>& summary, const char* label) {
  const std::int64_t H = saved.q.extent(1), G = saved.g.extent(2);
  auto chain = make_chain<Chain>(saved, s, false, d, d);
  chain.summary_state = summary.state;
  launch_items(space, label, chain.tiling.items(1, H), chain);
  launch_items(space, "ctxpar::chunkwise::decay::summary_transition", H * G,
               SequenceTransitionKernel<Scalar, MemorySpace>{saved.seq_chunk, saved.logm,
                                                             summary.transition, s, G});
}

template <bool Diagonal, class ExecutionSpace, class Scalar, class MemorySpace>
void decay_forward_prepare(const ExecutionSpace& space, DecaySaved<Scalar, MemorySpace>& saved,
                           const LocalSequences& seqs, int chunk,
                           const SummaryViews<MemorySpace>& summary) {
  build_chunk_tables(saved, seqs, chunk);
  const std::int64_t T = saved.q.extent(0), H = saved.q.extent(1), K = saved.q.extent(2),
                     V = saved.v.extent(2), G = saved.g.extent(2), C = saved.chunks;
  // The saved arrays keep their memory from call to call while the shapes stay the same.
  using ctxpar::impl::ensure_extents;
  ensure_extents(saved.gamma, "ctxpar::chunkwise::decay::gamma", T, H, G);
  Kokkos::deep_copy(space, saved.gamma, Scalar(0));
  ensure_extents(saved.logm, "ctxpar::chunkwise::decay::logm", C, H, G);
  Kokkos::deep_copy(space, saved.logm, Scalar(0));
  ensure_extents(saved.ds, "ctxpar::chunkwise::decay::ds", C, H, K, V);
  ensure_extents(saved.reset, "ctxpar::chunkwise::decay::reset", T, H, G);
  ensure_extents(saved.gamma_lo, "ctxpar::chunkwise::decay::gamma_lo", T, H, G);
  launch_items(
      space, "ctxpar::chunkwise::decay::gamma", C * H * G,
      GammaKernel<Scalar, MemorySpace>{saved.g, saved.chunk_begin, saved.chunk_end, saved.gamma,
                                       saved.logm, saved.reset, saved.gamma_lo, H, G});
  using update = ChunkUpdateTiles<Scalar, ExecutionSpace, MemorySpace, Diagonal>;
  launch_chunk_teams(space, "ctxpar::chunkwise::decay::chunk_update", C * H,
                     update::scratch_bytes(chunk, int(K)),
                     update{saved.k, saved.v, saved.chunk_begin, saved.chunk_end, saved.gamma,
                            saved.ds, saved.reset, int(H), int(K), int(V), chunk, saved.products},
                     saved.products);
  summarize_sequence<ForwardChain<ExecutionSpace, Scalar, MemorySpace, Diagonal>>(
      space, saved, saved.ds, seqs.count() - 1, summary, "ctxpar::chunkwise::decay::summary_state");
}

template <bool Diagonal, class ExecutionSpace, class Scalar, class MemorySpace>
void decay_forward_apply(const ExecutionSpace& space, DecaySaved<Scalar, MemorySpace>& saved,
                         const LocalSequences& seqs, const const_state_view<MemorySpace>& s_in,
                         const const_sequence_states_view<Scalar, MemorySpace>& initial,
                         const token_view<Scalar, MemorySpace>& out,
                         const sequence_states_view<Scalar, MemorySpace>& finals) {
  const std::int64_t H = saved.q.extent(1), K = saved.q.extent(2), V = saved.v.extent(2),
                     C = saved.chunks;
  ctxpar::impl::ensure_extents(saved.states, "ctxpar::chunkwise::decay::states", C, H, K, V);
  auto chain = make_chain<ForwardChain<ExecutionSpace, Scalar, MemorySpace, Diagonal>>(
      saved, 0, true, saved.ds, saved.states);
  chain.start_from(s_in, 0, initial);
  chain.finals = finals;
  chain.have_finals = is_given(finals);
  launch_items(space, "ctxpar::chunkwise::decay::chain_forward",
               chain.tiling.items(seqs.count(), H), chain);
  using output = OutputTiles<Scalar, ExecutionSpace, MemorySpace, Diagonal>;
  launch_chunk_teams(space, "ctxpar::chunkwise::decay::output", C * H,
                     output::scratch_bytes(saved.chunk, int(K)),
                     output{saved.q, saved.k, saved.v, saved.chunk_begin, saved.chunk_end,
                            saved.gamma, saved.states, out, static_cast<Scalar>(saved.scale),
                            int(H), int(K), int(V), saved.chunk, saved.reset, saved.products},
                     saved.products);
}

template <bool Diagonal, class ExecutionSpace, class Scalar, class MemorySpace>
void decay_backward_prepare(const ExecutionSpace& space, DecaySaved<Scalar, MemorySpace>& saved,
                            const const_token_view<Scalar, MemorySpace>& dout,
                            const LocalSequences& /*seqs*/,
                            const SummaryViews<MemorySpace>& summary) {
  const std::int64_t H = saved.q.extent(1), K = saved.q.extent(2), V = saved.v.extent(2),
                     C = saved.chunks;
  ctxpar::impl::ensure_extents(saved.dmat, "ctxpar::chunkwise::decay::dmat", C, H, K, V);
  launch_items(space, "ctxpar::chunkwise::decay::query_output", C * H * K,
               QueryOutputKernel<Scalar, MemorySpace, Diagonal>{
                   saved.q, dout, saved.chunk_begin, saved.chunk_end, saved.gamma, saved.dmat,
                   static_cast<Scalar>(saved.scale), H, K, V, saved.reset, saved.gamma_lo});
  summarize_sequence<BackwardChain<ExecutionSpace, Scalar, MemorySpace, Diagonal>>(
      space, saved, saved.dmat, 0, summary, "ctxpar::chunkwise::decay::summary_gamma");
}

/// The gradient kernel of the family over `saved` (`DiagonalGradientTiles` or
/// `ScalarGradientTiles`): writes dq, dk, dv and dg.
template <bool Diagonal, class ExecutionSpace, class Scalar, class MemorySpace, class Dg>
auto gradient_tiles(const DecaySaved<Scalar, MemorySpace>& saved,
                    const const_token_view<Scalar, MemorySpace>& dout,
                    const token_view<Scalar, MemorySpace>& dq,
                    const token_view<Scalar, MemorySpace>& dk,
                    const token_view<Scalar, MemorySpace>& dv, const Dg& dg) {
  const std::int64_t H = saved.q.extent(1), K = saved.q.extent(2), V = saved.v.extent(2);
  const auto scale = static_cast<Scalar>(saved.scale);
  if constexpr (Diagonal) {
    return DiagonalGradientTiles<Scalar, ExecutionSpace, MemorySpace>{
        GradientRowKernel<Scalar, MemorySpace, true>{
            saved.q, saved.k, saved.v, dout, saved.chunk_begin, saved.chunk_end, saved.token_chunk,
            saved.gamma, saved.states, saved.gend, dq, dk, dv, scale, H, K, V, saved.reset,
            saved.gamma_lo},
        saved.chunk, dg, saved.products};
  } else {
    return ScalarGradientTiles<Scalar, ExecutionSpace, MemorySpace>{saved.q,
                                                                    saved.k,
                                                                    saved.v,
                                                                    dout,
                                                                    saved.chunk_begin,
                                                                    saved.chunk_end,
                                                                    saved.gamma,
                                                                    saved.states,
                                                                    saved.gend,
                                                                    dq,
                                                                    dk,
                                                                    dv,
                                                                    scale,
                                                                    int(H),
                                                                    int(K),
                                                                    int(V),
                                                                    saved.chunk,
                                                                    saved.reset,
                                                                    saved.gamma_lo,
                                                                    dg,
                                                                    saved.products};
  }
}

template <bool Diagonal, class ExecutionSpace, class Scalar, class MemorySpace>
void decay_backward_apply(const ExecutionSpace& space, DecaySaved<Scalar, MemorySpace>& saved,
                          const const_token_view<Scalar, MemorySpace>& dout,
                          const LocalSequences& seqs, const const_state_view<MemorySpace>& ds_out,
                          const const_sequence_states_view<Scalar, MemorySpace>& final_grads,
                          const token_view<Scalar, MemorySpace>& dq,
                          const token_view<Scalar, MemorySpace>& dk,
                          const token_view<Scalar, MemorySpace>& dv, Scalar* dg_data,
                          const sequence_states_view<Scalar, MemorySpace>& initial_grads,
                          const state_view<MemorySpace>& ds_in) {
  const std::int64_t T = saved.q.extent(0), H = saved.q.extent(1), K = saved.q.extent(2),
                     V = saved.v.extent(2), G = saved.g.extent(2), C = saved.chunks;
  ctxpar::impl::ensure_extents(saved.gend, "ctxpar::chunkwise::decay::gend", C, H, K, V);
  auto chain = make_chain<BackwardChain<ExecutionSpace, Scalar, MemorySpace, Diagonal>>(
      saved, 0, true, saved.dmat, saved.gend);
  chain.start_from(ds_out, seqs.count() - 1, final_grads);
  chain.initial_grads = initial_grads;
  chain.ds_in = ds_in;
  chain.have_initial_grads = is_given(initial_grads);
  chain.have_ds_in = is_given(ds_in);
  launch_items(space, "ctxpar::chunkwise::decay::chain_backward",
               chain.tiling.items(seqs.count(), H), chain);
  // dg is written by the gradient kernels, from the pairs that straddle each token.
  const Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace, Kokkos::MemoryUnmanaged> dg(
      dg_data, T, H, G);
  const auto grads = gradient_tiles<Diagonal, ExecutionSpace>(saved, dout, dq, dk, dv, dg);
  launch_chunk_teams(space, "ctxpar::chunkwise::decay::gradients", C * H,
                     decltype(grads)::scratch_bytes(saved.chunk, int(K), int(V)), grads,
                     saved.products);
}

/// Counts non-finite values of a view (NaN/Inf check flag).
template <class ExecutionSpace, class View>
std::int64_t count_non_finite(const ExecutionSpace& space, const View& view) {
  using value_type = std::remove_const_t<typename View::value_type>;
  Kokkos::View<const value_type*, typename View::memory_space, Kokkos::MemoryUnmanaged> flat(
      view.data(), view.span());
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "ctxpar::chunkwise::count_non_finite",
      range(space, static_cast<std::int64_t>(flat.extent(0))),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t & sum) {
        sum += compat::isfinite(flat(i)) ? 0 : 1;
      },
      bad);
  return bad;
}

}  // namespace ctxpar::chunkwise::impl
