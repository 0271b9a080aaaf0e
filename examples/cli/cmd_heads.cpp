// `ctxpar heads`: head-partitioned context parallelism (mechanism C) for a Gated Delta Product
// layer on .npy tensors, checked on rank 0 against the single-rank (P = 1) layer; and the `heads`
// part of `ctxpar demo` (a GDP head-parallel run checked against P = 1).
//
//   mpirun -np P ctxpar heads --in DIR --out DIR --nheads H --headdim d --ngroups G --dstate N
//       --householder M --conv-width w [--layout contiguous|zigzag] [--uneven] [--backward]
//       [--chunk C]
//
// DIR: x.npy [T, C] (input-projection output [z | V | K | Q | b | a], natural token order; float32,
// float64, float16 or bfloat16; with 16-bit x the parameters are float32), conv_w.npy [C_conv, w],
// conv_b.npy [C_conv], dt_bias.npy [H], A_log.npy [H], optional cu_seqlens.npy (int32), optional
// dy.npy [T, H·d] (ones when absent; dz is zero), optional D.npy (the skip term: [H] per head, or
// [H·d] per channel, i.e. D_has_hdim). Every rank reads the files and keeps its own rows in the
// chosen layout. Rank 0 writes y.npy and z.npy (natural order), with --backward dx.npy,
// dconv_w.npy, dconv_b.npy, ddt_bias.npy, dA_log.npy (and dD.npy when D.npy was given), and
// heads.json (shape, layout, bytes per rank against the formula, times, max |diff| against P = 1).
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <sys/stat.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "choice.hpp"
#include "command.hpp"
#include "ctxpar/heads/gdp_context_parallel.hpp"
#include "json.hpp"
#include "measure.hpp"
#include "nonfinite.hpp"
#include "npy.hpp"
#include "output_dir.hpp"
#include "stored_tolerance.hpp"

namespace {

namespace ch = ctxpar::heads;
using exec = Kokkos::DefaultExecutionSpace;
using mem = exec::memory_space;
using ctxpar::cli::Json;
using ctxpar::cli::NpyArray;

struct Inputs {
  ch::GdpShape shape;
  std::int64_t tokens = 0;
  std::vector<std::int64_t> cu;                         // empty: dense
  std::vector<double> x, conv_w, conv_b, dt, alog, dy;  // natural order, as doubles
  std::vector<double> d;                                // the skip term D, empty when absent
};

struct Outputs {
  std::vector<double> y, z, dx, dw, db, ddt, dalog, dd;  // natural order (rank 0: y, z, dx)
  double forward_seconds = 0, backward_seconds = 0;
  std::int64_t formula_bytes = 0;
  ctxpar::cli::SteadyState steady;  // --repeat
};

// The values (exact in the view's type: they came from a file of that dtype) into `v`.
template <class View>
void fill(const View& v, const std::vector<double>& values) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < values.size(); ++i)
    h.data()[i] = ctxpar::narrow<typename View::non_const_value_type>(values[i]);
  Kokkos::deep_copy(v, h);
}
template <class View>
std::vector<double> read(const View& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<double> out(h.span());
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<double>(ctxpar::widen(h.data()[i]));
  return out;
}

// Collective: the natural-order [T, cols] array on rank 0 from every rank's rows and their
// natural indices.
std::vector<double> gather_natural(const ctxpar::Group& group, const std::vector<double>& local,
                                   const std::vector<std::int64_t>& natural, std::int64_t cols,
                                   std::int64_t tokens) {
  const int p = group.size();
  int n = static_cast<int>(natural.size());
  std::vector<int> counts(p), displs(p, 0);
  MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, group.mpi_comm());
  for (int i = 1; i < p; ++i) displs[i] = displs[i - 1] + counts[i - 1];
  std::vector<std::int64_t> all_idx(group.rank() == 0 ? tokens : 0);
  MPI_Gatherv(natural.data(), n, MPI_INT64_T, all_idx.data(), counts.data(), displs.data(),
              MPI_INT64_T, 0, group.mpi_comm());
  std::vector<int> vcounts(p), vdispls(p);
  for (int i = 0; i < p; ++i)
    vcounts[i] = static_cast<int>(counts[i] * cols),
    vdispls[i] = static_cast<int>(displs[i] * cols);
  std::vector<double> all(group.rank() == 0 ? tokens * cols : 0);
  MPI_Gatherv(local.data(), static_cast<int>(local.size()), MPI_DOUBLE, all.data(), vcounts.data(),
              vdispls.data(), MPI_DOUBLE, 0, group.mpi_comm());
  std::vector<double> out(group.rank() == 0 ? tokens * cols : 0);
  for (std::size_t r = 0; r < all_idx.size(); ++r)
    std::copy(all.begin() + r * cols, all.begin() + (r + 1) * cols,
              out.begin() + all_idx[r] * cols);
  return out;
}

template <class Scalar, class HeadPolicy, class TokenOrder>
Outputs run_layer(const ctxpar::Group& group, const Inputs& in, bool backward, int chunk,
                  int perturb_rank, int repeat) {
  using layer = ch::GdpContextParallel<HeadPolicy, TokenOrder, exec, Scalar>;
  using matrix = typename layer::matrix;
  using parameters = typename layer::parameters;  // in the compute type (fp32 for 16-bit x)
  const ch::GdpShape& s = in.shape;
  layer cp(exec(), group, s, in.tokens, in.cu, ch::GdpOptions{1e-6, chunk});
  typename layer::saved_type saved;  // what the backward reads
  const auto& plan = cp.input_plan();
  const std::int64_t rows = plan.local_rows(), c = s.input_layout().channels(), di = s.d_inner();
  std::vector<std::int64_t> natural(rows);
  for (std::int64_t t = 0; t < rows; ++t) natural[t] = plan.natural_row(group.rank(), t);
  if (perturb_rank >= 0) {
    // Corrupting a rank that holds no tokens changes nothing: the check would pass.
    ctxpar::Preconditions chk(group, "ctxpar heads");
    chk.require(group.rank() != perturb_rank || rows > 0,
                "--perturb-rank " + std::to_string(perturb_rank) + " holds no tokens",
                "a rank that holds tokens", "an empty shard");
    chk.agree();
  }
  auto take = [&](const std::vector<double>& a, std::int64_t cols) {
    std::vector<double> out;
    for (std::int64_t n : natural)
      out.insert(out.end(), a.begin() + n * cols, a.begin() + (n + 1) * cols);
    return out;
  };
  matrix x("x", rows, c), y("y", rows, di), z("z", rows, di), dy("dy", rows, di),
      dz("dz", rows, di), dx("dx", rows, c);
  fill(x, take(in.x, c));
  fill(dy, take(in.dy, di));
  auto params = parameters::allocate(s), grads = parameters::allocate(s, "grads");
  fill(params.conv_weight, in.conv_w);
  fill(params.conv_bias, in.conv_b);
  fill(params.dt_bias, in.dt);
  fill(params.a_log, in.alog);
  fill(params.d, in.d);
  Outputs out;
  group.reset_traffic();
  const auto forward_call = [&] {
    MPI_Barrier(group.mpi_comm());
    const auto t0 = std::chrono::steady_clock::now();
    cp.forward(x, params, y, z, saved, in.cu);
    exec().fence();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const auto backward_call = [&] {
    if (!backward) return 0.0;
    MPI_Barrier(group.mpi_comm());
    const auto t0 = std::chrono::steady_clock::now();
    cp.backward(saved, dy, dz, dx, grads);
    exec().fence();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  out.forward_seconds = forward_call();
  out.backward_seconds = backward_call();
  // --repeat: the same layer object and views again; every call writes its outputs whole, so
  // the checked results are the last call's.
  out.steady.repeat = repeat;
  out.steady.run(forward_call, backward_call);
  if (group.rank() == perturb_rank && rows > 0) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
    h(0, 0) = ctxpar::narrow<Scalar>(ctxpar::widen(h(0, 0)) + 1);
    Kokkos::deep_copy(y, h);
  }
  // Per transpose: rows · (channels sent to other ranks) · sizeof; the forward has one input and
  // two output transposes.
  out.formula_bytes = plan.bytes_per_transpose() + 2 * cp.output_plan().bytes_per_transpose();
  out.y = gather_natural(group, read(y), natural, di, in.tokens);
  out.z = gather_natural(group, read(z), natural, di, in.tokens);
  if (backward) {
    out.dx = gather_natural(group, read(dx), natural, c, in.tokens);
    out.dw = read(grads.conv_weight), out.db = read(grads.conv_bias), out.ddt = read(grads.dt_bias),
    out.dalog = read(grads.a_log), out.dd = read(grads.d);
  }
  return out;
}

// The layer under the head policy of the flag `--uneven` and the token order `layout` (an index
// into `cli::layouts`).
template <class Scalar>
Outputs dispatch(const ctxpar::Group& group, const Inputs& in, bool uneven, int layout,
                 bool backward, int chunk, int perturb_rank = -1, int repeat = 0) {
  const int r = perturb_rank, n = repeat;
  return ctxpar::cli::layouts.visit(layout, [&](auto order) {
    // The input is one dense sequence, so its zigzag is the head transposes' per-sequence zigzag.
    using Order = std::conditional_t<std::is_same_v<decltype(order), ctxpar::Zigzag>,
                                     ctxpar::ZigzagPerSequence, decltype(order)>;
    return uneven ? run_layer<Scalar, ch::UnevenHeads, Order>(group, in, backward, chunk, r, n)
                  : run_layer<Scalar, ch::EvenHeads, Order>(group, in, backward, chunk, r, n);
  });
}

// The largest difference of the finite elements; NaN/Inf are compared by kind in `nonfinite`.
double max_diff(const std::vector<double>& a, const std::vector<double>& b,
                ctxpar::cli::NonFinite& nonfinite) {
  nonfinite.add(a, b);
  double m = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (std::isfinite(a[i]) && std::isfinite(b[i])) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double v : a)
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  return m;
}

// The values of `a`, whose dtype must be `want` (the message names `what`, as NpyArray's).
std::vector<double> values_in(const NpyArray& a, ctxpar::cli::Dtype want, const std::string& what) {
  ctxpar::require_local(a.dtype() == want, "ctxpar::cli::npy", what + " has the wrong dtype",
                        ctxpar::cli::descr(want), ctxpar::cli::descr(a.dtype()));
  return ctxpar::cli::values_as_double(a, what);
}

// The largest difference the check allows, relative to max(1, max|P = 1 value|), for a result
// stored in `Stored` after arithmetic in `compute_t<Scalar>`: k = 4·(T + P)·u of the arithmetic,
// and a 16-bit result's rounding in each run (`stored_tolerance`).
template <class Scalar, class Stored>
double allowed_difference(std::int64_t tokens, int ranks) {
  using arithmetic = ctxpar::compute_t<Scalar>;
  const double u = std::numeric_limits<arithmetic>::epsilon() / 2;
  return ctxpar::cli::stored_tolerance<Stored>(4.0 * static_cast<double>(tokens + ranks) * u);
}

bool has_skip(const Inputs& in) {
  return in.shape.skip != ch::SkipTerm::none;
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Runs the distributed layer and, on rank 0, the P = 1 layer; returns the JSON check record.
// `passed` (rank 0) is the tool's verdict: every output and gradient within
// 4·(T + P)·u·max(1, max|reference|) of the P = 1 layer — the forward moves the same per-head
// arithmetic between ranks, the parameter gradients are sums over the T tokens reassociated across
// P ranks; 16-bit activations add their rounding (`allowed_difference`) — and NaN/Inf exactly
// where the P = 1 layer has them.
template <class Scalar>
Json run_and_check(const ctxpar::Group& group, const Inputs& in, bool uneven, int layout,
                   bool backward, int chunk, Outputs& dist, std::map<std::string, double>& diffs,
                   bool* passed = nullptr, int perturb_rank = -1, int repeat = 0,
                   Json* peak_rss = nullptr, Json* steady = nullptr) {
  dist = dispatch<Scalar>(group, in, uneven, layout, backward, chunk, perturb_rank, repeat);
  // Before the P = 1 layer, which only rank 0 runs.
  const Json rss = ctxpar::cli::gather_counts(group, ctxpar::cli::peak_rss_bytes());
  const Json steady_state = dist.steady.to_json(group);
  if (peak_rss) *peak_rss = rss;
  if (steady) *steady = steady_state;
  const Json traffic = ctxpar::cli::gather_traffic(group);
  std::int64_t formula = dist.formula_bytes;
  std::vector<std::int64_t> formulas(group.size());
  MPI_Gather(&formula, 1, MPI_INT64_T, formulas.data(), 1, MPI_INT64_T, 0, group.mpi_comm());
  const Json fwd = ctxpar::cli::gather_seconds(group, dist.forward_seconds);
  const Json bwd = ctxpar::cli::gather_seconds(group, dist.backward_seconds);
  Json check = Json::object();
  if (group.rank() == 0) {
    const ctxpar::Group self(MPI_COMM_SELF);
    const Outputs single = dispatch<Scalar>(
        self, in, uneven, ctxpar::cli::layouts.index("contiguous"), backward, chunk);
    ctxpar::cli::NonFinite nonfinite;
    // Activations (y, z, dx) are stored in Scalar, parameter gradients in the compute type.
    const double k = allowed_difference<Scalar, ctxpar::compute_t<Scalar>>(in.tokens, group.size());
    const double ka = allowed_difference<Scalar, Scalar>(in.tokens, group.size());
    bool ok = true;
    auto compare = [&](const char* name, const std::vector<double>& got,
                       const std::vector<double>& ref, double bound) {
      diffs[name] = max_diff(got, ref, nonfinite);
      ok = ok && diffs[name] <= bound * std::max(1.0, max_abs(ref));
    };
    compare("y", dist.y, single.y, ka);
    compare("z", dist.z, single.z, ka);
    if (backward) {
      compare("dx", dist.dx, single.dx, ka);
      compare("dconv_w", dist.dw, single.dw, k);
      compare("dconv_b", dist.db, single.db, k);
      compare("ddt_bias", dist.ddt, single.ddt, k);
      compare("dA_log", dist.dalog, single.dalog, k);
      if (has_skip(in)) compare("dD", dist.dd, single.dd, k);
    }
    ok = ok && nonfinite.same_pattern();
    if (passed) *passed = ok;
    for (const auto& d : diffs) check["max_abs_diff_" + d.first] = d.second;
    check["relative_bound"] = k;
    check["relative_bound_activations"] = ka;
    check["nonfinite"] = nonfinite.in_result;
    check["nonfinite_pattern_equal"] = nonfinite.same_pattern();
    check["passed"] = ok;
    Json f = Json::array();
    for (std::int64_t v : formulas) f.push_back(v);
    check["alltoall_bytes_sent_formula_forward"] = f;
    check["traffic"] = traffic;
    check["forward_seconds"] = fwd;
    check["backward_seconds"] = bwd;
  }
  return check;
}

int run_heads(const ctxpar::cli::Args& args, const ctxpar::Group& group) {
  // What the plans will agree on (CTXPAR_HOST_ISA is checked here, before any file is read).
  const std::string host_isa =
      ctxpar::host_isa_name(ctxpar::agreed_host_isa(group, "ctxpar heads"));
  const std::string in_dir = args.get<std::string>("in"), out_dir = args.get<std::string>("out");
  Inputs in;
  // Every size by its option's name: a zero would otherwise surface as an inconsistent channel
  // section, and a huge one as an overflowing channel count.
  const std::string size_why = "every size must be at least 1 (and at most 65536)";
  for (const char* required :
       {"nheads", "headdim", "ngroups", "dstate", "householder", "conv-width"})
    (void)args.get<int>(required);
  in.shape.nheads = args.get_in<int>("nheads", 0, 1, 65536, size_why);
  in.shape.headdim = args.get_in<int>("headdim", 0, 1, 65536, size_why);
  in.shape.ngroups = args.get_in<int>("ngroups", 0, 1, 65536, size_why);
  in.shape.d_state = args.get_in<int>("dstate", 0, 1, 65536, size_why);
  in.shape.householder = args.get_in<int>("householder", 0, 1, 64, size_why);
  in.shape.conv_width = args.get_in<int>("conv-width", 0, 1, 1024, size_why);
  args.require("ngroups", in.shape.nheads % in.shape.ngroups == 0,
               "the key groups must divide the heads",
               "a divisor of --nheads " + std::to_string(in.shape.nheads), in.shape.ngroups);
  const bool uneven = args.has("uneven"), backward = args.has("backward");
  // The per-chunk C×C matrices grow with the square of the chunk (see ctxpar chunkwise).
  const int chunk = args.get_in<int>("chunk", 64, 1, 4096);
  const int perturb_rank = args.get_in<int>("perturb-rank", -1, -1, group.size() - 1,
                                            "names a rank that does not exist (-1: none)");
  const int repeat = args.get_in<int>("repeat", 0, 0, 1000000);
  const int layout = ctxpar::cli::choose(args, "layout", ctxpar::cli::layouts, "contiguous");
  ctxpar::cli::OutputDir out(group, "ctxpar heads", out_dir);

  const ch::GdpShape& s = in.shape;
  const std::string x_path = in_dir + "/x.npy";
  const NpyArray x = ctxpar::cli::read_npy(x_path);
  using ctxpar::cli::Dtype;
  ctxpar::require_local(x.dtype() != Dtype::int32, "ctxpar heads",
                        x_path + " must be float32, float64, float16 or bfloat16",
                        "'<f4', '<f8', '<f2' or '<u2' (bfloat16 bit patterns)",
                        ctxpar::cli::descr(x.dtype()));
  // Activations (x, dy; y, z, dx) in x's dtype; parameters and their gradients in the layer's
  // compute type: fp32 for 16-bit x.
  const Dtype activations = x.dtype(),
              params = x.dtype() == Dtype::float64 ? Dtype::float64 : Dtype::float32;
  const std::string param_dtype = activations == params
                                      ? " (dtype of x.npy)"
                                      : " (float32: parameters stay fp32 beside 16-bit x.npy)";
  ctxpar::require_local(x.rank() == 2, "ctxpar heads", x_path + " must be [T, C]", 2, x.rank());
  in.tokens = x.extent(0);
  ctxpar::require_local(in.tokens >= 1, "ctxpar heads", x_path + " must hold at least one token",
                        ">= 1 rows", in.tokens);
  const std::int64_t c = s.input_layout().channels();
  ctxpar::require_local(x.extent(1) == c, "ctxpar heads",
                        x_path +
                            "'s channel count must match the layout [z | V | K | Q | b | a] "
                            "of --nheads, --headdim, --ngroups, --dstate, --householder",
                        c, x.extent(1));
  // Every file named by its path, dtype (that of x.npy) and shape.
  auto read = [&](const std::string& name, const std::vector<std::int64_t>& shape, Dtype dtype) {
    const std::string path = in_dir + "/" + name;
    const NpyArray a = ctxpar::cli::read_npy(path);
    a.require_shape(shape, path);
    return values_in(a, dtype, path + (dtype == activations ? " (dtype of x.npy)" : param_dtype));
  };
  in.x = ctxpar::cli::values_as_double(x, x_path);
  in.conv_w = read("conv_w.npy", {s.conv_channels(), s.conv_width}, params);
  in.conv_b = read("conv_b.npy", {s.conv_channels()}, params);
  in.dt = read("dt_bias.npy", {s.nheads}, params);
  in.alog = read("A_log.npy", {s.nheads}, params);
  if (file_exists(in_dir + "/cu_seqlens.npy")) {
    const std::string path = in_dir + "/cu_seqlens.npy";
    const NpyArray cu = ctxpar::cli::read_npy(path);
    ctxpar::require_local(cu.rank() == 1, "ctxpar heads", path + " must be int32 [N + 1]",
                          "1 dimension", NpyArray::shape_text(cu.shape()));
    for (std::int32_t v : cu.values<std::int32_t>(path)) in.cu.push_back(v);
  }
  if (file_exists(in_dir + "/D.npy")) {
    const std::string path = in_dir + "/D.npy";
    const NpyArray d = ctxpar::cli::read_npy(path);
    const std::int64_t n = d.rank() == 1 ? d.extent(0) : -1;
    // [H] is per head; [H·d] per channel (D_has_hdim). With headdim 1 both read the same.
    ctxpar::require_local(n == s.nheads || n == s.d_inner(), "ctxpar heads",
                          path + " must be [nheads] or [nheads·headdim]",
                          std::to_string(s.nheads) + " or " + std::to_string(s.d_inner()),
                          NpyArray::shape_text(d.shape()));
    in.shape.skip = n == s.nheads ? ch::SkipTerm::per_head : ch::SkipTerm::per_channel;
    in.d = values_in(d, params, path + param_dtype);
  }
  if (file_exists(in_dir + "/dy.npy")) {
    in.dy = read("dy.npy", {in.tokens, s.d_inner()}, activations);
  } else {
    in.dy.assign(in.tokens * s.d_inner(), 1.0);
  }

  Outputs dist;
  std::map<std::string, double> diffs;
  bool passed = true;
  Json peak_rss, steady;
  Json check = ctxpar::cli::with_float_type(activations, [&](auto tag) {
    return run_and_check<decltype(tag)>(group, in, uneven, layout, backward, chunk, dist, diffs,
                                        &passed, perturb_rank, repeat, &peak_rss, &steady);
  });
  if (group.rank() == 0) {
    auto keep = [&](const std::string& name, const std::vector<double>& v,
                    std::vector<std::int64_t> shape, Dtype dtype) {
      ctxpar::cli::with_float_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        std::vector<T> values(v.size());
        for (std::size_t i = 0; i < v.size(); ++i) values[i] = ctxpar::narrow<T>(v[i]);
        out.add(name, NpyArray::from_values(std::move(shape), values));
      });
    };
    keep("y.npy", dist.y, {in.tokens, s.d_inner()}, activations);
    keep("z.npy", dist.z, {in.tokens, s.d_inner()}, activations);
    if (backward) {
      keep("dx.npy", dist.dx, {in.tokens, c}, activations);
      keep("dconv_w.npy", dist.dw, {s.conv_channels(), s.conv_width}, params);
      keep("dconv_b.npy", dist.db, {s.conv_channels()}, params);
      keep("ddt_bias.npy", dist.ddt, {s.nheads}, params);
      keep("dA_log.npy", dist.dalog, {s.nheads}, params);
      if (has_skip(in)) keep("dD.npy", dist.dd, {s.skip_size()}, params);
    }
  }
  Json summary = Json::object();
  summary["command"] = "heads";
  summary["ranks"] = group.size();
  summary["tokens"] = in.tokens;
  summary["nheads"] = s.nheads;
  summary["headdim"] = s.headdim;
  summary["ngroups"] = s.ngroups;
  summary["d_state"] = s.d_state;
  summary["householder"] = s.householder;
  summary["conv_width"] = s.conv_width;
  summary["skip_d"] = ch::skip_name(s.skip);
  summary["layout"] = ctxpar::cli::layouts.name(layout);
  summary["uneven"] = uneven;
  summary["packed_sequences"] = static_cast<std::int64_t>(in.cu.empty() ? 1 : in.cu.size() - 1);
  summary["dtype"] = ctxpar::cli::dtype_name(activations);
  summary["parameter_dtype"] = ctxpar::cli::dtype_name(params);
  summary["host_isa"] = host_isa;
  summary["peak_rss_bytes"] = peak_rss;
  if (repeat > 0) summary["steady_state"] = steady;
  summary["check_against_single_rank"] = check;
  out.add("heads.json", summary);
  out.commit();
  int verdict = passed ? 0 : 1;
  MPI_Bcast(&verdict, 1, MPI_INT, 0, group.mpi_comm());
  if (group.rank() == 0)
    std::cout << "ctxpar heads: " << group.size() << " rank(s), " << in.tokens
              << " tokens; vs P = 1: " << (passed ? "within bounds (ok)" : "DIFFERS (FAILED)")
              << " (see " << out_dir << "/heads.json)" << std::endl;
  return verdict;
}

// Demo: a GDP layer (M = 2, ngroups = 1 < P when P > 1, packed sequences, zigzag, a per-head skip
// term D) forward and backward on every rank, checked against P = 1.
bool demo_heads(const ctxpar::Group& group, std::ostream& report) {
  const int p = group.size();
  Inputs in;
  in.shape = ch::GdpShape{4 * p, 8, 1, 8, 2, 4, ch::SkipTerm::per_head};
  in.cu = {0, 8 * p, 20 * p, 32 * p};
  in.tokens = in.cu.back();
  auto value = [](std::uint64_t seed, std::int64_t i) {
    std::uint64_t z =
        seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i) + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-52 - 1.0;
  };
  const ch::GdpShape& s = in.shape;
  const std::int64_t c = s.input_layout().channels();
  for (std::int64_t i = 0; i < in.tokens * c; ++i) in.x.push_back(value(1, i));
  for (std::int64_t i = 0; i < s.conv_channels() * s.conv_width; ++i)
    in.conv_w.push_back(0.5 * value(2, i));
  for (std::int64_t i = 0; i < s.conv_channels(); ++i) in.conv_b.push_back(0.1 * value(3, i));
  for (int h = 0; h < s.nheads; ++h)
    in.dt.push_back(value(4, h)), in.alog.push_back(0.5 * value(5, h));
  for (std::int64_t i = 0; i < in.tokens * s.d_inner(); ++i) in.dy.push_back(value(6, i));
  for (int h = 0; h < s.nheads; ++h) in.d.push_back(value(7, h));
  Outputs dist;
  std::map<std::string, double> diffs;
  run_and_check<double>(group, in, false, ctxpar::cli::layouts.index("zigzag"), true, 16, dist,
                        diffs);
  bool ok = true;
  if (group.rank() == 0) {
    // Forward: the same per-head arithmetic as P = 1 (bitwise); backward: sums of repeated key
    // groups reassociate, so allow a few ulps of the gradient scale.
    const double fwd = diffs["y"], z = diffs["z"];
    const double bwd = std::max({diffs["dx"], diffs["dconv_w"], diffs["dconv_b"], diffs["ddt_bias"],
                                 diffs["dA_log"], diffs["dD"]});
    ok = fwd == 0 && z == 0 && bwd <= 1e-12;
    report << "heads: GDP M=2, H=" << s.nheads << ", ngroups=1, " << in.cu.size() - 1
           << " packed sequences, zigzag, D per head, P=" << p << ": max|y - y(P=1)| = " << fwd
           << ", max|grad - grad(P=1)| = " << bwd << "\n";
  }
  return ok;
}

}  // namespace

CTXPAR_CLI_COMMAND(
    "heads", "head-partitioned (all-to-all) context parallelism for a Gated Delta Product layer",
    "--in DIR --out DIR --nheads H --headdim d --ngroups G --dstate N --householder M\n"
    "    --conv-width w [--layout contiguous|zigzag] [--uneven] [--backward] [--chunk C]\n"
    "    [--perturb-rank R] [--repeat N]\n\n"
    "options [default]:\n"
    "  --in DIR          directory of the input files below (required)\n"
    "  --out DIR         output directory, created if absent (required)\n"
    "  --nheads H        heads, 1..65536 (required)\n"
    "  --headdim d       value channels per head, 1..65536 (required)\n"
    "  --ngroups G       key groups, divides H (required)\n"
    "  --dstate N        key channels per group, 1..65536 (required)\n"
    "  --householder M   householder copies, 1..64 (required)\n"
    "  --conv-width w    causal conv width, 1..1024 (required)\n"
    "  --layout L        contiguous or zigzag token shards [contiguous]\n"
    "  --uneven          UnevenHeads (heads not divisible by the ranks) [EvenHeads]\n"
    "  --backward        also the gradients [off]\n"
    "  --chunk C         chunk length of the kernels, 1..4096 [64]\n"
    "  --perturb-rank R  test hook: corrupts one output value of rank R, so the check must fail;\n"
    "                    -1 = none [-1]\n"
    "  --repeat N        N more calls of the same layer after the checked one (its warm-up):\n"
    "                    heads.json's steady_state has each rank's fastest forward and backward\n"
    "                    and what the layer calls allocated in them [0]\n\n"
    "input files in --in (C order, little-endian; C = H·d·(M + 1) + G·N·(M + 1) + H·(M + 1),\n"
    "C_conv = H·d·M + G·N·(M + 1)):\n"
    "  x.npy           [T, C] input projection [z | V | K | Q | b | a], float32, float64,\n"
    "                  float16 ('<f2') or bfloat16 (bit patterns as '<u2'); sets the others'\n"
    "                  dtype (16-bit x: the parameter files conv_w .. D are float32)\n"
    "  conv_w.npy      [C_conv, w]\n"
    "  conv_b.npy      [C_conv]\n"
    "  dt_bias.npy     [H]\n"
    "  A_log.npy       [H]\n"
    "  cu_seqlens.npy  [N + 1] int32, optional: packed sequences ending at T [one sequence]\n"
    "  D.npy           [H] or [H·d], optional: skip term per head or per channel [none]\n"
    "  dy.npy          [T, H·d], optional: gradient of y for --backward [ones]\n\n"
    "output files in --out (written by rank 0 after the run, dtype of x; parameter gradients\n"
    "float32 when x is 16-bit):\n"
    "  y.npy, z.npy [T, H·d]; with --backward dx.npy [T, C], dconv_w.npy [C_conv, w],\n"
    "  dconv_b.npy [C_conv], ddt_bias.npy [H], dA_log.npy [H], dD.npy (shape of D.npy, when\n"
    "  given); heads.json: shape, bytes per rank against the formula, times, peak memory per\n"
    "  rank, the check: every output within 4·(T + P)·u·max(1, max|P = 1 value|) of the P = 1 "
    "layer\n"
    "  (u of the arithmetic; 16-bit y, z, dx add the rounding of each run)\n"
    "\n"
    "exit status: 0 the run passed its check; 1 the distributed result differs from the "
    "single-rank\n"
    "one (outputs are still written, with the verdict in the summary); 2 a bad option or input "
    "file,\n"
    "named in the message (nothing is written). Non-finite inputs are propagated as the "
    "single-rank\n"
    "operator propagates them: the check passes only when NaN/Inf appear in the same elements of\n"
    "both results, and the summary counts them.\n",
    run_heads);
CTXPAR_CLI_DEMO_PART("heads", demo_heads);
