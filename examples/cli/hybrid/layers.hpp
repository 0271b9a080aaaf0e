// The three layers of the `ctxpar hybrid` stack. Each takes this rank's rows of the residual
// stream in the shared token plan, runs its context-parallel operator, adds its output to the
// residual, and on the way back returns the input gradient and accumulates its weight gradients.
// The glue (projections, gates, norms) is token-local fp64 host code; the operators run on the
// default Kokkos execution space, on data of the layers' `Scalar` (`double`, or a 16-bit storage
// type: each operand is rounded to it once on its way to the device, and read back exactly).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "choice.hpp"
#include "ctxpar/chunkwise/driver.hpp"
#include "ctxpar/chunkwise/gated_delta_rule.hpp"
#include "ctxpar/chunkwise/sequence_layout.hpp"
#include "ctxpar/chunkwise/short_conv.hpp"
#include "ctxpar/comm/group.hpp"
#include "ctxpar/heads/gdp_context_parallel.hpp"
#include "ctxpar/partition/balanced_chunks.hpp"
#include "ctxpar/partition/zigzag.hpp"
#include "ctxpar/swa/distributed_step.hpp"
#include "hybrid/host_math.hpp"
#include "hybrid/phase_clock.hpp"
#include "hybrid/token_plan.hpp"

namespace ctxpar::cli::hybrid {

using execution_space = Kokkos::DefaultExecutionSpace;  ///< where the operators run
using memory_space = execution_space::memory_space;     ///< where their views live
using Params = std::map<std::string, Matrix>;           ///< named weights (or their gradients)

/// Sizes and policies of the stack, the same on every rank.
struct StackConfig {
  std::int64_t length = 2048;   ///< tokens `L`
  std::int64_t model_dim = 32;  ///< residual width
  std::int64_t heads = 4;       ///< query heads (SWA), heads (GDN, GDP)
  std::int64_t kv_heads = 2;    ///< SWA key/value heads
  std::int64_t head_dim = 16;   ///< SWA `D`, GDN `K = V`, GDP `d = N`
  std::int64_t window = 256;    ///< SWA window `W`
  std::int64_t chunk = 512;     ///< SWA stream chunk `t`
  int swa_policy = 0;           ///< SWA policy, an index into `cli::swa_policies`
  int gdn_policy = 0;           ///< GDN composition, an index into `cli::compositions`
  /// GDP head policy, an index into `cli::head_policies`
  int head_policy = head_policies.index("uneven");
  int householder = 2;    ///< GDP householder copies `M`
  int groups = 1;         ///< GDP key groups
  int conv_width = 4;     ///< GDP conv width
  int kernel_chunk = 64;  ///< chunk of the GDN and GDP chunkwise kernels
  bool gdn_conv = true;   ///< GDN short conv (contiguous or zigzag shards)
  /// How the GDN layer's chunk products multiply (`BackendOptions::products`; `automatic`: its
  /// storage type's on a GPU with tensor cores, exact elsewhere).
  chunkwise::ChunkProducts gdn_products = chunkwise::ChunkProducts::automatic;
};

/// What one layer did on this rank in one forward + backward.
struct LayerStats {
  std::string name, mechanism, policy;  ///< for the report
  double forward_seconds = 0;           ///< the operator's forward calls
  double backward_seconds = 0;          ///< the operator's backward calls
  Traffic measured;                     ///< data traffic of the operator, forward + backward
  std::int64_t formula_sent = -1;       ///< the same from the formula (-1: none)
  std::int64_t formula_received = -1;   ///< the same from the formula (-1: none)
  Traffic relayout;  ///< traffic of the demo's own re-layouts (SWA streaming, GDP order)
  /// Wall time of the layer's forward + backward by phase (max over ranks once reported): the
  /// whole layer, inside the operators' collectives (their `Traffic::seconds`, data and agreement:
  /// the communication and the waiting), the re-layouts, operand staging, host glue
  /// (projections); local compute is what remains.
  double total_seconds = 0, comm_seconds = 0, relayout_seconds = 0, staging_seconds = 0,
         glue_seconds = 0;
  /// Wall time outside every collective, the re-layouts' included (for the imbalance between
  /// ranks).
  double work_seconds = 0;
  /// Collective calls made, the re-layouts' included, as the groups count them (each a point
  /// where ranks wait for each other).
  long mpi_calls = 0;
  /// Resident memory the layer's forward left behind for its backward (the growth of the
  /// process's resident set across the forward call; activations and saved operator state).
  std::int64_t held_bytes = 0;
  /// Kokkos allocations made inside the layer's forward and backward while an
  /// `AllocationCounter` was passed to the stack (`--repeat`), by view label.
  std::map<std::string, std::int64_t> allocation_labels;
  std::string note;  ///< what is not there yet
};

namespace detail {

template <class Scalar>
using Tensor3 = Kokkos::View<Scalar***, Kokkos::LayoutRight, memory_space>;
template <class Scalar>
using Tensor2 = Kokkos::View<Scalar**, Kokkos::LayoutRight, memory_space>;
template <class Scalar>
using Tensor1 = Kokkos::View<Scalar*, memory_space>;

// Adds the time of its scope to PhaseClock::staging.
struct StagingScope {
  PhaseScope scope{PhaseClock::staging};
};

/// Rows `[row0, row0 + rows)` of `m` as a `[rows, h, d]` view (`m.cols == h·d`) of `Scalar`.
template <class Scalar>
Tensor3<Scalar> upload3(const Matrix& m, std::int64_t row0, std::int64_t rows, std::int64_t h,
                        std::int64_t d, const std::string& label) {
  StagingScope scope;
  Tensor3<Scalar> v(label, rows, h, d);
  auto hv = Kokkos::create_mirror_view(v);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < h * d; ++j)
      hv.data()[i * h * d + j] = ctxpar::narrow<Scalar>(m(row0 + i, j));
  Kokkos::deep_copy(v, hv);
  return v;
}

/// `m` as a `[rows, cols]` view of `Scalar`.
template <class Scalar>
Tensor2<Scalar> upload2(const Matrix& m, const std::string& label) {
  StagingScope scope;
  Tensor2<Scalar> v(label, m.rows, m.cols);
  auto hv = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < m.data.size(); ++i) hv.data()[i] = ctxpar::narrow<Scalar>(m.data[i]);
  Kokkos::deep_copy(v, hv);
  return v;
}

/// `m` (any shape) as a flat view of `Scalar`.
template <class Scalar>
Tensor1<Scalar> upload1(const Matrix& m, const std::string& label) {
  StagingScope scope;
  Tensor1<Scalar> v(label, m.data.size());
  auto hv = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < m.data.size(); ++i) hv(i) = ctxpar::narrow<Scalar>(m.data[i]);
  Kokkos::deep_copy(v, hv);
  return v;
}

/// Copies a contiguous view's values into rows `[row0, …)` of `m` (widened: exact).
template <class View>
void download(const View& v, Matrix& m, std::int64_t row0) {
  StagingScope scope;
  auto hv = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  const std::size_t n = hv.span();
  for (std::size_t i = 0; i < n; ++i)
    m.data[static_cast<std::size_t>(row0 * m.cols) + i] =
        static_cast<double>(ctxpar::widen(hv.data()[i]));
}

inline Traffic minus(const Traffic& a, const Traffic& b) {
  return Traffic{a.calls - b.calls, a.bytes_sent - b.bytes_sent,
                 a.bytes_received - b.bytes_received, a.seconds - b.seconds};
}

inline double now_fenced(const Kokkos::Timer& t) {
  Kokkos::fence();
  return t.seconds();
}

}  // namespace detail

/// Sliding-window attention, streamed in chunks of `t` tokens with its carried (sharded) cache.
/// The shared plan holds whole-sequence shards; the streaming step wants each chunk split by
/// `BalancedChunks(t, P)`, so the rows move to that layout and back (one all-to-all each way,
/// reported separately as re-layout traffic). The operator's data are `Scalar`.
template <class Scalar = double>
class SwaLayer {
 public:
  /// Collective. `relayout_group` carries the re-layout so its bytes stay out of the operator's.
  SwaLayer(const Group& group, const Group& relayout_group, const TokenPlan& plan,
           const StackConfig& cfg)
      : group_(group), cfg_(cfg), plan_(plan) {
    const int p = group.size();
    std::vector<std::vector<std::int64_t>> from(p), to(p);
    for (int r = 0; r < p; ++r) from[r] = plan.tokens_of(r);
    for (std::int64_t s0 = 0; s0 < plan.length; s0 += cfg.chunk) {
      const std::int64_t t = std::min(cfg.chunk, plan.length - s0);
      const BalancedChunks c{t, p};
      step_begin_.push_back(s0);
      step_length_.push_back(t);
      for (int r = 0; r < p; ++r)
        for (std::int64_t i = c.begin(r); i < c.end(r); ++i) to[r].push_back(s0 + i);
    }
    stream_tokens_ = to[group.rank()];
    relayout_ = Relayout(relayout_group, from, to, plan.length);
    relayout_group_ = &relayout_group;
  }

  /// Adds the layer's weights to `w`.
  static void init(Params& w, const StackConfig& c, std::uint64_t seed) {
    w["swa.Wq"] = init_weight(seed + 1, c.model_dim, c.heads * c.head_dim);
    w["swa.Wk"] = init_weight(seed + 2, c.model_dim, c.kv_heads * c.head_dim);
    w["swa.Wv"] = init_weight(seed + 3, c.model_dim, c.kv_heads * c.head_dim);
    w["swa.Wo"] = init_weight(seed + 4, c.heads * c.head_dim, c.model_dim, 0.5);
  }

  /// `x → x + SWA(x Wq, x Wk, x Wv) Wo` on this rank's rows. Collective.
  Matrix forward(const Matrix& x, const Params& w, LayerStats& stats) {
    x_ = x;
    const std::int64_t hq = cfg_.heads, hkv = cfg_.kv_heads, d = cfg_.head_dim;
    Matrix qkv(x.rows, (hq + 2 * hkv) * d);
    set_columns(qkv, 0, matmul(x, w.at("swa.Wq")));
    set_columns(qkv, hq * d, matmul(x, w.at("swa.Wk")));
    set_columns(qkv, (hq + hkv) * d, matmul(x, w.at("swa.Wv")));
    const Traffic r0 = relayout_group_->total_data_traffic();
    const Matrix s = relayout_.forward(qkv);
    const std::vector<std::int32_t> ids = plan_.document_ids();
    const bool packed = plan_.cu_seqlens.size() > 2;
    swa::Options opt;
    opt.window = cfg_.window;
    // One plan for every step and call; each step keeps its cache, state and output.
    const std::size_t steps = step_begin_.size();
    if (caches_.size() != steps + 1) {
      caches_.assign(steps + 1, swa::Cache<Scalar, memory_space>{});
      caches_[0] = swa::empty_cache<Scalar, memory_space>(hkv, d);
      states_.assign(steps, swa::DistributedState<Scalar, memory_space>{});
      grads_.assign(steps, swa::StepGradients<Scalar, memory_space>{});
      outs_.assign(steps, swa::Tensor<Scalar, memory_space>{});
    }
    if (step_plan_.index() == 0) make_plan(opt);
    Matrix o_stream(s.rows, hq * d);
    std::int64_t row = 0;
    const Traffic t0 = group_.total_data_traffic();
    Kokkos::Timer timer;
    // Step k's chunk shard: rows [row, row + its share) of the streaming layout, on the device.
    const auto chunk_at = [&](std::size_t k, std::int64_t row) {
      const std::int64_t n = BalancedChunks{step_length_[k], group_.size()}.size(group_.rank());
      swa::Chunk<Scalar, memory_space> chunk;
      chunk.q = detail::upload3<Scalar>(columns(s, 0, hq * d), row, n, hq, d, "ctxpar::hybrid::q");
      chunk.k =
          detail::upload3<Scalar>(columns(s, hq * d, hkv * d), row, n, hkv, d, "ctxpar::hybrid::k");
      chunk.v = detail::upload3<Scalar>(columns(s, (hq + hkv) * d, hkv * d), row, n, hkv, d,
                                        "ctxpar::hybrid::v");
      chunk.pos = swa::Positions<memory_space>("ctxpar::hybrid::pos", n);
      chunk.ids = swa::Ids<memory_space>("ctxpar::hybrid::ids", packed ? n : 0);
      auto hp = Kokkos::create_mirror_view(chunk.pos);
      auto hi = Kokkos::create_mirror_view(chunk.ids);
      for (std::int64_t i = 0; i < n; ++i) {
        hp(i) = stream_tokens_[static_cast<std::size_t>(row + i)];
        if (packed) hi(i) = ids[static_cast<std::size_t>(hp(i))];
      }
      Kokkos::deep_copy(chunk.pos, hp);
      Kokkos::deep_copy(chunk.ids, hi);
      return chunk;
    };
    // The next step's chunk is staged before this step's forward, so that the all-gather policies
    // post its gather there and it travels during this step's attention (`HaloKV` has no posted
    // form: its halo is point to point).
    swa::Chunk<Scalar, memory_space> chunk = chunk_at(0, 0), upcoming;
    for (std::size_t k = 0; k < steps; ++k) {
      const std::int64_t n = chunk.length();
      if (k + 1 < steps) upcoming = chunk_at(k + 1, row + n);
      std::visit(
          [&](auto& plan) {
            using plan_type = std::decay_t<decltype(plan)>;
            if constexpr (!std::is_same_v<plan_type, std::monostate>) {
              // The layer's outputs: allocated on the first forward, reused after.
              if (outs_[k].extent(1) == 0)
                outs_[k] = swa::allocate_output<Scalar, memory_space>(plan.shape(), n);
              if constexpr (!std::is_same_v<plan_type, StepPlanOf<swa::HaloKV>>) {
                if (k + 1 < steps) {
                  plan.forward(chunk, caches_[k], outs_[k], caches_[k + 1], states_[k], upcoming);
                  return;
                }
              }
              plan.forward(chunk, caches_[k], outs_[k], caches_[k + 1], states_[k]);
            }
          },
          step_plan_);
      detail::download(outs_[k], o_stream, row);
      row += n;
      chunk = upcoming;
    }
    stats.forward_seconds = detail::now_fenced(timer);
    fwd_traffic_ = detail::minus(group_.total_data_traffic(), t0);
    o_ = relayout_.backward(o_stream);
    relayout_fwd_ = detail::minus(relayout_group_->total_data_traffic(), r0);
    Matrix out = matmul(o_, w.at("swa.Wo"));
    add_into(out, x);
    return out;
  }

  /// Backward: `dy` (gradient of the output rows) → gradient of `x`; weight gradients into `g`.
  Matrix backward(const Matrix& dy, const Params& w, Params& g, LayerStats& stats) {
    const std::int64_t hq = cfg_.heads, hkv = cfg_.kv_heads, d = cfg_.head_dim;
    add_matmul_at(o_, dy, g["swa.Wo"]);
    Matrix dout(dy.rows, hq * d);
    add_matmul_bt(dy, w.at("swa.Wo"), dout);
    const Traffic r0 = relayout_group_->total_data_traffic();
    const Matrix ds = relayout_.forward(dout);
    Matrix dqkv_stream(ds.rows, (hq + 2 * hkv) * d);
    // Row offsets of every step in the streaming layout.
    std::vector<std::int64_t> offset{0};
    for (std::size_t k = 0; k < step_begin_.size(); ++k)
      offset.push_back(offset.back() +
                       BalancedChunks{step_length_[k], group_.size()}.size(group_.rank()));
    swa::CacheGradient<Scalar, memory_space> carried;
    const Traffic t0 = group_.total_data_traffic();
    Kokkos::Timer timer;
    for (std::size_t k = states_.size(); k-- > 0;) {
      const std::int64_t n = offset[k + 1] - offset[k];
      auto dv = detail::upload3<Scalar>(ds, offset[k], n, hq, d, "ctxpar::hybrid::dout");
      // Allocated on the first backward, written in place after that.
      swa::StepGradients<Scalar, memory_space>& gr = grads_[k];
      std::visit(
          [&](auto& plan) {
            if constexpr (!std::is_same_v<std::decay_t<decltype(plan)>, std::monostate>) {
              if (gr.dq.extent(1) == 0) gr = swa::allocate_gradients(plan.shape(), states_[k]);
              plan.backward(states_[k], dv, carried, gr);
            }
          },
          step_plan_);
      Matrix part(n, (hq + 2 * hkv) * d), piece(n, hq * d), kv(n, hkv * d);
      detail::download(gr.dq, piece, 0);
      set_columns(part, 0, piece);
      detail::download(gr.dk, kv, 0);
      set_columns(part, hq * d, kv);
      detail::download(gr.dv, kv, 0);
      set_columns(part, (hq + hkv) * d, kv);
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < part.cols; ++j) dqkv_stream(offset[k] + i, j) = part(i, j);
      carried.dk = gr.dk_cache;
      carried.dv = gr.dv_cache;
    }
    stats.backward_seconds = detail::now_fenced(timer);
    stats.measured = detail::minus(group_.total_data_traffic(), t0);
    stats.measured.calls += fwd_traffic_.calls;
    stats.measured.bytes_sent += fwd_traffic_.bytes_sent;
    stats.measured.bytes_received += fwd_traffic_.bytes_received;
    const Matrix dqkv = relayout_.backward(dqkv_stream);
    stats.relayout = detail::minus(relayout_group_->total_data_traffic(), r0);
    stats.relayout.calls += relayout_fwd_.calls;
    stats.relayout.bytes_sent += relayout_fwd_.bytes_sent;
    stats.relayout.bytes_received += relayout_fwd_.bytes_received;
    const Matrix dq = columns(dqkv, 0, hq * d), dk = columns(dqkv, hq * d, hkv * d),
                 dvv = columns(dqkv, (hq + hkv) * d, hkv * d);
    add_matmul_at(x_, dq, g["swa.Wq"]);
    add_matmul_at(x_, dk, g["swa.Wk"]);
    add_matmul_at(x_, dvv, g["swa.Wv"]);
    Matrix dx = dy;
    add_matmul_bt(dq, w.at("swa.Wq"), dx);
    add_matmul_bt(dk, w.at("swa.Wk"), dx);
    add_matmul_bt(dvv, w.at("swa.Wv"), dx);
    formula(stats);
    return dx;
  }

  /// Policy name (of the tag `p` selects).
  static const char* policy_name(int p) {
    return swa_policies.visit(p, [](auto tag) -> const char* { return decltype(tag)::name; });
  }

 private:
  template <class Policy>
  using StepPlanOf = swa::StepPlan<Policy, swa::SegmentChunks, execution_space, Scalar>;

  /// The step plan of the configured policy (the tool's run-time choice picks one of the
  /// compile-time tags). Collective.
  void make_plan(const swa::Options& opt) {
    const swa::StepShape shape{cfg_.heads, cfg_.kv_heads, cfg_.head_dim};
    swa_policies.visit(cfg_.swa_policy, [&](auto policy) {
      step_plan_.template emplace<StepPlanOf<decltype(policy)>>(execution_space(), group_, shape,
                                                                opt);
    });
  }

  // Bytes every rank sends and receives by the formulas of docs/swa.md §2 (which
  // tests/swa/traffic_test.cpp asserts exactly): per step, the all-gather of `c + t` records (or
  // the halo of `W - 1` records before the rank's first query), the next cache's re-shard, and in
  // the backward the reduce-scatter (or halo return) of `2·Hkv·D`-wide gradients and the
  // cache-gradient return. A record is K | V in `Scalar` and a 16-byte tail (position, id,
  // padding); gradients travel in the compute type (fp32 for the 16-bit types).
  void formula(LayerStats& stats) const {
    const int p = group_.size(), me = group_.rank();
    const std::int64_t per = cfg_.kv_heads * cfg_.head_dim;
    const std::int64_t rb = 2 * per * static_cast<std::int64_t>(sizeof(Scalar)) + 16,
                       gb = 2 * per * static_cast<std::int64_t>(sizeof(compute_t<Scalar>));
    const bool halo = swa_policies.is<swa::HaloKV>(cfg_.swa_policy);
    // RopeAfterGather saves the raw-key exchange of the next cache (swa/policies.hpp).
    const bool reshard = !swa_policies.is<swa::RopeAfterGather>(cfg_.swa_policy);
    std::int64_t sent = 0, recv = 0, c = 0;
    for (std::size_t k = 0; k < step_length_.size(); ++k) {
      const std::int64_t t = step_length_[k];
      const BalancedChunks cs{c, p}, ts{t, p};
      auto owner = [&](std::int64_t a) {
        return a < c ? static_cast<int>(cs.owner(a)) : static_cast<int>(ts.owner(a - c));
      };
      auto records = [&](int r) { return cs.size(r) + ts.size(r); };
      const std::int64_t len = c + t, mine = records(me);
      // Records in [lo, hi) owned by `r` / not owned by `r`.
      auto owned_in = [&](int r, std::int64_t lo, std::int64_t hi) {
        std::int64_t n = 0;
        for (std::int64_t a = lo; a < hi; ++a) n += owner(a) == r ? 1 : 0;
        return n;
      };
      if (!halo) {
        sent += mine * rb * (p - 1) + (len - mine) * gb;  // all-gather, reduce-scatter
        recv += (len - mine) * rb + mine * gb * (p - 1);
      } else {
        for (int q = 0; q < p; ++q) {
          if (ts.size(q) == 0) continue;
          const std::int64_t first = c + ts.begin(q);
          const std::int64_t lo =
              cfg_.window > 0 ? std::max<std::int64_t>(0, first - (cfg_.window - 1)) : 0;
          if (q == me) {
            const std::int64_t n = (first - lo) - owned_in(me, lo, first);
            recv += n * rb;  // halo in
            sent += n * gb;  // its gradient back
          } else {
            const std::int64_t n = owned_in(me, lo, first);
            sent += n * rb;
            recv += n * gb;
          }
        }
      }
      const std::int64_t next = swa::next_cache_length(cfg_.window, len);
      const BalancedChunks ns{next, p};
      const std::int64_t base = len - next;
      const bool has_next = k + 1 < step_length_.size();
      for (int q = 0; q < p; ++q) {
        const std::int64_t lo = base + ns.begin(q), hi = base + ns.end(q);
        const std::int64_t n = q == me ? (hi - lo) - owned_in(me, lo, hi) : owned_in(me, lo, hi);
        if (q == me) {
          if (reshard) recv += n * rb;   // re-shard of the next cache
          if (has_next) sent += n * gb;  // its gradient back to the owners
        } else {
          if (reshard) sent += n * rb;
          if (has_next) recv += n * gb;
        }
      }
      c = next;
    }
    stats.formula_sent = sent;
    stats.formula_received = recv;
  }

  const Group& group_;
  StackConfig cfg_;
  TokenPlan plan_;
  const Group* relayout_group_ = nullptr;
  std::vector<std::int64_t> step_begin_, step_length_, stream_tokens_;
  Relayout relayout_;
  Matrix x_, o_;
  std::variant<std::monostate, StepPlanOf<swa::RopeBeforeGather>, StepPlanOf<swa::RopeAfterGather>,
               StepPlanOf<swa::HaloKV>>
      step_plan_;
  std::vector<swa::Cache<Scalar, memory_space>> caches_;  // caches_[k]: the input of step k
  std::vector<swa::DistributedState<Scalar, memory_space>> states_;
  std::vector<swa::Tensor<Scalar, memory_space>> outs_;
  std::vector<swa::StepGradients<Scalar, memory_space>> grads_;
  Traffic fwd_traffic_, relayout_fwd_;
};

/// Gated DeltaNet with chunkwise summary context parallelism: `[q | k | v] = SiLU(conv(x·Wqkv))`
/// with the depthwise causal short conv and its halo exchange (`short_conv.hpp`; contiguous
/// shards only — its ring assumes rank `r-1` holds the tokens before rank `r`'s, which zigzag
/// shards break, so under zigzag the conv is left out), `q, k` L2-normalised per head,
/// `α = sigmoid(x·Wa)` (so `g = log α`), `β = sigmoid(x·Wb)`; one call of the CP driver per pass.
/// The recurrence's data are `Scalar`; the short conv runs in its compute type (`ShortConvPlan`
/// takes fp32 and fp64 views), so under a 16-bit `Scalar` its halo travels in fp32.
template <class Scalar = double>
class GdnLayer {
 public:
  using backend_type = chunkwise::GatedDeltaRuleBackend<Scalar, memory_space>;
  /// The short conv's data type.
  using conv_scalar = compute_t<Scalar>;

  /// Collective (the plan is agreed).
  GdnLayer(const Group& group, const TokenPlan& plan, const StackConfig& cfg)
      : group_(group),
        cfg_(cfg),
        plan_(plan.zigzag
                  ? chunkwise::SequenceLayout::create(group, Zigzag{}, plan.cu_seqlens)
                  : chunkwise::SequenceLayout::create(group, Contiguous{}, plan.cu_seqlens)),
        backend_(chunkwise::BackendOptions{cfg.kernel_chunk, 0.0, cfg.gdn_products}),
        cp_(make_cp(group, plan_, backend_, cfg)),
        conv_(cfg.gdn_conv),
        zigzag_(plan.zigzag) {
    packed_ = plan.cu_seqlens.size() > 2;
    if (packed_) {
      const std::vector<std::int32_t> all = plan.document_ids();
      const std::vector<std::int64_t> mine = plan.tokens_of(group.rank());
      ids_ = Kokkos::View<std::int32_t*, memory_space>("ctxpar::hybrid::gdn_ids", mine.size());
      auto h = Kokkos::create_mirror_view(ids_);
      for (std::size_t j = 0; j < mine.size(); ++j) h(j) = all[static_cast<std::size_t>(mine[j])];
      Kokkos::deep_copy(ids_, h);
    }
    if (conv_) {  // the conv plan of this run's layout, sized for this rank's shard
      const chunkwise::ShortConvShape shape{
          static_cast<std::int64_t>(plan.tokens_of(group.rank()).size()),
          3 * cfg.heads * cfg.head_dim, cfg.conv_width, true, packed_};
      if (zigzag_)
        conv_zigzag_.emplace(execution_space(), group, shape);
      else
        conv_contiguous_.emplace(execution_space(), group, shape);
    }
  }

  /// Whether the short conv runs.
  bool has_conv() const { return conv_; }

  /// Adds the layer's weights to `w`.
  static void init(Params& w, const StackConfig& c, std::uint64_t seed) {
    const std::int64_t hk = c.heads * c.head_dim;
    w["gdn.Wq"] = init_weight(seed + 11, c.model_dim, hk);
    w["gdn.Wk"] = init_weight(seed + 12, c.model_dim, hk);
    w["gdn.Wv"] = init_weight(seed + 13, c.model_dim, hk);
    w["gdn.Wa"] = init_weight(seed + 14, c.model_dim, c.heads, 2.0);
    w["gdn.Wb"] = init_weight(seed + 15, c.model_dim, c.heads);
    w["gdn.Wo"] = init_weight(seed + 16, hk, c.model_dim, 0.5);
    w["gdn.conv_weight"] = init_weight(seed + 17, 3 * hk, c.conv_width, 1.0);
    w["gdn.conv_bias"] = init_weight(seed + 18, 1, 3 * hk, 0.1);
  }

  /// `x → x + GDN(x) Wo`. Collective.
  Matrix forward(const Matrix& x, const Params& w, LayerStats& stats) {
    x_ = x;
    const std::int64_t h = cfg_.heads, d = cfg_.head_dim, t = x.rows;
    const std::int64_t hk = h * d;
    Matrix pre(t, 3 * hk);
    set_columns(pre, 0, matmul(x, w.at("gdn.Wq")));
    set_columns(pre, hk, matmul(x, w.at("gdn.Wk")));
    set_columns(pre, 2 * hk, matmul(x, w.at("gdn.Wv")));
    conv_out_ = pre;
    Kokkos::Timer conv_timer;
    const Traffic c0 = group_.total_data_traffic();
    if (conv_) {
      pre_v_ = detail::upload2<conv_scalar>(pre, "ctxpar::hybrid::gdn_conv_in");
      conv_w_ =
          detail::upload2<conv_scalar>(w.at("gdn.conv_weight"), "ctxpar::hybrid::gdn_conv_weight");
      auto bias =
          detail::upload1<conv_scalar>(w.at("gdn.conv_bias"), "ctxpar::hybrid::gdn_conv_bias");
      detail::Tensor2<conv_scalar> y("ctxpar::hybrid::gdn_conv_out", t, 3 * hk);
      const Kokkos::View<const conv_scalar*, memory_space> cb(bias);
      if (zigzag_)
        conv_zigzag_->forward(const2(pre_v_), const2(conv_w_), cb, const_ids(), y, conv_saved_);
      else
        conv_contiguous_->forward(const2(pre_v_), const2(conv_w_), cb, const_ids(), y, conv_saved_);
      detail::download(y, conv_out_, 0);
    }
    conv_seconds_ = detail::now_fenced(conv_timer);
    conv_fwd_traffic_ = detail::minus(group_.total_data_traffic(), c0);
    Matrix act = conv_out_;
    if (conv_)
      for (double& v : act.data) v = v * sigmoid(v);
    q_ = l2_normalize(columns(act, 0, hk), d, 1e-6, qn_);
    k_ = l2_normalize(columns(act, hk, hk), d, 1e-6, kn_);
    const Matrix v = columns(act, 2 * hk, hk);
    a_ = matmul(x, w.at("gdn.Wa"));
    b_ = matmul(x, w.at("gdn.Wb"));
    Matrix g(t, h), beta(t, h);
    for (std::size_t i = 0; i < g.data.size(); ++i) {
      g.data[i] = log_sigmoid(a_.data[i]);
      beta.data[i] = sigmoid(b_.data[i]);
    }
    chunkwise::GatedDeltaRuleInputs<Scalar, memory_space> in;
    in.q = detail::upload3<Scalar>(q_, 0, t, h, d, "ctxpar::hybrid::gdn_q");
    in.k = detail::upload3<Scalar>(k_, 0, t, h, d, "ctxpar::hybrid::gdn_k");
    in.v = detail::upload3<Scalar>(v, 0, t, h, d, "ctxpar::hybrid::gdn_v");
    g_keep_ = detail::upload2<Scalar>(g, "ctxpar::hybrid::gdn_g");
    beta_keep_ = detail::upload2<Scalar>(beta, "ctxpar::hybrid::gdn_beta");
    in.g = g_keep_;
    in.beta = beta_keep_;
    chunkwise::token_view<Scalar, memory_space> out("ctxpar::hybrid::gdn_out", t, h, d);
    const Traffic t0 = group_.total_data_traffic();
    Kokkos::Timer timer;
    // The layer's plan and context serve every call, so their memory is reused.
    std::visit([&](auto& cp) { cp.forward(in, out, ctx_); }, cp_);
    stats.forward_seconds = detail::now_fenced(timer) + conv_seconds_;
    fwd_traffic_ = detail::minus(group_.total_data_traffic(), t0);
    fwd_traffic_.calls += conv_fwd_traffic_.calls;
    fwd_traffic_.bytes_sent += conv_fwd_traffic_.bytes_sent;
    fwd_traffic_.bytes_received += conv_fwd_traffic_.bytes_received;
    o_ = Matrix(t, h * d);
    detail::download(out, o_, 0);
    Matrix y = matmul(o_, w.at("gdn.Wo"));
    add_into(y, x);
    return y;
  }

  /// Backward. Collective.
  Matrix backward(const Matrix& dy, const Params& w, Params& grads, LayerStats& stats) {
    const std::int64_t h = cfg_.heads, d = cfg_.head_dim, t = dy.rows;
    add_matmul_at(o_, dy, grads["gdn.Wo"]);
    Matrix dout(t, h * d);
    add_matmul_bt(dy, w.at("gdn.Wo"), dout);
    auto dout_v = detail::upload3<Scalar>(dout, 0, t, h, d, "ctxpar::hybrid::gdn_dout");
    chunkwise::GatedDeltaRuleGradients<Scalar, memory_space> gr;
    gr.dq = chunkwise::token_view<Scalar, memory_space>("ctxpar::hybrid::gdn_dq", t, h, d);
    gr.dk = chunkwise::token_view<Scalar, memory_space>("ctxpar::hybrid::gdn_dk", t, h, d);
    gr.dv = chunkwise::token_view<Scalar, memory_space>("ctxpar::hybrid::gdn_dv", t, h, d);
    gr.dg = chunkwise::head_view<Scalar, memory_space>("ctxpar::hybrid::gdn_dg", t, h);
    gr.dbeta = chunkwise::head_view<Scalar, memory_space>("ctxpar::hybrid::gdn_dbeta", t, h);
    const Traffic t0 = group_.total_data_traffic();
    Kokkos::Timer timer;
    std::visit([&](auto& cp) { cp.backward(ctx_, dout_v, gr); }, cp_);
    stats.backward_seconds = detail::now_fenced(timer);
    stats.measured = detail::minus(group_.total_data_traffic(), t0);
    stats.measured.calls += fwd_traffic_.calls;
    stats.measured.bytes_sent += fwd_traffic_.bytes_sent;
    stats.measured.bytes_received += fwd_traffic_.bytes_received;
    Matrix dq(t, h * d), dk(t, h * d), dv(t, h * d), dg(t, h), dbeta(t, h);
    detail::download(gr.dq, dq, 0);
    detail::download(gr.dk, dk, 0);
    detail::download(gr.dv, dv, 0);
    detail::download(gr.dg, dg, 0);
    detail::download(gr.dbeta, dbeta, 0);
    const std::int64_t hk = h * d;
    Matrix dact(t, 3 * hk);
    set_columns(dact, 0, l2_normalize_backward(q_, dq, d, qn_));
    set_columns(dact, hk, l2_normalize_backward(k_, dk, d, kn_));
    set_columns(dact, 2 * hk, dv);
    Matrix dpre = dact;
    if (conv_) {
      for (std::size_t i = 0; i < dact.data.size(); ++i) {  // SiLU'(u) = σ(u)(1 + u(1 − σ(u)))
        const double u = conv_out_.data[i], sg = sigmoid(u);
        dact.data[i] *= sg * (1 + u * (1 - sg));
      }
      auto dy_v = detail::upload2<conv_scalar>(dact, "ctxpar::hybrid::gdn_conv_dy");
      detail::Tensor2<conv_scalar> dx_v("ctxpar::hybrid::gdn_conv_dx", t, 3 * hk),
          dw("ctxpar::hybrid::gdn_conv_dweight", 3 * hk, cfg_.conv_width);
      detail::Tensor1<conv_scalar> db("ctxpar::hybrid::gdn_conv_dbias", 3 * hk);
      const Traffic c0 = group_.total_data_traffic();
      Kokkos::Timer conv_timer;
      if (zigzag_)
        conv_zigzag_->backward(conv_saved_, const2(dy_v), dx_v, dw, db);
      else
        conv_contiguous_->backward(conv_saved_, const2(dy_v), dx_v, dw, db);
      stats.backward_seconds += detail::now_fenced(conv_timer);
      const Traffic c = detail::minus(group_.total_data_traffic(), c0);
      stats.measured.calls += c.calls;
      stats.measured.bytes_sent += c.bytes_sent;
      stats.measured.bytes_received += c.bytes_received;
      detail::download(dx_v, dpre, 0);
      Matrix gw(3 * hk, cfg_.conv_width), gb(1, 3 * hk);
      detail::download(dw, gw, 0);
      detail::download(db, gb, 0);
      add_into(grads["gdn.conv_weight"], gw);
      add_into(grads["gdn.conv_bias"], gb);
    }
    const Matrix dqr = columns(dpre, 0, hk), dkr = columns(dpre, hk, hk),
                 dvr = columns(dpre, 2 * hk, hk);
    Matrix da(t, h), db(t, h);
    for (std::size_t i = 0; i < da.data.size(); ++i) {
      da.data[i] = dg.data[i] * (1.0 - sigmoid(a_.data[i]));
      const double s = sigmoid(b_.data[i]);
      db.data[i] = dbeta.data[i] * s * (1.0 - s);
    }
    add_matmul_at(x_, dqr, grads["gdn.Wq"]);
    add_matmul_at(x_, dkr, grads["gdn.Wk"]);
    add_matmul_at(x_, dvr, grads["gdn.Wv"]);
    add_matmul_at(x_, da, grads["gdn.Wa"]);
    add_matmul_at(x_, db, grads["gdn.Wb"]);
    Matrix dx = dy;
    add_matmul_bt(dqr, w.at("gdn.Wq"), dx);
    add_matmul_bt(dkr, w.at("gdn.Wk"), dx);
    add_matmul_bt(dvr, w.at("gdn.Wv"), dx);
    add_matmul_bt(da, w.at("gdn.Wa"), dx);
    add_matmul_bt(db, w.at("gdn.Wb"), dx);
    formula(stats);
    return dx;
  }

  /// Policy name (of the tag `p` selects).
  static const char* policy_name(int p) {
    return compositions.is<chunkwise::GatherFold>(p) ? "GatherFold" : "ScanCompose";
  }

  /// What the layer's chunk products run as on this build's space (`cfg.gdn_products` resolved).
  static chunkwise::ChunkProducts products(const StackConfig& cfg) {
    return chunkwise::resolve_chunk_products<execution_space, Scalar>(cfg.gdn_products);
  }

 private:
  // One fp32 summary record per virtual shard: `H·(K·V + K·K)` floats (dense transition), once
  // forward and once backward. GatherFold all-gathers every shard's record; ScanCompose moves one
  // record per Hillis-Steele round in scan order (forward: rank order, backward: reversed).
  //
  // The short conv (C = 3·H·D channels, width w): every fragment whose successor lives on
  // another rank sends its last w − 1 rows there (and their ids when packed), every fragment whose
  // predecessor lives elsewhere receives w − 1; the backward repeats that halo, returns the
  // halo's gradient to its owner, and all-reduces the weight and bias gradients (C·(w + 1)
  // values, (P − 1) times each way). Contiguous: one link up (to r + 1) and one down (from r − 1)
  // where they exist. Zigzag: chunk r feeds rank r + 1 and chunk 2P − 1 − r feeds rank r − 1, so
  // every rank sends and receives (r > 0) + (r < P − 1) halos (rank P − 1 hands chunk P − 1's
  // tail to its own chunk P without a message).
  void formula(LayerStats& stats) const {
    const int p = group_.size(), me = group_.rank();
    const std::int64_t rec = cfg_.heads * (cfg_.head_dim * cfg_.head_dim * 2) * 4;
    std::int64_t sent = 0, recv = 0;
    if (conv_) {
      const std::int64_t c = 3 * cfg_.heads * cfg_.head_dim,
                         value = static_cast<std::int64_t>(sizeof(conv_scalar)),
                         halo = (cfg_.conv_width - 1) * (c * value + (packed_ ? 4 : 0));
      const std::int64_t back = (cfg_.conv_width - 1) * c * value,
                         reduce = c * (cfg_.conv_width + 1) * value * (p - 1);
      const std::int64_t links_out = zigzag_ ? (me > 0) + (me + 1 < p) : (me + 1 < p);
      const std::int64_t links_in = zigzag_ ? (me > 0) + (me + 1 < p) : (me > 0);
      sent += links_out * 2 * halo + links_in * back + reduce;
      recv += links_in * 2 * halo + links_out * back + reduce;
    }
    if (compositions.is<chunkwise::GatherFold>(cfg_.gdn_policy)) {
      const std::int64_t mine = plan_.slots();
      stats.formula_sent = sent + 2 * mine * rec * (p - 1);
      stats.formula_received = recv + 2 * (plan_.virtual_count() - mine) * rec;
      return;
    }
    if (plan_.zigzag()) return;  // the scan over 2P virtual shards: no closed form here
    for (int ordinal : {me, p - 1 - me})
      for (int d = 1; d < p; d *= 2) {
        if (ordinal + d < p) sent += rec;
        if (ordinal - d >= 0) recv += rec;
      }
    stats.formula_sent = sent;
    stats.formula_received = recv;
  }

  // The chunkwise operator of the configured composition policy (a compile-time tag of the plan).
  using cp_type =
      std::variant<chunkwise::CpPlan<chunkwise::GatherFold, backend_type, execution_space>,
                   chunkwise::CpPlan<chunkwise::ScanCompose, backend_type, execution_space>>;
  static cp_type make_cp(const Group& group, const chunkwise::SequenceLayout& layout,
                         const backend_type& backend, const StackConfig& cfg) {
    const chunkwise::ChunkwiseShape shape{layout.local_length(), cfg.heads, cfg.head_dim,
                                          cfg.head_dim};
    return compositions.visit(cfg.gdn_policy, [&](auto policy) {
      using plan_type = chunkwise::CpPlan<decltype(policy), backend_type, execution_space>;
      return cp_type(std::in_place_type<plan_type>, execution_space(), group, backend, layout,
                     shape);
    });
  }

  using const_matrix = Kokkos::View<const conv_scalar**, Kokkos::LayoutRight, memory_space>;
  static const_matrix const2(const detail::Tensor2<conv_scalar>& v) { return const_matrix(v); }
  Kokkos::View<const std::int32_t*, memory_space> const_ids() const {
    return packed_ ? Kokkos::View<const std::int32_t*, memory_space>(ids_)
                   : Kokkos::View<const std::int32_t*, memory_space>();
  }

  const Group& group_;
  StackConfig cfg_;
  chunkwise::SequenceLayout plan_;
  backend_type backend_;
  cp_type cp_;
  bool conv_ = true, zigzag_ = false, packed_ = false;
  Kokkos::View<std::int32_t*, memory_space> ids_;
  detail::Tensor2<conv_scalar> pre_v_, conv_w_;
  // The conv's plan (only the one of the run's layout is built) and what its forward keeps.
  std::optional<chunkwise::ShortConvPlan<Contiguous, execution_space, conv_scalar, memory_space>>
      conv_contiguous_;
  std::optional<chunkwise::ShortConvPlan<Zigzag, execution_space, conv_scalar, memory_space>>
      conv_zigzag_;
  chunkwise::ShortConvSaved<conv_scalar, memory_space> conv_saved_;
  Matrix conv_out_;
  double conv_seconds_ = 0;
  Traffic conv_fwd_traffic_;
  // What the forward keeps for the backward (the 16-bit plan's context holds fp32 copies too).
  typename chunkwise::CpPlan<chunkwise::GatherFold, backend_type, execution_space>::context_type
      ctx_;
  detail::Tensor2<Scalar> g_keep_, beta_keep_;
  Matrix x_, q_, k_, a_, b_, o_;
  std::vector<double> qn_, kn_;
  Traffic fwd_traffic_;
};

/// Gated Delta Product with head-partitioned context parallelism: `u = x·Win` is the layer's
/// input projection `[z | V | K | Q | b | a]`; the layer returns `y` and `z`, and the residual
/// gets `(y ⊙ z)·Wo`.
///
/// Packed documents under zigzag: the shared plan zigzags the whole packed stream (what the
/// chunkwise and conv layers need), while the head transposes zigzag each document
/// (`ZigzagPerSequenceLayout`). The layer then moves its input rows into the per-document order and
/// its output rows back (one all-to-all of `d_model`-wide rows each way, forward and backward),
/// reported as re-layout traffic. Activations are `Scalar`; the parameters and their gradients
/// are its compute type (fp32 for the 16-bit types), as the operator takes them.
template <class Scalar = double>
class GdpLayer {
 public:
  /// The parameters' and their gradients' type (the operator's compute type).
  using param_scalar = compute_t<Scalar>;
  /// The operator's parameters (or their gradients).
  using parameters = heads::GdpParameters<param_scalar, memory_space>;
  /// The operator's activations `[rows, channels]`.
  using matrix = detail::Tensor2<Scalar>;

  /// Collective (the transpose plans are agreed). `relayout_group` carries the re-layout.
  GdpLayer(const Group& group, const Group& relayout_group, const TokenPlan& plan,
           const StackConfig& cfg)
      : group_(group), relayout_group_(&relayout_group), cfg_(cfg) {
    const heads::GdpShape s = shape(cfg);
    heads::GdpOptions o;
    o.chunk_size = cfg.kernel_chunk;
    const std::vector<std::int64_t> cu =
        plan.cu_seqlens.size() > 2 ? plan.cu_seqlens : std::vector<std::int64_t>{};
    if (plan.zigzag && !cu.empty()) {
      const int p = group.size();
      const auto order = ZigzagPerSequenceLayout<Kokkos::HostSpace>::create(cu, p);
      std::vector<std::vector<std::int64_t>> from(p), to(p);
      for (int r = 0; r < p; ++r) {
        from[r] = plan.tokens_of(r);
        for (std::int64_t j = 0; j < order.local_length(r); ++j)
          to[r].push_back(order.global_index(r, j));
      }
      relayout_ = Relayout(relayout_group, from, to, plan.length);
      relayout_on_ = true;
    }
    head_policies.visit(cfg.head_policy, [&](auto heads) {
      using Heads = decltype(heads);
      if (plan.zigzag)
        impl_ = std::make_unique<Impl<Heads, ZigzagPerSequence>>(group, s, plan.length, cu, o);
      else
        impl_ = std::make_unique<Impl<Heads, Contiguous>>(group, s, plan.length, cu, o);
    });
  }

  /// The layer shape.
  static heads::GdpShape shape(const StackConfig& c) {
    heads::GdpShape s;
    s.nheads = static_cast<int>(c.heads);
    s.headdim = static_cast<int>(c.head_dim);
    s.ngroups = c.groups;
    s.d_state = static_cast<int>(c.head_dim);
    s.householder = c.householder;
    s.conv_width = c.conv_width;
    return s;
  }

  /// Adds the layer's weights to `w`.
  static void init(Params& w, const StackConfig& c, std::uint64_t seed) {
    const heads::GdpShape s = shape(c);
    w["gdp.Win"] = init_weight(seed + 21, c.model_dim, s.input_layout().channels());
    w["gdp.Wo"] = init_weight(seed + 22, s.d_inner(), c.model_dim, 0.5);
    w["gdp.conv_weight"] = init_weight(seed + 23, s.conv_channels(), s.conv_width, 1.0);
    w["gdp.conv_bias"] = init_weight(seed + 24, 1, s.conv_channels(), 0.1);
    w["gdp.dt_bias"] = init_weight(seed + 25, 1, s.nheads, 0.5);
    Matrix a_log(1, s.nheads);
    for (int h = 0; h < s.nheads; ++h) a_log(0, h) = -1.0 + 0.5 * uniform(seed + 26, h);
    w["gdp.a_log"] = a_log;
  }

  /// Names of the weights whose gradients the operator already sums over ranks.
  static bool reduced_by_operator(const std::string& name) {
    return name == "gdn.conv_weight" || name == "gdn.conv_bias" || name == "gdp.conv_weight" ||
           name == "gdp.conv_bias" || name == "gdp.dt_bias" || name == "gdp.a_log";
  }

  /// `x → x + (y ⊙ z)·Wo` on this rank's rows of the shared plan. Collective.
  Matrix forward(const Matrix& x, const Params& w, LayerStats& stats) {
    if (!relayout_on_) return forward_rows(x, w, stats);
    const Traffic r0 = relayout_group_->total_data_traffic();
    Matrix out = relayout_.backward(forward_rows(relayout_.forward(x), w, stats));
    stats.relayout = detail::minus(relayout_group_->total_data_traffic(), r0);
    return out;
  }

  /// Backward: gradient of the output rows → gradient of `x` (shared plan rows). Collective.
  Matrix backward(const Matrix& dy, const Params& w, Params& grads, LayerStats& stats) {
    if (!relayout_on_) return backward_rows(dy, w, grads, stats);
    const Traffic r0 = relayout_group_->total_data_traffic();
    Matrix dx = relayout_.backward(backward_rows(relayout_.forward(dy), w, grads, stats));
    const Traffic t = detail::minus(relayout_group_->total_data_traffic(), r0);
    stats.relayout.calls += t.calls;
    stats.relayout.bytes_sent += t.bytes_sent;
    stats.relayout.bytes_received += t.bytes_received;
    return dx;
  }

  /// Whether the layer re-lays out its rows (packed documents under zigzag).
  bool relayouts() const { return relayout_on_; }

  /// Policy name.
  static std::string policy_name(const StackConfig& c, bool zigzag) {
    return std::string(head_policies.is<UnevenHeads>(c.head_policy) ? "UnevenHeads" : "EvenHeads") +
           "+" + (zigzag ? "ZigzagPerSequence" : "Contiguous");
  }

 private:
  // The layer on rows in the head transposes' order.
  Matrix forward_rows(const Matrix& x, const Params& w, LayerStats& stats) {
    x_ = x;
    const heads::GdpShape s = shape(cfg_);
    const Matrix u = matmul(x, w.at("gdp.Win"));
    auto uv = detail::upload2<Scalar>(u, "ctxpar::hybrid::gdp_u");
    detail::Tensor2<Scalar> y("ctxpar::hybrid::gdp_y", x.rows, s.d_inner()),
        z("ctxpar::hybrid::gdp_z", x.rows, s.d_inner());
    parameters p;
    p.conv_weight =
        detail::upload2<param_scalar>(w.at("gdp.conv_weight"), "ctxpar::hybrid::conv_weight");
    p.conv_bias = detail::upload1<param_scalar>(w.at("gdp.conv_bias"), "ctxpar::hybrid::conv_bias");
    p.dt_bias = detail::upload1<param_scalar>(w.at("gdp.dt_bias"), "ctxpar::hybrid::dt_bias");
    p.a_log = detail::upload1<param_scalar>(w.at("gdp.a_log"), "ctxpar::hybrid::a_log");
    const Traffic t0 = group_.total_data_traffic();
    Kokkos::Timer timer;
    impl_->forward(uv, p, y, z);
    stats.forward_seconds = detail::now_fenced(timer);
    fwd_traffic_ = detail::minus(group_.total_data_traffic(), t0);
    y_ = Matrix(x.rows, s.d_inner());
    z_ = Matrix(x.rows, s.d_inner());
    detail::download(y, y_, 0);
    detail::download(z, z_, 0);
    h_ = y_;
    for (std::size_t i = 0; i < h_.data.size(); ++i) h_.data[i] *= z_.data[i];
    Matrix out = matmul(h_, w.at("gdp.Wo"));
    add_into(out, x);
    return out;
  }

  Matrix backward_rows(const Matrix& dy, const Params& w, Params& grads, LayerStats& stats) {
    const heads::GdpShape s = shape(cfg_);
    add_matmul_at(h_, dy, grads["gdp.Wo"]);
    Matrix dh(dy.rows, s.d_inner());
    add_matmul_bt(dy, w.at("gdp.Wo"), dh);
    Matrix dyy = dh, dz = dh;
    for (std::size_t i = 0; i < dh.data.size(); ++i) {
      dyy.data[i] *= z_.data[i];
      dz.data[i] *= y_.data[i];
    }
    auto dyv = detail::upload2<Scalar>(dyy, "ctxpar::hybrid::gdp_dy"),
         dzv = detail::upload2<Scalar>(dz, "ctxpar::hybrid::gdp_dz");
    detail::Tensor2<Scalar> du("ctxpar::hybrid::gdp_du", dy.rows, s.input_layout().channels());
    // The backward overwrites the parameter gradients: one set serves every call.
    if (!param_grads_) param_grads_ = parameters::allocate(s, "hybrid_grads");
    const auto& pg = *param_grads_;
    const Traffic t0 = group_.total_data_traffic();
    Kokkos::Timer timer;
    impl_->backward(dyv, dzv, du, pg);
    stats.backward_seconds = detail::now_fenced(timer);
    stats.measured = detail::minus(group_.total_data_traffic(), t0);
    stats.measured.calls += fwd_traffic_.calls;
    stats.measured.bytes_sent += fwd_traffic_.bytes_sent;
    stats.measured.bytes_received += fwd_traffic_.bytes_received;
    Matrix dum(dy.rows, s.input_layout().channels());
    detail::download(du, dum, 0);
    Matrix cw(s.conv_channels(), s.conv_width), cb(1, s.conv_channels()), dt(1, s.nheads),
        al(1, s.nheads);
    detail::download(pg.conv_weight, cw, 0);
    detail::download(pg.conv_bias, cb, 0);
    detail::download(pg.dt_bias, dt, 0);
    detail::download(pg.a_log, al, 0);
    add_into(grads["gdp.conv_weight"], cw);
    add_into(grads["gdp.conv_bias"], cb);
    add_into(grads["gdp.dt_bias"], dt);
    add_into(grads["gdp.a_log"], al);
    add_matmul_at(x_, dum, grads["gdp.Win"]);
    Matrix dx = dy;
    add_matmul_bt(dum, w.at("gdp.Win"), dx);
    formula(stats, s, dy.rows);
    return dx;
  }

  struct Base {
    virtual ~Base() = default;
    virtual void forward(const matrix& u, const parameters& p, const matrix& y,
                         const matrix& z) = 0;
    virtual void backward(const matrix& dy, const matrix& dz, const matrix& du,
                          const parameters& g) = 0;
    virtual std::int64_t input_channels(int r) const = 0;
    virtual std::int64_t output_channels(int r) const = 0;
  };
  template <class HeadPolicy, class TokenOrder>
  struct Impl : Base {
    heads::GdpContextParallel<HeadPolicy, TokenOrder, execution_space, Scalar> layer;
    heads::GdpSaved<param_scalar, memory_space> saved;  // the last forward, for its backward
    Impl(const Group& g, const heads::GdpShape& s, std::int64_t t,
         const std::vector<std::int64_t>& cu, const heads::GdpOptions& o)
        : layer(execution_space(), g, s, t, cu, o) {}
    void forward(const matrix& u, const parameters& p, const matrix& y, const matrix& z) override {
      layer.forward(u, p, y, z, saved);
    }
    void backward(const matrix& dy, const matrix& dz, const matrix& du,
                  const parameters& g) override {
      layer.backward(saved, dy, dz, du, g);
    }
    std::int64_t input_channels(int r) const override {
      return layer.input_plan().local_channels(r);
    }
    std::int64_t output_channels(int r) const override {
      return layer.output_plan().local_channels(r);
    }
  };

  // Per rank with `t_r` rows and `C_r` (`d_r`) head-parallel input (output) channels, the input
  // transpose sends `t_me·Σ_{q≠me} C_q` and receives `(T − t_me)·C_me` values; each of the two
  // output transposes (y, z) sends `(T − t_me)·d_me` and receives `t_me·(d_inner − d_me)`; the
  // backward mirrors all three; the parameter gradients are all-reduced (`n·(P−1)` each way).
  void formula(LayerStats& stats, const heads::GdpShape& s, std::int64_t rows) const {
    const int p = group_.size(), me = group_.rank();
    // Every token is a row of exactly one rank. (Not summed over the ranks here: an MPI call of
    // the tool's own inside the layer's timed backward would be neither the operator's
    // communication nor its compute.)
    const std::int64_t total_rows = cfg_.length;
    std::int64_t c_others = 0;
    for (int q = 0; q < p; ++q)
      if (q != me) c_others += impl_->input_channels(q);
    const std::int64_t c_me = impl_->input_channels(me), d_me = impl_->output_channels(me);
    const std::int64_t in_sent = rows * c_others, in_recv = (total_rows - rows) * c_me;
    const std::int64_t out_sent = (total_rows - rows) * d_me,
                       out_recv = rows * (s.d_inner() - d_me);
    const std::int64_t params = s.conv_channels() * (s.conv_width + 1) + 2 * s.nheads;
    const std::int64_t allreduce = params * (p - 1);
    // The transposes of x, y, z, dy and dz move `Scalar` values; the input gradient's transpose
    // and the all-reduce move the compute type (a 16-bit layer rounds dx once, after its
    // transpose).
    const std::int64_t value = sizeof(Scalar), wide = sizeof(param_scalar);
    stats.formula_sent =
        value * (in_sent + 2 * out_sent + 2 * out_recv) + wide * (in_recv + allreduce);
    stats.formula_received =
        value * (in_recv + 2 * out_recv + 2 * out_sent) + wide * (in_sent + allreduce);
  }

  const Group& group_;
  const Group* relayout_group_ = nullptr;
  StackConfig cfg_;
  Relayout relayout_;
  bool relayout_on_ = false;
  std::unique_ptr<Base> impl_;
  std::optional<parameters> param_grads_;
  Matrix x_, y_, z_, h_;
  Traffic fwd_traffic_;
};

}  // namespace ctxpar::cli::hybrid
