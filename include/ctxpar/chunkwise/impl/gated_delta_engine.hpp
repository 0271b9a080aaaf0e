/// \file
/// Host-side orchestration of the gated delta chunk kernels, shared by the gated delta rule and
/// the gated delta product backends: the chunk table of the local sequences (the slot owner's),
/// the saved bundle (per call), and the four contract steps expressed on raw problems.
#pragma once

#include <Kokkos_Core.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar/chunkwise/impl/gated_delta_kernels.hpp"
#include "ctxpar/chunkwise/local_sequences.hpp"
#include "ctxpar/chunkwise/summary.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/host_mirror.hpp"
#include "ctxpar/core/team_size.hpp"
#include "ctxpar/core/workspace.hpp"

namespace ctxpar::impl::gated_delta {

/// A contiguous `[n, H, K, V]` Scalar buffer.
template <class Scalar, class MemorySpace>
using states_buffer = Kokkos::View<Scalar****, Kokkos::LayoutRight, MemorySpace>;

/// The per-shape facts of one local slot, owned by whoever owns the slot (a `CpPlan`, the heads
/// layer core) and built once, before any call, from the slot's local sequences and the problem's
/// sizes (`make_chunk_table`): the chunk table and the row table of the state passes. Calls read
/// the chunk table only, so any number of saved bundles (forwards in flight) share one; the row
/// table `state_rows` is the one exception, rewritten by each pass just before it reads it (calls
/// run in order on the plan's space).
template <class MemorySpace>
struct ChunkTable {
  /// (first sub-step row, rows, local sequence) of every chunk.
  Kokkos::View<int* [3], MemorySpace> chunks;
  Kokkos::View<int*, MemorySpace> first_chunk;  ///< [n + 1] chunk range of each local sequence
  std::vector<std::int64_t> cu_seqlens;         ///< the local token boundaries it is for
  std::array<int, 5> dims{};                    ///< (C, H, K, V, n_h) it is for
  /// Per state row: (take the composed state?, row of the user's states or -1), and its mirror:
  /// scratch of the apply passes, written by each call just before its pass reads it.
  Kokkos::View<int* [2], MemorySpace> state_rows;
  typename Kokkos::View<int* [2], MemorySpace>::HostMirror state_rows_host;

  /// Number of chunks (0 for a table no plan built).
  int chunk_count() const { return static_cast<int>(chunks.extent(0)); }
};

/// The per-call memory of one saved bundle: what a forward writes and its backward reads (the
/// per-chunk quantities, M) and the work buffers of the four steps. Sized from a `ChunkTable`
/// (`size_buffers`), up front or by the first forward, and reused while the table's sizes hold.
template <class Scalar, class MemorySpace>
struct ChunkBuffers {
  /// Per-chunk quantities; `cd.chunks` is the table's (a view of the plan's memory).
  ChunkData<Scalar, MemorySpace> cd;
  Kokkos::View<float***, Kokkos::LayoutRight, MemorySpace> m;  ///< `[H, K, K]` M (or Mᵀ) memory
  /// Work buffers of the apply steps (initial and final states, their gradients), `[n, H, K, V]`.
  states_buffer<Scalar, MemorySpace> init_work, final_work, dinit_work, dstart_work;
  /// Memory of the prepare steps' early apply passes (outputs, final states, start gradients) and
  /// of one `[1, H, K, V]` summary state.
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace> out_work;
  states_buffer<Scalar, MemorySpace> prepared_final_work, prepared_start_work, summary_work;
  int sized_chunks = -1;            ///< the chunk count `cd` and `m` were allocated for
  std::array<int, 5> sized_dims{};  ///< and the table's (C, H, K, V, n_h)
};

/// What `forward_prepare` computed for the `forward_apply` of the same call: the per-chunk phase
/// on `inputs` (in the bundle's buffers) and, when the driver's needs allowed, more.
template <class Scalar, class MemorySpace, class Inputs>
struct PreparedForward {
  Inputs inputs;                ///< the views the per-chunk phase ran on
  const void* table = nullptr;  ///< the chunk table it ran on (its `chunks` memory)
  /// M of the trailing fragment (the buffers' `m`) when the summary needed it, else empty.
  Kokkos::View<float***, Kokkos::LayoutRight, MemorySpace> m;
  /// The apply's pass, already run from zero (the driver's `zero_boundary`): the outputs
  /// `[T, H, V]` and per-sequence final states `[n, H, K, V]`; both empty when it did not run.
  Kokkos::View<Scalar***, Kokkos::LayoutRight, MemorySpace> out;
  states_buffer<Scalar, MemorySpace> fin;
};

/// What a forward computed that the backward reuses: the per-chunk phase, chunk-start states and
/// U of `inputs` (in the bundle's buffers), and M of the trailing fragment when it is at hand.
/// Every `forward_apply` writes it whole.
template <class MemorySpace, class Inputs>
struct ForwardRecord {
  Inputs inputs;                ///< the views of the forward; the backward's problem
  const void* table = nullptr;  ///< the chunk table of the forward (its `chunks` memory)
  /// M of the trailing fragment (the buffers' `m`), or empty; a backward_prepare that overwrites
  /// that memory with Mᵀ of the leading fragment empties it.
  Kokkos::View<float***, Kokkos::LayoutRight, MemorySpace> m;
};

/// What `backward_prepare` computed for the `backward_apply` of the same call: the apply's
/// reverse pass run from a zero `ds_out` (the driver's `zero_boundary`), with the gradient at
/// every local sequence's start, `[n, H, K, V]`; the chunk gradients' inputs are saved.
template <class Scalar, class MemorySpace>
struct PreparedBackward {
  states_buffer<Scalar, MemorySpace> start;  ///< the gradient at each local sequence's start
};

/// The bundle a backend keeps between its four methods, one per forward in flight: the per-call
/// buffers (kept across calls) and the records one call's steps hand to the next. Each record
/// exists exactly when the step that writes it ran in this call: a step takes its predecessor's
/// record, and a forward starts afresh (its per-chunk phase overwrites the memory the older
/// records describe). The chunk table is not here: the slot's owner keeps it and passes it in.
template <class Scalar, class MemorySpace, class Inputs>
struct Saved {
  ChunkBuffers<Scalar, MemorySpace> buffers;  ///< per-call memory: sized from the table
  /// forward_prepare → forward_apply.
  std::optional<PreparedForward<Scalar, MemorySpace, Inputs>> prepared_forward;
  std::optional<ForwardRecord<MemorySpace, Inputs>> forward;  ///< forward_apply → the backward
  /// backward_prepare → backward_apply.
  std::optional<PreparedBackward<Scalar, MemorySpace>> prepared_backward;
};

/// Whether two input bundles are the same views (data pointers). Values are not compared: only
/// the call order (prepare, then apply of the same call) vouches for them.
template <class Inputs>
bool same_views(const Inputs& a, const Inputs& b) {
  return a.q.data() == b.q.data() && a.k.data() == b.k.data() && a.v.data() == b.v.data() &&
         a.g.data() == b.g.data() && a.beta.data() == b.beta.data();
}

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

/// The (C, H, K, V, n_h) of a problem: what a chunk table and a bundle's buffers are sized for.
template <class Scalar>
std::array<int, 5> dims_of(const Problem<Scalar>& pb) {
  return {pb.chunk, pb.heads, pb.key_dim, pb.value_dim, pb.n_h};
}

/// The chunk table of the local sequences `seqs` for the sizes of `pb` (its pointers are not
/// read): the chunks of every sequence in sub-step rows, and the row table of the state passes.
/// Allocates; built once per slot by the slot's owner.
template <class MemorySpace, class Scalar>
ChunkTable<MemorySpace> make_chunk_table(const Problem<Scalar>& pb,
                                         const chunkwise::LocalSequences& seqs) {
  const int C = pb.chunk;
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
  ChunkTable<MemorySpace> table;
  table.cu_seqlens = seqs.cu_seqlens;
  table.dims = dims_of(pb);
  const int nc = first.back();
  table.chunks = Kokkos::View<int* [3], MemorySpace>("ctxpar::chunkwise::gated_delta::chunks", nc);
  auto chunks_host = ctxpar::impl::host_mirror(table.chunks);
  for (int c = 0; c < nc; ++c)
    for (int j = 0; j < 3; ++j) chunks_host(c, j) = rows[std::size_t(c) * 3 + j];
  Kokkos::deep_copy(table.chunks, chunks_host);
  ctxpar::impl::upload(first, table.first_chunk, "ctxpar::chunkwise::gated_delta::first_chunk");
  table.state_rows = Kokkos::View<int* [2], MemorySpace>(
      "ctxpar::chunkwise::gated_delta::state_rows", static_cast<std::size_t>(seqs.count()));
  table.state_rows_host = ctxpar::impl::host_mirror(table.state_rows);
  return table;
}

/// Allocates the per-chunk buffers and M of `buf` for `table` unless they already are for its
/// chunk count and sizes, and points `buf.cd` at the table's chunks.
template <class Scalar, class MemorySpace>
void size_buffers(ChunkBuffers<Scalar, MemorySpace>& buf, const ChunkTable<MemorySpace>& table) {
  const int nc = table.chunk_count();
  buf.cd.chunks = table.chunks;
  // The same chunk count and sizes as the buffers hold: everything is recomputed into them.
  if (buf.cd.x.data() != nullptr && nc == buf.sized_chunks && table.dims == buf.sized_dims) return;
  buf.sized_chunks = nc;
  buf.sized_dims = table.dims;
  const int C = table.dims[0], H = table.dims[1], K = table.dims[2], V = table.dims[3];
  using view = typename ChunkData<Scalar, MemorySpace>::view;
  auto alloc = [&](const char* what, std::size_t n) {
    return view(Kokkos::view_alloc(Kokkos::WithoutInitializing,
                                   std::string("ctxpar::chunkwise::gated_delta::") + what),
                n);
  };
  const std::size_t blocks = std::size_t(nc) * H;
  auto& cd = buf.cd;
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
  buf.m = Kokkos::View<float***, Kokkos::LayoutRight, MemorySpace>(
      "ctxpar::chunkwise::gated_delta::m", H, K, K);
}

/// A team per work item running `Functor` with `scratch` bytes of team scratch at `level`
/// (`scratch_level`), of the size `chunk_team_size` gives (whole warps on a device where the team
/// multiplies on tensor cores).
template <class Functor, class ExecutionSpace>
Kokkos::TeamPolicy<ExecutionSpace> team_policy(const ExecutionSpace& space, int league,
                                               std::size_t scratch, int level,
                                               bool tensor_cores = false) {
  const auto probe = Kokkos::TeamPolicy<ExecutionSpace>(space, league, 1)
                         .set_scratch_size(level, Kokkos::PerTeam(scratch));
  const int size = chunk_team_size<Functor>(probe, tensor_cores, "ctxpar::chunkwise::gated_delta");
  Kokkos::TeamPolicy<ExecutionSpace> policy(space, league, size);
  return policy.set_scratch_size(level, Kokkos::PerTeam(scratch));
}

/// Launches `functor` with a team per work item (`league` of them, none when it is empty) and
/// `scratch` bytes of team scratch each, at level 0 where they fit (`scratch_level`, written to
/// the functor's `level`), else 1 (teams of whole warps where `tensor_cores`).
template <class ExecutionSpace, class Functor>
void launch_teams(const ExecutionSpace& space, const char* label, int league, std::size_t scratch,
                  Functor functor, bool tensor_cores = false) {
  if (league <= 0) return;
  functor.level = scratch_level<ExecutionSpace>(scratch);
  Kokkos::parallel_for(
      label, team_policy<Functor>(space, league, scratch, functor.level, tensor_cores), functor);
}

/// Launches a per-chunk kernel (`IntraChunk`, `ChunkGradients`): a team per (chunk, head).
template <template <class, class, class> class Kernel, class ExecutionSpace, class Scalar,
          class MemorySpace, class... Extra>
void for_each_chunk(const ExecutionSpace& space, const char* label,
                    const ChunkTable<MemorySpace>& table,
                    const ChunkBuffers<Scalar, MemorySpace>& buf, const Problem<Scalar>& pb,
                    const Extra&... extra) {
  using functor = Kernel<Scalar, ExecutionSpace, MemorySpace>;
  launch_teams(space, label, table.chunk_count() * pb.heads,
               functor::scratch_bytes(pb.chunk, pb.key_dim, pb.value_dim),
               functor{pb, buf.cd, extra...},
               pb.products != ctxpar::chunkwise::ChunkProducts::exact);
}

/// The per-chunk phase of every forward: sizes `buf` from the slot's `table` (which must be for
/// `seqs` and the sizes of `pb`) and runs the per-chunk (WY/UT) kernel over its chunks on the
/// problem's inputs.
template <class ExecutionSpace, class Scalar, class MemorySpace>
void chunk_phase(const ExecutionSpace& space, const ChunkTable<MemorySpace>& table,
                 ChunkBuffers<Scalar, MemorySpace>& buf, const Problem<Scalar>& pb,
                 const chunkwise::LocalSequences& seqs) {
  if (table.dims != dims_of(pb) || table.cu_seqlens != seqs.cu_seqlens)
    require_local(false, "ctxpar::chunkwise::gated_delta",
                  "the chunk table must be for these sizes and local sequences",
                  "the slot's table (make_table)", "a table of another slot or shape");
  size_buffers(buf, table);
  for_each_chunk<IntraChunk>(space, "ctxpar::chunkwise::gated_delta::intra_chunk", table, buf, pb);
}

/// Runs a forward (`Reverse = false`) or reverse state pass over sequences `[begin, end)`.
template <bool Reverse, class ExecutionSpace, class Scalar, class MemorySpace>
void run_pass(const ExecutionSpace& space, const ChunkTable<MemorySpace>& table,
              const ChunkBuffers<Scalar, MemorySpace>& buf, const Problem<Scalar>& pb,
              PassTargets<Scalar> tg, int begin, int end) {
  tg.first_chunk = table.first_chunk.data();
  tg.seq_begin = begin;
  const int nb = pass_block<ExecutionSpace>();
  const int blocks = (pb.value_dim + (tg.m_out ? pb.key_dim : 0) + nb - 1) / nb;
  const int league = (end - begin) * pb.heads * blocks;
  using functor = std::conditional_t<Reverse, ReversePass<Scalar, ExecutionSpace, MemorySpace>,
                                     ForwardPass<Scalar, ExecutionSpace, MemorySpace>>;
  launch_teams(space,
               Reverse ? "ctxpar::chunkwise::gated_delta::reverse_pass"
                       : "ctxpar::chunkwise::gated_delta::forward_pass",
               league, functor::scratch_bytes(pb.chunk, pb.key_dim, nb),
               functor{pb, buf.cd, tg, blocks, nb},
               pb.products != ctxpar::chunkwise::ChunkProducts::exact);
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
/// its mirror `table_host` (the chunk table's `state_rows`, `n` rows).
template <class ExecutionSpace, class Scalar, class MemorySpace, class Rows>
void fill_states(const ExecutionSpace& space, const states_buffer<Scalar, MemorySpace>& buf,
                 const chunkwise::const_state_view<MemorySpace>& first, int pick_first,
                 const Rows& rows_view, const std::vector<std::int32_t>& ordinals,
                 const std::vector<bool>& use_row, const Kokkos::View<int* [2], MemorySpace>& table,
                 const typename Kokkos::View<int* [2], MemorySpace>::HostMirror& table_host) {
  const int n = static_cast<int>(buf.extent(0)), H = static_cast<int>(buf.extent(1)),
            K = static_cast<int>(buf.extent(2)), V = static_cast<int>(buf.extent(3));
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
/// Each step reads the record its predecessor in the call wrote into the bundle and writes its
/// own; what exists is what ran (see `Saved`). `table` is the slot's chunk table, the same for
/// the four steps of a call.
template <class Scalar, class MemorySpace, class Inputs>
struct Engine {
  using saved_type = Saved<Scalar, MemorySpace, Inputs>;
  using table_type = ChunkTable<MemorySpace>;
  using buffers_type = ChunkBuffers<Scalar, MemorySpace>;
  using buffer = states_buffer<Scalar, MemorySpace>;

  /// Step 1: the per-chunk phase of `in` and the summary `(M, dS)` the driver needs.
  template <class ExecutionSpace>
  static void forward_prepare(const ExecutionSpace& space, saved_type& sv, const Inputs& in,
                              const Problem<Scalar>& pb, const chunkwise::LocalSequences& seqs,
                              const table_type& table,
                              const chunkwise::SummaryViews<MemorySpace>& summary,
                              const chunkwise::SummaryNeeds& needs, std::int64_t tokens) {
    // A new call: the per-chunk phase overwrites what the last call's records describe.
    sv.prepared_forward.reset();
    sv.forward.reset();
    sv.prepared_backward.reset();
    chunk_phase(space, table, sv.buffers, pb, seqs);
    sv.prepared_forward =
        forward_summary(space, table, sv.buffers, in, pb, seqs, summary, needs, tokens);
  }

  /// Step 2: outputs and final states from the composed `s_in`; writes the forward record.
  template <class ExecutionSpace, class Initial, class Output, class Final>
  static void forward_apply(const ExecutionSpace& space, saved_type& sv, const Inputs& in,
                            const Problem<Scalar>& pb, const chunkwise::LocalSequences& seqs,
                            const table_type& table,
                            const chunkwise::const_state_view<MemorySpace>& s_in,
                            const Initial& initial_states, const Output& output,
                            const Final& final_states) {
    // The per-chunk phase of this call's forward_prepare is reused only on the very views and
    // table it ran on; without one (or with other views) it runs here.
    std::optional<PreparedForward<Scalar, MemorySpace, Inputs>> prep;
    prep.swap(sv.prepared_forward);
    if (prep && !(same_views(prep->inputs, in) && prep->table == table.chunks.data() &&
                  table.cu_seqlens == seqs.cu_seqlens))
      prep.reset();
    sv.forward.reset();
    sv.prepared_backward.reset();
    if (!prep) chunk_phase(space, table, sv.buffers, pb, seqs);
    const int n = seqs.count();
    std::vector<bool> starts(static_cast<std::size_t>(n)), ends(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i)
      starts[std::size_t(i)] = seqs.starts_here(i), ends[std::size_t(i)] = seqs.ends_here(i);
    if (prep && chunkwise::is_given(prep->out) && !chunkwise::is_given(initial_states) &&
        prep->out.extent(0) == output.extent(0) && static_cast<int>(prep->fin.extent(0)) == n) {
      // forward_prepare ran this pass from a zero s_in (the driver's zero_boundary).
      Kokkos::deep_copy(space, output, prep->out);
      scatter_states(space, prep->fin, final_states, seqs.ordinals, ends);
    } else {
      buffers_type& buf = sv.buffers;
      PassTargets<Scalar> tg;
      tg.out = output.data();
      const buffer fin = apply_pass<false>(space, table, buf, pb, seqs, buf.init_work,
                                           "ctxpar::chunkwise::gated_delta::init", buf.final_work,
                                           "ctxpar::chunkwise::gated_delta::final", s_in, 0,
                                           initial_states, starts, tg);
      scatter_states(space, fin, final_states, seqs.ordinals, ends);
    }
    ForwardRecord<MemorySpace, Inputs> record{in, table.chunks.data(), {}};
    if (prep) record.m = prep->m;
    sv.forward = record;
  }

  /// Step 3: the summary `(Mᵀ, γ)` the driver needs, from the forward record. Without a record
  /// for these sequences the summary stays as it arrived (zeros): backward_apply refuses the
  /// bundle, and no rank is left alone in the composition in between.
  template <class ExecutionSpace, class OutputGrad>
  static void backward_prepare(const ExecutionSpace& space, saved_type& sv,
                               const Problem<Scalar>& pb, const OutputGrad& output_grad,
                               const chunkwise::LocalSequences& seqs, const table_type& table,
                               const chunkwise::SummaryViews<MemorySpace>& summary,
                               const chunkwise::SummaryNeeds& needs) {
    sv.prepared_backward.reset();
    if (!recorded_for(sv, table, seqs)) return;
    if (!needs.state) return;  // nobody reads γ: the apply's reverse pass does all the work
    buffers_type& buf = sv.buffers;
    const std::int64_t kv = std::int64_t(pb.key_dim) * pb.value_dim;
    if (needs.zero_boundary && !needs.transition) {
      // The apply would run this reverse pass from a zero ds_out: run it once here (saving what
      // the chunk gradients read) and take γ from the leading sequence's start.
      const int n = seqs.count();
      const buffer start =
          reuse_states(buf.prepared_start_work, "ctxpar::chunkwise::gated_delta::dstart", n,
                       pb.heads, pb.key_dim, pb.value_dim);
      PassTargets<Scalar> tg;
      tg.final_state = start.data();
      tg.dout = output_grad.data();
      tg.save = true;
      run_pass<true>(space, table, buf, pb, tg, 0, n);
      store_summary_state(space, summary.state, start.data(), kv);
      sv.prepared_backward = PreparedBackward<Scalar, MemorySpace>{start};
      return;
    }
    const buffer gamma =
        reuse_states(buf.summary_work, "ctxpar::chunkwise::gated_delta::gamma_summary", 1, pb.heads,
                     pb.key_dim, pb.value_dim);
    PassTargets<Scalar> tg;
    tg.final_state = gamma.data();
    tg.dout = output_grad.data();
    // With one local sequence the leading fragment is the trailing one: Mᵀ is the forward's M.
    const bool reuse_m = chunkwise::is_given(sv.forward->m) && seqs.count() == 1;
    if (needs.transition && !reuse_m) tg.m_out = buf.m.data();
    run_pass<true>(space, table, buf, pb, tg, 0, 1);
    store_summary_state(space, summary.state, gamma.data(), kv);
    if (!needs.transition) return;
    if (!reuse_m) sv.forward->m = {};  // buf.m now holds Mᵀ of the leading fragment
    store_summary_transition(space, summary.transition, buf.m, reuse_m);
  }

  /// Step 4: every gradient from the composed `ds_out`, on the forward record.
  template <class ExecutionSpace, class OutputGrad, class FinalGrads, class InitialGrads>
  static void backward_apply(const ExecutionSpace& space, saved_type& sv, const Problem<Scalar>& pb,
                             const OutputGrad& output_grad, const chunkwise::LocalSequences& seqs,
                             const table_type& table,
                             const chunkwise::const_state_view<MemorySpace>& ds_out,
                             const FinalGrads& final_grads, const GradTargets<Scalar>& grads,
                             const InitialGrads& initial_grads,
                             const chunkwise::state_view<MemorySpace>& ds_in) {
    const int n = seqs.count();
    // The backward reads the chunk-start states that only forward_apply (with the true S_in) saves.
    require_local(recorded_for(sv, table, seqs), "ctxpar::chunkwise::gated_delta::backward_apply",
                  "forward_apply must run on this saved bundle before backward_apply",
                  "a forward bundle", "a bundle without forward_apply");
    std::optional<PreparedBackward<Scalar, MemorySpace>> prep;
    prep.swap(sv.prepared_backward);
    buffers_type& buf = sv.buffers;
    std::vector<bool> ends_here(static_cast<std::size_t>(n)), starts(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i)
      ends_here[std::size_t(i)] = seqs.ends_here(i), starts[std::size_t(i)] = seqs.starts_here(i);
    buffer start;
    if (prep && !chunkwise::is_given(final_grads) && static_cast<int>(prep->start.extent(0)) == n) {
      start = prep->start;  // backward_prepare ran this pass from a zero ds_out (zero_boundary)
    } else {
      PassTargets<Scalar> tg;
      tg.dout = output_grad.data();
      start = apply_pass<true>(space, table, buf, pb, seqs, buf.dinit_work,
                               "ctxpar::chunkwise::gated_delta::dinit", buf.dstart_work,
                               "ctxpar::chunkwise::gated_delta::dstart", ds_out, n - 1, final_grads,
                               ends_here, tg);
    }
    GradTargets<Scalar> gt = grads;
    gt.dout = output_grad.data();
    for_each_chunk<ChunkGradients>(space, "ctxpar::chunkwise::gated_delta::chunk_gradients", table,
                                   buf, pb, gt);
    scatter_states(space, start, initial_grads, seqs.ordinals, starts);
    if (chunkwise::is_given(ds_in)) store_state(space, start, 0, ds_in);
  }

 private:
  // The apply's state pass over every local sequence (`Reverse`: the backward's): the boundary
  // state fills row `pick` and the user's `rows` the rows `use_row` marks (in the buffers'
  // `init_slot`), and the pass writes the state leaving each sequence (the gradient at each start)
  // into `result_slot`, saving what the later kernels read; returns that buffer.
  template <bool Reverse, class ExecutionSpace, class Rows>
  static buffer apply_pass(const ExecutionSpace& space, const table_type& table, buffers_type& buf,
                           const Problem<Scalar>& pb, const chunkwise::LocalSequences& seqs,
                           buffer& init_slot, const char* init_label, buffer& result_slot,
                           const char* result_label,
                           const chunkwise::const_state_view<MemorySpace>& boundary, int pick,
                           const Rows& rows, const std::vector<bool>& use_row,
                           PassTargets<Scalar> tg) {
    const int n = seqs.count();
    const buffer init = reuse_states(init_slot, init_label, n, pb.heads, pb.key_dim, pb.value_dim);
    const buffer result =
        reuse_states(result_slot, result_label, n, pb.heads, pb.key_dim, pb.value_dim);
    fill_states(space, init, boundary, pick, rows, seqs.ordinals, use_row, table.state_rows,
                table.state_rows_host);
    tg.init = init.data();
    tg.final_state = result.data();
    tg.save = true;
    run_pass<Reverse>(space, table, buf, pb, tg, 0, n);
    return result;
  }

  // Whether the bundle holds a forward record on this chunk table, for these local sequences.
  static bool recorded_for(const saved_type& sv, const table_type& table,
                           const chunkwise::LocalSequences& seqs) {
    return sv.forward.has_value() && sv.forward->table == table.chunks.data() &&
           table.cu_seqlens == seqs.cu_seqlens;
  }

  // The summary `(M, dS)` after the per-chunk phase, and what of it forward_apply can reuse.
  template <class ExecutionSpace>
  static PreparedForward<Scalar, MemorySpace, Inputs> forward_summary(
      const ExecutionSpace& space, const table_type& table, buffers_type& buf, const Inputs& in,
      const Problem<Scalar>& pb, const chunkwise::LocalSequences& seqs,
      const chunkwise::SummaryViews<MemorySpace>& summary, const chunkwise::SummaryNeeds& needs,
      std::int64_t tokens) {
    PreparedForward<Scalar, MemorySpace, Inputs> prep{in, table.chunks.data(), {}, {}, {}};
    // Nobody reads the summary (its record arrives zeroed): the apply's pass does all the work.
    if (!needs.state) return prep;
    const int last = seqs.count() - 1;
    const std::int64_t kv = std::int64_t(pb.key_dim) * pb.value_dim;
    if (needs.zero_boundary && !needs.transition) {
      // The apply would run this very pass from zero: run it once here, keep the outputs, and
      // take dS from the trailing sequence's final state.
      const int n = seqs.count();
      ctxpar::impl::ensure_extents(buf.out_work, "ctxpar::chunkwise::gated_delta::out", tokens,
                                   pb.heads, pb.value_dim);
      prep.out = buf.out_work;
      prep.fin = reuse_states(buf.prepared_final_work, "ctxpar::chunkwise::gated_delta::final", n,
                              pb.heads, pb.key_dim, pb.value_dim);
      PassTargets<Scalar> tg;
      tg.final_state = prep.fin.data();
      tg.out = prep.out.data();
      tg.save = true;
      run_pass<false>(space, table, buf, pb, tg, 0, n);
      store_summary_state(space, summary.state,
                          prep.fin.data() + std::int64_t(last) * pb.heads * kv, kv);
      return prep;
    }
    const buffer ds = reuse_states(buf.summary_work, "ctxpar::chunkwise::gated_delta::ds", 1,
                                   pb.heads, pb.key_dim, pb.value_dim);
    PassTargets<Scalar> tg;
    tg.final_state = ds.data();
    tg.row_base = last;
    if (needs.transition) tg.m_out = buf.m.data();
    run_pass<false>(space, table, buf, pb, tg, last, last + 1);
    store_summary_state(space, summary.state, ds.data(), kv);
    if (!needs.transition) return prep;
    prep.m = buf.m;
    store_summary_transition(space, summary.transition, buf.m, false);
    return prep;
  }
};

}  // namespace ctxpar::impl::gated_delta
