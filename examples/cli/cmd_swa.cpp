// `ctxpar swa`: streamed sliding-window attention over a whole stream of .npy tensors, context
// parallel across the ranks, checked against the same plan on one rank; and the `swa` part of
// `ctxpar demo`.
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "choice.hpp"
#include "command.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/swa/swa.hpp"
#include "json.hpp"
#include "measure.hpp"
#include "nonfinite.hpp"
#include "npy.hpp"
#include "output_dir.hpp"

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;

/// The whole stream on the host, as every rank reads it.
template <class Scalar>
struct Stream {
  std::int64_t tokens = 0, hq = 0, hkv = 0, dim = 0;
  std::vector<Scalar> q, k, v, dout;
  std::vector<std::int64_t> pos;
  std::vector<std::int32_t> ids;
};

/// Everything a streamed run produces, assembled on rank 0.
template <class Scalar>
struct StreamOutput {
  std::vector<Scalar> out, dq, dk, dv;
  std::vector<double> step_seconds;
  /// Seconds of the backward through every step (slowest rank), 0 without --backward.
  double backward_seconds = 0;
};

template <class Scalar>
ctxpar::swa::Tensor<Scalar, Mem> rows(const std::vector<Scalar>& x, std::int64_t from,
                                      std::int64_t n, std::int64_t heads, std::int64_t dim) {
  ctxpar::swa::Tensor<Scalar, Mem> t(std::string("ctxpar::cli::swa"), n, heads, dim);
  auto h = Kokkos::create_mirror_view(t);
  std::copy(x.begin() + from * heads * dim, x.begin() + (from + n) * heads * dim, h.data());
  Kokkos::deep_copy(t, h);
  return t;
}

template <class T, class View>
View vec(const std::vector<T>& x, std::int64_t from, std::int64_t n) {
  View v(std::string("ctxpar::cli::swa"), x.empty() ? 0 : n);
  auto h = Kokkos::create_mirror_view(v);
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(v.extent(0)); ++i) h(i) = x[from + i];
  Kokkos::deep_copy(v, h);
  return v;
}

template <class Scalar>
ctxpar::swa::Chunk<Scalar, Mem> chunk_of(const Stream<Scalar>& s, std::int64_t from,
                                         std::int64_t n) {
  ctxpar::swa::Chunk<Scalar, Mem> c;
  c.q = rows(s.q, from, n, s.hq, s.dim);
  c.k = rows(s.k, from, n, s.hkv, s.dim);
  c.v = rows(s.v, from, n, s.hkv, s.dim);
  c.pos = vec<std::int64_t, ctxpar::swa::Positions<Mem>>(s.pos, from, n);
  c.ids = vec<std::int32_t, ctxpar::swa::Ids<Mem>>(s.ids, from, n);
  return c;
}

/// Writes rows of `view` into `dst` at token `from` (host copy).
template <class Scalar, class View>
void place(std::vector<Scalar>& dst, const View& view, std::int64_t from) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  if (h.span() > 0)
    std::copy(h.data(), h.data() + h.span(), dst.begin() + from * view.extent(1) * view.extent(2));
}

/// Sums every rank's partial (disjoint rows, zeros elsewhere) onto rank 0: exact, x + 0 = x.
/// MPI cannot add 16-bit floats: those rows travel widened to fp32 (exact both ways).
template <class Scalar>
void reduce_rows(const ctxpar::Group& group, std::vector<Scalar>& x) {
  if constexpr (ctxpar::is_narrow_storage_v<Scalar>) {
    std::vector<float> wide(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) wide[i] = ctxpar::widen(x[i]);
    reduce_rows(group, wide);
    if (group.rank() == 0)
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = ctxpar::narrow<Scalar>(wide[i]);
    return;
  }
  MPI_Datatype type = sizeof(Scalar) == 4 ? MPI_FLOAT : MPI_DOUBLE;
  if (group.rank() == 0)
    MPI_Reduce(MPI_IN_PLACE, x.data(), static_cast<int>(x.size()), type, MPI_SUM, 0,
               group.mpi_comm());
  else
    MPI_Reduce(x.data(), nullptr, static_cast<int>(x.size()), type, MPI_SUM, 0, group.mpi_comm());
}

/// Runs `call` on every rank from a common start, fenced; returns the slowest rank's seconds.
/// With `steady`, also counts what the call allocated.
template <class F>
double timed_call(const ctxpar::Group& group, ctxpar::cli::SteadyState* steady,
                  const ctxpar::AllocationCounter* counter, F&& call) {
  const auto fenced = [&] {
    call();
    Exec().fence();
  };
  MPI_Barrier(group.mpi_comm());
  const double start = MPI_Wtime();
  if (steady != nullptr)
    steady->counted(*counter, fenced);
  else
    fenced();
  double mine = MPI_Wtime() - start, slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, group.mpi_comm());
  return slowest;
}

/// Streams the whole input in steps of `step` tokens with the carried cache, sharded across
/// `group`, forward (and backward through every step when asked). One plan serves every step and
/// every run; each step keeps its cache, state, output and gradients between runs, so a repeated
/// run (--repeat) allocates nothing. Collective.
template <class Scalar, class Policy, class Layout>
class StreamRunner {
 public:
  StreamRunner(const ctxpar::Group& group, const Stream<Scalar>& s,
               const ctxpar::swa::Options& options)
      : plan_(Exec(), group, {s.hq, s.hkv, s.dim}, options) {}

  /// Whether each forward posts the next step's all-gather (`--overlap`; the all-gather policies
  /// under `SegmentChunks` only).
  void post_next(bool on) { post_next_ = on && can_post; }

  /// One run over the stream. With `steady`, counts what the operator calls allocate.
  StreamOutput<Scalar> run(const ctxpar::Group& group, const Stream<Scalar>& s, std::int64_t step,
                           bool backward, ctxpar::cli::SteadyState* steady = nullptr,
                           const ctxpar::AllocationCounter* counter = nullptr) {
    const int p = group.size(), me = group.rank();
    const std::int64_t qsize = s.tokens * s.hq * s.dim, ksize = s.tokens * s.hkv * s.dim;
    const std::size_t steps = static_cast<std::size_t>((s.tokens + step - 1) / step);
    if (caches_.empty()) {
      caches_.resize(steps + 1);
      caches_[0] = ctxpar::swa::empty_cache<Scalar, Mem>(s.hkv, s.dim);
      states_.resize(steps);
      outs_.resize(steps);
      grads_.resize(steps);
    }
    StreamOutput<Scalar> o;
    o.out.assign(qsize, Scalar{});
    std::vector<std::int64_t> froms;
    // This rank's shard of the step starting at token `from`.
    const auto shard_at = [&](std::int64_t from) {
      const ctxpar::BalancedChunks split{std::min(step, s.tokens - from), p};
      return chunk_of(s, from + split.begin(me), split.size(me));
    };
    // With --overlap the next step's shard exists before this step's forward, which posts its
    // gather.
    ctxpar::swa::Chunk<Scalar, Mem> upcoming;
    bool posted = false;
    for (std::int64_t from = 0, k = 0; from < s.tokens; from += step, ++k) {
      const std::int64_t t = std::min(step, s.tokens - from);
      const ctxpar::BalancedChunks split{t, p};
      const auto chunk = posted ? upcoming : shard_at(from);
      posted = post_next_ && from + step < s.tokens;
      if (posted) upcoming = shard_at(from + step);
      // The caller's outputs: allocated on the first run, reused by the repeats.
      if (outs_[k].extent(1) == 0)
        outs_[k] = ctxpar::swa::allocate_output<Scalar, Mem>(plan_.shape(), split.size(me));
      o.step_seconds.push_back(timed_call(group, steady, counter, [&] {
        if constexpr (can_post) {
          if (posted) {
            plan_.forward(chunk, caches_[k], outs_[k], caches_[k + 1], states_[k], upcoming);
            return;
          }
        }
        plan_.forward(chunk, caches_[k], outs_[k], caches_[k + 1], states_[k]);
      }));
      place(o.out, outs_[k], from + split.begin(me));
      froms.push_back(from + split.begin(me));
    }
    reduce_rows(group, o.out);
    if (!backward) return o;
    o.dq.assign(qsize, Scalar{});
    o.dk.assign(ksize, Scalar{});
    o.dv.assign(ksize, Scalar{});
    ctxpar::swa::CacheGradient<Scalar, Mem> carried;
    for (std::size_t k = steps; k-- > 0;) {
      const auto n = static_cast<std::int64_t>(states_[k].q_rot.extent(0));
      const auto dout = rows(s.dout, froms[k], n, s.hq, s.dim);
      auto& g = grads_[k];
      if (g.dq.extent(1) == 0) g = ctxpar::swa::allocate_gradients(plan_.shape(), states_[k]);
      o.backward_seconds +=
          timed_call(group, steady, counter, [&] { plan_.backward(states_[k], dout, carried, g); });
      place(o.dq, g.dq, froms[k]);
      place(o.dk, g.dk, froms[k]);
      place(o.dv, g.dv, froms[k]);
      carried.dk = g.dk_cache;
      carried.dv = g.dv_cache;
    }
    reduce_rows(group, o.dq);
    reduce_rows(group, o.dk);
    reduce_rows(group, o.dv);
    return o;
  }

 private:
  static constexpr bool can_post = !std::is_same_v<Policy, ctxpar::swa::HaloKV> &&
                                   std::is_same_v<Layout, ctxpar::swa::SegmentChunks>;
  bool post_next_ = false;
  ctxpar::swa::StepPlan<Policy, Layout, Exec, Scalar, Mem> plan_;
  std::vector<ctxpar::swa::Cache<Scalar, Mem>> caches_;  // caches_[k]: the input of step k
  std::vector<ctxpar::swa::DistributedState<Scalar, Mem>> states_;
  std::vector<ctxpar::swa::Tensor<Scalar, Mem>> outs_;
  std::vector<ctxpar::swa::StepGradients<Scalar, Mem>> grads_;
};

/// The same stream on this rank alone: the plan on a one-rank group (`MPI_COMM_SELF`), the
/// single-rank use of the operator.
template <class Scalar>
StreamOutput<Scalar> single_run(const Stream<Scalar>& s, std::int64_t step,
                                const ctxpar::swa::Options& options, bool backward) {
  const ctxpar::Group self(MPI_COMM_SELF);
  StreamRunner<Scalar, ctxpar::swa::RopeBeforeGather, ctxpar::swa::SegmentChunks> runner(self, s,
                                                                                         options);
  return runner.run(self, s, step, backward);
}

/// A stored value as a double (exact for every storage type).
template <class Scalar>
double wide(Scalar x) {
  return static_cast<double>(ctxpar::widen(x));
}

/// Largest |a - b| / (1 + |b|) over two arrays (0 for empty ones).
template <class Scalar>
double max_relative(const std::vector<Scalar>& a, const std::vector<Scalar>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    worst = std::max(worst, std::fabs(wide(a[i]) - wide(b[i])) / (1.0 + std::fabs(wide(b[i]))));
  return worst;
}

template <class Scalar>
bool bitwise(const std::vector<Scalar>& a, const std::vector<Scalar>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(Scalar)) == 0);
}

/// Calls `f(policy_tag, layout_tag)` with the tags of `policy` (an index into
/// `cli::swa_policies`) and `layout` (into `cli::swa_kv_layouts`).
template <class F>
void with_policy(int policy, int layout, F&& f) {
  ctxpar::cli::swa_policies.visit(policy, [&](auto policy_tag) {
    ctxpar::cli::swa_kv_layouts.visit(layout, [&](auto layout_tag) { f(policy_tag, layout_tag); });
  });
}

/// One run of the stream under `policy` and `layout` on a fresh plan.
template <class Scalar>
StreamOutput<Scalar> run_policy(int policy, int layout, const ctxpar::Group& group,
                                const Stream<Scalar>& s, std::int64_t step,
                                const ctxpar::swa::Options& o, bool backward) {
  StreamOutput<Scalar> result;
  with_policy(policy, layout, [&](auto policy_tag, auto layout_tag) {
    StreamRunner<Scalar, decltype(policy_tag), decltype(layout_tag)> runner(group, s, o);
    result = runner.run(group, s, step, backward);
  });
  return result;
}

template <class Scalar>
int run_typed(const ctxpar::Group& group, ctxpar::cli::OutputDir& out_dir, const std::string& in,
              std::int64_t window, std::int64_t step, int policy, int layout, int kernels,
              double base, bool backward, bool check, int repeat, bool overlap) {
  // What the plans will agree on (CTXPAR_HOST_ISA is checked here, before any file is read).
  const std::string host_isa = ctxpar::host_isa_name(ctxpar::agreed_host_isa(group, "ctxpar swa"));
  Stream<Scalar> s;
  // Qualified calls, no block-scope using-declaration: hipcc (clang) otherwise treats the results
  // as dependent inside this template and rejects `q.values<Scalar>`.
  const auto q = ctxpar::cli::read_npy(in + "/q.npy");
  const auto k = ctxpar::cli::read_npy(in + "/k.npy");
  const auto v = ctxpar::cli::read_npy(in + "/v.npy");
  for (const auto* file : {&q, &k}) {
    const std::string name = in + (file == &q ? "/q.npy" : "/k.npy");
    ctxpar::require_local(file->rank() == 3, "ctxpar swa", name + " must be [T, heads, D]",
                          "3 dimensions", ctxpar::cli::NpyArray::shape_text(file->shape()));
    // An empty stream or a zero-sized head is refused here, by file: the operator would only
    // report an inconsistent section or write empty outputs.
    ctxpar::require_local(file->extent(0) >= 1 && file->extent(1) >= 1 && file->extent(2) >= 1,
                          "ctxpar swa", name + ": every dimension must be at least 1",
                          "T, heads, D >= 1", ctxpar::cli::NpyArray::shape_text(file->shape()));
  }
  s.tokens = q.extent(0);
  s.hq = q.extent(1);
  s.hkv = k.extent(1);
  s.dim = q.extent(2);
  ctxpar::require_local(s.hq % s.hkv == 0, "ctxpar swa",
                        in + "/q.npy's heads must be a multiple of " + in + "/k.npy's heads",
                        "a multiple of " + std::to_string(s.hkv), s.hq);
  k.require_shape({s.tokens, s.hkv, s.dim}, in + "/k.npy");
  v.require_shape({s.tokens, s.hkv, s.dim}, in + "/v.npy");
  // q.npy sets the dtype: another file that differs is named together with q.npy.
  const std::string same = " (which must have the dtype of q.npy)";
  s.q = q.values<Scalar>(in + "/q.npy");
  s.k = k.values<Scalar>(in + "/k.npy" + same);
  s.v = v.values<Scalar>(in + "/v.npy" + same);
  namespace fs = std::filesystem;
  if (fs::exists(in + "/pos.npy")) {
    const auto pos = ctxpar::cli::read_npy(in + "/pos.npy");
    pos.require_shape({s.tokens}, in + "/pos.npy");
    for (auto x : pos.values<std::int32_t>(in + "/pos.npy")) s.pos.push_back(x);
  } else {
    for (std::int64_t i = 0; i < s.tokens; ++i) s.pos.push_back(i);
  }
  if (fs::exists(in + "/seq.npy")) {
    const auto seq = ctxpar::cli::read_npy(in + "/seq.npy");
    seq.require_shape({s.tokens}, in + "/seq.npy");
    s.ids = seq.values<std::int32_t>(in + "/seq.npy");
  }
  const bool given_dout = fs::exists(in + "/dout.npy");
  if (given_dout) {
    const auto d = ctxpar::cli::read_npy(in + "/dout.npy");
    d.require_shape({s.tokens, s.hq, s.dim}, in + "/dout.npy");
    s.dout = d.values<Scalar>(in + "/dout.npy" + same);
  } else {
    s.dout.assign(s.q.size(), ctxpar::narrow<Scalar>(1.0));
  }
  // A step of at least the stream is the whole stream in one step, and a window wider than every
  // position difference is unlimited: clamped here, so that no arithmetic sees an extreme value
  // (from + step, position + window near INT64_MAX).
  if (step == 0 || step > s.tokens) step = s.tokens;
  const auto [lo, hi] = std::minmax_element(s.pos.begin(), s.pos.end());
  ctxpar::swa::Options o;
  o.window = window > std::int64_t(*hi) - *lo ? 0 : window;
  o.rope_base = base;
  o.kernels =
      ctxpar::cli::swa_kernel_choices.visit(kernels, [](auto tag) { return decltype(tag)::value; });
  StreamOutput<Scalar> result;
  ctxpar::cli::Json traffic;
  ctxpar::cli::SteadyState steady;
  steady.repeat = repeat;
  with_policy(policy, layout, [&](auto policy_tag, auto layout_tag) {
    StreamRunner<Scalar, decltype(policy_tag), decltype(layout_tag)> runner(group, s, o);
    runner.post_next(overlap);
    group.reset_traffic();
    result = runner.run(group, s, step, backward);
    traffic = ctxpar::cli::gather_traffic(group);
    // --repeat: the same stream again on the same plan and state, the first run being the
    // warm-up.
    if (repeat > 0) {
      ctxpar::AllocationCounter counter;
      for (int r = 0; r < repeat; ++r) {
        const auto again = runner.run(group, s, step, backward, &steady, &counter);
        double forward = 0;
        for (double x : again.step_seconds) forward += x;
        steady.add(forward, again.backward_seconds);
      }
    }
  });
  const ctxpar::cli::Json steady_json = steady.to_json(group);
  const ctxpar::cli::Json peak_rss =
      ctxpar::cli::gather_counts(group, ctxpar::cli::peak_rss_bytes());
  using ctxpar::cli::NpyArray;
  out_dir.add("out.npy", NpyArray::from_values({s.tokens, s.hq, s.dim}, result.out));
  if (backward) {
    out_dir.add("dq.npy", NpyArray::from_values({s.tokens, s.hq, s.dim}, result.dq));
    out_dir.add("dk.npy", NpyArray::from_values({s.tokens, s.hkv, s.dim}, result.dk));
    out_dir.add("dv.npy", NpyArray::from_values({s.tokens, s.hkv, s.dim}, result.dv));
  }
  ctxpar::cli::Json summary = ctxpar::cli::Json::object();
  summary["command"] = "swa";
  summary["ranks"] = group.size();
  summary["tokens"] = s.tokens;
  summary["q_heads"] = s.hq;
  summary["kv_heads"] = s.hkv;
  summary["head_dim"] = s.dim;
  summary["window"] = window;
  summary["chunk"] = step;
  summary["policy"] = ctxpar::cli::swa_policies.name(policy);
  summary["overlap"] = overlap;
  summary["layout"] = ctxpar::cli::swa_kv_layouts.name(layout);
  summary["kernels"] = ctxpar::cli::swa_kernel_choices.name(kernels);
  summary["rope_base"] = base;
  summary["dtype"] = ctxpar::cli::dtype_name(ctxpar::cli::dtype_of<Scalar>());
  summary["host_isa"] = host_isa;
  summary["backward"] = backward;
  summary["dout"] = given_dout ? "dout.npy" : "ones";
  ctxpar::cli::Json seconds = ctxpar::cli::Json::array();
  double total = 0;
  for (double x : result.step_seconds) {
    seconds.push_back(x);
    total += x;
  }
  summary["steps"] = static_cast<std::int64_t>(result.step_seconds.size());
  summary["forward_seconds_per_step"] = seconds;
  summary["forward_seconds_total"] = total;
  if (backward) summary["backward_seconds_total"] = result.backward_seconds;
  summary["peak_rss_bytes"] = peak_rss;
  if (repeat > 0) summary["steady_state"] = steady_json;
  summary["traffic_per_rank"] = traffic;
  bool ok = true;
  if (check && group.rank() == 0) {
    const auto single = single_run(s, step, o, backward);
    ctxpar::cli::Json c = ctxpar::cli::Json::object();
    // Bitwise equality already requires the same NaN/Inf pattern in the output; the gradients,
    // compared by their difference, must have the same pattern too (a NaN difference would
    // otherwise hide in the maximum).
    ctxpar::cli::NonFinite out_nf, grad_nf;
    out_nf.add(result.out, single.out);
    if (backward) {
      grad_nf.add(result.dq, single.dq);
      grad_nf.add(result.dk, single.dk);
      grad_nf.add(result.dv, single.dv);
    }
    c["out_nonfinite"] = out_nf.in_result;
    c["gradients_nonfinite"] = grad_nf.in_result;
    c["gradients_nonfinite_pattern_equal"] = grad_nf.same_pattern();
    c["out_bitwise_equal"] = bitwise(result.out, single.out);
    c["out_max_relative_difference"] = max_relative(result.out, single.out);
    if (backward) {
      c["dq_max_relative_difference"] = max_relative(result.dq, single.dq);
      c["dk_max_relative_difference"] = max_relative(result.dk, single.dk);
      c["dv_max_relative_difference"] = max_relative(result.dv, single.dv);
    }
    summary["check_against_single_rank"] = c;
    ok = bitwise(result.out, single.out) && grad_nf.same_pattern();
    summary["passed"] = ok;
  }
  out_dir.add("summary.json", summary);
  out_dir.commit();
  if (group.rank() == 0) {
    summary.dump(std::cout, 2);
    std::cout << "\n";
    if (!ok)
      std::cerr << "ctxpar swa: the distributed result differs from the single-rank one (see "
                << out_dir.path() << "/summary.json)" << std::endl;
  }
  int verdict = ok ? 0 : 1;
  MPI_Bcast(&verdict, 1, MPI_INT, 0, group.mpi_comm());
  return verdict;
}

int run_swa(const ctxpar::cli::Args& args, const ctxpar::Group& group) {
  const auto in = args.get<std::string>("in");
  const auto out = args.get<std::string>("out");
  const auto window = args.get<std::int64_t>("window", 0);
  const auto step = args.get<std::int64_t>("chunk", 0);
  const auto base = args.get<double>("rope-base", 10000.0);
  args.require("chunk", step >= 0, "the step must be >= 0 (0: the whole stream in one step)",
               ">= 0", step);
  args.require("rope-base", base > 0, "the RoPE base must be positive", "> 0", base);
  const bool backward = args.has("backward");
  const bool check = !args.has("no-check");
  const int repeat = args.get_in<int>("repeat", 0, 0, 1000000);
  const int policy = ctxpar::cli::choose(args, "policy", ctxpar::cli::swa_policies, "allgather");
  const int layout = ctxpar::cli::choose(args, "layout", ctxpar::cli::swa_kv_layouts, "segments");
  const int kernels =
      ctxpar::cli::choose(args, "kernels", ctxpar::cli::swa_kernel_choices, "automatic");
  if (window < 0)
    throw ctxpar::cli::UsageError("ctxpar swa", -1, "--window must be >= 0", ">= 0",
                                  std::to_string(window));
  const bool overlap = args.has("overlap");
  if (overlap && (ctxpar::cli::swa_policies.is<ctxpar::swa::HaloKV>(policy) ||
                  !ctxpar::cli::swa_kv_layouts.is<ctxpar::swa::SegmentChunks>(layout)))
    throw ctxpar::cli::UsageError(
        "ctxpar swa", -1,
        "--overlap posts the next step's all-gather: it needs an all-gather policy and segment "
        "shards",
        "--policy allgather or rope-after with --layout segments",
        std::string("--policy ") + ctxpar::cli::swa_policies.name(policy) + " --layout " +
            ctxpar::cli::swa_kv_layouts.name(layout));
  ctxpar::cli::OutputDir out_dir(group, "ctxpar swa", out);
  const auto q = ctxpar::cli::read_npy(in + "/q.npy");
  ctxpar::require_local(q.dtype() != ctxpar::cli::Dtype::int32, "ctxpar swa",
                        in + "/q.npy must be float32, float64, float16 or bfloat16",
                        "'<f4', '<f8', '<f2' or '<u2' (bfloat16 bit patterns)",
                        ctxpar::cli::descr(q.dtype()));
  if (q.dtype() == ctxpar::cli::Dtype::float64)
    return run_typed<double>(group, out_dir, in, window, step, policy, layout, kernels, base,
                             backward, check, repeat, overlap);
  if (q.dtype() == ctxpar::cli::Dtype::float16)
    return run_typed<ctxpar::float16>(group, out_dir, in, window, step, policy, layout, kernels,
                                      base, backward, check, repeat, overlap);
  if (q.dtype() == ctxpar::cli::Dtype::bfloat16)
    return run_typed<ctxpar::bfloat16>(group, out_dir, in, window, step, policy, layout, kernels,
                                       base, backward, check, repeat, overlap);
  return run_typed<float>(group, out_dir, in, window, step, policy, layout, kernels, base, backward,
                          check, repeat, overlap);
}

/// The demo: a packed stream of 64 tokens (two documents, positions with gaps) in 13 steps of
/// 5 with a window of 9, through each policy across the ranks, against the single-rank stream:
/// the forward bitwise, the gradients of the whole stream within a few ulps of fp64.
bool demo_swa(const ctxpar::Group& group, std::ostream& report) {
  Stream<double> s;
  s.tokens = 64;
  s.hq = 4;
  s.hkv = 2;
  s.dim = 16;
  auto fill = [](std::vector<double>& x, std::size_t n, double seed) {
    for (std::size_t i = 0; i < n; ++i) x.push_back(std::sin(seed * (i + 1) + 0.3 * seed));
  };
  fill(s.q, s.tokens * s.hq * s.dim, 1.3);
  fill(s.k, s.tokens * s.hkv * s.dim, 2.1);
  fill(s.v, s.tokens * s.hkv * s.dim, 0.7);
  fill(s.dout, s.tokens * s.hq * s.dim, 1.9);
  for (std::int64_t i = 0; i < s.tokens; ++i) {
    s.pos.push_back(3 + 2 * i);
    s.ids.push_back(i < 40 ? 1 : 2);
  }
  ctxpar::swa::Options o;
  o.window = 9;
  const std::int64_t step = 5;
  const auto single = single_run(s, step, o, true);
  bool ok = true;
  const int segments = ctxpar::cli::swa_kv_layouts.index("segments");
  for (int policy = 0; policy < ctxpar::cli::swa_policies.size(); ++policy) {
    const auto r = run_policy(policy, segments, group, s, step, o, true);
    if (group.rank() != 0) continue;
    const bool same = bitwise(r.out, single.out);
    const double dg = std::max({max_relative(r.dq, single.dq), max_relative(r.dk, single.dk),
                                max_relative(r.dv, single.dv)});
    const bool good = same && dg < 1e-12;
    ok = ok && good;
    report << "swa " << ctxpar::cli::swa_policies.name(policy)
           << ": 64 tokens in 13 streamed steps on " << group.size()
           << " rank(s), W = 9, 2 documents: forward "
           << (same ? "bitwise equal to" : "DIFFERS from")
           << " the single-rank stream, gradients max relative difference " << dg
           << (good ? " (ok)" : " (FAIL)") << "\n";
  }
  return ok;
}

}  // namespace

CTXPAR_CLI_COMMAND(
    "swa", "streamed sliding-window attention over .npy tensors, context parallel across the ranks",
    "--in DIR --out DIR [--window W] [--chunk t] [--policy allgather|rope-after|halo]\n"
    "    [--layout segments|whole-axis] [--kernels K] [--rope-base B] [--backward] [--no-check]\n"
    "    [--repeat N] [--overlap]\n\n"
    "options [default]:\n"
    "  --in DIR         directory of the input files below (required)\n"
    "  --out DIR        output directory, created if absent (required)\n"
    "  --window W       sliding window in tokens, 0 = unlimited [0]\n"
    "  --chunk t        tokens per streamed step, >= 0; 0 = the whole stream in one step [0]\n"
    "  --policy P       allgather (RoPE before the gather), rope-after or halo [allgather]\n"
    "  --layout L       segments or whole-axis shards of each step [segments]\n"
    "  --kernels K      automatic, portable, host-fused, host-unfused or tensor-core (float as\n"
    "                   TF32; the host spaces emulate the warp: a test, not speed) [automatic]\n"
    "  --rope-base B    RoPE base, finite and > 0 [10000]\n"
    "  --backward       also the gradients, through every step [off]\n"
    "  --no-check       skip the single-rank check on rank 0 [check]\n"
    "  --repeat N       N more runs after the checked one (its warm-up): summary.json's\n"
    "                   steady_state has each rank's fastest forward and backward and what\n"
    "                   the operator calls allocated in them [0]\n"
    "  --overlap        each step's forward posts the next step's all-gather before its\n"
    "                   attention (allgather or rope-after, segments); same results [off]\n\n"
    "input files in --in (C order, little-endian):\n"
    "  q.npy      [T, Hq, D]   float32, float64, float16 ('<f2') or bfloat16 (its bit patterns\n"
    "                          as '<u2'); sets the dtype of k, v, dout and of the outputs\n"
    "  k.npy      [T, Hkv, D]  Hq a multiple of Hkv\n"
    "  v.npy      [T, Hkv, D]\n"
    "  pos.npy    [T] int32    optional: RoPE positions [0, 1, ..., T-1]\n"
    "  seq.npy    [T] int32    optional: sequence ids of packed documents [one sequence]\n"
    "  dout.npy   [T, Hq, D]   optional: gradient of out for --backward [ones]\n\n"
    "output files in --out (written by rank 0 after the run):\n"
    "  out.npy [T, Hq, D]; with --backward dq.npy [T, Hq, D], dk.npy and dv.npy [T, Hkv, D]\n"
    "  (dtype of q); summary.json: sizes, times per step, traffic and peak memory per rank, the\n"
    "  check:\n"
    "  the forward must be bitwise equal to the single-rank stream\n"
    "\n"
    "exit status: 0 the run passed its check; 1 the distributed result differs from the "
    "single-rank\n"
    "one (outputs are still written, with the verdict in the summary); 2 a bad option or input "
    "file,\n"
    "named in the message (nothing is written). Non-finite inputs are propagated as the "
    "single-rank\n"
    "operator propagates them: the check passes only when NaN/Inf appear in the same elements of\n"
    "both results, and the summary counts them.\n",
    run_swa)
CTXPAR_CLI_DEMO_PART("swa", demo_swa)
