// `ctxpar heads`: head-partitioned context parallelism (mechanism C) for a Gated Delta Product
// layer on .npy tensors, checked on rank 0 against the single-rank (P = 1) layer; and the `heads`
// part of `ctxpar demo` (a GDP head-parallel run checked against P = 1).
//
//   mpirun -np P ctxpar heads --in DIR --out DIR --nheads H --headdim d --ngroups G --dstate N
//       --householder M --conv-width w [--layout contiguous|zigzag] [--uneven] [--backward]
//       [--chunk C]
//
// DIR: x.npy [T, C] (input-projection output [z | V | K | Q | b | a], natural token order; float32
// or float64), conv_w.npy [C_conv, w], conv_b.npy [C_conv], dt_bias.npy [H], A_log.npy [H],
// optional cu_seqlens.npy (int32), optional dy.npy [T, H·d] (ones when absent; dz is zero),
// optional D.npy (the skip term: [H] per head, or [H·d] per channel, i.e. D_has_hdim). Every rank
// reads the files and keeps its own rows in the chosen layout. Rank 0 writes y.npy and z.npy
// (natural order), with --backward dx.npy, dconv_w.npy, dconv_b.npy, ddt_bias.npy, dA_log.npy (and
// dD.npy when D.npy was given), and heads.json (shape, layout, bytes per rank against the formula,
// times, max |diff| against P = 1).
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <sys/stat.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "command.hpp"
#include "ctxpar/heads/gdp_context_parallel.hpp"
#include "json.hpp"
#include "npy.hpp"

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
};

template <class View>
void fill(const View& v, const std::vector<double>& values) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < values.size(); ++i)
    h.data()[i] = static_cast<typename View::value_type>(values[i]);
  Kokkos::deep_copy(v, h);
}
template <class View>
std::vector<double> read(const View& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<double>(h.data(), h.data() + h.span());
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
Outputs run_layer(const ctxpar::Group& group, const Inputs& in, bool backward, int chunk) {
  using matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, mem>;
  const ch::GdpShape& s = in.shape;
  ch::GdpContextParallel<Scalar, mem, HeadPolicy, TokenOrder> cp(group, s, in.tokens, in.cu,
                                                                 ch::GdpOptions{1e-6, chunk});
  const auto& plan = cp.input_plan();
  const std::int64_t rows = plan.local_rows(), c = s.input_layout().channels(), di = s.d_inner();
  std::vector<std::int64_t> natural(rows);
  for (std::int64_t t = 0; t < rows; ++t) natural[t] = plan.natural_row(group.rank(), t);
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
  auto params = ch::GdpParameters<Scalar, mem>::allocate(s),
       grads = ch::GdpParameters<Scalar, mem>::allocate(s, "grads");
  fill(params.conv_weight, in.conv_w);
  fill(params.conv_bias, in.conv_b);
  fill(params.dt_bias, in.dt);
  fill(params.a_log, in.alog);
  fill(params.d, in.d);
  Outputs out;
  group.reset_traffic();
  MPI_Barrier(group.mpi_comm());
  auto t0 = std::chrono::steady_clock::now();
  cp.forward(exec(), x, params, y, z, in.cu);
  exec().fence();
  out.forward_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (backward) {
    t0 = std::chrono::steady_clock::now();
    cp.backward(exec(), dy, dz, dx, grads);
    exec().fence();
    out.backward_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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

template <class Scalar>
Outputs dispatch(const ctxpar::Group& group, const Inputs& in, bool uneven, bool zigzag,
                 bool backward, int chunk) {
  if (uneven) {
    return zigzag ? run_layer<Scalar, ch::UnevenHeads, ch::Zigzag>(group, in, backward, chunk)
                  : run_layer<Scalar, ch::UnevenHeads, ch::Contiguous>(group, in, backward, chunk);
  }
  return zigzag ? run_layer<Scalar, ch::EvenHeads, ch::Zigzag>(group, in, backward, chunk)
                : run_layer<Scalar, ch::EvenHeads, ch::Contiguous>(group, in, backward, chunk);
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

std::vector<double> as_doubles(const NpyArray& a, bool f32, const std::string& what) {
  std::vector<double> out;
  if (f32) {
    for (float v : a.values<float>(what)) out.push_back(v);
  } else {
    out = a.values<double>(what);
  }
  return out;
}

bool has_skip(const Inputs& in) {
  return in.shape.skip != ch::SkipTerm::none;
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Runs the distributed layer and, on rank 0, the P = 1 layer; returns the JSON check record.
template <class Scalar>
Json run_and_check(const ctxpar::Group& group, const Inputs& in, bool uneven, bool zigzag,
                   bool backward, int chunk, Outputs& dist, std::map<std::string, double>& diffs) {
  dist = dispatch<Scalar>(group, in, uneven, zigzag, backward, chunk);
  const Json traffic = ctxpar::cli::gather_traffic(group);
  std::int64_t formula = dist.formula_bytes;
  std::vector<std::int64_t> formulas(group.size());
  MPI_Gather(&formula, 1, MPI_INT64_T, formulas.data(), 1, MPI_INT64_T, 0, group.mpi_comm());
  const Json fwd = ctxpar::cli::gather_seconds(group, dist.forward_seconds);
  const Json bwd = ctxpar::cli::gather_seconds(group, dist.backward_seconds);
  Json check = Json::object();
  if (group.rank() == 0) {
    const ctxpar::Group self(MPI_COMM_SELF);
    const Outputs single = dispatch<Scalar>(self, in, uneven, false, backward, chunk);
    diffs["y"] = max_diff(dist.y, single.y);
    diffs["z"] = max_diff(dist.z, single.z);
    if (backward) {
      diffs["dx"] = max_diff(dist.dx, single.dx);
      diffs["dconv_w"] = max_diff(dist.dw, single.dw);
      diffs["dconv_b"] = max_diff(dist.db, single.db);
      diffs["ddt_bias"] = max_diff(dist.ddt, single.ddt);
      diffs["dA_log"] = max_diff(dist.dalog, single.dalog);
      if (has_skip(in)) diffs["dD"] = max_diff(dist.dd, single.dd);
    }
    for (const auto& d : diffs) check["max_abs_diff_" + d.first] = d.second;
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
  const std::string in_dir = args.get<std::string>("in"), out_dir = args.get<std::string>("out");
  Inputs in;
  in.shape.nheads = args.get<int>("nheads");
  in.shape.headdim = args.get<int>("headdim");
  in.shape.ngroups = args.get<int>("ngroups");
  in.shape.d_state = args.get<int>("dstate");
  in.shape.householder = args.get<int>("householder");
  in.shape.conv_width = args.get<int>("conv-width");
  const std::string layout = args.get<std::string>("layout", std::string("contiguous"));
  const bool uneven = args.has("uneven"), backward = args.has("backward");
  const int chunk = args.get<int>("chunk", 64);
  if (layout != "contiguous" && layout != "zigzag")
    throw ctxpar::cli::UsageError("ctxpar heads", -1, "--layout must be contiguous or zigzag",
                                  "contiguous|zigzag", layout);

  const ch::GdpShape& s = in.shape;
  const NpyArray x = ctxpar::cli::read_npy(in_dir + "/x.npy");
  const bool f32 = x.dtype() == ctxpar::cli::Dtype::float32;
  ctxpar::require_local(x.rank() == 2, "ctxpar heads", "x.npy must be [T, C]", 2, x.rank());
  in.tokens = x.extent(0);
  const std::int64_t c = s.input_layout().channels();
  ctxpar::require_local(x.extent(1) == c, "ctxpar heads",
                        "x.npy's channel count must match the layout [z | V | K | Q | b | a]", c,
                        x.extent(1));
  in.x = as_doubles(x, f32, "x.npy");
  const NpyArray w = ctxpar::cli::read_npy(in_dir + "/conv_w.npy");
  w.require_shape({s.conv_channels(), s.conv_width}, "conv_w.npy");
  in.conv_w = as_doubles(w, f32, "conv_w.npy");
  const NpyArray b = ctxpar::cli::read_npy(in_dir + "/conv_b.npy");
  b.require_shape({s.conv_channels()}, "conv_b.npy");
  in.conv_b = as_doubles(b, f32, "conv_b.npy");
  const NpyArray dt = ctxpar::cli::read_npy(in_dir + "/dt_bias.npy");
  dt.require_shape({s.nheads}, "dt_bias.npy");
  in.dt = as_doubles(dt, f32, "dt_bias.npy");
  const NpyArray al = ctxpar::cli::read_npy(in_dir + "/A_log.npy");
  al.require_shape({s.nheads}, "A_log.npy");
  in.alog = as_doubles(al, f32, "A_log.npy");
  if (file_exists(in_dir + "/cu_seqlens.npy")) {
    for (std::int32_t v :
         ctxpar::cli::read_npy(in_dir + "/cu_seqlens.npy").values<std::int32_t>("cu_seqlens.npy"))
      in.cu.push_back(v);
  }
  if (file_exists(in_dir + "/D.npy")) {
    const NpyArray d = ctxpar::cli::read_npy(in_dir + "/D.npy");
    const std::int64_t n = d.rank() == 1 ? d.extent(0) : -1;
    // [H] is per head; [H·d] per channel (D_has_hdim). With headdim 1 both read the same.
    ctxpar::require_local(n == s.nheads || n == s.d_inner(), "ctxpar heads",
                          "D.npy must be [nheads] or [nheads·headdim]",
                          std::to_string(s.nheads) + " or " + std::to_string(s.d_inner()),
                          d.rank() == 1 ? std::to_string(n) : "rank " + std::to_string(d.rank()));
    in.shape.skip = n == s.nheads ? ch::SkipTerm::per_head : ch::SkipTerm::per_channel;
    in.d = as_doubles(d, f32, "D.npy");
  }
  if (file_exists(in_dir + "/dy.npy")) {
    const NpyArray dy = ctxpar::cli::read_npy(in_dir + "/dy.npy");
    dy.require_shape({in.tokens, s.d_inner()}, "dy.npy");
    in.dy = as_doubles(dy, f32, "dy.npy");
  } else {
    in.dy.assign(in.tokens * s.d_inner(), 1.0);
  }

  Outputs dist;
  std::map<std::string, double> diffs;
  Json check = f32 ? run_and_check<float>(group, in, uneven, layout == "zigzag", backward, chunk,
                                          dist, diffs)
                   : run_and_check<double>(group, in, uneven, layout == "zigzag", backward, chunk,
                                           dist, diffs);
  if (group.rank() == 0) {
    auto write = [&](const std::string& name, const std::vector<double>& v,
                     std::vector<std::int64_t> shape) {
      if (f32) {
        std::vector<float> f(v.begin(), v.end());
        ctxpar::cli::write_npy(out_dir + "/" + name, f.data(), shape);
      } else {
        ctxpar::cli::write_npy(out_dir + "/" + name, v.data(), shape);
      }
    };
    write("y.npy", dist.y, {in.tokens, s.d_inner()});
    write("z.npy", dist.z, {in.tokens, s.d_inner()});
    if (backward) {
      write("dx.npy", dist.dx, {in.tokens, c});
      write("dconv_w.npy", dist.dw, {s.conv_channels(), s.conv_width});
      write("dconv_b.npy", dist.db, {s.conv_channels()});
      write("ddt_bias.npy", dist.ddt, {s.nheads});
      write("dA_log.npy", dist.dalog, {s.nheads});
      if (has_skip(in)) write("dD.npy", dist.dd, {s.skip_size()});
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
  summary["layout"] = layout;
  summary["uneven"] = uneven;
  summary["packed_sequences"] = static_cast<std::int64_t>(in.cu.empty() ? 1 : in.cu.size() - 1);
  summary["dtype"] = f32 ? "float32" : "float64";
  summary["check_against_single_rank"] = check;
  ctxpar::cli::write_json(group, out_dir + "/heads.json", summary);
  return 0;
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
  run_and_check<double>(group, in, false, true, true, 16, dist, diffs);
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
    "--in DIR --out DIR --nheads H --headdim d --ngroups G --dstate N --householder M --conv-width "
    "w --layout L --uneven --backward --chunk C (optional D.npy in DIR: the skip term, dD.npy out)",
    run_heads);
CTXPAR_CLI_DEMO_PART("heads", demo_heads);
