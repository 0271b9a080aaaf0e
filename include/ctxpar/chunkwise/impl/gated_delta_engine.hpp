/// \file
/// Host-side orchestration of the gated delta chunk kernels, shared by the gated delta rule and
/// the gated delta product backends: chunk layout of the local sequences, the saved bundle, and
/// the four contract steps expressed on raw problems.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "ctxpar/core/host_mirror.hpp"
#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar/chunkwise/impl/gated_delta_kernels.hpp"
#include "ctxpar/chunkwise/local_sequences.hpp"
#include "ctxpar/chunkwise/summary.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/team_size.hpp"
#include "ctxpar/core/workspace.hpp"

namespace ctxpar::impl::gated_delta {

/// A contiguous `[n, H, K, V]` Scalar buffer.
template <class Scalar, class MemorySpace>
using states_buffer = Kokkos::View<Scalar****, Kokkos::LayoutRight, MemorySpace>;

/// What the forward keeps for the backward (views only), plus the chunk layout and the work
/// buffers of the calls. A bundle kept across calls (the heads layer keeps one) reuses all of them
/// while the shapes and the chunk layout stay the same: after `invalidate()`, the next call
/// recomputes everything into the same memory and allocates nothing.
template <class Scalar, class MemorySpace, class Inputs>
struct Saved {
  Inputs inputs;                                ///< the forward inputs (views)
  ChunkData<Scalar, MemorySpace> cd;            ///< per-chunk quantities
  Kokkos::View<int*, MemorySpace> first_chunk;  ///< [n + 1] chunk range of each local sequence
  std::vector<std::int64_t> cu_seqlens;         ///< the local token boundaries the layout is for
  Kokkos::View<float***, Kokkos::LayoutRight, MemorySpace> m;  ///< M of the trailing fragment
  bool intra_done = false;  ///< the per-chunk phase ran on `inputs`
  /// forward_prepare ran and no forward_apply has consumed its per-chunk phase yet. Only then may
  /// forward_apply reuse it: matching data pointers alone cannot tell new values in old buffers.
  bool prepared = false;
  bool m_ready = false;       ///< `m` holds M of the trailing fragment
  bool forward_done = false;  ///< chunk-start states and U are saved
  /// forward_prepare already ran the apply's pass from zero (the driver said `s_in` is zero and
  /// no initial states apply): `out` and `fin` hold its outputs and per-sequence final states.
  bool forward_applied = false;
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace> out;   ///< `[T, H, V]` outputs
  Kokkos::View<Scalar****, Kokkos::LayoutRight, MemorySpace> fin;  ///< `[n, H, K, V]` final states
  /// backward_prepare already ran the apply's reverse pass from zero: `start` holds the gradient
  /// at every local sequence's start and the chunk gradients' inputs are saved.
  bool backward_applied = false;
  Kokkos::View<Scalar****, Kokkos::LayoutRight, MemorySpace> start;  ///< `[n, H, K, V]`

  /// The chunk layout `cd` was allocated and uploaded for: (first row, rows, sequence) per chunk,
  /// the chunk range per sequence, and (C, H, K, V, n_h).
  std::vector<int> planned_rows, planned_first, planned_dims;
  /// Work buffers of the apply steps (initial and final states, their gradients), `[n, H, K, V]`.
  states_buffer<Scalar, MemorySpace> init_work, final_work, dinit_work, dstart_work;
  /// Memory of the prepare steps' outputs (`out`, `fin`, `start` point into it while valid) and
  /// of one `[1, H, K, V]` summary state; kept so a steady-state call allocates nothing.
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace> out_work;
  states_buffer<Scalar, MemorySpace> prepared_final_work, prepared_start_work, summary_work;
  /// Per state row: (take the composed state?, row of the user's states or -1), and its mirror.
  Kokkos::View<int* [2], MemorySpace> state_rows;
  typename Kokkos::View<int* [2], MemorySpace>::HostMirror state_rows_host;

  /// Marks every computed quantity stale (new values in the same input buffers), keeping the
  /// memory for the next call.
  void invalidate() {
    intra_done = prepared = m_ready = forward_done = forward_applied = backward_applied = false;
    out = {};
    fin = {};
    start = {};
  }
};

/// `slot` when it already has the extents `[n, H, K, V]`, else a new buffer there (labelled).
template <class Scalar, class MemorySpace>
states_buffer<Scalar, MemorySpace> reuse_states(states_buffer<Scalar, MemorySpace>& slot,
                                                const char* label, int n, int H, int K, int V) {
  if (slot.data() == nullptr || static_cast<int>(slot.extent(0)) != n ||
      static_cast<int>(slot.extent(1)) != H || static_cast<int>(slot.extent(2)) != K ||
      static_cast<int>(slot.extent(3)) != V)
    slot = states_buffer<Scalar, MemorySpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n, H, K, V);
  return slot;
}

/// Number of chunks of `rows` sub-steps.
inline int chunks_of(std::int64_t rows, int chunk) {
  return static_cast<int>((rows + chunk - 1) / chunk);
}

/// Lays out the chunks of the local sequences (in sub-step rows) and allocates the saved views.
template <class Scalar, class MemorySpace, class Inputs>
void plan_chunks(Saved<Scalar, MemorySpace, Inputs>& sv, const Problem<Scalar>& pb,
                 const chunkwise::LocalSequences& seqs) {
  const int C = pb.chunk, H = pb.heads, K = pb.key_dim, V = pb.value_dim;
  std::vector<int> first(1, 0), rows;
  for (int s = 0; s < seqs.count(); ++s) {
    const std::int64_t b = seqs.begin(s) * pb.n_h, e = seqs.end(s) * pb.n_h;
    for (std::int64_t r = b; r < e; r += C) {
      rows.push_back(static_cast<int>(r));
      rows.push_back(static_cast<int>(e - r < C ? e - r : C));
      rows.push_back(s);
    }
    first.push_back(static_cast<int>(rows.size() / 3));
  }
  sv.cu_seqlens = seqs.cu_seqlens;
  sv.intra_done = sv.m_ready = sv.forward_done = false;
  const std::vector<int> dims{C, H, K, V, pb.n_h};
  // The same layout and shapes as the buffers hold: everything is recomputed into them.
  if (sv.cd.x.data() != nullptr && rows == sv.planned_rows && first == sv.planned_first &&
      dims == sv.planned_dims)
    return;
  sv.planned_rows = rows;
  sv.planned_first = first;
  sv.planned_dims = dims;
  const int nc = first.back();
  using view = typename ChunkData<Scalar, MemorySpace>::view;
  auto alloc = [&](const char* what, std::size_t n) {
    return view(Kokkos::view_alloc(Kokkos::WithoutInitializing,
                                   std::string("ctxpar::chunkwise::gated_delta::") + what),
                n);
  };
  const std::size_t blocks = std::size_t(nc) * H;
  auto& cd = sv.cd;
  cd.chunks = Kokkos::View<int* [3], MemorySpace>("ctxpar::chunkwise::gated_delta::chunks", nc);
  auto chunks_host = ctxpar::impl::host_mirror(cd.chunks);
  for (int c = 0; c < nc; ++c)
    for (int j = 0; j < 3; ++j) chunks_host(c, j) = rows[std::size_t(c) * 3 + j];
  Kokkos::deep_copy(cd.chunks, chunks_host);
  sv.first_chunk =
      Kokkos::View<int*, MemorySpace>("ctxpar::chunkwise::gated_delta::first_chunk", first.size());
  auto first_host = ctxpar::impl::host_mirror(sv.first_chunk);
  for (std::size_t i = 0; i < first.size(); ++i) first_host(i) = first[i];
  Kokkos::deep_copy(sv.first_chunk, first_host);
  cd.gamma = alloc("gamma", blocks * C);
  cd.gamma_lo = alloc("gamma_lo", blocks * C);
  cd.reset = Kokkos::View<int*, MemorySpace>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "ctxpar::chunkwise::gated_delta::reset"),
      blocks * C);
  cd.x = alloc("x", blocks * C * C);
  cd.p = alloc("p", blocks * C * C);
  cd.wt = alloc("wt", blocks * C * K);
  cd.kt = alloc("kt", blocks * C * K);
  cd.qh = alloc("qh", blocks * C * K);
  cd.ut = alloc("ut", blocks * C * V);
  cd.u = alloc("u", blocks * C * V);
  cd.du = alloc("du", blocks * C * V);
  cd.s0 = alloc("s0", blocks * K * V);
  cd.dse = alloc("dse", blocks * K * V);
  sv.m = Kokkos::View<float***, Kokkos::LayoutRight, MemorySpace>(
      "ctxpar::chunkwise::gated_delta::m", H, K, K);
}

/// A team per work item running `Functor` with `scratch` bytes of level-1 scratch; the team size
/// is the library's one rule (`choose_team_size`) for this functor type (a value-initialised
/// functor is enough for Kokkos to size the launch).
template <class Functor, class ExecutionSpace>
Kokkos::TeamPolicy<ExecutionSpace> team_policy(const ExecutionSpace& space, int league,
                                               std::size_t scratch) {
  const auto probe = Kokkos::TeamPolicy<ExecutionSpace>(space, league, 1)
                         .set_scratch_size(1, Kokkos::PerTeam(scratch));
  Kokkos::TeamPolicy<ExecutionSpace> policy(space, league, choose_team_size(probe, Functor{}));
  return policy.set_scratch_size(1, Kokkos::PerTeam(scratch));
}

/// Runs the per-chunk phase over every chunk (once per forward).
template <class ExecutionSpace, class Scalar, class MemorySpace, class Inputs>
void run_intra(const ExecutionSpace& space, Saved<Scalar, MemorySpace, Inputs>& sv,
               const Problem<Scalar>& pb) {
  using functor = IntraChunk<Scalar, ExecutionSpace, MemorySpace>;
  const int league = static_cast<int>(sv.cd.chunks.extent(0)) * pb.heads;
  if (league > 0)
    Kokkos::parallel_for(
        "ctxpar::chunkwise::gated_delta::intra_chunk",
        team_policy<functor>(space, league,
                             functor::scratch_bytes(pb.chunk, pb.key_dim, pb.value_dim)),
        functor{pb, sv.cd});
  sv.intra_done = true;
}

/// Runs a forward (`Reverse = false`) or reverse state pass over sequences `[begin, end)`.
template <bool Reverse, class ExecutionSpace, class Scalar, class MemorySpace, class Inputs>
void run_pass(const ExecutionSpace& space, const Saved<Scalar, MemorySpace, Inputs>& sv,
              const Problem<Scalar>& pb, PassTargets<Scalar> tg, int begin, int end) {
  tg.first_chunk = sv.first_chunk.data();
  tg.seq_begin = begin;
  const int nb = pass_block<ExecutionSpace>();
  const int blocks = (pb.value_dim + (tg.m_out ? pb.key_dim : 0) + nb - 1) / nb;
  const int league = (end - begin) * pb.heads * blocks;
  if (league <= 0) return;
  if constexpr (Reverse) {
    using functor = ReversePass<Scalar, ExecutionSpace, MemorySpace>;
    Kokkos::parallel_for(
        "ctxpar::chunkwise::gated_delta::reverse_pass",
        team_policy<functor>(space, league, functor::scratch_bytes(pb.chunk, pb.key_dim, nb)),
        functor{pb, sv.cd, tg, blocks, nb});
  } else {
    using functor = ForwardPass<Scalar, ExecutionSpace, MemorySpace>;
    Kokkos::parallel_for(
        "ctxpar::chunkwise::gated_delta::forward_pass",
        team_policy<functor>(space, league, functor::scratch_bytes(pb.chunk, pb.key_dim, nb)),
        functor{pb, sv.cd, tg, blocks, nb});
  }
}

/// Copies `[rows, H, K·V]`-shaped Scalar states (row `src_row` of a contiguous `[n, H, K, V]`
/// buffer) into a (possibly strided) fp32 `[H, K·V]` summary view.
template <class ExecutionSpace, class Scalar, class Dst>
void store_summary_state(const ExecutionSpace& space, const Dst& dst, const Scalar* src,
                         std::int64_t kv) {
  const int H = static_cast<int>(dst.extent(0));
  Kokkos::parallel_for(
      "ctxpar::chunkwise::gated_delta::store_summary",
      Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(space, {0, 0},
                                                             {H, static_cast<int>(kv)}),
      KOKKOS_LAMBDA(int h, int i) {
        dst(h, i) = static_cast<float>(src[static_cast<long>(h) * kv + i]);
      });
}

/// Copies M (or its transpose) `[H, K, K]` into the summary's `[H, K·K]` transition part.
template <class ExecutionSpace, class MemorySpace, class Dst>
void store_summary_transition(const ExecutionSpace& space, const Dst& dst,
                              const Kokkos::View<float***, Kokkos::LayoutRight, MemorySpace>& m,
                              bool transpose) {
  const int H = static_cast<int>(m.extent(0)), K = static_cast<int>(m.extent(1));
  Kokkos::parallel_for(
      "ctxpar::chunkwise::gated_delta::store_transition",
      Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {H, K, K}),
      KOKKOS_LAMBDA(int h, int a, int b) {
        dst(h, a * K + b) = transpose ? m(h, b, a) : m(h, a, b);
      });
}

/// Fills `buf` row `i` with `(i == pick_first ? first : 0) + (use_row[i] ? rows(ordinals[i]) : 0)`
/// (each term only when its view is given): the composed fp32 state from other shards plus the
/// user's own state of a sequence that starts (ends) here. The row table goes through `table` and
/// its mirror `table_host`, (re)allocated only when their length is not `n`.
template <class ExecutionSpace, class Scalar, class MemorySpace, class Rows>
void fill_states(const ExecutionSpace& space, const states_buffer<Scalar, MemorySpace>& buf,
                 const chunkwise::const_state_view<MemorySpace>& first, int pick_first,
                 const Rows& rows_view, const std::vector<std::int32_t>& ordinals,
                 const std::vector<bool>& use_row, Kokkos::View<int* [2], MemorySpace>& table,
                 typename Kokkos::View<int* [2], MemorySpace>::HostMirror& table_host) {
  const int n = static_cast<int>(buf.extent(0)), H = static_cast<int>(buf.extent(1)),
            K = static_cast<int>(buf.extent(2)), V = static_cast<int>(buf.extent(3));
  if (table.data() == nullptr || static_cast<int>(table.extent(0)) != n) {
    table = Kokkos::View<int* [2], MemorySpace>("ctxpar::chunkwise::gated_delta::state_rows", n);
    table_host = ctxpar::impl::host_mirror(table);
  }
  const auto source = table;
  const auto host = table_host;
  const bool rows_given = chunkwise::is_given(rows_view);
  const bool first_given = chunkwise::is_given(first);
  for (int i = 0; i < n; ++i) {
    host(i, 0) = (i == pick_first && first_given) ? 1 : 0;
    host(i, 1) = (rows_given && use_row[std::size_t(i)]) ? ordinals[std::size_t(i)] : -1;
  }
  Kokkos::deep_copy(source, host);
  Kokkos::parallel_for(
      "ctxpar::chunkwise::gated_delta::fill_states",
      Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<4>>(space, {0, 0, 0, 0}, {n, H, K, V}),
      KOKKOS_LAMBDA(int i, int h, int a, int b) {
        Scalar x = Scalar(0);
        if (source(i, 0) == 1) x = static_cast<Scalar>(first(h, a, b));
        const int row = source(i, 1);
        if (row >= 0) x += rows_view(row, h, a, b);
        buf(i, h, a, b) = x;
      });
}

/// Copies row `i` of `buf` to `rows(ordinals[i])` for every `i` with `use_row[i]`.
template <class ExecutionSpace, class Scalar, class MemorySpace, class Rows>
void scatter_states(const ExecutionSpace& space, const states_buffer<Scalar, MemorySpace>& buf,
                    const Rows& rows_view, const std::vector<std::int32_t>& ordinals,
                    const std::vector<bool>& use_row) {
  if (!chunkwise::is_given(rows_view)) return;
  const int H = static_cast<int>(buf.extent(1)), K = static_cast<int>(buf.extent(2)),
            V = static_cast<int>(buf.extent(3));
  for (std::size_t i = 0; i < use_row.size(); ++i) {
    if (!use_row[i]) continue;
    const int from = static_cast<int>(i), to = ordinals[i];
    Kokkos::parallel_for(
        "ctxpar::chunkwise::gated_delta::scatter_states",
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {H, K, V}),
        KOKKOS_LAMBDA(int h, int a, int b) { rows_view(to, h, a, b) = buf(from, h, a, b); });
  }
}

/// Copies row `i` of `buf` into an fp32 `[H, K, V]` state.
template <class ExecutionSpace, class Scalar, class MemorySpace>
void store_state(const ExecutionSpace& space, const states_buffer<Scalar, MemorySpace>& buf, int i,
                 const chunkwise::state_view<MemorySpace>& out) {
  const int H = static_cast<int>(buf.extent(1)), K = static_cast<int>(buf.extent(2)),
            V = static_cast<int>(buf.extent(3));
  Kokkos::parallel_for(
      "ctxpar::chunkwise::gated_delta::store_state",
      Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {H, K, V}),
      KOKKOS_LAMBDA(int h, int a, int b) { out(h, a, b) = static_cast<float>(buf(i, h, a, b)); });
}

/// The four contract steps on a raw problem; the public backends adapt their views to these.
template <class Scalar, class MemorySpace, class Inputs>
struct Engine {
  using saved_type = Saved<Scalar, MemorySpace, Inputs>;
  using buffer = states_buffer<Scalar, MemorySpace>;

  template <class ExecutionSpace>
  static void ensure_intra(const ExecutionSpace& space, saved_type& sv, const Problem<Scalar>& pb,
                           const chunkwise::LocalSequences& seqs) {
    if (!sv.intra_done || sv.cu_seqlens != seqs.cu_seqlens) {
      plan_chunks(sv, pb, seqs);
      run_intra(space, sv, pb);
    }
  }

  template <class ExecutionSpace>
  static void forward_prepare(const ExecutionSpace& space, saved_type& sv,
                              const Problem<Scalar>& pb, const chunkwise::LocalSequences& seqs,
                              const chunkwise::SummaryViews<MemorySpace>& summary,
                              const chunkwise::SummaryNeeds& needs, std::int64_t tokens) {
    ensure_intra(space, sv, pb, seqs);
    sv.forward_applied = false;
    sv.out = {};
    sv.fin = {};
    // Nobody reads the summary (its record arrives zeroed): the apply's pass does all the work.
    if (!needs.state) return;
    const int last = seqs.count() - 1;
    if (needs.zero_boundary && !needs.transition) {
      // The apply would run this very pass from zero: run it once here, keep the outputs, and
      // take dS from the trailing sequence's final state.
      const int n = seqs.count();
      ctxpar::impl::ensure_extents(sv.out_work, "ctxpar::chunkwise::gated_delta::out", tokens,
                                   pb.heads, pb.value_dim);
      sv.out = sv.out_work;
      sv.fin = reuse_states(sv.prepared_final_work, "ctxpar::chunkwise::gated_delta::final", n,
                            pb.heads, pb.key_dim, pb.value_dim);
      PassTargets<Scalar> tg;
      tg.final_state = sv.fin.data();
      tg.out = sv.out.data();
      tg.save = true;
      run_pass<false>(space, sv, pb, tg, 0, n);
      const std::int64_t kv = std::int64_t(pb.key_dim) * pb.value_dim;
      store_summary_state(space, summary.state, sv.fin.data() + std::int64_t(last) * pb.heads * kv,
                          kv);
      sv.forward_applied = true;
      return;
    }
    if (!needs.transition) {
      const buffer ds = reuse_states(sv.summary_work, "ctxpar::chunkwise::gated_delta::ds", 1,
                                     pb.heads, pb.key_dim, pb.value_dim);
      PassTargets<Scalar> tg;
      tg.final_state = ds.data();
      tg.row_base = last;
      run_pass<false>(space, sv, pb, tg, last, last + 1);
      store_summary_state(space, summary.state, ds.data(), std::int64_t(pb.key_dim) * pb.value_dim);
      return;
    }
    const buffer ds = reuse_states(sv.summary_work, "ctxpar::chunkwise::gated_delta::ds", 1,
                                   pb.heads, pb.key_dim, pb.value_dim);
    PassTargets<Scalar> tg;
    tg.final_state = ds.data();
    tg.row_base = last;
    tg.m_out = sv.m.data();
    run_pass<false>(space, sv, pb, tg, last, last + 1);
    sv.m_ready = true;
    store_summary_state(space, summary.state, ds.data(), std::int64_t(pb.key_dim) * pb.value_dim);
    store_summary_transition(space, summary.transition, sv.m, false);
  }

  template <class ExecutionSpace, class Initial, class Output, class Final>
  static void forward_apply(const ExecutionSpace& space, saved_type& sv, const Problem<Scalar>& pb,
                            const chunkwise::LocalSequences& seqs,
                            const chunkwise::const_state_view<MemorySpace>& s_in,
                            const Initial& initial_states, const Output& output,
                            const Final& final_states) {
    ensure_intra(space, sv, pb, seqs);
    const int n = seqs.count();
    if (sv.forward_applied && !chunkwise::is_given(initial_states) &&
        sv.out.extent(0) == output.extent(0) && static_cast<int>(sv.fin.extent(0)) == n) {
      // forward_prepare ran this pass from a zero s_in (the driver's zero_boundary).
      Kokkos::deep_copy(space, output, sv.out);
      std::vector<bool> ends(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) ends[std::size_t(i)] = seqs.ends_here(i);
      scatter_states(space, sv.fin, final_states, seqs.ordinals, ends);
      sv.forward_applied = false;
      sv.out = {};
      sv.fin = {};
      sv.forward_done = true;
      return;
    }
    sv.forward_applied = false;
    const buffer init = reuse_states(sv.init_work, "ctxpar::chunkwise::gated_delta::init", n,
                                     pb.heads, pb.key_dim, pb.value_dim);
    const buffer fin = reuse_states(sv.final_work, "ctxpar::chunkwise::gated_delta::final", n,
                                    pb.heads, pb.key_dim, pb.value_dim);
    std::vector<bool> starts(static_cast<std::size_t>(n)), ends(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i)
      starts[std::size_t(i)] = seqs.starts_here(i), ends[std::size_t(i)] = seqs.ends_here(i);
    fill_states(space, init, s_in, 0, initial_states, seqs.ordinals, starts, sv.state_rows,
                sv.state_rows_host);
    PassTargets<Scalar> tg;
    tg.init = init.data();
    tg.final_state = fin.data();
    tg.out = output.data();
    tg.save = true;
    run_pass<false>(space, sv, pb, tg, 0, n);
    scatter_states(space, fin, final_states, seqs.ordinals, ends);
    sv.forward_done = true;
  }

  template <class ExecutionSpace, class OutputGrad>
  static void backward_prepare(const ExecutionSpace& space, saved_type& sv,
                               const Problem<Scalar>& pb, const OutputGrad& output_grad,
                               const chunkwise::LocalSequences& seqs,
                               const chunkwise::SummaryViews<MemorySpace>& summary,
                               const chunkwise::SummaryNeeds& needs) {
    ensure_intra(space, sv, pb, seqs);
    sv.backward_applied = false;
    sv.start = {};
    if (!needs.state) return;  // nobody reads γ: the apply's reverse pass does all the work
    if (needs.zero_boundary && !needs.transition && sv.forward_done) {
      // The apply would run this reverse pass from a zero ds_out: run it once here (saving what
      // the chunk gradients read) and take γ from the leading sequence's start.
      const int n = seqs.count();
      sv.start = reuse_states(sv.prepared_start_work, "ctxpar::chunkwise::gated_delta::dstart", n,
                              pb.heads, pb.key_dim, pb.value_dim);
      PassTargets<Scalar> tg;
      tg.final_state = sv.start.data();
      tg.dout = output_grad.data();
      tg.save = true;
      run_pass<true>(space, sv, pb, tg, 0, n);
      store_summary_state(space, summary.state, sv.start.data(),
                          std::int64_t(pb.key_dim) * pb.value_dim);
      sv.backward_applied = true;
      return;
    }
    if (!needs.transition) {
      const buffer gamma =
          reuse_states(sv.summary_work, "ctxpar::chunkwise::gated_delta::gamma_summary", 1,
                       pb.heads, pb.key_dim, pb.value_dim);
      PassTargets<Scalar> tg;
      tg.final_state = gamma.data();
      tg.dout = output_grad.data();
      run_pass<true>(space, sv, pb, tg, 0, 1);
      store_summary_state(space, summary.state, gamma.data(),
                          std::int64_t(pb.key_dim) * pb.value_dim);
      return;
    }
    const buffer gamma =
        reuse_states(sv.summary_work, "ctxpar::chunkwise::gated_delta::gamma_summary", 1, pb.heads,
                     pb.key_dim, pb.value_dim);
    const bool reuse_m = sv.m_ready && seqs.count() == 1;
    PassTargets<Scalar> tg;
    tg.final_state = gamma.data();
    tg.dout = output_grad.data();
    if (!reuse_m) tg.m_out = sv.m.data();
    run_pass<true>(space, sv, pb, tg, 0, 1);
    if (!reuse_m) sv.m_ready = false;  // sv.m now holds Mᵀ of the leading fragment
    store_summary_state(space, summary.state, gamma.data(),
                        std::int64_t(pb.key_dim) * pb.value_dim);
    store_summary_transition(space, summary.transition, sv.m, reuse_m);
  }

  template <class ExecutionSpace, class OutputGrad, class FinalGrads, class InitialGrads>
  static void backward_apply(const ExecutionSpace& space, saved_type& sv, const Problem<Scalar>& pb,
                             const OutputGrad& output_grad, const chunkwise::LocalSequences& seqs,
                             const chunkwise::const_state_view<MemorySpace>& ds_out,
                             const FinalGrads& final_grads, const GradTargets<Scalar>& grads,
                             const InitialGrads& initial_grads,
                             const chunkwise::state_view<MemorySpace>& ds_in) {
    const int n = seqs.count();
    // The backward reads the chunk-start states that only forward_apply (with the true S_in) saves.
    require_local(sv.forward_done, "ctxpar::chunkwise::gated_delta::backward_apply",
                  "forward_apply must run on this saved bundle before backward_apply",
                  "a forward bundle", "a bundle without forward_apply");
    std::vector<bool> ends_here(static_cast<std::size_t>(n)), starts(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i)
      ends_here[std::size_t(i)] = seqs.ends_here(i), starts[std::size_t(i)] = seqs.starts_here(i);
    buffer start;
    if (sv.backward_applied && !chunkwise::is_given(final_grads) &&
        static_cast<int>(sv.start.extent(0)) == n) {
      start = sv.start;  // backward_prepare ran this pass from a zero ds_out (zero_boundary)
    } else {
      const buffer init = reuse_states(sv.dinit_work, "ctxpar::chunkwise::gated_delta::dinit", n,
                                       pb.heads, pb.key_dim, pb.value_dim);
      start = reuse_states(sv.dstart_work, "ctxpar::chunkwise::gated_delta::dstart", n, pb.heads,
                           pb.key_dim, pb.value_dim);
      fill_states(space, init, ds_out, n - 1, final_grads, seqs.ordinals, ends_here, sv.state_rows,
                  sv.state_rows_host);
      PassTargets<Scalar> tg;
      tg.init = init.data();
      tg.final_state = start.data();
      tg.dout = output_grad.data();
      tg.save = true;
      run_pass<true>(space, sv, pb, tg, 0, n);
    }
    sv.backward_applied = false;
    sv.start = {};
    GradTargets<Scalar> gt = grads;
    gt.dout = output_grad.data();
    using functor = ChunkGradients<Scalar, ExecutionSpace, MemorySpace>;
    const int league = static_cast<int>(sv.cd.chunks.extent(0)) * pb.heads;
    if (league > 0)
      Kokkos::parallel_for(
          "ctxpar::chunkwise::gated_delta::chunk_gradients",
          team_policy<functor>(space, league,
                               functor::scratch_bytes(pb.chunk, pb.key_dim, pb.value_dim)),
          functor{pb, sv.cd, gt});
    scatter_states(space, start, initial_grads, seqs.ordinals, starts);
    if (chunkwise::is_given(ds_in)) store_state(space, start, 0, ds_in);
  }
};

}  // namespace ctxpar::impl::gated_delta
