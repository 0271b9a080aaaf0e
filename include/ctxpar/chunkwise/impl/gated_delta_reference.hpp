/// \file
/// What the gated-delta tests and benchmarks measure the chunkwise kernels against, outside any
/// plan: one rank's local forward on its own (the chunk kernels without communication), and the
/// token-by-token recurrence on the same inputs. Every call allocates; the operators never use
/// them (users run a `CpPlan`, on a one-rank group for one device).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "ctxpar/chunkwise/gated_delta_rule.hpp"
#include "ctxpar/chunkwise/impl/gated_delta_recurrence.hpp"
#include "ctxpar/chunkwise/local_sequences.hpp"
#include "ctxpar/chunkwise/summary.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/view_checks.hpp"

namespace ctxpar::chunkwise::impl {

/// The local work of one CP rank in a forward, without communication: the whole shard is one
/// sequence; `forward_prepare` (the summary `(M, dS)`, dense `M` chained per chunk) unless
/// `with_summary` is false, then `forward_apply` from a zero incoming state into `output [T, H,
/// V]`. Count its work with `gated_delta_forward_flops`. `Backend` is `GatedDeltaRuleBackend` or
/// `GatedDeltaProductBackend`. It builds a chunk table and allocates a saved bundle and a zero
/// state on every call; a caller that repeats it keeps all three and calls the backend's
/// `forward_apply` itself, as the heads layer does: a kept bundle keeps its buffers, and each
/// forward rewrites its per-call record, so nothing needs resetting.
template <class ExecutionSpace, class Backend>
void reference_local_forward(
    const ExecutionSpace& space, const Backend& backend,
    const typename Backend::inputs_type& inputs,
    const token_view<typename Backend::scalar_type, typename Backend::memory_space>& output,
    bool with_summary = true) {
  using memory_space = typename Backend::memory_space;
  using output_view = token_view<typename Backend::scalar_type, memory_space>;
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::chunkwise::impl::reference_local_forward", ExecutionSpace,
                           output_view);
  const ChunkwiseShape s = backend.shape(inputs);
  if (s.tokens == 0) return;
  const LocalSequences seqs = LocalSequences::single(s.tokens);
  const typename Backend::table_type table = backend.make_table(seqs, s);
  typename Backend::saved_type saved;
  if (with_summary) {
    SummaryStore<DenseTransition, memory_space> summary(SummaryForm::packed, 1, s.heads, s.key_dim,
                                                        s.value_dim);
    backend.forward_prepare(space, inputs, seqs, table, summary[0], saved);
  }
  state_view<memory_space> zero("ctxpar::chunkwise::gated_delta::zero_state", s.heads, s.key_dim,
                                s.value_dim);
  backend.forward_apply(space, inputs, seqs, table, zero, {}, output, {}, saved);
}

/// The token-by-token recurrence on the same inputs (one sequence, zero initial state) into
/// `output`: the baseline benchmarks compare the chunkwise kernels with (same data, same
/// threads). Never used by the CP operators. Count its work with `gated_delta_recurrence_flops`.
template <class ExecutionSpace, class Backend>
void reference_recurrence_forward(
    const ExecutionSpace& space, const Backend& backend,
    const typename Backend::inputs_type& inputs,
    const token_view<typename Backend::scalar_type, typename Backend::memory_space>& output) {
  using output_view = token_view<typename Backend::scalar_type, typename Backend::memory_space>;
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::chunkwise::impl::reference_recurrence_forward", ExecutionSpace,
                           output_view);
  const ChunkwiseShape s = backend.shape(inputs);
  if (s.tokens == 0) return;
  const auto pb = backend.problem(inputs);
  ctxpar::impl::gated_delta::recurrence_forward(space, pb, static_cast<int>(s.tokens) * pb.n_h,
                                                output.data());
}

}  // namespace ctxpar::chunkwise::impl
