// `ctxpar hybrid`: a small hybrid long-context stack over one sequence sharded across the ranks —
// sliding-window attention (streamed in chunks with its carried cache), Gated DeltaNet (chunkwise
// summary CP) and Gated Delta Product (head-partitioned CP) — sharing one token plan, with a loss,
// forward and backward, and a few SGD steps. Every layer output and every gradient is compared
// with the same stack run on one rank (each process runs it on MPI_COMM_SELF over the whole
// sequence and compares its own rows). `--dtype` picks the operators' data type (fp64, or bf16 /
// fp16 storage with fp32 arithmetic); the glue between them is fp64 either way.
#include <malloc.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "choice.hpp"
#include "command.hpp"
#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/preconditions.hpp"
#include "hybrid/host_math.hpp"
#include "hybrid/layers.hpp"
#include "hybrid/phase_clock.hpp"
#include "hybrid/reference_files.hpp"
#include "hybrid/token_plan.hpp"
#include "json.hpp"
#include "measure.hpp"

namespace {

using namespace ctxpar::cli::hybrid;
using ctxpar::Group;
using ctxpar::cli::Json;

// The operators' data types `--dtype` offers (the glue is fp64 host code in every case).
constexpr ctxpar::cli::Choices operator_dtypes{ctxpar::cli::Named<double>{"float64"},
                                               ctxpar::cli::Named<ctxpar::bfloat16>{"bfloat16"},
                                               ctxpar::cli::Named<ctxpar::float16>{"float16"}};

struct Settings {
  StackConfig stack;
  int dtype = 0;  // --dtype: an index into operator_dtypes
  bool zigzag = false;
  int documents = 1;
  int steps = 3;
  double lr = 0.5;
  std::string json;
  bool progress = true;
  int perturb_rank =
      -1;  // test hook: corrupt one GDN output value on this rank (distributed run only)
  std::string save_reference;  // P = 1: write the run's values here (the reference job)
  std::string reference;       // compare with the values a P = 1 run saved here
  int repeat = 0;              // --repeat: stack calls on the same layers after the steps
};

// Everything one forward + backward of the stack produced on this rank.
struct RunOutput {
  Matrix x1, x2, x3, dx0, dx1, dx2;  // this rank's rows of each layer output / input gradient
  Params grads;                      // gradients of every weight, summed over ranks
  double loss = 0;
  LayerStats layers[3];
};

Matrix input_rows(const std::vector<std::int64_t>& tokens, std::int64_t width) {
  Matrix x(static_cast<std::int64_t>(tokens.size()), width);
  for (std::int64_t j = 0; j < x.rows; ++j)
    for (std::int64_t c = 0; c < width; ++c)
      x(j, c) =
          uniform(7, static_cast<std::uint64_t>(tokens[static_cast<std::size_t>(j)] * width + c));
  return x;
}

// Time and calls inside communication on `group`, as the library's counters record them around
// their MPI calls: its data collectives and its agreements (the precondition verdicts of plans and
// checked collectives, where ranks wait for each other as much as in a data collective).
ctxpar::Traffic communication(const Group& group) {
  ctxpar::Traffic t = group.total_data_traffic();
  const ctxpar::Traffic& agreed = group.traffic(ctxpar::CollectiveKind::agreement);
  t.calls += agreed.calls;
  t.seconds += agreed.seconds;
  return t;
}

// The tool's own sums over ranks (the loss, the weight gradients the operators leave partial, and
// the checks below) call MPI directly, outside any layer's timed call: they are in no phase.
void allreduce_sum(const Group& group, Matrix& m) {
  MPI_Allreduce(MPI_IN_PLACE, m.data.data(), static_cast<int>(m.data.size()), MPI_DOUBLE, MPI_SUM,
                group.mpi_comm());
}

// The three layers, built once (collectively, in this order) and called for every step and
// repetition: their operator plans, contexts and kept outputs serve every call. `relayout` is the
// group of the demo's own re-layouts (its counters share the original's). The operators' data
// are `Scalar`.
template <class Scalar>
struct Stack {
  Group relayout;
  SwaLayer<Scalar> swa;
  GdnLayer<Scalar> gdn;
  GdpLayer<Scalar> gdp;
  Stack(const Group& group, const Group& relayout_group, const TokenPlan& plan,
        const StackConfig& cfg)
      : relayout(relayout_group),
        swa(group, relayout_group, plan, cfg),
        gdn(group, plan, cfg),
        gdp(group, relayout_group, plan, cfg) {}
};

// The unit roundoff of the checks' bounds for operator data of `Scalar`: fp32's (the arithmetic
// of the summaries crossing ranks, docs/chunkwise.md §1) for fp64 data; the storage's own for the
// 16-bit types, whose every layer output is rounded to it once (a rounding that falls to the other
// neighbour in one run moves a value by one ulp, 2u relative, and then travels like an fp32
// difference).
template <class Scalar>
constexpr double check_roundoff() {
  if constexpr (std::is_same_v<Scalar, ctxpar::bfloat16>) return 0x1p-8;
  if constexpr (std::is_same_v<Scalar, ctxpar::float16>) return 0x1p-11;
  return 0x1p-24;
}

// One forward + backward of `stack`. With `counter`, each layer's allocations by label go to its
// `LayerStats::allocation_labels`.
template <class Scalar>
RunOutput run_stack(Stack<Scalar>& stack, const Group& group, const TokenPlan& plan,
                    const StackConfig& cfg, const Params& w, int perturb_rank = -1,
                    const ctxpar::AllocationCounter* counter = nullptr) {
  RunOutput out;
  const Matrix x0 = input_rows(plan.tokens_of(group.rank()), cfg.model_dim);
  SwaLayer<Scalar>& swa = stack.swa;
  GdnLayer<Scalar>& gdn = stack.gdn;
  GdpLayer<Scalar>& gdp = stack.gdp;
  // Phase clocks around each layer call (the layers' own barriers-free wall time on this rank).
  // Communication is what the two groups' counters gained: the operators' on `group`, the
  // re-layouts' (whose MPI time is part of `relayout`) on `stack.relayout`.
  auto timed = [&](int l, auto&& f) {
    Kokkos::fence();
    const auto labels0 = counter ? counter->labels() : std::map<std::string, std::int64_t>{};
    const ctxpar::Traffic comm0 = communication(group), moved0 = communication(stack.relayout);
    const double st0 = PhaseClock::staging, re0 = PhaseClock::relayout, gl0 = PhaseClock::glue;
    Kokkos::Timer t;
    auto result = f();
    Kokkos::fence();
    const double total = t.seconds();
    const ctxpar::Traffic comm = detail::minus(communication(group), comm0),
                          moved = detail::minus(communication(stack.relayout), moved0);
    LayerStats& st = out.layers[l];
    st.total_seconds += total;
    st.comm_seconds += comm.seconds;
    st.relayout_seconds += PhaseClock::relayout - re0;
    st.staging_seconds += PhaseClock::staging - st0;
    st.glue_seconds += PhaseClock::glue - gl0;
    st.mpi_calls += comm.calls + moved.calls;
    st.work_seconds += total - (comm.seconds + moved.seconds);
    if (counter)
      for (const auto& [label, n] : counter->labels()) {
        const auto before = labels0.find(label);
        const std::int64_t added = n - (before == labels0.end() ? 0 : before->second);
        if (added > 0) st.allocation_labels[label] += added;
      }
    return result;
  };
  // What each forward leaves resident for the backward (its output is counted with it).
  auto held = [&](int l, auto&& f) {
    const std::int64_t before = ctxpar::cli::current_rss_bytes();
    auto result = timed(l, f);
    out.layers[l].held_bytes += ctxpar::cli::current_rss_bytes() - before;
    return result;
  };
  out.x1 = held(0, [&] { return swa.forward(x0, w, out.layers[0]); });
  out.x2 = held(1, [&] { return gdn.forward(out.x1, w, out.layers[1]); });
  // The corruption scales with the checks' roundoff, so it is as far outside their bounds (about
  // 40 times at fp64 data) for every data type.
  if (group.rank() == perturb_rank && out.x2.rows > 0)
    out.x2(out.x2.rows - 1, 0) += 1e-3 * check_roundoff<Scalar>() / 0x1p-24;
  out.x3 = held(2, [&] { return gdp.forward(out.x2, w, out.layers[2]); });
  // loss = ½·Σ|x3|² / L over all tokens.
  double local = 0;
  for (double v : out.x3.data) local += 0.5 * v * v / static_cast<double>(plan.length);
  MPI_Allreduce(&local, &out.loss, 1, MPI_DOUBLE, MPI_SUM, group.mpi_comm());
  Matrix dx3 = out.x3;
  for (double& v : dx3.data) v /= static_cast<double>(plan.length);
  for (const auto& kv : w) out.grads[kv.first] = Matrix(kv.second.rows, kv.second.cols);
  out.dx2 = timed(2, [&] { return gdp.backward(dx3, w, out.grads, out.layers[2]); });
  out.dx1 = timed(1, [&] { return gdn.backward(out.dx2, w, out.grads, out.layers[1]); });
  out.dx0 = timed(0, [&] { return swa.backward(out.dx1, w, out.grads, out.layers[0]); });
  for (auto& kv : out.grads)
    if (!GdpLayer<>::reduced_by_operator(kv.first)) allreduce_sum(group, kv.second);
  return out;
}

// The whole stack built for this one call (the in-process single-rank reference).
template <class Scalar>
RunOutput run_stack(const Group& group, const Group& relayout, const TokenPlan& plan,
                    const StackConfig& cfg, const Params& w) {
  Stack<Scalar> stack(group, relayout, plan, cfg);
  return run_stack(stack, group, plan, cfg, w);
}

// One comparison of this rank's values against the single-rank run.
struct Check {
  std::string what;
  double error = 0, bound = 0;
  bool ok = true;
};

double max_abs(const Matrix& m) {
  double s = 0;
  for (double v : m.data) s = std::max(s, std::fabs(v));
  return s;
}

// Summaries cross ranks in fp32 (docs/chunkwise.md §1, "Storage"), so everything downstream of the
// chunkwise layer's forward — and every gradient, which flows back through it — can differ from
// the single-rank run by fp32 rounding of the incoming states, amplified by at most the P − 1
// compositions each state goes through and the layers after it: bound = 64·P·u32·max|ref|.
// With 16-bit operator data u is the storage's (`check_roundoff`).
// The sliding-window layer's forward is bitwise identical by design (same key tiles and order),
// so in the first step, before any weight update has carried fp32-level differences into the
// weights, its output gets fp64 rounding only. `ref` holds the single-rank run's values of this
// rank's rows, in the same order as `got`; max|ref| is taken over every rank's rows.
// The largest |got - ref|, +Inf when either holds a NaN or an Inf (std::max would drop a NaN, and
// an Inf in the reference would also make the bound infinite): a non-finite value fails a check.
double max_difference(const Matrix& got, const Matrix& ref) {
  double e = 0;
  for (std::size_t i = 0; i < got.data.size(); ++i) {
    const double d = std::fabs(got.data[i] - ref.data[i]);
    if (!std::isfinite(got.data[i]) || !std::isfinite(ref.data[i]) || !std::isfinite(d))
      return std::numeric_limits<double>::infinity();
    e = std::max(e, d);
  }
  return e;
}

Check compare_rows(const Group& group, const std::string& what, const Matrix& got,
                   const Matrix& ref, bool fp64_only, double roundoff) {
  Check c;
  c.what = what;
  c.error = max_difference(got, ref);
  const double u = fp64_only ? std::ldexp(1.0, -53) : roundoff;
  double scale = max_abs(ref);
  MPI_Allreduce(MPI_IN_PLACE, &scale, 1, MPI_DOUBLE, MPI_MAX, group.mpi_comm());
  c.bound = 64.0 * group.size() * u * scale;
  MPI_Allreduce(MPI_IN_PLACE, &c.error, 1, MPI_DOUBLE, MPI_MAX, group.mpi_comm());
  c.ok = c.error <= c.bound && std::isfinite(c.error) && std::isfinite(c.bound);
  return c;
}

Check compare_all(const Group& group, const std::string& what, const Matrix& got, const Matrix& ref,
                  double roundoff) {
  Check c;
  c.what = what;
  c.error = max_difference(got, ref);
  c.bound = 64.0 * group.size() * roundoff * max_abs(ref);
  MPI_Allreduce(MPI_IN_PLACE, &c.error, 1, MPI_DOUBLE, MPI_MAX, group.mpi_comm());
  c.ok = c.error <= c.bound && std::isfinite(c.error) && std::isfinite(c.bound);
  return c;
}

bool all_ranks(const Group& group, bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, group.mpi_comm());
  return all != 0;
}

double max_over_ranks(const Group& group, double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, group.mpi_comm());
  return v;
}

// One layer's forward + backward time by phase, the maximum over ranks of each.
struct Phases {
  double total = 0, compute = 0, comm = 0, relayout = 0, staging = 0, glue = 0;
  double work_max = 0, work_min = 0;  // time outside communication: slowest and fastest rank
  long mpi_calls = 0;  // collective calls of the layer on rank 0 (each a synchronisation point)
};

Phases phases(const Group& group, const LayerStats& st) {
  Phases p;
  p.total = st.total_seconds;
  p.comm = st.comm_seconds;
  p.relayout = st.relayout_seconds;
  p.staging = st.staging_seconds;
  p.glue = st.glue_seconds;
  p.compute = std::max(0.0, p.total - p.comm - p.relayout - p.staging - p.glue);
  double v[6] = {p.total, p.compute, p.comm, p.relayout, p.staging, p.glue};
  double work[2] = {st.work_seconds, -st.work_seconds};
  MPI_Allreduce(MPI_IN_PLACE, v, 6, MPI_DOUBLE, MPI_MAX, group.mpi_comm());
  MPI_Allreduce(MPI_IN_PLACE, work, 2, MPI_DOUBLE, MPI_MAX, group.mpi_comm());
  return Phases{v[0], v[1], v[2], v[3], v[4], v[5], work[0], -work[1], st.mpi_calls};
}

Json ph_json(const Phases& p) {
  Json j = Json::object();
  j["total"] = p.total;
  j["local_compute"] = p.compute;
  j["communication"] = p.comm;
  j["relayout"] = p.relayout;
  j["staging"] = p.staging;
  j["host_glue"] = p.glue;
  j["outside_mpi_slowest_rank"] = p.work_max;
  j["outside_mpi_fastest_rank"] = p.work_min;
  j["mpi_calls_rank0"] = p.mpi_calls;
  return j;
}

std::string human_bytes(double b) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1);
  if (b >= 1 << 20) {
    s << b / (1 << 20) << " MiB";
  } else if (b >= 1 << 10) {
    s << b / (1 << 10) << " KiB";
  } else {
    s << std::setprecision(0) << b << " B";
  }
  return s.str();
}

std::string sci(double v) {
  std::ostringstream s;
  s << std::scientific << std::setprecision(1) << v;
  return s.str();
}

std::vector<std::int64_t> documents(std::int64_t length, int n, std::int64_t multiple) {
  // Uneven documents: lengths grow like 1, 2, …, n (boundaries at L·k(k+1)/(n(n+1))), rounded to
  // multiples of `multiple` (2P under zigzag, where every document is cut into 2P chunks) and kept
  // non-empty (the caller ensures L / multiple >= n).
  std::vector<std::int64_t> cu{0};
  const std::int64_t units = length / multiple;
  for (int k = 1; k <= n; ++k) {
    // In 128 bits: L · k · (k + 1) passes INT64_MAX at L = --documents = 2^22.
    std::int64_t u = static_cast<std::int64_t>(static_cast<__int128>(units) * k * (k + 1) /
                                               (static_cast<__int128>(n) * (n + 1)));
    u = std::max<std::int64_t>(u, cu.back() / multiple + 1);
    u = std::min<std::int64_t>(u, units - (n - k));
    cu.push_back(u * multiple);
  }
  cu.back() = length;
  return cu;
}

// What fixes the values of a run: a reference saved by one run can check another only if these
// agree (the layout and the rank count may differ; the document boundaries must not).
ReferenceKey reference_key(const Settings& s, const TokenPlan& plan) {
  const StackConfig& c = s.stack;
  std::ostringstream cu, lr;
  for (std::size_t i = 0; i < plan.cu_seqlens.size(); ++i)
    cu << (i ? "," : "") << plan.cu_seqlens[i];
  lr.precision(17);
  lr << s.lr;
  return {{"dtype", operator_dtypes.name(s.dtype)},
          {"products", ctxpar::chunkwise::to_string(c.gdn_products)},
          {"length", std::to_string(c.length)},
          {"model-dim", std::to_string(c.model_dim)},
          {"heads", std::to_string(c.heads)},
          {"kv-heads", std::to_string(c.kv_heads)},
          {"head-dim", std::to_string(c.head_dim)},
          {"window", std::to_string(c.window)},
          {"chunk", std::to_string(c.chunk)},
          {"swa-policy", SwaLayer<>::policy_name(c.swa_policy)},
          {"gdn-policy", GdnLayer<>::policy_name(c.gdn_policy)},
          {"householder", std::to_string(c.householder)},
          {"kernel-chunk", std::to_string(c.kernel_chunk)},
          {"groups", std::to_string(c.groups)},
          {"lr", lr.str()},
          {"documents", cu.str()}};
}

// True for the views this demo allocates to stage its host matrices (not an operator's).
bool demo_staging(const std::string& label) {
  return label.rfind("ctxpar::hybrid::", 0) == 0;
}

// The median of `v` (0 when empty).
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// `repeat` more forward + backward calls of `stack` with weights `w`: per layer, every rank's
// fastest operator forward and backward, and its allocations per call, the operators' and the
// demo's staging apart. Prints a summary to `report` (rank 0) and returns the JSON (rank 0).
// Collective.
template <class Scalar>
Json steady_state(const Group& world, Stack<Scalar>& stack, const TokenPlan& plan,
                  const StackConfig& cfg, const Params& w, int repeat, std::ostream* report) {
  if (repeat == 0) return Json();
  constexpr int layers = 3;
  const double inf = std::numeric_limits<double>::infinity();
  double fwd[layers] = {inf, inf, inf}, bwd[layers] = {inf, inf, inf};
  std::int64_t op[layers] = {0, 0, 0}, staging[layers] = {0, 0, 0};
  std::map<std::string, std::int64_t> op_labels[layers];
  const char* names[layers] = {"swa", "gdn", "gdp"};  // the "layer" keys of the step records
  // Per call, each layer's slowest rank: their medians over the calls are the steady-state
  // figures a CP efficiency divides (docs/performance.md, "Definitions").
  std::vector<double> slowest[2 * layers];
  {
    ctxpar::AllocationCounter counter;
    for (int r = 0; r < repeat; ++r) {
      const RunOutput o = run_stack(stack, world, plan, cfg, w, -1, &counter);
      double mine[2 * layers], worst[2 * layers];
      for (int l = 0; l < layers; ++l) {
        mine[2 * l] = o.layers[l].forward_seconds;
        mine[2 * l + 1] = o.layers[l].backward_seconds;
      }
      MPI_Allreduce(mine, worst, 2 * layers, MPI_DOUBLE, MPI_MAX, world.mpi_comm());
      for (int i = 0; i < 2 * layers; ++i) slowest[i].push_back(worst[i]);
      for (int l = 0; l < layers; ++l) {
        fwd[l] = std::min(fwd[l], o.layers[l].forward_seconds);
        bwd[l] = std::min(bwd[l], o.layers[l].backward_seconds);
        for (const auto& [label, n] : o.layers[l].allocation_labels) {
          if (demo_staging(label)) {
            staging[l] += n;
          } else {
            op[l] += n;
            op_labels[l][label] += n;
          }
        }
      }
    }
  }
  Json out = Json::object();
  out["repeat"] = repeat;
  Json per_layer = Json::array();
  std::int64_t op_worst = 0;
  for (int l = 0; l < layers; ++l) {
    Json lj = Json::object();
    lj["layer"] = names[l];
    lj["forward_seconds"] = ctxpar::cli::gather_seconds(world, fwd[l]);
    lj["backward_seconds"] = ctxpar::cli::gather_seconds(world, bwd[l]);
    lj["forward_median_seconds"] = median_of(slowest[2 * l]);
    lj["backward_median_seconds"] = median_of(slowest[2 * l + 1]);
    lj["operator_allocations"] = ctxpar::cli::gather_counts(world, op[l]);
    lj["staging_allocations"] = ctxpar::cli::gather_counts(world, staging[l]);
    const double f = max_over_ranks(world, fwd[l]), b = max_over_ranks(world, bwd[l]);
    const auto op_max =
        static_cast<std::int64_t>(max_over_ranks(world, static_cast<double>(op[l])));
    const auto st_max =
        static_cast<std::int64_t>(max_over_ranks(world, static_cast<double>(staging[l])));
    op_worst = std::max(op_worst, op_max);
    Json by_label = Json::object();
    for (const auto& [label, n] : op_labels[l]) by_label[label] = n;
    lj["operator_allocation_labels_rank0"] = by_label;
    per_layer.push_back(lj);
    if (report) {
      *report << "  " << names[l] << ": operator forward " << std::fixed << std::setprecision(4)
              << f << " s, backward " << b << " s (fastest of " << repeat
              << ", slowest rank); allocations in " << repeat << " call" << (repeat > 1 ? "s" : "")
              << ": operator " << op_max << ", demo staging " << st_max << " (max over ranks)";
      if (!op_labels[l].empty()) {
        *report << "; rank 0's operator allocations:";
        for (const auto& [label, n] : op_labels[l]) *report << " " << label << " x" << n;
      }
      *report << "\n";
    }
  }
  if (report)
    *report << "steady state over " << repeat << " more stack call" << (repeat > 1 ? "s" : "")
            << " on the same layers: "
            << (op_worst == 0 ? "the operators allocated nothing"
                              : "the operators allocated " + std::to_string(op_worst) +
                                    " times on the worst rank")
            << "\n";
  out["layers"] = per_layer;
  return out;
}

// Runs `read` on every rank; a ctxpar::Error on any rank becomes the same `UsageError` on every
// rank (the lowest failing rank's), so none is left waiting in the next collective.
template <class Read>
void agreed_usage(const Group& world, Read&& read) {
  ctxpar::Preconditions chk(world, "ctxpar hybrid");
  try {
    read();
  } catch (const ctxpar::Error& e) {
    chk.require(false, e.condition(), e.expected(), e.actual());
  }
  try {
    chk.agree();
  } catch (const ctxpar::Error& e) {
    throw ctxpar::cli::UsageError(e.op(), e.rank(), e.condition(), e.expected(), e.actual());
  }
}

// Which options a saved reference must share with the run that reads it.
const char* const reference_hint =
    "a reference must be saved with the same --dtype, --products, --length, --model-dim, "
    "--heads, --kv-heads, --head-dim, --window, --chunk, --swa-policy, --gdn-policy, "
    "--householder, --kernel-chunk, "
    "--groups, --lr and --packed --documents, at least as many --steps, and the same document "
    "boundaries, which --packed with --layout zigzag rounds to multiples of 2P";

// Runs the stack distributed and on one rank, `steps` SGD steps, and writes the report. Returns
// true iff every check passed on every rank. The operators' data are `Scalar`.
template <class Scalar>
bool run_hybrid(const Group& world, const Settings& s, std::ostream& report, Json* json,
                ReferenceWriter* writer = nullptr) {
  const int p = world.size(), me = world.rank();
  const bool root = me == 0;
  StackConfig cfg = s.stack;
  TokenPlan plan{cfg.length, p, s.zigzag, documents(cfg.length, s.documents, s.zigzag ? 2 * p : 1)};
  TokenPlan single{cfg.length, 1, false, plan.cu_seqlens};
  const std::vector<std::int64_t> mine = plan.tokens_of(me);
  const Group layers(world.mpi_comm()), relayout(world.mpi_comm());
  const Group self(MPI_COMM_SELF), self_relayout(MPI_COMM_SELF);

  Params w;
  SwaLayer<>::init(w, cfg, 100);
  GdnLayer<>::init(w, cfg, 100);
  GdpLayer<>::init(w, cfg, 100);
  // The checks' unit roundoff: the storage's, or the GDN layer's chunk products' where those
  // round coarser (float16 data with bfloat16 products); the same argument bounds both.
  const ctxpar::chunkwise::ChunkProducts products = GdnLayer<Scalar>::products(cfg);
  const double roundoff =
      std::max(check_roundoff<Scalar>(), ctxpar::chunkwise::products_unit_roundoff(products));
  Params w_ref = w;
  // A saved reference is read and checked (every line of reference.txt, its options, gradient
  // list and steps) before anything is computed, on every rank; the lowest failing rank's error
  // is every rank's.
  ReferenceIndex ref_index;
  if (!s.reference.empty()) {
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> shapes;
    for (const auto& [name, m] : w) shapes[name] = {m.rows, m.cols};
    agreed_usage(world, [&] {
      ref_index = read_reference_index(s.reference, reference_key(s, plan), shapes, 3, s.steps,
                                       reference_hint);
    });
  }

  if (root) {
    report << "hybrid stack: L = " << cfg.length << " tokens on P = " << p << " rank"
           << (p > 1 ? "s" : "") << ", " << (s.zigzag ? "zigzag" : "contiguous") << " shards, "
           << s.documents << " document" << (s.documents > 1 ? "s" : "") << "; d_model "
           << cfg.model_dim << ", heads " << cfg.heads << " (SWA kv " << cfg.kv_heads
           << "), head dim " << cfg.head_dim << ", window " << cfg.window << ", SWA stream chunk "
           << cfg.chunk << ", GDP M = " << cfg.householder << ", kernel chunk " << cfg.kernel_chunk
           << "; operator data " << operator_dtypes.name(s.dtype) << ", GDN chunk products "
           << ctxpar::chunkwise::to_string(products) << "\n"
           << (!s.save_reference.empty()
                   ? "  this run is the reference: its values go to " + s.save_reference + "\n"
               : !s.reference.empty()
                   ? "  reference: the values a P = 1 run saved in " + s.reference +
                         "; each rank reads and compares its rows\n"
                   : "  reference: the same stack on one rank (MPI_COMM_SELF) over the whole "
                     "sequence; each rank compares its rows\n");
  }
  Stack<Scalar> stack(layers, relayout, plan, cfg);
  bool all_ok = true;
  int checks = 0, failed = 0;
  Json steps_json = Json::array();
  for (int step = 1; step <= s.steps; ++step) {
    Kokkos::Timer wall;
    if (root && s.progress)
      std::cerr << "[hybrid] step " << step << "/" << s.steps << ": distributed pass… "
                << std::flush;
    RunOutput d = run_stack(stack, layers, plan, cfg, w, s.perturb_rank);
    // The single-rank values of this rank's rows: from the files of a P = 1 run, or from the
    // whole stack run again here on MPI_COMM_SELF. A P = 1 run saving the reference is the
    // reference itself: it writes its values and compares nothing.
    ReferenceStep r;
    RunOutput in_process;
    const bool saving = !s.save_reference.empty(), from_files = !s.reference.empty();
    if (saving) {
      r = ReferenceStep{d.x1, d.x2, d.x3, d.dx0, d.dx1, d.dx2, d.grads, d.loss, {}};
      for (const LayerStats& st : d.layers) r.layer_seconds.push_back(st.total_seconds);
      if (step == 1) writer->key(reference_key(s, plan), d.grads);
      writer->step(step, r);
      if (root && s.progress) std::cerr << "reference staged\n";
    } else if (from_files) {
      if (root && s.progress) std::cerr << "reading the reference… " << std::flush;
      // Collective verdict: a rank whose rows cannot be read must not leave the others waiting
      // in the next collective.
      agreed_usage(world, [&] {
        r = read_reference_step(s.reference, ref_index, step, cfg.length, cfg.model_dim, mine);
      });
    } else {
      if (root && s.progress) std::cerr << "single-rank reference… " << std::flush;
      in_process = run_stack<Scalar>(self, self_relayout, single, cfg, w_ref);
      auto rows = [&](const Matrix& m) {
        Matrix out(static_cast<std::int64_t>(mine.size()), m.cols);
        for (std::size_t j = 0; j < mine.size(); ++j)
          for (std::int64_t k = 0; k < m.cols; ++k)
            out(static_cast<std::int64_t>(j), k) = m(mine[j], k);
        return out;
      };
      r = ReferenceStep{rows(in_process.x1),  rows(in_process.x2),  rows(in_process.x3),
                        rows(in_process.dx0), rows(in_process.dx1), rows(in_process.dx2),
                        in_process.grads,     in_process.loss,      {}};
    }
    if (root && s.progress && !saving)
      std::cerr << "compare (" << std::fixed << std::setprecision(1) << wall.seconds() << " s)\n";

    std::vector<Check> outs = {compare_rows(world, "swa out", d.x1, r.x1, step == 1, roundoff),
                               compare_rows(world, "gdn out", d.x2, r.x2, false, roundoff),
                               compare_rows(world, "gdp out", d.x3, r.x3, false, roundoff)};
    std::vector<Check> ins = {compare_rows(world, "d swa in", d.dx0, r.dx0, false, roundoff),
                              compare_rows(world, "d gdn in", d.dx1, r.dx1, false, roundoff),
                              compare_rows(world, "d gdp in", d.dx2, r.dx2, false, roundoff)};
    std::vector<Check> grads;
    for (const auto& kv : d.grads)
      grads.push_back(compare_all(world, kv.first, kv.second, r.grads.at(kv.first), roundoff));
    Check loss;
    loss.what = "loss";
    loss.error = std::fabs(d.loss - r.loss);
    loss.bound = 64.0 * p * roundoff * std::fabs(r.loss);
    loss.ok = loss.error <= loss.bound && std::isfinite(d.loss) && std::isfinite(r.loss);
    // A non-finite loss fails the check (an Inf on both sides would otherwise pass); say why.
    if (root && !std::isfinite(r.loss))
      report << "the single-rank loss is not finite at step " << step
             << ": the weights diverged (a smaller --lr keeps them finite)\n";

    auto tally = [&](const Check& c) {
      ++checks;
      if (!c.ok) ++failed;
      all_ok = all_ok && c.ok;
    };
    if (!saving) {  // a run saving the reference compares nothing: it is the reference
      for (const auto& c : outs) tally(c);
      for (const auto& c : ins) tally(c);
      for (const auto& c : grads) tally(c);
      tally(loss);
    }

    Json step_json = Json::object();
    step_json["step"] = step;
    step_json["loss"] = d.loss;
    step_json["loss_single_rank"] = r.loss;
    Json layer_json = Json::array();
    if (root) {
      report << "\nstep " << step << "/" << s.steps << ": loss " << std::setprecision(9)
             << std::defaultfloat << d.loss << " (single rank " << r.loss << ", |diff| "
             << sci(loss.error) << " <= " << sci(loss.bound) << ")\n";
      report << "  layer  mechanism / policy                                  max|err| vs P=1 "
                "(bound)   d input (bound)        "
                "fwd ms   bwd ms   tokens/s   bytes/rank sent|recv (formula)\n";
    }
    const char* mechanism[3] = {"sliding-window attention", "Gated DeltaNet + conv halo, chunkwise",
                                "Gated Delta Product, heads"};
    const std::string policy[3] = {SwaLayer<>::policy_name(cfg.swa_policy),
                                   GdnLayer<>::policy_name(cfg.gdn_policy),
                                   GdpLayer<>::policy_name(cfg, s.zigzag)};
    const char* short_name[3] = {"swa", "gdn", "gdp"};
    const Check* in_check[3] = {&ins[0], &ins[1], &ins[2]};
    Phases dist_ph[3], ref_ph[3];
    double eff[3], held_per_token[3];
    for (int l = 0; l < 3; ++l) {
      const LayerStats& st = d.layers[l];
      dist_ph[l] = phases(world, st);
      held_per_token[l] =
          max_over_ranks(world, static_cast<double>(st.held_bytes) /
                                    static_cast<double>(std::max<std::size_t>(mine.size(), 1)));
      // T(1): the single-rank run of the same processes (in-process reference, while every rank
      // runs it: contended), or the saved P = 1 job's own time (solo), or this P = 1 run's.
      if (!saving && !from_files) ref_ph[l] = phases(world, in_process.layers[l]);
      if (from_files && static_cast<std::size_t>(l) < r.layer_seconds.size())
        ref_ph[l].total = r.layer_seconds[static_cast<std::size_t>(l)];
      if (saving) ref_ph[l].total = dist_ph[l].total;
      eff[l] = ref_ph[l].total / (p * std::max(dist_ph[l].total, 1e-12));
      const double fwd = max_over_ranks(world, st.forward_seconds),
                   bwd = max_over_ranks(world, st.backward_seconds);
      const bool formula_given = st.formula_sent >= 0;
      const bool bytes_ok =
          all_ranks(world, !formula_given || (st.formula_sent == st.measured.bytes_sent &&
                                              st.formula_received == st.measured.bytes_received));
      Check bytes;
      bytes.what = std::string(short_name[l]) + " bytes";
      bytes.ok = bytes_ok;
      tally(bytes);
      if (root) {
        std::ostringstream row;
        row << "  " << std::left << std::setw(5) << short_name[l] << "  " << std::setw(52)
            << (std::string(mechanism[l]) + " / " + policy[l]) << std::setw(26)
            << (sci(outs[l].error) + " (" + sci(outs[l].bound) + ")" + (outs[l].ok ? "" : " FAIL"))
            << std::setw(23)
            << (sci(in_check[l]->error) + " (" + sci(in_check[l]->bound) + ")" +
                (in_check[l]->ok ? "" : " FAIL"))
            << std::right << std::fixed << std::setprecision(1) << std::setw(7) << 1e3 * fwd
            << std::setw(9) << 1e3 * bwd << std::setw(11) << std::setprecision(0)
            << cfg.length / std::max(fwd + bwd, 1e-9) << "   "
            << human_bytes(static_cast<double>(st.measured.bytes_sent)) << " | "
            << human_bytes(static_cast<double>(st.measured.bytes_received));
        if (formula_given) {
          row << (bytes_ok ? " (= formula on every rank)"
                           : " (formula MISMATCH: " + std::to_string(st.formula_sent) + " | " +
                                 std::to_string(st.formula_received) + ")");
        } else {
          row << " (no closed form for this policy)";
        }
        report << row.str() << "\n";
        if (st.relayout.bytes_sent + st.relayout.bytes_received > 0) {
          report << (l == 0 ? "         + streaming re-layout of the shared plan's rows to "
                              "BalancedChunks(t, P) and back: "
                            : "         + re-layout of the shared plan's rows to per-document "
                              "zigzag and back: ")
                 << human_bytes(static_cast<double>(st.relayout.bytes_sent)) << " | "
                 << human_bytes(static_cast<double>(st.relayout.bytes_received)) << "\n";
        }
        Json lj = Json::object();
        lj["layer"] = short_name[l];
        lj["mechanism"] = mechanism[l];
        lj["policy"] = policy[l];
        lj["max_error"] = outs[l].error;
        lj["bound"] = outs[l].bound;
        lj["input_grad_error"] = in_check[l]->error;
        lj["forward_seconds"] = fwd;
        lj["backward_seconds"] = bwd;
        lj["tokens_per_second"] = cfg.length / std::max(fwd + bwd, 1e-9);
        lj["bytes_sent_rank0"] = st.measured.bytes_sent;
        lj["bytes_received_rank0"] = st.measured.bytes_received;
        lj["formula_sent_rank0"] = st.formula_sent;
        lj["formula_received_rank0"] = st.formula_received;
        lj["bytes_equal_formula_every_rank"] = bytes_ok;
        lj["relayout_bytes_sent_rank0"] = st.relayout.bytes_sent;
        lj["relayout_bytes_received_rank0"] = st.relayout.bytes_received;
        lj["phases_seconds"] = Json::object();
        lj["phases_seconds"]["distributed"] = ph_json(dist_ph[l]);
        if (!saving && !from_files) lj["phases_seconds"]["single_rank"] = ph_json(ref_ph[l]);
        lj["cp_efficiency"] = eff[l];
        lj["held_bytes_per_token_max_rank"] = held_per_token[l];
        lj["single_rank_seconds"] = ref_ph[l].total;
        lj["single_rank_baseline"] = from_files ? "solo (the saved P = 1 job)"
                                     : saving   ? "this run"
                                                : "contended";
        layer_json.push_back(lj);
      }
    }
    // Where the time goes, per layer and phase, here and (in-process reference) in the
    // single-rank run of the same processes right after, which saw the same machine load. With a
    // saved reference, T(1) is the P = 1 job's own forward + backward time.
    const bool ref_row = !saving && !from_files;
    if (root) {
      report << "  time by phase, forward + backward, ms (slowest rank"
             << (ref_row      ? "; P=1: the single-rank reference of this step)\n"
                 : from_files ? "; T(1) from the saved P = 1 job)\n"
                              : ")\n")
             << "  layer    P    total  compute     comm relayout  staging     glue  MPI calls  "
                "imbalance   CP efficiency "
                "P=1/(P*P="
             << p << ")\n";
    }
    for (int l = 0; l < 3; ++l) {
      const Phases &dist = dist_ph[l], &ref = ref_ph[l];
      if (root) {
        if (from_files)
          report << "  " << std::left << std::setw(5) << short_name[l] << std::right << std::setw(5)
                 << 1 << std::fixed << std::setprecision(1) << std::setw(9) << 1e3 * ref.total
                 << "  (saved P = 1 job)\n";
        for (int which = ref_row ? 0 : 1; which < 2; ++which) {
          const Phases& ph = which == 0 ? ref : dist;
          std::ostringstream row;
          row << "  " << std::left << std::setw(5) << (which == 0 || !ref_row ? short_name[l] : "")
              << std::right << std::setw(5) << (which == 0 ? 1 : p) << std::fixed
              << std::setprecision(1);
          for (double v : {ph.total, ph.compute, ph.comm, ph.relayout, ph.staging, ph.glue})
            row << std::setw(9) << 1e3 * v;
          row << std::setw(11) << ph.mpi_calls << std::setw(11)
              << 1e3 * (ph.work_max - ph.work_min);
          if (which == 1) row << std::setprecision(2) << std::setw(10) << eff[l];
          report << row.str() << "\n";
        }
      }
    }
    if (root) {
      report << std::fixed << std::setprecision(0)
             << "  resident memory each forward leaves for its backward, bytes per token of the "
                "rank's shard (max over ranks): swa "
             << held_per_token[0] << ", gdn " << held_per_token[1] << ", gdp " << held_per_token[2]
             << "\n";
      report << "  weight gradients (summed over ranks) vs P=1:";
      int col = 0;
      for (const auto& g : grads) {
        if (col++ % 4 == 0) report << "\n    ";
        std::ostringstream e;
        e << g.what << " " << sci(g.error) << (g.ok ? "" : " FAIL") << " (" << sci(g.bound) << ")";
        report << std::left << std::setw(38) << e.str() << std::right;
      }
      report << "\n";
    }
    step_json["layers"] = layer_json;
    steps_json.push_back(step_json);
    // SGD on every weight, both runs from their own gradients.
    for (auto& kv : w)
      for (std::size_t i = 0; i < kv.second.data.size(); ++i)
        kv.second.data[i] -= s.lr * d.grads.at(kv.first).data[i];
    for (auto& kv : w_ref)
      for (std::size_t i = 0; i < kv.second.data.size(); ++i)
        kv.second.data[i] -= s.lr * r.grads.at(kv.first).data[i];
  }
  // --repeat: the stack again on the same layers (after the steps, with the last weights): each
  // layer's fastest operator forward and backward, and what the layer calls allocated, split into
  // the operators' allocations and this demo's own staging (host matrices uploaded per call, the
  // views labelled ctxpar::hybrid::*).
  const Json steady = steady_state(world, stack, plan, cfg, w, s.repeat, root ? &report : nullptr);
  all_ok = all_ranks(world, all_ok);
  if (root) {
    report << "\n"
           << (all_ok ? "all " + std::to_string(checks) + " checks passed"
                      : std::to_string(failed) + " of " + std::to_string(checks) + " checks FAILED")
           << (s.save_reference.empty()
                   ? " (outputs, input gradients, weight gradients and loss of every layer against "
                     "the single-rank run, bytes against their formulas)\n"
                   : " (bytes against their formulas); this run is the reference: its values are "
                     "in " +
                         s.save_reference + " for `--reference`\n")
           << "  the GDN layer includes its short conv with the halo exchange "
              "(chunkwise/short_conv.hpp, "
           << (s.zigzag ? "zigzag: chunk r's halo from rank r-1, chunk 2P-1-r's from rank r+1"
                        : "contiguous ring")
           << "); the GDP layer's causal conv runs inside its head-parallel core\n";
  }
  // With the in-process reference every rank also runs the whole sequence on one rank, so this
  // includes the reference's memory; with a saved reference it is the distributed run's alone.
  const std::int64_t my_peak = ctxpar::cli::peak_rss_bytes();
  const Json peak_rss = ctxpar::cli::gather_counts(world, my_peak);
  const double peak_max = max_over_ranks(world, static_cast<double>(my_peak));
  if (root) {
    report << "peak resident memory per rank: " << human_bytes(peak_max) << " (max over ranks; "
           << std::fixed << std::setprecision(0)
           << peak_max / static_cast<double>(std::max<std::size_t>(mine.size(), 1))
           << " bytes per token of the shard"
           << (s.save_reference.empty() && s.reference.empty()
                   ? ", with the in-process whole-sequence reference"
                   : "")
           << ")\n";
  }
  if (json != nullptr && root) {
    (*json)["benchmark"] = "hybrid";
    (*json)["case"] = std::string("hybrid P=") + std::to_string(p);
    (*json)["ranks"] = p;
    double load = -1;
    if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
      if (std::fscanf(f, "%lf", &load) != 1) load = -1;
      std::fclose(f);
    }
    (*json)["load_average"] = load;
    (*json)["dtype"] = operator_dtypes.name(s.dtype);
    (*json)["gdn_products"] = ctxpar::chunkwise::to_string(GdnLayer<Scalar>::products(cfg));
    (*json)["length"] = cfg.length;
    (*json)["layout"] = s.zigzag ? "zigzag" : "contiguous";
    (*json)["documents"] = s.documents;
    (*json)["window"] = cfg.window;
    (*json)["heads"] = cfg.heads;
    (*json)["head_dim"] = cfg.head_dim;
    (*json)["steps"] = steps_json;
    (*json)["checks"] = checks;
    (*json)["passed"] = all_ok;
    (*json)["peak_rss_bytes"] = peak_rss;
    if (s.repeat > 0) (*json)["steady_state"] = steady;
  }
  return all_ok;
}

int run_hybrid_command(const ctxpar::cli::Args& args, const Group& world) {
  // Large blocks come from mmap and go back to the system when freed (a fixed threshold also stops
  // glibc from raising it after the first large free), so the resident set measures live memory:
  // what each forward keeps for the backward, and the peak.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  Settings s;
  StackConfig& c = s.stack;
  c.length = args.get<std::int64_t>("length", c.length);
  c.model_dim = args.get<std::int64_t>("model-dim", c.model_dim);
  c.heads = args.get<std::int64_t>("heads", c.heads);
  c.kv_heads = args.get<std::int64_t>("kv-heads", c.kv_heads);
  c.head_dim = args.get<std::int64_t>("head-dim", c.head_dim);
  c.window = args.get<std::int64_t>("window", c.window);
  c.chunk = args.get<std::int64_t>("chunk", std::max<std::int64_t>(1, c.length / 4));
  using ctxpar::cli::choose;
  c.swa_policy = choose(args, "swa-policy", ctxpar::cli::swa_policies, "allgather");
  c.gdn_policy = choose(args, "gdn-policy", ctxpar::cli::compositions, "gather");
  c.head_policy = choose(args, "head-policy", ctxpar::cli::head_policies, "uneven");
  s.dtype = choose(args, "dtype", operator_dtypes, "float64");
  c.gdn_products = ctxpar::cli::chunk_products.visit(
      choose(args, "products", ctxpar::cli::chunk_products, "automatic"),
      [](auto tag) { return decltype(tag)::value; });
  c.householder = args.get<int>("householder", c.householder);
  c.kernel_chunk = args.get<int>("kernel-chunk", c.kernel_chunk);
  c.groups = args.get<int>("groups", c.groups);
  s.zigzag = ctxpar::cli::layouts.is<ctxpar::Zigzag>(
      choose(args, "layout", ctxpar::cli::layouts, "contiguous"));
  s.documents = args.has("packed") ? args.get<int>("documents", 3) : 1;
  if (!args.has("packed") && args.given("documents"))
    throw ctxpar::cli::UsageError("ctxpar hybrid", -1, "--documents needs --packed",
                                  "--packed --documents N", "--documents alone");
  s.steps = args.get<int>("steps", s.steps);
  s.lr = args.get<double>("lr", s.lr);
  s.json = args.get("json", "");
  s.progress = !args.has("quiet");
  s.save_reference = args.get("save-reference", "");
  s.reference = args.get("reference", "");
  s.repeat = args.get_in<int>("repeat", 0, 0, 1000000);
  s.perturb_rank = args.get_in<int>("perturb-rank", -1, -1, world.size() - 1,
                                    "names a rank that does not exist (-1: none)");
  args.require("lr", s.lr >= 0, "the learning rate must be >= 0", ">= 0", s.lr);
  // Each size by its option's name; the upper bounds keep a typo from asking for terabytes.
  args.require("length", c.length >= 1 && c.length <= (std::int64_t(1) << 22),
               "the sequence length must be in [1, 4194304]", "1..4194304", c.length);
  args.require("model-dim", c.model_dim >= 1 && c.model_dim <= 4096,
               "the model width must be in [1, 4096]", "1..4096", c.model_dim);
  args.require("heads", c.heads >= 1 && c.heads <= 256, "the heads must be in [1, 256]", "1..256",
               c.heads);
  args.require("kv-heads", c.kv_heads >= 1 && c.kv_heads <= 256,
               "the key/value heads must be in [1, 256]", "1..256", c.kv_heads);
  args.require("head-dim", c.head_dim >= 2 && c.head_dim <= 1024 && c.head_dim % 2 == 0,
               "the head dimension must be even (RoPE pairs) and in [2, 1024]", "2, 4, ..., 1024",
               c.head_dim);
  args.require("householder", c.householder >= 1 && c.householder <= 16,
               "the householder copies must be in [1, 16]", "1..16", c.householder);
  args.require("kernel-chunk", c.kernel_chunk >= 1 && c.kernel_chunk <= 4096,
               "the chunk of the GDN and GDP kernels must be in [1, 4096]", "1..4096",
               c.kernel_chunk);
  args.require("groups", c.groups >= 1 && c.heads % c.groups == 0,
               "the key groups must divide --heads", "a divisor of " + std::to_string(c.heads),
               c.groups);
  const std::string op = "ctxpar hybrid";
  auto usage = [&](bool ok, const std::string& what, const std::string& expected,
                   const std::string& actual) {
    if (!ok) throw ctxpar::cli::UsageError(op, -1, what, expected, actual);
  };
  usage(c.length >= 1, "--length must be positive", ">= 1", std::to_string(c.length));
  usage(c.chunk >= 1, "--chunk must be positive", ">= 1", std::to_string(c.chunk));
  usage(c.heads % c.kv_heads == 0, "--heads must be a multiple of --kv-heads",
        "a multiple of " + std::to_string(c.kv_heads), std::to_string(c.heads));
  usage(c.window >= 0, "--window must be >= 0 (0 = unlimited)", ">= 0", std::to_string(c.window));
  usage(c.gdn_products == ctxpar::chunkwise::ChunkProducts::exact ||
            c.gdn_products == ctxpar::chunkwise::ChunkProducts::automatic ||
            !operator_dtypes.is<double>(s.dtype),
        "--products other than exact or automatic needs 16-bit --dtype (fp64 data multiply "
        "exactly)",
        "exact or automatic with --dtype float64", ctxpar::chunkwise::to_string(c.gdn_products));
  usage(s.documents >= 1 && s.documents <= c.length, "--documents must be in [1, L]",
        "1.." + std::to_string(c.length), std::to_string(s.documents));
  // The upper bound keeps a typo from running for days (as --repeat's).
  usage(s.steps >= 1 && s.steps <= 1000000, "--steps must be in [1, 1000000]", "1..1000000",
        std::to_string(s.steps));
  usage(s.save_reference.empty() || s.reference.empty(),
        "--save-reference and --reference exclude each other (a run either is the reference or "
        "checks against one)",
        "one of them", "both");
  usage(s.save_reference.empty() || world.size() == 1,
        "--save-reference runs at P = 1 (the single-rank reference)", "1 rank",
        std::to_string(world.size()) + " ranks");
  usage(s.save_reference.empty() || s.perturb_rank < 0,
        "--perturb-rank would corrupt the reference itself",
        "no --perturb-rank with "
        "--save-reference",
        std::to_string(s.perturb_rank));
  usage(!s.zigzag || c.length % (2 * world.size()) == 0,
        "--layout zigzag needs L to be a multiple of 2P",
        "a multiple of " + std::to_string(2 * world.size()), std::to_string(c.length));
  usage(!s.zigzag || c.length / (2 * world.size()) >= s.documents,
        "--layout zigzag with --packed needs at least 2P tokens per document (each is cut into 2P "
        "chunks)",
        "--documents <= " + std::to_string(c.length / (2 * world.size())),
        std::to_string(s.documents));
  usage(!s.zigzag || c.length / (2 * world.size()) >= c.conv_width - 1,
        "--layout zigzag needs chunks of at least w - 1 tokens for the short conv's halo",
        "L >= " + std::to_string(2 * world.size() * (c.conv_width - 1)), std::to_string(c.length));
  // Overflow and resource limits, estimated before anything is allocated. A window or a stream
  // chunk of at least L means the whole sequence: clamped, so no arithmetic sees the extreme.
  if (c.window >= c.length) c.window = 0;
  c.chunk = std::min(c.chunk, c.length);
  const std::int64_t widest = std::max(
      c.model_dim, (2 + 2 * static_cast<std::int64_t>(c.householder)) * c.heads * c.head_dim);
  usage(c.length <= std::numeric_limits<int>::max() / widest,
        "--length times the widest row (--model-dim, or (2 + 2 --householder) --heads --head-dim) "
        "exceeds an MPI count (int)",
        "at most " + std::to_string(std::numeric_limits<int>::max()) + " values",
        std::to_string(c.length) + " x " + std::to_string(widest));
  // A lower bound of what one process keeps: every layer's inputs, outputs and gradients, the
  // heads' q, k, v and the kernels' per-chunk matrices, for the whole sequence when the reference
  // runs in-process (its own rows otherwise).
  const std::int64_t tokens =
      s.reference.empty() ? c.length : (c.length + world.size() - 1) / world.size();
  const double per_token =
      8.0 * (8.0 * c.model_dim + (4.0 + 4.0 * c.householder) * c.heads * c.head_dim +
             2.0 * c.kernel_chunk * c.heads);
  const double need = per_token * static_cast<double>(tokens);
  const double have = ctxpar::cli::memory_limit_bytes();
  if (have > 0)
    usage(need <= have,
          "the run needs more memory than this process may use (--length, --model-dim, --heads, "
          "--head-dim, --householder, --kernel-chunk; --reference DIR keeps only each rank's rows)",
          "at most " + std::to_string(static_cast<std::int64_t>(have / (1 << 20))) + " MiB",
          "at least " + std::to_string(static_cast<std::int64_t>(need / (1 << 20))) + " MiB");
  if (s.perturb_rank >= 0) {
    const TokenPlan plan{c.length, world.size(), s.zigzag, {}};
    usage(!plan.tokens_of(s.perturb_rank).empty(),
          "--perturb-rank names a rank that holds no tokens (L < P): corrupting it would change "
          "nothing",
          "a rank that holds tokens", std::to_string(s.perturb_rank));
  }
  // Output paths, before the run: a bad one is refused now, on every rank.
  ctxpar::cli::check_json_path(world, op, s.json);
  if (!s.save_reference.empty()) {
    const std::string problem = why_not_reference_dir(s.save_reference);
    usage(problem.empty(), "--save-reference " + s.save_reference + ": " + problem,
          "a writable directory, or a path where one can be created", problem);
  }
  Json json = Json::object();
  std::unique_ptr<ReferenceWriter> writer;
  if (!s.save_reference.empty()) writer = std::make_unique<ReferenceWriter>(s.save_reference);
  const bool ok = operator_dtypes.visit(s.dtype, [&](auto scalar) {
    return run_hybrid<decltype(scalar)>(world, s, std::cout, s.json.empty() ? nullptr : &json,
                                        writer.get());
  });
  // The reference and the JSON are committed together: all of them, or none.
  if (writer) writer->finish();
  if (!s.json.empty()) {
    ctxpar::cli::write_json(world, op, s.json, json, writer ? &writer->files() : nullptr);
  } else if (writer) {
    const std::string problem = writer->files().commit();
    usage(problem.empty(), "--save-reference " + s.save_reference + ": cannot write the reference",
          "every file written", problem);
  }
  return ok ? 0 : 1;
}

bool demo_hybrid(const Group& group, std::ostream& report) {
  Settings s;
  // Small enough for `ctxpar demo` at 8 oversubscribed ranks; `ctxpar hybrid` runs the larger
  // default.
  s.stack.length = 320;
  s.stack.window = 48;
  s.stack.chunk = 80;
  s.steps = 2;
  s.progress = false;
  s.documents = 1;
  return run_hybrid<double>(group, s, report, nullptr);
}

}  // namespace

CTXPAR_CLI_COMMAND(
    "hybrid",
    "hybrid stack (SWA + Gated DeltaNet + Gated Delta Product) across ranks, checked against one "
    "rank",
    "[--length L] [--model-dim D] [--heads H] [--kv-heads H] [--head-dim D] [--window W]\n"
    "    [--chunk T] [--swa-policy P] [--gdn-policy P] [--head-policy P] [--householder M]\n"
    "    [--groups G] [--kernel-chunk C] [--layout L] [--packed [--documents N]] [--steps S] [--lr "
    "X] [--json FILE]\n"
    "    [--dtype T] [--products P]\n"
    "    [--quiet] [--perturb-rank R] [--save-reference DIR | --reference DIR] [--repeat N]\n\n"
    "options [default]:\n"
    "  --length L        tokens, 1..4194304 [2048]\n"
    "  --model-dim D     residual width, 1..4096 [32]\n"
    "  --heads H         heads of every layer, 1..256 [4]\n"
    "  --kv-heads H      SWA key/value heads, divides --heads [2]\n"
    "  --head-dim D      head dimension, even, 2..1024 [16]\n"
    "  --window W        SWA window, 0 = unlimited; W >= L is unlimited too [256]\n"
    "  --chunk T         SWA stream chunk, >= 1; T >= L streams the whole sequence at once [L/4]\n"
    "  --swa-policy P    allgather, rope-after or halo [allgather]\n"
    "  --gdn-policy P    gather or scan [gather]\n"
    "  --head-policy P   even or uneven [uneven]\n"
    "  --householder M   GDP householder copies, 1..16 [2]\n"
    "  --groups G        GDP key groups, divides --heads [1]\n"
    "  --kernel-chunk C  chunk of the GDN and GDP kernels, 1..4096; their saved per-chunk\n"
    "                    C x C matrices cost 2·C values per token and head [64]\n"
    "  --layout L        contiguous or zigzag [contiguous]\n"
    "  --products P      the GDN layer's chunk products (as chunkwise --products): exact, tf32,\n"
    "                    bfloat16, float16 or automatic (the storage type's on a GPU with tensor\n"
    "                    cores, exact elsewhere); not exact needs 16-bit --dtype. The checks'\n"
    "                    roundoff becomes the products' where it is coarser [automatic]\n"
    "  --dtype T         the operators' data: float64, or bfloat16 / float16 storage with fp32\n"
    "                    arithmetic (SWA, the GDN recurrence and the GDP layer take it; the GDN\n"
    "                    short conv runs in fp32 then; the glue between layers is fp64 host "
    "code).\n"
    "                    The checks' roundoff becomes the storage's: 2^-8 or 2^-11 [float64]\n"
    "  --packed          several documents in the sequence [one]\n"
    "  --documents N     with --packed: documents, 1..L [3]\n"
    "  --steps S         SGD steps, 1..1000000 [3]\n"
    "  --lr X            learning rate, finite, >= 0 [0.5]\n"
    "  --json FILE       also write the results as JSON (rank 0) [none]\n"
    "  --quiet           no progress lines [progress]\n"
    "  --perturb-rank R  test hook: corrupts one value of rank R's GDN output, so the checks must\n"
    "                    fail; R must hold tokens; -1 = none [-1]\n"
    "  --save-reference DIR  P = 1 only: write this run's values (every step's layer outputs,\n"
    "                    input gradients, weight gradients, loss, layer times) to DIR, all\n"
    "                    renamed into place at the end (a failed run leaves none) [none]\n"
    "  --reference DIR   compare with the values a P = 1 run saved in DIR, each rank reading its\n"
    "                    rows, instead of running the whole sequence on one rank in every "
    "process.\n"
    "                    The reference must be saved with the same --dtype, --products, --length,\n"
    "                    --model-dim, --heads, --kv-heads, --head-dim, --window, --chunk, "
    "--swa-policy, --gdn-policy,\n"
    "                    --householder, --kernel-chunk, --groups, --lr, --packed --documents and "
    "at\n"
    "                    least as many --steps (--layout may differ); with --packed the document\n"
    "                    boundaries must match too, and --layout zigzag rounds them to multiples\n"
    "                    of 2P, so a packed zigzag run at P > 1 fits a P = 1 reference only when\n"
    "                    those boundaries agree. A mismatch is refused before anything runs\n"
    "                    [run it in-process]\n"
    "  --repeat N        N more forward + backward calls of the same layers after the checked\n"
    "                    steps: each layer's fastest operator forward and backward (and the\n"
    "                    median over the calls of the slowest rank's), and what the operators\n"
    "                    and the demo's staging allocated in them, in the report and the JSON's\n"
    "                    steady_state [0]\n\n"
    "no input files; the inputs are generated. exit status: 0 every check passed; 1 a check\n"
    "failed (a NaN or Inf anywhere, the saved reference included, fails it); 2 a bad option,\n"
    "a bad reference or an output that cannot be written, named in the message.\n",
    run_hybrid_command);
CTXPAR_CLI_DEMO_PART("hybrid", demo_hybrid);
