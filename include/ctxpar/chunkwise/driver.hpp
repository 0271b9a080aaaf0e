/// \file
/// `CpPlan`: the communication driver of chunkwise context parallelism, as a plan built once per
/// layer. It validates its shape and inputs collectively, calls a backend's four local methods (see
/// `backend.hpp`) for each of the rank's virtual shards, exchanges summaries with the chosen
/// composition policy, folds them in fp32, and hands each shard exactly the incoming state
/// (forward) or outgoing gradient (backward) of the sequence fragment it continues.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar/chunkwise/compose.hpp"
#include "ctxpar/chunkwise/policy.hpp"
#include "ctxpar/chunkwise/sequence_layout.hpp"
#include "ctxpar/chunkwise/summary.hpp"
#include "ctxpar/comm/allgather.hpp"
#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/host_isa_agreement.hpp"
#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar/comm/reduce.hpp"
#include "ctxpar/comm/scan.hpp"
#include "ctxpar/core/checked_product.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/impl/detect.hpp"
#include "ctxpar/core/impl/warp_lanes.hpp"
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

/// A `CpPlan`'s memory between calls: the slots' summaries, the composed incoming states (forward)
/// and outgoing gradients (backward), and the composition's scratch. Nothing in it outlives a
/// call's use, so one plan serves any number of contexts.
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

/// What one forward keeps for its backward, owned by the caller: the rank's inputs (views, read
/// again by the backward) and the backend's saved arrays per local slot. A context passed back to
/// the same plan's next forward is refilled in place: with the same shapes its memory is not
/// allocated again. Keep one per forward you will differentiate.
template <class Backend>
struct ChunkwiseContext {
  typename Backend::inputs_type inputs;             ///< the rank's inputs (views)
  std::vector<typename Backend::saved_type> saved;  ///< one per local slot
  std::int64_t plan = 0;  ///< id of the `CpPlan` whose forward filled it (0: none)
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

  Composer(const ExecutionSpace& space, const Group& group, const SequenceLayout& plan,
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
  const SequenceLayout& plan_;
  std::int64_t heads_, k_, v_;
  bool backward_;
  DriverWorkspace<Transition, memory_space>& work_;
};

// What a composition in one direction reads of a slot's summary: its state part when the fragment
// it leaves through continues into a later shard (`leaves`), its transition when, besides, a value
// arrives at the fragment it enters through (`enters`, with one fragment only) or the caller gives
// the boundary value, and nothing incoming at all (`zero_boundary`) otherwise.
inline SummaryNeeds direction_needs(bool leaves, bool enters, int fragments, bool boundary_given) {
  SummaryNeeds needs;
  needs.state = leaves;
  const bool incoming = (fragments == 1 && enters) || boundary_given;
  needs.transition = needs.state && incoming;
  needs.zero_boundary = !enters && !boundary_given;
  return needs;
}

// What the forward composition reads of slot summaries of shard `v` (see SummaryNeeds).
inline SummaryNeeds forward_needs(const LocalSequences& seqs, bool initial_states_given) {
  return direction_needs(seqs.last_continues, seqs.first_continues, seqs.count(),
                         initial_states_given);
}

// The backward mirror: γ of the leading fragment is read when it continues from an earlier shard.
inline SummaryNeeds backward_needs(const LocalSequences& seqs, bool final_grads_given) {
  return direction_needs(seqs.first_continues, seqs.last_continues, seqs.count(),
                         final_grads_given);
}

template <class ExecutionSpace, class Backend, class Summary>
void call_forward_prepare(const ExecutionSpace& space, const Backend& backend,
                          const typename Backend::inputs_type& inputs, const LocalSequences& seqs,
                          const typename Backend::table_type& table, const Summary& summary,
                          typename Backend::saved_type& saved, const SummaryNeeds& needs) {
  if constexpr (has_forward_prepare_needs<Backend, ExecutionSpace>::value) {
    backend.forward_prepare(space, inputs, seqs, table, summary, saved, needs);
  } else {
    backend.forward_prepare(space, inputs, seqs, table, summary, saved);
  }
}

template <class ExecutionSpace, class Backend, class OutputGrad, class Summary>
void call_backward_prepare(const ExecutionSpace& space, const Backend& backend,
                           typename Backend::saved_type& saved, const OutputGrad& output_grad,
                           const LocalSequences& seqs, const typename Backend::table_type& table,
                           const Summary& summary, const SummaryNeeds& needs) {
  if constexpr (has_backward_prepare_needs<Backend, ExecutionSpace>::value) {
    backend.backward_prepare(space, saved, output_grad, seqs, table, summary, needs);
  } else {
    backend.backward_prepare(space, saved, output_grad, seqs, table, summary);
  }
}

// What a `CpPlan` checks once, at construction: the shape and options its calls will use, local
// violations first (each rank's own message), then the values every rank must agree on.
template <class Backend, class Policy>
void build_checks(Preconditions& chk, const Backend& backend, const SequenceLayout& plan,
                  const ChunkwiseShape& shape, const DriverOptions& options) {
  // The messages of the backends' per-call checks: a bad value is named the same way whether the
  // plan or a call sees it. The chunk size is checked here only: a plan's backend keeps it.
  require_chunk_size(chk, backend.chunk_size(), "the chunk size");
  chk.require(shape.key_dim > 0, "the key dimension K must be positive", "K > 0", shape.key_dim);
  chk.require(shape.value_dim > 0, "the value dimension V must be positive", "V > 0",
              shape.value_dim);
  chk.require(shape.heads > 0, "the head count H must be positive", "H > 0", shape.heads);
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
  chk.require_same("the composition policy", fingerprint(Policy::name));
  chk.require_same("the summary form", options.form == SummaryForm::packed ? 0 : 1);
  chk.require_same("the sequence layout (T, cu_seqlens, zigzag)", plan.fingerprint());
}

template <class Backend>
using backend_products_t = decltype(std::declval<const Backend&>().options().products);

// The chunk products of a backend built from `BackendOptions` (others multiply as they do): the
// tensor-core ones need an execution space that has the team products, and every rank must ask
// for the same.
template <class ExecutionSpace, class Backend>
void check_chunk_products(Preconditions& chk, const Backend& backend) {
  if constexpr (ctxpar::impl::is_detected<backend_products_t, Backend>::value) {
    const ChunkProducts products = backend.options().products;
    chk.require(products == ChunkProducts::exact || products == ChunkProducts::automatic ||
                    ctxpar::impl::has_team_mma_v<ExecutionSpace>,
                "tensor-core chunk products need tensor cores (CUDA built for sm_80 or later, "
                "HIP built for gfx908, gfx90a or gfx94x) or a host space (emulated)",
                "exact on this execution space", to_string(products));
    chk.require_same("the chunk products", static_cast<int>(products));
  }
}

template <class View>
void check_states(Preconditions& chk, const View& states, const char* what, std::int64_t n,
                  const ChunkwiseShape& s) {
  if (!is_given(states)) return;
  chk.require(ctxpar::impl::has_extents(states, n, s.heads, s.key_dim, s.value_dim),
              std::string(what) + " must be [N, H, K, V]",
              ctxpar::impl::shape_text({n, s.heads, s.key_dim, s.value_dim}),
              ctxpar::impl::shape_text(states));
}

// A call's inputs and output against the plan's shape (the backend's local checks of the inputs,
// then their shape and the output's `[T, H, V]`), on views of any storage type: the 16-bit plan
// checks its caller's views with them before it widens them.
template <class Backend, class Inputs, class Output>
void check_forward_views(Preconditions& chk, const Backend& backend, const Inputs& inputs,
                         const Output& output, const ChunkwiseShape& shape) {
  backend.check(chk, inputs);
  const ChunkwiseShape s = backend.shape(inputs);
  chk.require(s.tokens == shape.tokens && s.heads == shape.heads && s.key_dim == shape.key_dim &&
                  s.value_dim == shape.value_dim,
              "the inputs must have the plan's shape [T, H, K, V]",
              ctxpar::impl::shape_text({shape.tokens, shape.heads, shape.key_dim, shape.value_dim}),
              ctxpar::impl::shape_text({s.tokens, s.heads, s.key_dim, s.value_dim}));
  chk.require(ctxpar::impl::has_extents(output, shape.tokens, shape.heads, shape.value_dim),
              "the output must be [T, H, V]",
              ctxpar::impl::shape_text({shape.tokens, shape.heads, shape.value_dim}),
              ctxpar::impl::shape_text(output));
}

// A backward call's context (filled by the forward of plan `plan_id`: `filled_by`), gradients
// and output gradient, on views of any storage type (as `check_forward_views`).
template <class Backend, class Inputs, class OutputGrad, class Gradients>
void check_backward_views(Preconditions& chk, const Backend& backend, std::int64_t filled_by,
                          std::int64_t plan_id, const Inputs& inputs, const OutputGrad& output_grad,
                          const Gradients& grads, const ChunkwiseShape& shape) {
  const bool from_here = filled_by == plan_id;
  chk.require(from_here, "the context must come from a forward of this plan",
              "a context filled by this plan's forward",
              filled_by == 0 ? "a context no forward filled" : "a context of another plan");
  if (from_here) backend.check_gradients(chk, inputs, grads);
  chk.require(ctxpar::impl::has_extents(output_grad, shape.tokens, shape.heads, shape.value_dim),
              "the output gradient must be [T, H, V]",
              ctxpar::impl::shape_text({shape.tokens, shape.heads, shape.value_dim}),
              ctxpar::impl::shape_text(output_grad));
}

// Each plan object gets its own id, so that a context filled by another plan is recognised.
inline std::int64_t next_plan_id() {
  static std::atomic<std::int64_t> next{0};
  return ++next;
}

}  // namespace impl

/// Chunkwise context parallelism of one layer, as a plan: built once, collectively, for a backend,
/// a sequence layout (`SequenceLayout`), the rank's shape `[T_local, H, K, V]` and options, with
/// the composition policy (`GatherFold` or `ScanCompose`) a compile-time tag. `forward` and
/// `backward` take the caller's views and write into them; what a backward needs from its forward
/// lives in a caller-owned `ChunkwiseContext`.
///
/// Memory: the plan owns the backend's per-slot tables (built with the plan: what depends only on
/// the shapes and the slots' local sequences) and the driver's memory — the slots' summaries, the
/// composed incoming states and outgoing gradients, the composition and scan scratch
/// (`workspace_bytes()`); the context owns the backend's saved arrays (per call). Both grow to
/// what a call needs and are reused, so a steady-state forward + backward allocates nothing. Not
/// copyable (its memory is not shared); movable.
///
/// A backend on a 16-bit storage type (`ctxpar::bfloat16`, `ctxpar::float16`) selects the
/// specialization of `narrow_plan.hpp` (`Enable`, left to its default, picks it): the same calls
/// on 16-bit views, computed by this plan on the backend's fp32 twin.
template <class Policy, class Backend, class ExecutionSpace, class Enable = void>
class CpPlan {
  static_assert(is_composition_policy_v<Policy>,
                "ctxpar::chunkwise::CpPlan: Policy must be GatherFold or ScanCompose");
  static_assert(check_chunkwise_backend<Backend, ExecutionSpace>(),
                "ctxpar::chunkwise::CpPlan: Backend does not satisfy the contract");
  static_assert(
      Kokkos::SpaceAccessibility<ExecutionSpace, typename Backend::memory_space>::accessible,
      "ctxpar::chunkwise::CpPlan: the backend's memory space must be accessible from "
      "the execution space");

 public:
  /// The composition policy tag.
  using policy_type = Policy;
  /// The model family's backend.
  using backend_type = Backend;
  /// Where the kernels run.
  using execution_space = ExecutionSpace;
  /// Where the views live.
  using memory_space = typename Backend::memory_space;
  /// The activation type.
  using scalar_type = typename Backend::scalar_type;
  /// The backend's inputs (q, k, v, gates, …).
  using inputs_type = typename Backend::inputs_type;
  /// The backend's input gradients.
  using gradients_type = typename Backend::gradients_type;
  /// What a forward keeps for its backward.
  using context_type = ChunkwiseContext<Backend>;
  /// The contract's name for `context_type` (`core/plan.hpp`).
  using saved_type = context_type;
  /// Optional per-sequence states of a forward.
  using forward_states_type = ForwardStates<scalar_type, memory_space>;
  /// Optional per-sequence state gradients of a backward.
  using backward_states_type = BackwardStates<scalar_type, memory_space>;

  /// Builds the plan. Collective: every rank passes its local shape (`shape.tokens` =
  /// `layout.local_length()`) and the same backend family, chunk size, `H`, `K`, `V`, policy,
  /// summary form and layout (checked); a bad or disagreeing value makes every rank throw the
  /// same `ctxpar::Error`. Allocates the backend's per-slot tables (`Backend::make_table`) and
  /// nothing else: the driver's and the contexts' memory is taken by the first calls.
  CpPlan(const ExecutionSpace& space, const Group& group, const Backend& backend,
         const SequenceLayout& layout, const ChunkwiseShape& shape,
         const DriverOptions& options = {})
      : space_(space),
        group_(group),
        backend_(backend),
        layout_(layout),
        shape_(shape),
        options_(options),
        id_(impl::next_plan_id()) {
    Preconditions chk(group, "ctxpar::chunkwise::CpPlan");
    impl::build_checks<Backend, Policy>(chk, backend, layout, shape, options);
    impl::check_chunk_products<ExecutionSpace>(chk, backend);
    int isa = 0;
    ctxpar::impl::agree_host_isa(chk, isa);
    chk.agree();
    host_isa_ = static_cast<HostIsa>(isa);
    // The per-shape facts of each slot, once: every call on the slot reads its table.
    tables_.resize(static_cast<std::size_t>(layout_.slots()));
    for_filled_slots([&](int slot, int v, std::int64_t, std::int64_t len) {
      tables_[static_cast<std::size_t>(slot)] = backend_.make_table(
          layout_.local_sequences(v), {len, shape_.heads, shape_.key_dim, shape_.value_dim});
    });
  }

  /// The instruction set of the host kernels, agreed by the ranks at construction
  /// (`core/host_isa.hpp`).
  HostIsa host_isa() const { return host_isa_; }

  CpPlan(const CpPlan&) = delete;             ///< not copyable: the plan owns its memory
  CpPlan& operator=(const CpPlan&) = delete;  ///< not copyable: the plan owns its memory
  CpPlan(CpPlan&&) = default;                 ///< movable
  CpPlan& operator=(CpPlan&&) = default;      ///< movable

  /// Forward. Every rank passes its local inputs (its shard, or for zigzag its two shards
  /// concatenated, as the layout says) and receives `output [T_local, H, V]`; with
  /// `states.final_states` every rank receives every sequence's final state. Fills `ctx` with what
  /// `backward` needs (a context of another plan is refilled from scratch). Collective; bad input
  /// on any rank makes every rank throw the same `ctxpar::Error` before any data moves. Keep the
  /// inputs unchanged until the backward: it reads them again.
  void forward(const inputs_type& inputs, const token_view<scalar_type, memory_space>& output,
               context_type& ctx, const forward_states_type& states = {}) {
    using transition = typename Backend::transition_type;
    compat::ScopedRegion region("ctxpar::chunkwise::CpPlan::forward");
    const ctxpar::impl::HostIsaScope isa_scope(host_isa_);
    {
      Preconditions chk(group_, "ctxpar::chunkwise::CpPlan::forward");
      impl::check_forward_views(chk, backend_, inputs, output, shape_);
      impl::check_states(chk, states.initial_states, "the initial states", layout_.sequence_count(),
                         shape_);
      impl::check_states(chk, states.final_states, "the final states", layout_.sequence_count(),
                         shape_);
      if (options_.check_finite && chk.locally_ok()) {
        chk.require(!backend_.has_non_finite(space_, inputs),
                    "the inputs must be finite (check_finite)", "no NaN or Inf",
                    "a NaN or Inf value");
      }
      chk.agree();
    }

    // Another plan's saved arrays may have other shapes: start them afresh.
    if (ctx.plan != id_) ctx.saved.clear();
    ctx.plan = 0;
    ctx.inputs = inputs;
    ctx.saved.resize(static_cast<std::size_t>(layout_.slots()));
    const bool h0 = is_given(states.initial_states);

    SummaryStore<transition, memory_space>& local = work_.forward_local;
    std::vector<state_view<memory_space>>& s_in = work_.s_in;
    ensure_direction(local, "ctxpar::chunkwise::forward_summary", s_in, "ctxpar::chunkwise::s_in");
    compose_slots(local, false, states.initial_states, s_in,
                  [&](int slot, int v, std::int64_t off, std::int64_t len) {
                    const LocalSequences seqs = layout_.local_sequences(v);
                    impl::call_forward_prepare(
                        space_, backend_, backend_.slice(inputs, off, off + len), seqs,
                        tables_[static_cast<std::size_t>(slot)], local[slot],
                        ctx.saved[static_cast<std::size_t>(slot)], impl::forward_needs(seqs, h0));
                  });
    if (is_given(states.final_states))
      Kokkos::deep_copy(space_, states.final_states, scalar_type(0));
    for_filled_slots([&](int slot, int v, std::int64_t off, std::int64_t len) {
      token_view<scalar_type, memory_space> out =
          Kokkos::subview(output, std::make_pair(off, off + len), Kokkos::ALL, Kokkos::ALL);
      const auto i = static_cast<std::size_t>(slot);
      backend_.forward_apply(space_, backend_.slice(inputs, off, off + len),
                             layout_.local_sequences(v), tables_[i], s_in[i], states.initial_states,
                             out, states.final_states, ctx.saved[i]);
    });
    // A sequence without tokens ends where it starts: its final state is its initial state.
    sum_sequence_states(states.final_states, states.initial_states);
    ctx.plan = id_;
  }

  /// Backward of the forward that filled `ctx` (on this plan): from `output_grad [T_local, H, V]`
  /// (and optionally the final-state gradients) writes every input gradient of the rank's tokens
  /// into `grads` and, when asked, every sequence's initial-state gradient on every rank.
  /// Collective; a context no forward of this plan filled is refused on every rank.
  void backward(context_type& ctx, const const_token_view<scalar_type, memory_space>& output_grad,
                const gradients_type& grads, const backward_states_type& states = {}) {
    using transition = typename Backend::transition_type;
    compat::ScopedRegion region("ctxpar::chunkwise::CpPlan::backward");
    const ctxpar::impl::HostIsaScope isa_scope(host_isa_);
    {
      Preconditions chk(group_, "ctxpar::chunkwise::CpPlan::backward");
      impl::check_backward_views(chk, backend_, ctx.plan, id_, ctx.inputs, output_grad, grads,
                                 shape_);
      impl::check_states(chk, states.final_state_grads, "the final-state gradients",
                         layout_.sequence_count(), shape_);
      impl::check_states(chk, states.initial_state_grads, "the initial-state gradients",
                         layout_.sequence_count(), shape_);
      chk.agree();
    }

    const bool dht = is_given(states.final_state_grads);
    SummaryStore<transition, memory_space>& local = work_.backward_local;
    std::vector<state_view<memory_space>>& ds_out = work_.ds_out;
    ensure_direction(local, "ctxpar::chunkwise::backward_summary", ds_out,
                     "ctxpar::chunkwise::ds_out");
    auto dout_of = [&](std::int64_t off, std::int64_t len) {
      return const_token_view<scalar_type, memory_space>(
          Kokkos::subview(output_grad, std::make_pair(off, off + len), Kokkos::ALL, Kokkos::ALL));
    };
    compose_slots(local, true, states.final_state_grads, ds_out,
                  [&](int slot, int v, std::int64_t off, std::int64_t len) {
                    const LocalSequences seqs = layout_.local_sequences(v);
                    const auto i = static_cast<std::size_t>(slot);
                    impl::call_backward_prepare(space_, backend_, ctx.saved[i], dout_of(off, len),
                                                seqs, tables_[i], local[slot],
                                                impl::backward_needs(seqs, dht));
                  });
    if (is_given(states.initial_state_grads))
      Kokkos::deep_copy(space_, states.initial_state_grads, scalar_type(0));
    for_filled_slots([&](int slot, int v, std::int64_t off, std::int64_t len) {
      const auto i = static_cast<std::size_t>(slot);
      backend_.backward_apply(space_, ctx.saved[i], dout_of(off, len), layout_.local_sequences(v),
                              tables_[i], ds_out[i], states.final_state_grads,
                              backend_.slice(grads, off, off + len), states.initial_state_grads,
                              state_view<memory_space>());
    });
    sum_sequence_states(states.initial_state_grads, states.final_state_grads);
  }

  /// The rank's shape `[T_local, H, K, V]` the plan was built for.
  const ChunkwiseShape& shape() const { return shape_; }
  /// The sequence layout.
  const SequenceLayout& layout() const { return layout_; }
  /// The options the plan was built with.
  const DriverOptions& options() const { return options_; }
  /// The backend the plan calls.
  const Backend& backend() const { return backend_; }
  /// The ranks of the plan.
  const Group& group() const { return group_; }
  /// The execution space every call runs on.
  const ExecutionSpace& space() const { return space_; }
  /// Bytes of driver memory the plan holds now (summaries, composed states and gradients,
  /// composition and scan scratch); it grows to what the calls need and never shrinks. The
  /// backend's saved arrays live in the contexts.
  std::size_t workspace_bytes() const {
    auto floats = [](const auto& view) { return view.span() * sizeof(float); };
    auto store = [&](const auto& s) {
      return floats(s.packed()) + floats(s.states()) + floats(s.transitions());
    };
    std::size_t bytes = store(work_.forward_local) + store(work_.backward_local) +
                        store(work_.gathered) + floats(work_.fold_tmp);
    for (const auto& s : work_.s_in) bytes += floats(s);
    for (const auto& s : work_.ds_out) bytes += floats(s);
    for (const auto& r : work_.scan_records) bytes += floats(r);
    return bytes + work_.scan_tmp.capacity_bytes() + work_.scan_own.capacity_bytes() +
           work_.scan_total.capacity_bytes() + work_.scan.inclusive.capacity_bytes() +
           work_.scan.received.capacity_bytes() + work_.scan.exclusive.capacity_bytes();
  }

 private:
  // One direction's memory at the plan's sizes: the slots' summaries `local` and the composed
  // states `carried` (zeroed), labelled; reallocated only when the sizes change.
  template <class Transition>
  void ensure_direction(SummaryStore<Transition, memory_space>& local, const char* local_label,
                        std::vector<state_view<memory_space>>& carried, const char* carried_label) {
    const int slots = layout_.slots();
    impl::ensure_store(space_, local, options_.form, slots, shape_.heads, shape_.key_dim,
                       shape_.value_dim, local_label);
    impl::ensure_states(space_, carried, slots, shape_.heads, shape_.key_dim, shape_.value_dim,
                        carried_label);
  }
  // When `result` is given: every sequence's row of it summed over the ranks (each rank wrote the
  // rows of the sequences that end (start) on it), after rank 0 copied the rows of `given` (when
  // given) into those of the sequences without tokens, which pass their boundary value through.
  template <class Given>
  void sum_sequence_states(const sequence_states_view<scalar_type, memory_space>& result,
                           const Given& given) {
    if (!is_given(result)) return;
    if (group_.rank() == 0 && is_given(given)) {
      for (int n : layout_.empty_sequences()) {
        Kokkos::deep_copy(space_, Kokkos::subview(result, n, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL),
                          Kokkos::subview(given, n, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL));
      }
    }
    allreduce_sum(space_, group_, result, unchecked);
  }
  // `f(slot, v, off, len)` for every local slot: its virtual shard and its rows of the rank's
  // tokens.
  template <class F>
  void for_slots(const F& f) const {
    for (int slot = 0; slot < layout_.slots(); ++slot) {
      const int v = layout_.virtual_shard(group_.rank(), slot);
      f(slot, v, layout_.local_offset(slot), layout_.shard_length(v));
    }
  }
  // `f(slot, v, off, len)` for the local slots that hold tokens.
  template <class F>
  void for_filled_slots(const F& f) const {
    for_slots([&](int slot, int v, std::int64_t off, std::int64_t len) {
      if (len > 0) f(slot, v, off, len);
    });
  }
  // Each local slot's summary (`prepare(slot, v, off, len)` where it holds tokens, the identity
  // where it holds none), then their composition over the ranks into one carried state per slot
  // (`backward`: the chain reversed), from the sequences' `given` boundary states.
  template <class Transition, class Given, class Prepare>
  void compose_slots(SummaryStore<Transition, memory_space>& local, bool backward,
                     const Given& given, std::vector<state_view<memory_space>>& carried,
                     const Prepare& prepare) {
    for_slots([&](int slot, int v, std::int64_t off, std::int64_t len) {
      if (len == 0) {
        identity_summary<Transition>(space_, local[slot], shape_.key_dim, shape_.value_dim);
      } else {
        prepare(slot, v, off, len);
      }
    });
    impl::Composer<Transition, ExecutionSpace, scalar_type> composer(
        space_, group_, layout_, shape_.heads, shape_.key_dim, shape_.value_dim, backward, work_);
    if constexpr (std::is_same_v<Policy, GatherFold>) {
      composer.gather_fold(local, options_.form, given, carried);
    } else {
      composer.scan_compose(local, given, carried);
    }
  }

  ExecutionSpace space_;
  Group group_;
  Backend backend_;
  SequenceLayout layout_;
  ChunkwiseShape shape_;
  DriverOptions options_;
  HostIsa host_isa_ = HostIsa::baseline;
  std::int64_t id_;
  std::vector<typename Backend::table_type> tables_;  // per local slot (empty where no tokens)
  impl::DriverWorkspace<typename Backend::transition_type, memory_space> work_;
};

/// A `CpPlan` whose backend and execution space are deduced from the arguments:
/// `auto cp = make_cp_plan<ScanCompose>(space, group, backend, layout, shape, options);`.
/// Collective (see the constructor).
template <class Policy, class ExecutionSpace, class Backend>
CpPlan<Policy, Backend, ExecutionSpace> make_cp_plan(const ExecutionSpace& space,
                                                     const Group& group, const Backend& backend,
                                                     const SequenceLayout& layout,
                                                     const ChunkwiseShape& shape,
                                                     const DriverOptions& options = {}) {
  return CpPlan<Policy, Backend, ExecutionSpace>(space, group, backend, layout, shape, options);
}
}  // namespace ctxpar::chunkwise

// The specialization for backends on 16-bit storage, so that `make_cp_plan` and every user of
// `CpPlan` sees it.
#include "ctxpar/chunkwise/narrow_plan.hpp"
