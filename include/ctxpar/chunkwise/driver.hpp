/// \file
/// `chunkwise_cp_forward` / `chunkwise_cp_backward`: the communication driver of chunkwise context
/// parallelism. It validates inputs collectively, calls a backend's four local methods (see
/// `backend.hpp`) for each of the rank's virtual shards, exchanges summaries with the chosen
/// composition policy, folds them in fp32, and hands each shard exactly the incoming state
/// (forward) or outgoing gradient (backward) of the sequence fragment it continues.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar/chunkwise/compose.hpp"
#include "ctxpar/chunkwise/plan.hpp"
#include "ctxpar/chunkwise/policy.hpp"
#include "ctxpar/chunkwise/summary.hpp"
#include "ctxpar/comm/allgather.hpp"
#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar/comm/reduce.hpp"
#include "ctxpar/comm/scan.hpp"
#include "ctxpar/core/checked_product.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/view_checks.hpp"
#include "ctxpar/core/workspace.hpp"

namespace ctxpar::chunkwise {

/// Optional per-sequence states of a forward call, `[N, H, K, V]` in the activation type, `N` =
/// `plan.sequence_count()`. Both may be left empty. `final_states` is written on every rank (each
/// row comes from the rank where its sequence ends; one all-reduce).
template <class Scalar, class MemorySpace>
struct ForwardStates {
  const_sequence_states_view<Scalar, MemorySpace> initial_states;  ///< `h0` (in)
  sequence_states_view<Scalar, MemorySpace> final_states;          ///< `h_T` (out)
};

/// Optional per-sequence state gradients of a backward call, `[N, H, K, V]`. `initial_state_grads`
/// is written on every rank (each row from the rank where its sequence starts; one all-reduce).
template <class Scalar, class MemorySpace>
struct BackwardStates {
  const_sequence_states_view<Scalar, MemorySpace> final_state_grads;  ///< `dh_T` (in)
  sequence_states_view<Scalar, MemorySpace> initial_state_grads;      ///< `dh0` (out)
};

namespace impl {

/// The driver's memory between calls on one context: the slots' summaries, the composed incoming
/// states (forward) and outgoing gradients (backward), and the composition's scratch. Reused while
/// the plan's slot count, the rank count and the shape stay the same.
template <class Transition, class MemorySpace>
struct DriverWorkspace {
  SummaryStore<Transition, MemorySpace> forward_local, backward_local, gathered;
  std::vector<state_view<MemorySpace>> s_in, ds_out;
  state_view<MemorySpace> fold_tmp;
  std::vector<Kokkos::View<float*, MemorySpace>> scan_records;
  GrowingBuffer<MemorySpace> scan_tmp{"ctxpar::chunkwise::scan_tmp"},
      scan_own{"ctxpar::chunkwise::scan_own"}, scan_total{"ctxpar::chunkwise::scan_total"};
  ScanWorkspace<MemorySpace> scan;
};

/// `store` with these parameters and every record zero: reallocated only when they change.
template <class Transition, class ExecutionSpace, class MemorySpace>
void ensure_store(const ExecutionSpace& space, SummaryStore<Transition, MemorySpace>& store,
                  SummaryForm form, int count, std::int64_t heads, std::int64_t k, std::int64_t v,
                  const std::string& label) {
  if (store.form() != form || store.count() != count || store.heads() != heads ||
      store.key_dim() != k || store.value_dim() != v ||
      (store.packed().data() == nullptr && store.states().data() == nullptr)) {
    store = SummaryStore<Transition, MemorySpace>(form, count, heads, k, v, label);
    return;
  }
  if (form == SummaryForm::packed) {
    Kokkos::deep_copy(space, store.packed(), 0.0f);
  } else {
    Kokkos::deep_copy(space, store.states(), 0.0f);
    Kokkos::deep_copy(space, store.transitions(), 0.0f);
  }
}

/// `count` zeroed `[H, K, V]` states, reallocated only when their shape changes.
template <class ExecutionSpace, class MemorySpace>
void ensure_states(const ExecutionSpace& space, std::vector<state_view<MemorySpace>>& states,
                   int count, std::int64_t heads, std::int64_t k, std::int64_t v,
                   const std::string& label) {
  states.resize(static_cast<std::size_t>(count));
  for (auto& s : states) {
    if (ctxpar::impl::has_extents(s, heads, k, v) && s.data() != nullptr)
      Kokkos::deep_copy(space, s, 0.0f);
    else
      s = state_view<MemorySpace>(label, heads, k, v);
  }
}

}  // namespace impl

/// What a forward call keeps for its backward: the plan, the backend's saved state per virtual
/// shard, the inputs, and the driver's memory. A context passed back to the next forward is
/// reused: with the same plan and shapes, its memory is not allocated again.
template <class Backend>
struct ChunkwiseContext {
  ChunkwisePlan plan;                               ///< the sequence layout
  typename Backend::inputs_type inputs;             ///< the rank's inputs (views)
  std::vector<typename Backend::saved_type> saved;  ///< one per local slot
  std::int64_t heads = 0;                           ///< `H`
  std::int64_t key_dim = 0;                         ///< `K`
  std::int64_t value_dim = 0;                       ///< `V`
  bool initial_states_given = false;                ///< forward got `h0`
  /// The driver's memory (summaries, composed states, composition scratch).
  impl::DriverWorkspace<typename Backend::transition_type, typename Backend::memory_space> work;
};

namespace impl {

template <class Scalar, class MemorySpace>
struct LoadStateKernel {  // out[h, e] = states(row, h, e / V, e % V) as fp32, or 0 without states
  part<MemorySpace> out;
  const_sequence_states_view<Scalar, MemorySpace> states;
  std::int64_t row, k, v;
  bool given;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t kv = k * v, h = i / kv, e = i % kv;
    out(h, e) = given ? static_cast<float>(states(row, h, e / v, e % v)) : 0.0f;
  }
};

template <class MemorySpace>
part<MemorySpace> flat_state(const state_view<MemorySpace>& s) {
  return Kokkos::View<float**, Kokkos::LayoutRight, MemorySpace, Kokkos::MemoryUnmanaged>(
      s.data(), s.extent(0), s.extent(1) * s.extent(2));
}

template <class MemorySpace>
SummaryViews<MemorySpace> record_views(float* data, std::int64_t heads, std::int64_t kv,
                                       std::int64_t m) {
  Kokkos::View<float**, Kokkos::LayoutRight, MemorySpace, Kokkos::MemoryUnmanaged> all(data, heads,
                                                                                       kv + m);
  SummaryViews<MemorySpace> out;
  out.state = Kokkos::subview(all, Kokkos::ALL, std::make_pair(std::int64_t{0}, kv));
  out.transition = Kokkos::subview(all, Kokkos::ALL, std::make_pair(kv, kv + m));
  return out;
}

// Heads of a scan record `later` whose transition is exactly zero (a record that starts a segment,
// see Composer::to_scan_record) keep `later` in `out`: the composition must drop the earlier value,
// not multiply it by 0 (0·NaN would carry another sequence's non-finite value into this one).
template <class MemorySpace>
struct KeepSegmentStartKernel {
  Kokkos::View<const float*, MemorySpace> later;
  Kokkos::View<float*, MemorySpace> out;
  std::int64_t kv, width;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t h) const {
    const float* l = later.data() + h * width;
    for (std::int64_t j = kv; j < width; ++j)
      if (l[j] != 0.0f) return;
    float* o = out.data() + h * width;
    for (std::int64_t j = 0; j < width; ++j) o[j] = l[j];
  }
};

// The fold/scan machinery of one direction (forward or backward) for one transition structure.
template <class Transition, class ExecutionSpace, class Scalar>
class Composer {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using scan_t = scan_transition_t<Transition>;
  using flat_record = Kokkos::View<float*, memory_space>;

  Composer(const ExecutionSpace& space, const Group& group, const ChunkwisePlan& plan,
           std::int64_t heads, std::int64_t k, std::int64_t v, bool backward,
           DriverWorkspace<Transition, memory_space>& work)
      : space_(space),
        group_(group),
        plan_(plan),
        heads_(heads),
        k_(k),
        v_(v),
        backward_(backward),
        work_(work) {}

  // The boundary value of slot `slot`'s sequence: its initial state (forward, first local sequence)
  // or its final-state gradient (backward, last local sequence); zero when `states` is empty.
  void load_boundary(const const_sequence_states_view<Scalar, memory_space>& states, int row,
                     const state_view<memory_space>& out) const {
    Kokkos::parallel_for("ctxpar::chunkwise::load_state", range(heads_ * k_ * v_),
                         LoadStateKernel<Scalar, memory_space>{flat_state(out), states, row, k_, v_,
                                                               is_given(states)});
  }

  // GatherFold: one all-gather, then a sequential fold over the slice each slot needs.
  void gather_fold(const SummaryStore<Transition, memory_space>& local, SummaryForm form,
                   const const_sequence_states_view<Scalar, memory_space>& boundary,
                   std::vector<state_view<memory_space>>& result) const {
    const int slots = plan_.slots();
    SummaryStore<Transition, memory_space>& all = work_.gathered;
    ensure_store(space_, all, form, slots * group_.size(), heads_, k_, v_,
                 "ctxpar::chunkwise::gathered");
    gather_store(space_, group_, local, all);
    ctxpar::impl::ensure_extents(work_.fold_tmp, "ctxpar::chunkwise::fold_tmp", heads_, k_, v_);
    const state_view<memory_space> tmp = work_.fold_tmp;
    for (int slot = 0; slot < slots; ++slot) {
      const int v = plan_.virtual_shard(group_.rank(), slot);
      if (plan_.shard_length(v) == 0) continue;
      const LocalSequences seqs = plan_.local_sequences(v);
      state_view<memory_space> h = result[static_cast<std::size_t>(slot)];
      const bool continues = backward_ ? seqs.last_continues : seqs.first_continues;
      if (!continues) continue;  // zero: the backend applies the sequence's own boundary value
      load_boundary(boundary, backward_ ? seqs.ordinals.back() : seqs.ordinals.front(), h);
      std::vector<int> order;
      if (!backward_) {
        for (int u = plan_.preceding_start(v); u < v; ++u) order.push_back(u);
      } else {
        for (int u = plan_.following_stop(v) - 1; u > v; --u) order.push_back(u);
      }
      state_view<memory_space> a = h, b = tmp;
      for (int u : order) {
        const auto where = plan_.holder(u);
        apply_summary<Transition>(space_, all[where.first * slots + where.second], flat_state(a),
                                  flat_state(b), k_, v_);
        std::swap(a, b);
      }
      if (a.data() != h.data()) Kokkos::deep_copy(space_, h, a);
    }
  }

  // ScanCompose: segmented exclusive scans (one chain contiguous, two chains zigzag).
  void scan_compose(const SummaryStore<Transition, memory_space>& local,
                    const const_sequence_states_view<Scalar, memory_space>& boundary,
                    std::vector<state_view<memory_space>>& result) const {
    const int slots = plan_.slots(), me = group_.rank(), p = group_.size();
    const std::int64_t kv = k_ * v_, m = scan_m_size<Transition>(k_), n = heads_ * (kv + m);
    std::vector<flat_record>& records = work_.scan_records;
    records.resize(static_cast<std::size_t>(slots));
    for (int slot = 0; slot < slots; ++slot) {
      // Every part of the record is written before the scan reads it.
      ctxpar::impl::ensure_extents(records[static_cast<std::size_t>(slot)],
                                   "ctxpar::chunkwise::scan_record", n);
      to_scan_record(local[slot], plan_.virtual_shard(me, slot), boundary,
                     records[static_cast<std::size_t>(slot)]);
    }
    const flat_record tmp = carve<flat_record>(work_.scan_tmp, n);
    auto combine = [&](const flat_record& earlier, const flat_record& inout) {
      compose_segmented(inout, earlier, tmp);
      Kokkos::deep_copy(space_, inout, tmp);
    };
    std::vector<flat_record> prefix(static_cast<std::size_t>(slots));
    std::vector<bool> have(static_cast<std::size_t>(slots), false);
    if (slots == 1) {
      have[0] = exclusive_scan(space_, group_, records[0], combine,
                               backward_ ? ScanDirection::reverse : ScanDirection::forward,
                               unchecked, work_.scan);
      prefix[0] = records[0];
    } else {
      // Forward: chain A = first chunks in rank order, chain B = second chunks in reverse rank
      // order. Backward: chain A = second chunks in rank order (rank 0's is the farthest), chain B
      // = first chunks in reverse. Chain B starts on rank P-1 with the total of chain A.
      const int a = backward_ ? 1 : 0, b = 1 - a;
      const flat_record own_a = carve<flat_record>(work_.scan_own, n);
      Kokkos::deep_copy(space_, own_a, records[static_cast<std::size_t>(a)]);
      have[static_cast<std::size_t>(a)] =
          exclusive_scan(space_, group_, records[static_cast<std::size_t>(a)], combine,
                         ScanDirection::forward, unchecked, work_.scan);
      prefix[static_cast<std::size_t>(a)] = records[static_cast<std::size_t>(a)];
      const flat_record total = carve<flat_record>(work_.scan_total, n);
      if (me == p - 1) {
        if (have[static_cast<std::size_t>(a)]) {
          compose_segmented(own_a, records[static_cast<std::size_t>(a)], total);
        } else {
          Kokkos::deep_copy(space_, total, own_a);
        }
        compose_segmented(records[static_cast<std::size_t>(b)], total, tmp);
        Kokkos::deep_copy(space_, records[static_cast<std::size_t>(b)], tmp);
      }
      const bool got = exclusive_scan(space_, group_, records[static_cast<std::size_t>(b)], combine,
                                      ScanDirection::reverse, unchecked, work_.scan);
      prefix[static_cast<std::size_t>(b)] =
          me == p - 1 ? total : records[static_cast<std::size_t>(b)];
      have[static_cast<std::size_t>(b)] = me == p - 1 ? true : got;
    }
    for (int slot = 0; slot < slots; ++slot) {
      const int v = plan_.virtual_shard(me, slot);
      if (plan_.shard_length(v) == 0) continue;
      const LocalSequences seqs = plan_.local_sequences(v);
      state_view<memory_space> h = result[static_cast<std::size_t>(slot)];
      const bool continues = backward_ ? seqs.last_continues : seqs.first_continues;
      // A sequence continuing from another shard always has a prefix (its first shard resets
      // the scan); one starting here gets zero and the backend applies its boundary value.
      if (continues && have[static_cast<std::size_t>(slot)]) {
        copy_part(space_,
                  const_part<memory_space>(view(prefix[static_cast<std::size_t>(slot)]).state),
                  flat_state(h));
      }
    }
  }

 private:
  auto range(std::int64_t n) const {
    return Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space_, 0, n);
  }
  SummaryViews<memory_space> view(const flat_record& r) const {
    return record_views<memory_space>(r.data(), heads_, k_ * v_, scan_m_size<Transition>(k_));
  }

  // out = later ∘ earlier for the segmented scan (`out` distinct from both).
  void compose_segmented(const flat_record& later, const flat_record& earlier,
                         const flat_record& out) const {
    compose_summaries<scan_t>(space_, view(later), view(earlier), view(out), k_, v_);
    const std::int64_t kv = k_ * v_;
    Kokkos::parallel_for(
        "ctxpar::chunkwise::scan_keep_segment_start", range(heads_),
        KeepSegmentStartKernel<memory_space>{later, out, kv, kv + scan_m_size<Transition>(k_)});
  }

  // Copies a summary into a scan record; a shard whose fragment starts (forward) / ends (backward)
  // a sequence resets the scan: its boundary value is folded in, then M := 0.
  void to_scan_record(const SummaryViews<memory_space>& summary, int v,
                      const const_sequence_states_view<Scalar, memory_space>& boundary,
                      const flat_record& record) const {
    const SummaryViews<memory_space> rec = view(record);
    copy_part(space_, const_part<memory_space>(summary.state), rec.state);
    if constexpr (std::is_same_v<Transition, IdentityTransition>) {
      copy_part(space_, const_part<memory_space>(), rec.transition, 1.0f);
    } else {
      copy_part(space_, const_part<memory_space>(summary.transition), rec.transition);
    }
    const bool reset = backward_ ? plan_.backward_reset(v) : plan_.forward_reset(v);
    if (!reset) return;
    const LocalSequences seqs = plan_.local_sequences(v);
    if (is_given(boundary)) {
      const int row = backward_ ? seqs.ordinals.front() : seqs.ordinals.back();
      Kokkos::View<const Scalar***, Kokkos::LayoutStride, memory_space> b =
          Kokkos::subview(boundary, row, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL);
      Kokkos::parallel_for(
          "ctxpar::chunkwise::scan_reset", range(heads_ * k_ * v_),
          BakeInitialKernel<scan_t, Scalar, memory_space>{rec.state, rec.transition, b, k_, v_});
    }
    copy_part(space_, const_part<memory_space>(), rec.transition, 0.0f);
  }

  ExecutionSpace space_;
  Group group_;
  const ChunkwisePlan& plan_;
  std::int64_t heads_, k_, v_;
  bool backward_;
  DriverWorkspace<Transition, memory_space>& work_;
};

// What the forward composition reads of slot summaries of shard `v` (see SummaryNeeds).
inline SummaryNeeds forward_needs(const LocalSequences& seqs, bool initial_states_given) {
  SummaryNeeds needs;
  needs.state = seqs.last_continues;
  const bool incoming = (seqs.count() == 1 && seqs.first_continues) || initial_states_given;
  needs.transition = needs.state && incoming;
  needs.zero_boundary = !seqs.first_continues && !initial_states_given;
  return needs;
}

// The backward mirror: γ of the leading fragment is read when it continues from an earlier shard.
inline SummaryNeeds backward_needs(const LocalSequences& seqs, bool final_grads_given) {
  SummaryNeeds needs;
  needs.state = seqs.first_continues;
  const bool outgoing = (seqs.count() == 1 && seqs.last_continues) || final_grads_given;
  needs.transition = needs.state && outgoing;
  needs.zero_boundary = !seqs.last_continues && !final_grads_given;
  return needs;
}

template <class ExecutionSpace, class Backend, class Summary>
void call_forward_prepare(const ExecutionSpace& space, const Backend& backend,
                          const typename Backend::inputs_type& inputs, const LocalSequences& seqs,
                          const Summary& summary, typename Backend::saved_type& saved,
                          const SummaryNeeds& needs) {
  if constexpr (has_forward_prepare_needs<Backend, ExecutionSpace>::value) {
    backend.forward_prepare(space, inputs, seqs, summary, saved, needs);
  } else {
    backend.forward_prepare(space, inputs, seqs, summary, saved);
  }
}

template <class ExecutionSpace, class Backend, class OutputGrad, class Summary>
void call_backward_prepare(const ExecutionSpace& space, const Backend& backend,
                           typename Backend::saved_type& saved, const OutputGrad& output_grad,
                           const LocalSequences& seqs, const Summary& summary,
                           const SummaryNeeds& needs) {
  if constexpr (has_backward_prepare_needs<Backend, ExecutionSpace>::value) {
    backend.backward_prepare(space, saved, output_grad, seqs, summary, needs);
  } else {
    backend.backward_prepare(space, saved, output_grad, seqs, summary);
  }
}

template <class Backend, class Policy>
void common_checks(Preconditions& chk, const Backend& backend, const ChunkwisePlan& plan,
                   const ChunkwiseShape& shape, const DriverOptions& options) {
  chk.require(shape.tokens == plan.local_length(),
              "the local token count must match the plan's shard(s)", plan.local_length(),
              shape.tokens);
  // The summary buffers hold `slots · H · (K·V + m)` floats per rank and move as one MPI message
  // per rank (gather) or per round (scan): extents whose product wraps int64 or exceeds an MPI int
  // count would allocate or send garbage sizes.
  using transition = typename Backend::transition_type;
  const std::int64_t m =
      std::max(transition::m_size(shape.key_dim), scan_m_size<transition>(shape.key_dim));
  const std::int64_t kv = ctxpar::impl::checked_product({shape.key_dim, shape.value_dim});
  const std::int64_t per_rank =
      ctxpar::impl::checked_product({plan.slots(), shape.heads, kv < 0 || m < 0 ? -1 : kv + m});
  chk.require(
      per_rank >= 0 && per_rank <= std::numeric_limits<int>::max(),
      "the summaries of one rank (slots * H * (K * V + m) floats) must fit an MPI int count",
      "at most " + ctxpar::impl::to_text(std::numeric_limits<int>::max()),
      per_rank < 0
          ? std::string("an int64 overflow")
          : ctxpar::impl::to_text(per_rank) + " (H = " + ctxpar::impl::to_text(shape.heads) +
                ", K = " + ctxpar::impl::to_text(shape.key_dim) +
                ", V = " + ctxpar::impl::to_text(shape.value_dim) + ")");
  chk.require_same("the model family (backend)", Backend::family_id);
  chk.require_same("the head count H", shape.heads);
  chk.require_same("the key dimension K", shape.key_dim);
  chk.require_same("the value dimension V", shape.value_dim);
  chk.require_same("the chunk size", backend.chunk_size());
  chk.require_same("the composition policy", Policy::id);
  chk.require_same("the summary form", options.form == SummaryForm::packed ? 0 : 1);
  chk.require_same("the sequence layout (T, cu_seqlens, zigzag)", plan.fingerprint());
}

template <class View>
void check_states(Preconditions& chk, const View& states, const char* what, std::int64_t n,
                  const ChunkwiseShape& s) {
  if (!is_given(states)) return;
  const bool ok = static_cast<std::int64_t>(states.extent(0)) == n &&
                  static_cast<std::int64_t>(states.extent(1)) == s.heads &&
                  static_cast<std::int64_t>(states.extent(2)) == s.key_dim &&
                  static_cast<std::int64_t>(states.extent(3)) == s.value_dim;
  chk.require(
      ok, std::string(what) + " must be [N, H, K, V]",
      "[" + ctxpar::impl::to_text(n) + ", " + ctxpar::impl::to_text(s.heads) + ", " +
          ctxpar::impl::to_text(s.key_dim) + ", " + ctxpar::impl::to_text(s.value_dim) + "]",
      "[" + ctxpar::impl::to_text(states.extent(0)) + ", " +
          ctxpar::impl::to_text(states.extent(1)) + ", " + ctxpar::impl::to_text(states.extent(2)) +
          ", " + ctxpar::impl::to_text(states.extent(3)) + "]");
}

}  // namespace impl

/// Chunkwise CP forward. Every rank passes its local inputs (its shard, or for zigzag its two
/// shards concatenated, as described by `plan`), and receives `output [T_local, H, V]`; with
/// `states.final_states` every rank receives every sequence's final state. Collective; bad input
/// on any rank makes every rank throw the same `ctxpar::Error` before any data moves. `Policy`
/// is `GatherFold` or `ScanCompose`. Fills `ctx` with what `chunkwise_cp_backward` needs; a
/// context passed back to the next forward keeps its memory (the steady state of a training loop:
/// one context per layer, reused every step).
template <class Policy = GatherFold, class ExecutionSpace, class Backend>
void chunkwise_cp_forward(
    const ExecutionSpace& space, const Group& group, const Backend& backend,
    const ChunkwisePlan& plan, const typename Backend::inputs_type& inputs,
    const token_view<typename Backend::scalar_type, typename Backend::memory_space>& output,
    ChunkwiseContext<Backend>& ctx,
    const ForwardStates<typename Backend::scalar_type, typename Backend::memory_space>& states = {},
    const DriverOptions& options = {}) {
  static_assert(
      is_composition_policy_v<Policy>,
      "ctxpar::chunkwise::chunkwise_cp_forward: Policy must be GatherFold or ScanCompose");
  static_assert(check_chunkwise_backend<Backend, ExecutionSpace>(),
                "ctxpar::chunkwise::chunkwise_cp_forward: Backend does not satisfy the contract");
  using memory_space = typename Backend::memory_space;
  using scalar = typename Backend::scalar_type;
  using transition = typename Backend::transition_type;
  using output_view = token_view<scalar, memory_space>;
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::chunkwise::chunkwise_cp_forward", ExecutionSpace, output_view);
  compat::ScopedRegion region("ctxpar::chunkwise::forward");
  const std::string op = "ctxpar::chunkwise::chunkwise_cp_forward";

  const ChunkwiseShape shape = backend.shape(inputs);
  Preconditions chk(group, op);
  backend.check(chk, inputs);
  impl::common_checks<Backend, Policy>(chk, backend, plan, shape, options);
  chk.require(static_cast<std::int64_t>(output.extent(0)) == shape.tokens &&
                  static_cast<std::int64_t>(output.extent(1)) == shape.heads &&
                  static_cast<std::int64_t>(output.extent(2)) == shape.value_dim,
              "the output must be [T, H, V]",
              "[" + ctxpar::impl::to_text(shape.tokens) + ", " +
                  ctxpar::impl::to_text(shape.heads) + ", " +
                  ctxpar::impl::to_text(shape.value_dim) + "]",
              "[" + ctxpar::impl::to_text(output.extent(0)) + ", " +
                  ctxpar::impl::to_text(output.extent(1)) + ", " +
                  ctxpar::impl::to_text(output.extent(2)) + "]");
  impl::check_states(chk, states.initial_states, "the initial states", plan.sequence_count(),
                     shape);
  impl::check_states(chk, states.final_states, "the final states", plan.sequence_count(), shape);
  if (options.check_finite && chk.locally_ok()) {
    chk.require(!backend.has_non_finite(space, inputs), "the inputs must be finite (check_finite)",
                "no NaN or Inf", "a NaN or Inf value");
  }
  chk.agree();

  ctx.plan = plan;
  ctx.inputs = inputs;
  ctx.heads = shape.heads;
  ctx.key_dim = shape.key_dim;
  ctx.value_dim = shape.value_dim;
  ctx.initial_states_given = is_given(states.initial_states);
  const int slots = plan.slots();
  ctx.saved.resize(static_cast<std::size_t>(slots));

  SummaryStore<transition, memory_space>& local = ctx.work.forward_local;
  impl::ensure_store(space, local, options.form, slots, shape.heads, shape.key_dim, shape.value_dim,
                     "ctxpar::chunkwise::forward_summary");
  std::vector<state_view<memory_space>>& s_in = ctx.work.s_in;
  impl::ensure_states(space, s_in, slots, shape.heads, shape.key_dim, shape.value_dim,
                      "ctxpar::chunkwise::s_in");
  for (int slot = 0; slot < slots; ++slot) {
    const int v = plan.virtual_shard(group.rank(), slot);
    const std::int64_t off = plan.local_offset(slot), len = plan.shard_length(v);
    if (len == 0) {
      identity_summary<transition>(space, local[slot], shape.key_dim, shape.value_dim);
    } else {
      const LocalSequences seqs = plan.local_sequences(v);
      impl::call_forward_prepare(space, backend, backend.slice(inputs, off, off + len), seqs,
                                 local[slot], ctx.saved[static_cast<std::size_t>(slot)],
                                 impl::forward_needs(seqs, is_given(states.initial_states)));
    }
  }
  impl::Composer<transition, ExecutionSpace, scalar> composer(
      space, group, ctx.plan, shape.heads, shape.key_dim, shape.value_dim, false, ctx.work);
  if constexpr (std::is_same_v<Policy, GatherFold>) {
    composer.gather_fold(local, options.form, states.initial_states, s_in);
  } else {
    composer.scan_compose(local, states.initial_states, s_in);
  }
  if (is_given(states.final_states)) Kokkos::deep_copy(space, states.final_states, scalar(0));
  for (int slot = 0; slot < slots; ++slot) {
    const int v = plan.virtual_shard(group.rank(), slot);
    const std::int64_t off = plan.local_offset(slot), len = plan.shard_length(v);
    if (len == 0) continue;
    const auto range = std::make_pair(off, off + len);
    token_view<scalar, memory_space> out = Kokkos::subview(output, range, Kokkos::ALL, Kokkos::ALL);
    backend.forward_apply(space, backend.slice(inputs, off, off + len), plan.local_sequences(v),
                          s_in[static_cast<std::size_t>(slot)], states.initial_states, out,
                          states.final_states, ctx.saved[static_cast<std::size_t>(slot)]);
  }
  if (is_given(states.final_states)) {
    // A sequence without tokens ends where it starts: its final state is its initial state.
    if (group.rank() == 0 && is_given(states.initial_states)) {
      for (int n : plan.empty_sequences()) {
        Kokkos::deep_copy(
            space, Kokkos::subview(states.final_states, n, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL),
            Kokkos::subview(states.initial_states, n, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL));
      }
    }
    allreduce_sum(space, group, states.final_states, unchecked);
  }
}

/// Chunkwise CP forward into a fresh context (see the overload above), returned.
template <class Policy = GatherFold, class ExecutionSpace, class Backend>
ChunkwiseContext<Backend> chunkwise_cp_forward(
    const ExecutionSpace& space, const Group& group, const Backend& backend,
    const ChunkwisePlan& plan, const typename Backend::inputs_type& inputs,
    const token_view<typename Backend::scalar_type, typename Backend::memory_space>& output,
    const ForwardStates<typename Backend::scalar_type, typename Backend::memory_space>& states = {},
    const DriverOptions& options = {}) {
  ChunkwiseContext<Backend> ctx;
  chunkwise_cp_forward<Policy>(space, group, backend, plan, inputs, output, ctx, states, options);
  return ctx;
}

/// Chunkwise CP backward: from `output_grad [T_local, H, V]` (and optionally the final-state
/// gradients) computes every input gradient of the rank's tokens into `grads` and, when asked,
/// every sequence's initial-state gradient on every rank. Same policy and options as the forward.
/// Collective.
template <class Policy = GatherFold, class ExecutionSpace, class Backend>
void chunkwise_cp_backward(const ExecutionSpace& space, const Group& group, const Backend& backend,
                           ChunkwiseContext<Backend>& ctx,
                           const const_token_view<typename Backend::scalar_type,
                                                  typename Backend::memory_space>& output_grad,
                           const typename Backend::gradients_type& grads,
                           const BackwardStates<typename Backend::scalar_type,
                                                typename Backend::memory_space>& states = {},
                           const DriverOptions& options = {}) {
  static_assert(
      is_composition_policy_v<Policy>,
      "ctxpar::chunkwise::chunkwise_cp_backward: Policy must be GatherFold or ScanCompose");
  static_assert(check_chunkwise_backend<Backend, ExecutionSpace>(),
                "ctxpar::chunkwise::chunkwise_cp_backward: Backend does not satisfy the contract");
  using memory_space = typename Backend::memory_space;
  using scalar = typename Backend::scalar_type;
  using transition = typename Backend::transition_type;
  using output_view = token_view<scalar, memory_space>;
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::chunkwise::chunkwise_cp_backward", ExecutionSpace, output_view);
  compat::ScopedRegion region("ctxpar::chunkwise::backward");
  const std::string op = "ctxpar::chunkwise::chunkwise_cp_backward";
  const ChunkwisePlan& plan = ctx.plan;

  const ChunkwiseShape shape = backend.shape(ctx.inputs);
  Preconditions chk(group, op);
  backend.check_gradients(chk, ctx.inputs, grads);
  impl::common_checks<Backend, Policy>(chk, backend, plan, shape, options);
  chk.require(static_cast<std::int64_t>(output_grad.extent(0)) == shape.tokens &&
                  static_cast<std::int64_t>(output_grad.extent(1)) == shape.heads &&
                  static_cast<std::int64_t>(output_grad.extent(2)) == shape.value_dim,
              "the output gradient must be [T, H, V]",
              "[" + ctxpar::impl::to_text(shape.tokens) + ", " +
                  ctxpar::impl::to_text(shape.heads) + ", " +
                  ctxpar::impl::to_text(shape.value_dim) + "]",
              "[" + ctxpar::impl::to_text(output_grad.extent(0)) + ", " +
                  ctxpar::impl::to_text(output_grad.extent(1)) + ", " +
                  ctxpar::impl::to_text(output_grad.extent(2)) + "]");
  chk.require(static_cast<int>(ctx.saved.size()) == plan.slots(),
              "the context must come from chunkwise_cp_forward", plan.slots(), ctx.saved.size());
  impl::check_states(chk, states.final_state_grads, "the final-state gradients",
                     plan.sequence_count(), shape);
  impl::check_states(chk, states.initial_state_grads, "the initial-state gradients",
                     plan.sequence_count(), shape);
  chk.agree();

  const int slots = plan.slots();
  SummaryStore<transition, memory_space>& local = ctx.work.backward_local;
  impl::ensure_store(space, local, options.form, slots, shape.heads, shape.key_dim, shape.value_dim,
                     "ctxpar::chunkwise::backward_summary");
  std::vector<state_view<memory_space>>& ds_out = ctx.work.ds_out;
  impl::ensure_states(space, ds_out, slots, shape.heads, shape.key_dim, shape.value_dim,
                      "ctxpar::chunkwise::ds_out");
  for (int slot = 0; slot < slots; ++slot) {
    const int v = plan.virtual_shard(group.rank(), slot);
    const std::int64_t off = plan.local_offset(slot), len = plan.shard_length(v);
    if (len == 0) {
      identity_summary<transition>(space, local[slot], shape.key_dim, shape.value_dim);
    } else {
      const_token_view<scalar, memory_space> dout =
          Kokkos::subview(output_grad, std::make_pair(off, off + len), Kokkos::ALL, Kokkos::ALL);
      const LocalSequences seqs = plan.local_sequences(v);
      impl::call_backward_prepare(space, backend, ctx.saved[static_cast<std::size_t>(slot)], dout,
                                  seqs, local[slot],
                                  impl::backward_needs(seqs, is_given(states.final_state_grads)));
    }
  }
  impl::Composer<transition, ExecutionSpace, scalar> composer(
      space, group, plan, shape.heads, shape.key_dim, shape.value_dim, true, ctx.work);
  if constexpr (std::is_same_v<Policy, GatherFold>) {
    composer.gather_fold(local, options.form, states.final_state_grads, ds_out);
  } else {
    composer.scan_compose(local, states.final_state_grads, ds_out);
  }
  if (is_given(states.initial_state_grads))
    Kokkos::deep_copy(space, states.initial_state_grads, scalar(0));
  for (int slot = 0; slot < slots; ++slot) {
    const int v = plan.virtual_shard(group.rank(), slot);
    const std::int64_t off = plan.local_offset(slot), len = plan.shard_length(v);
    if (len == 0) continue;
    const_token_view<scalar, memory_space> dout =
        Kokkos::subview(output_grad, std::make_pair(off, off + len), Kokkos::ALL, Kokkos::ALL);
    backend.backward_apply(space, ctx.saved[static_cast<std::size_t>(slot)], dout,
                           plan.local_sequences(v), ds_out[static_cast<std::size_t>(slot)],
                           states.final_state_grads, backend.slice(grads, off, off + len),
                           states.initial_state_grads, state_view<memory_space>());
  }
  if (is_given(states.initial_state_grads)) {
    if (group.rank() == 0 && is_given(states.final_state_grads)) {
      for (int n : plan.empty_sequences()) {
        Kokkos::deep_copy(
            space,
            Kokkos::subview(states.initial_state_grads, n, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL),
            Kokkos::subview(states.final_state_grads, n, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL));
      }
    }
    allreduce_sum(space, group, states.initial_state_grads, unchecked);
  }
}

}  // namespace ctxpar::chunkwise
