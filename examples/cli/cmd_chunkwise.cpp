// `ctxpar chunkwise`: chunkwise context parallelism (mechanism B) on .npy tensors, checked on
// rank 0 against the single-rank path; and the `chunkwise` part of `ctxpar demo` (a gated delta
// rule CP run against single-rank).
//
//   mpirun -np P ctxpar chunkwise --family scalar|diagonal|gdn|gdp --in DIR --out DIR
//       [--householder M] [--compose gather|scan] [--layout contiguous|zigzag] [--chunk 64]
//       [--scale s] [--products exact|tf32|bfloat16|float16|automatic] [--backward]
//
// DIR holds q.npy [T,H,K]; k.npy [T,H,K] and v.npy [T,H,V] (gdp: [T,M,H,K], [T,M,H,V]); g.npy
// (log-gates [T,H], diagonal [T,H,K]); beta.npy (gdn [T,H], gdp [T,M,H]); optional cu_seqlens.npy
// (int32), h0.npy [N,H,K,V], dout.npy [T,H,V] (ones when absent), dht.npy [N,H,K,V]. Every rank
// reads the files and keeps its own rows; rank 0 writes o.npy, ht.npy and with --backward dq, dk,
// dv, dg, dbeta, dh0 (.npy, shapes of their inputs) plus chunkwise.json.
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <sys/stat.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "choice.hpp"
#include "command.hpp"
#include "ctxpar/chunkwise/diagonal_gate.hpp"
#include "ctxpar/chunkwise/driver.hpp"
#include "ctxpar/chunkwise/gated_delta_product.hpp"
#include "ctxpar/chunkwise/gated_delta_rule.hpp"
#include "ctxpar/chunkwise/scalar_decay.hpp"
#include "json.hpp"
#include "measure.hpp"
#include "nonfinite.hpp"
#include "npy.hpp"
#include "output_dir.hpp"
#include "stored_tolerance.hpp"

namespace {

namespace cw = ctxpar::chunkwise;
using exec = Kokkos::DefaultExecutionSpace;
using mem = exec::memory_space;
using Rows = std::vector<std::pair<std::int64_t, std::int64_t>>;
using ctxpar::cli::NpyArray;

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// A view of the rows `rows` (global token ranges, local order) of a token-major array.
template <class View>
View take_rows(const NpyArray& a, const Rows& rows, const std::string& label) {
  using T = typename View::non_const_value_type;
  constexpr int rank = static_cast<int>(View::rank);
  ctxpar::require_local(a.rank() == rank, "ctxpar chunkwise",
                        label + " has the wrong number of dimensions", rank, a.rank());
  std::int64_t local = 0;
  for (auto r : rows) local += r.second - r.first;
  std::size_t e[4] = {static_cast<std::size_t>(local), KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX,
                      KOKKOS_INVALID_INDEX};
  std::int64_t per = 1;
  for (int d = 1; d < rank; ++d) {
    e[d] = static_cast<std::size_t>(a.extent(d));
    per *= a.extent(d);
  }
  typename View::non_const_type v(label, e[0], e[1], e[2], e[3]);
  auto h = Kokkos::create_mirror_view(v);
  const T* src = a.data<T>(label);
  std::int64_t at = 0;
  for (auto r : rows) {
    for (std::int64_t t = r.first; t < r.second; ++t, ++at) {
      for (std::int64_t j = 0; j < per; ++j) h.data()[at * per + j] = src[t * per + j];
    }
  }
  Kokkos::deep_copy(v, h);
  return v;
}

// Collective: the global array (rank 0) assembled from every rank's rows of a token-major view.
template <class View>
std::vector<double> gather_rows(const ctxpar::Group& group, const View& local, const Rows& rows,
                                std::int64_t T) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), local);
  const std::int64_t n = static_cast<std::int64_t>(local.span());
  std::int64_t count = 0;
  for (auto r : rows) count += r.second - r.first;
  std::int64_t per = 1;
  for (int d = 1; d < static_cast<int>(View::rank); ++d)
    per *= static_cast<std::int64_t>(local.extent(d));
  std::vector<double> mine(static_cast<std::size_t>(T * per), 0.0), all(mine.size(), 0.0);
  std::int64_t at = 0;
  for (auto r : rows) {
    for (std::int64_t t = r.first; t < r.second; ++t, ++at) {
      for (std::int64_t j = 0; j < per && at * per + j < n; ++j) {
        mine[static_cast<std::size_t>(t * per + j)] =
            static_cast<double>(ctxpar::widen(h.data()[at * per + j]));
      }
    }
  }
  (void)count;
  MPI_Reduce(mine.data(), all.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_SUM, 0,
             group.mpi_comm());
  return all;
}

// `values` in the file dtype `T`: exact, as every value came from a `T` (or from fp32 states).
template <class T>
NpyArray as_npy(const std::vector<double>& values, std::vector<std::int64_t> shape) {
  std::vector<T> cast(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) cast[i] = ctxpar::narrow<T>(values[i]);
  return NpyArray::from_values(std::move(shape), cast);
}

// The members every family's inputs and gradients share (q, k, v, g) plus β for the gated delta
// families; the view types come from the backend's structs, so one reader serves all four.
template <class T, class = void>
struct has_beta : std::false_type {};
template <class T>
struct has_beta<T, std::void_t<decltype(T::beta)>> : std::true_type {};
template <class T, class = void>
struct has_dbeta : std::false_type {};
template <class T>
struct has_dbeta<T, std::void_t<decltype(T::dbeta)>> : std::true_type {};

template <class Backend>
typename Backend::inputs_type read_inputs(std::map<std::string, NpyArray>& f, const Rows& r) {
  using In = typename Backend::inputs_type;
  In in;
  in.q = take_rows<decltype(In::q)>(f["q"], r, "q.npy");
  in.k = take_rows<decltype(In::k)>(f["k"], r, "k.npy");
  in.v = take_rows<decltype(In::v)>(f["v"], r, "v.npy");
  in.g = take_rows<decltype(In::g)>(f["g"], r, "g.npy");
  if constexpr (has_beta<In>::value)
    in.beta = take_rows<decltype(In::beta)>(f["beta"], r, "beta.npy");
  return in;
}

// A zeroed gradient view with the extents of the input it belongs to.
template <class Out, class In>
Out like(const In& in, const char* label) {
  return Out(Kokkos::view_alloc(std::string(label)), in.layout());
}

template <class Backend>
typename Backend::gradients_type make_gradients(const typename Backend::inputs_type& in) {
  using G = typename Backend::gradients_type;
  G g;
  g.dq = like<decltype(G::dq)>(in.q, "dq");
  g.dk = like<decltype(G::dk)>(in.k, "dk");
  g.dv = like<decltype(G::dv)>(in.v, "dv");
  g.dg = like<decltype(G::dg)>(in.g, "dg");
  if constexpr (has_dbeta<G>::value) g.dbeta = like<decltype(G::dbeta)>(in.beta, "dbeta");
  return g;
}

// Calls f(gradient name, input name, view) for each gradient.
template <class G, class F>
void each_gradient(const G& g, F&& f) {
  f("dq", "q", g.dq);
  f("dk", "k", g.dk);
  f("dv", "v", g.dv);
  f("dg", "g", g.dg);
  if constexpr (has_dbeta<G>::value) f("dbeta", "beta", g.dbeta);
}

struct Settings {
  // family, compose, layout: spellings from a table
  std::string family, in, out, compose, layout;
  cw::ChunkProducts products = cw::ChunkProducts::automatic;  // as asked (--products)
  std::string host_isa;  // the instruction set the plans' host kernels run at
  int householder = 1, chunk = 64;
  double scale = 0;
  bool backward = false;
  int perturb_rank = -1;  // test hook: corrupts one output value of this rank's distributed run
  int repeat = 0;         // --repeat: calls after the checked one, timed and counted
};

// The backend families of `--family`: each tag builds its backend for a scalar type (the files'
// dtype, known only after they are read). Only this subcommand offers them, so the table is here.
struct ScalarFamily {
  template <class Scalar>
  static cw::ScalarDecayBackend<Scalar, mem> backend(const Settings&, const cw::BackendOptions& o) {
    return cw::ScalarDecayBackend<Scalar, mem>(o);
  }
};
struct DiagonalFamily {
  template <class Scalar>
  static cw::DiagonalGateBackend<Scalar, mem> backend(const Settings&,
                                                      const cw::BackendOptions& o) {
    return cw::DiagonalGateBackend<Scalar, mem>(o);
  }
};
struct GdnFamily {
  template <class Scalar>
  static cw::GatedDeltaRuleBackend<Scalar, mem> backend(const Settings&,
                                                        const cw::BackendOptions& o) {
    return cw::GatedDeltaRuleBackend<Scalar, mem>(o);
  }
};
struct GdpFamily {
  template <class Scalar>
  static cw::GatedDeltaProductBackend<Scalar, mem> backend(const Settings& s,
                                                           const cw::BackendOptions& o) {
    return cw::GatedDeltaProductBackend<Scalar, mem>(s.householder, o);
  }
};
using ctxpar::cli::Named;
constexpr ctxpar::cli::Choices families{Named<ScalarFamily>{"scalar"},
                                        Named<DiagonalFamily>{"diagonal"}, Named<GdnFamily>{"gdn"},
                                        Named<GdpFamily>{"gdp"}};

// Seconds `f` takes on this rank, started together on every rank and fenced at the end.
template <class F>
double timed(const ctxpar::Group& group, F&& f) {
  MPI_Barrier(group.mpi_comm());
  const auto t0 = std::chrono::steady_clock::now();
  f();
  exec().fence();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One CP pass (forward, optionally backward) of `backend` over `group` for the rows the plan gives
// this rank. Fills the rank's local outputs; returns the context for the caller's timing.
template <class Policy, class Scalar, class Backend>
struct Pass {
  // The plan of this backend: on 16-bit storage it keeps the states and their gradients in fp32.
  using plan_type = cw::CpPlan<Policy, Backend, exec>;
  using State = ctxpar::compute_t<Scalar>;
  cw::token_view<Scalar, mem> o;
  typename Backend::gradients_type grads;
  cw::sequence_states_view<State, mem> ht, dh0;
  Rows rows;
  double forward_seconds = 0, backward_seconds = 0;
  ctxpar::cli::SteadyState steady;

  // `repeat` more forward (+ backward) calls on the same plan and views after the first, into
  // `steady` (the checked outputs are those of the last call: every call writes them whole).
  void run(const ctxpar::Group& group, const Backend& backend, const Settings& s,
           std::map<std::string, NpyArray>& f, const std::vector<std::int64_t>& cu,
           int repeat = 0) {
    // The token count is q.npy's, so the plan checks cu_seqlens.npy against it (agreed): offsets
    // past T would read past the inputs, offsets short of T would leave the tail unread.
    const std::int64_t tokens = f.at("q").extent(0);
    const auto& layouts = ctxpar::cli::layouts;
    const auto plan = layouts.visit(layouts.index(s.layout), [&](auto order) {
      return cw::SequenceLayout::create(group, order, tokens, cu);
    });
    rows.clear();
    for (int slot = 0; slot < plan.slots(); ++slot) {
      const int v = plan.virtual_shard(group.rank(), slot);
      rows.emplace_back(plan.shard_begin(v), plan.shard_begin(v) + plan.shard_length(v));
    }
    if (s.perturb_rank >= 0) {
      // Corrupting a rank that holds no tokens changes nothing: the check would pass.
      std::int64_t held = 0;
      for (const auto& r : rows) held += r.second - r.first;
      ctxpar::Preconditions chk(group, "ctxpar chunkwise");
      chk.require(group.rank() != s.perturb_rank || held > 0,
                  "--perturb-rank " + std::to_string(s.perturb_rank) + " holds no tokens",
                  "a rank that holds tokens", "an empty shard");
      chk.agree();
    }
    const auto in = read_inputs<Backend>(f, rows);
    const auto shape = backend.shape(in);
    const std::int64_t N = plan.sequence_count();
    o = cw::token_view<Scalar, mem>("o", shape.tokens, shape.heads, shape.value_dim);
    ht = cw::sequence_states_view<State, mem>("ht", N, shape.heads, shape.key_dim, shape.value_dim);
    typename plan_type::forward_states_type fs;
    fs.final_states = ht;
    if (f.count("h0"))
      fs.initial_states =
          take_rows<cw::const_sequence_states_view<State, mem>>(f["h0"], {{0, N}}, "h0.npy");
    // One plan and one context for every call: a repeated call reuses their memory (the steady
    // state).
    auto cp = cw::make_cp_plan<Policy>(exec(), group, backend, plan, shape);
    typename plan_type::context_type ctx;
    const auto forward_call = [&] { cp.forward(in, o, ctx, fs); };
    forward_seconds = timed(group, forward_call);
    steady.repeat = repeat;
    if (!s.backward) {
      steady.run([&] { return timed(group, forward_call); }, [] { return 0.0; });
      return;
    }
    cw::const_token_view<Scalar, mem> dout;
    if (f.count("dout")) {
      dout = take_rows<cw::const_token_view<Scalar, mem>>(f["dout"], rows, "dout.npy");
    } else {
      cw::token_view<Scalar, mem> ones("dout", shape.tokens, shape.heads, shape.value_dim);
      Kokkos::deep_copy(ones, ctxpar::narrow<Scalar>(1.0f));
      dout = ones;
    }
    grads = make_gradients<Backend>(in);
    dh0 =
        cw::sequence_states_view<State, mem>("dh0", N, shape.heads, shape.key_dim, shape.value_dim);
    typename plan_type::backward_states_type bs;
    bs.initial_state_grads = dh0;
    if (f.count("dht"))
      bs.final_state_grads =
          take_rows<cw::const_sequence_states_view<State, mem>>(f["dht"], {{0, N}}, "dht.npy");
    const auto backward_call = [&] { cp.backward(ctx, dout, grads, bs); };
    backward_seconds = timed(group, backward_call);
    steady.run([&] { return timed(group, forward_call); },
               [&] { return timed(group, backward_call); });
  }
};

// Differences of the finite elements; where either value is NaN or ±Inf the two must agree in
// kind (`nonfinite`), as the single-rank operator propagates them.
struct Compare {
  double max_abs = 0, ref_norm = 0, diff_norm = 0;
  ctxpar::cli::NonFinite nonfinite;
  void add(const std::vector<double>& a, const std::vector<double>& b) {
    nonfinite.add(a, b);
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
      max_abs = std::max(max_abs, std::fabs(a[i] - b[i]));
      diff_norm += (a[i] - b[i]) * (a[i] - b[i]);
      ref_norm += b[i] * b[i];
    }
  }
  double relative_l2() const {
    return ref_norm > 0 ? std::sqrt(diff_norm / ref_norm) : std::sqrt(diff_norm);
  }
  // The design's bar for a CP result against single-rank (summaries cross ranks in fp32, so both
  // dtypes meet it and neither beats it by much at moderate lengths); the demo uses the same.
  static constexpr double fp32_tolerance = 1e-4;
  double tolerance = fp32_tolerance;
  bool ok() const { return nonfinite.same_pattern() && relative_l2() <= tolerance; }
};

// How many chunks the state passes carry a product's rounding through (`cw::decayed_chain`): the
// chunks of the longest sequence as the CP run cuts it (at most two pieces per rank: zigzag),
// fewer where every whole chunk decays the state: the largest decay of `chunk` consecutive
// tokens of one sequence and head (log-gates `g` [T, H]). A chunk's decay bounds its transition
// for unit-norm keys and β in [0, 2], as a GDN layer gives them.
double products_chain(const std::vector<double>& g, const std::vector<std::int64_t>& cu, int H,
                      int chunk, int ranks) {
  std::int64_t longest = 0;
  double widest = -HUGE_VAL;  // the largest sum of `chunk` consecutive log-gates
  for (std::size_t s = 1; s < cu.size(); ++s) {
    longest = std::max(longest, cu[s] - cu[s - 1]);
    for (int h = 0; h < H; ++h) {
      double sum = 0;
      for (std::int64_t t = cu[s - 1]; t < cu[s]; ++t) {
        sum += g[static_cast<std::size_t>(t * H + h)];
        if (t - chunk >= cu[s - 1]) sum -= g[static_cast<std::size_t>((t - chunk) * H + h)];
        if (t - cu[s - 1] + 1 >= chunk) widest = std::max(widest, sum);
      }
    }
  }
  const double chunks = double(cw::chained_chunks(longest, chunk, 2 * ranks));
  return cw::decayed_chain(chunks, std::exp(widest), 2.0 * ranks);
}

// The bar for results stored in `Scalar`: a 16-bit output or gradient is the fp32 one rounded
// once in each run (states and their gradients stay fp32: `fp32` true). With tensor-core chunk
// products (`products`, resolved) each run is within `factor`·u_p of the exact products' result
// (`products_factors`), and the two runs' chunks need not line up, so their difference may be
// twice that.
template <class Scalar>
double stored_tolerance(cw::ChunkProducts products, double factor, bool fp32 = false) {
  const double tau = Compare::fp32_tolerance + 2 * factor * cw::products_unit_roundoff(products);
  return fp32 ? tau : ctxpar::cli::stored_tolerance<Scalar>(tau);
}

// The products' factors of the bars, forward and backward: for the gated delta families (dense
// transitions, which carry a rounding from chunk to chunk) `cw::products_roundoff_factor` over
// `chain` chunks (`products_chain`); for the decay families `cw::decay_products_roundoff_factor`,
// their componentwise bound read against each result's norm.
struct ProductsFactors {
  double forward = 0, backward = 0;
};
template <class Backend>
ProductsFactors products_factors(double chain) {
  if constexpr (std::is_same_v<typename Backend::transition_type, cw::DenseTransition>)
    return {cw::products_roundoff_factor(false, chain), cw::products_roundoff_factor(true, chain)};
  else
    return {cw::decay_products_roundoff_factor, cw::decay_products_roundoff_factor};
}

template <class View>
std::vector<double> host_values(const View& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<double> out(v.span());
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<double>(ctxpar::widen(h.data()[i]));
  return out;
}

// Rank 0: the single-rank run, the comparison, and the output files; returns the exit status.
template <class Scalar, class Backend, class CP>
int check_and_keep(int ranks, const Backend& backend, const Settings& s,
                   std::map<std::string, NpyArray>& f, const std::vector<std::int64_t>& cu,
                   const CP& cp, const std::vector<double>& o,
                   std::map<std::string, std::vector<double>>& grads,
                   const ctxpar::cli::Json& traffic, const ctxpar::cli::Json& fwd,
                   const ctxpar::cli::Json& bwd, const ctxpar::cli::Json& peak_rss,
                   const ctxpar::cli::Json& steady, ctxpar::cli::OutputDir& out) {
  const std::int64_t T = cu.back();

  // The single-rank path on rank 0, for the check.
  const ctxpar::Group self(MPI_COMM_SELF);
  Pass<cw::GatherFold, Scalar, Backend> one;
  Settings single = s;
  single.layout = "contiguous";
  one.run(self, backend, single, f, cu);
  Compare out_check, grad_check, state_check;
  // Both runs' plans multiply with these (`automatic` resolved for the space and storage type).
  const cw::ChunkProducts products = cw::chunk_products_of<exec>(backend);
  constexpr bool dense = std::is_same_v<typename Backend::transition_type, cw::DenseTransition>;
  const double chain = products == cw::ChunkProducts::exact || !dense
                           ? 0.0
                           : products_chain(ctxpar::cli::values_as_double(f.at("g"), "g.npy"), cu,
                                            static_cast<int>(f.at("g").shape()[1]), s.chunk, ranks);
  const ProductsFactors factors = products_factors<Backend>(chain);
  out_check.tolerance = stored_tolerance<Scalar>(products, factors.forward);
  grad_check.tolerance = stored_tolerance<Scalar>(products, factors.backward);
  // The states hold ht and, with --backward, dh0.
  state_check.tolerance =
      stored_tolerance<Scalar>(products, s.backward ? factors.backward : factors.forward, true);
  out_check.add(o, host_values(one.o));
  const auto ht = host_values(cp.ht);
  state_check.add(ht, host_values(one.ht));
  const auto shape_of = [&](const std::string& input) { return f[input].shape(); };
  out.add("o.npy", as_npy<Scalar>(
                       o, {T, f["v"].extent(f["v"].rank() - 2), f["v"].extent(f["v"].rank() - 1)}));
  using State = ctxpar::compute_t<Scalar>;
  out.add("ht.npy", as_npy<State>(ht, {static_cast<std::int64_t>(cu.size()) - 1,
                                       static_cast<std::int64_t>(cp.ht.extent(1)),
                                       static_cast<std::int64_t>(cp.ht.extent(2)),
                                       static_cast<std::int64_t>(cp.ht.extent(3))}));
  if (s.backward) {
    each_gradient(one.grads, [&](const char* name, const char* input, const auto& view) {
      grad_check.add(grads[name], host_values(view));
      out.add(std::string(name) + ".npy", as_npy<Scalar>(grads[name], shape_of(input)));
    });
    const auto dh0 = host_values(cp.dh0);
    state_check.add(dh0, host_values(one.dh0));
    out.add("dh0.npy", as_npy<State>(dh0, {static_cast<std::int64_t>(cu.size()) - 1,
                                           static_cast<std::int64_t>(cp.dh0.extent(1)),
                                           static_cast<std::int64_t>(cp.dh0.extent(2)),
                                           static_cast<std::int64_t>(cp.dh0.extent(3))}));
  }
  ctxpar::cli::Json j = ctxpar::cli::Json::object();
  j["command"] = "chunkwise";
  j["family"] = s.family;
  j["ranks"] = ranks;
  j["tokens"] = T;
  j["sequences"] = static_cast<std::int64_t>(cu.size()) - 1;
  j["compose"] = s.compose;
  j["layout"] = s.layout;
  j["chunk"] = s.chunk;
  j["products"] = cw::to_string(products);
  j["products_requested"] = cw::to_string(s.products);
  j["dtype"] = ctxpar::cli::dtype_name(ctxpar::cli::dtype_of<Scalar>());
  j["state_dtype"] = ctxpar::cli::dtype_name(ctxpar::cli::dtype_of<State>());
  j["host_isa"] = s.host_isa;
  j["forward_seconds"] = fwd;
  j["backward_seconds"] = bwd;
  j["peak_rss_bytes"] = peak_rss;
  if (s.repeat > 0) j["steady_state"] = steady;
  j["traffic"] = traffic;
  ctxpar::cli::Json check = ctxpar::cli::Json::object();
  check["outputs_max_abs_diff"] = out_check.max_abs;
  check["outputs_relative_l2"] = out_check.relative_l2();
  check["outputs_nonfinite"] = out_check.nonfinite.in_result;
  check["outputs_nonfinite_pattern_equal"] = out_check.nonfinite.same_pattern();
  if (s.backward) {
    check["gradients_max_abs_diff"] = grad_check.max_abs;
    check["gradients_relative_l2"] = grad_check.relative_l2();
    check["gradients_nonfinite"] = grad_check.nonfinite.in_result;
    check["gradients_nonfinite_pattern_equal"] = grad_check.nonfinite.same_pattern();
  }
  check["states_max_abs_diff"] = state_check.max_abs;
  check["states_relative_l2"] = state_check.relative_l2();
  check["states_nonfinite"] = state_check.nonfinite.in_result;
  check["states_nonfinite_pattern_equal"] = state_check.nonfinite.same_pattern();
  check["tolerance_relative_l2"] = out_check.tolerance;
  if (s.backward) check["gradients_tolerance_relative_l2"] = grad_check.tolerance;
  check["states_tolerance_relative_l2"] = state_check.tolerance;
  if (products != cw::ChunkProducts::exact && dense) check["products_chain_chunks"] = chain;
  const bool ok = out_check.ok() && state_check.ok() && (!s.backward || grad_check.ok());
  check["passed"] = ok;
  j["check_vs_single_rank"] = check;
  out.add("chunkwise.json", j);
  std::cout << "ctxpar chunkwise: " << s.family << " on " << ranks << " rank(s), " << T
            << " tokens; vs single-rank: outputs rel L2 " << out_check.relative_l2();
  std::cout << ", states rel L2 " << state_check.relative_l2();
  if (s.backward) std::cout << ", gradients rel L2 " << grad_check.relative_l2();
  std::cout << (ok ? " (ok)" : " (FAILED)") << "\n";
  if (!out_check.nonfinite.same_pattern() || !grad_check.nonfinite.same_pattern() ||
      !state_check.nonfinite.same_pattern())
    std::cout
        << "ctxpar chunkwise: NaN/Inf where the single-rank result has none, or the reverse\n";
  return ok ? 0 : 1;
}

template <class Policy, class Scalar, class Backend>
int run_typed(const ctxpar::Group& group, const Backend& backend, const Settings& s,
              std::map<std::string, NpyArray>& f, const std::vector<std::int64_t>& cu,
              ctxpar::cli::OutputDir& out) {
  const std::int64_t T = f.at("q").extent(0);
  group.reset_traffic();
  Pass<Policy, Scalar, Backend> cp;
  cp.run(group, backend, s, f, cu, s.repeat);
  if (group.rank() == s.perturb_rank && cp.o.extent(0) > 0) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cp.o);
    h(0, 0, 0) = ctxpar::narrow<Scalar>(ctxpar::widen(h(0, 0, 0)) + 1);
    Kokkos::deep_copy(cp.o, h);
  }
  ctxpar::cli::Json traffic = ctxpar::cli::gather_traffic(group);
  const auto o = gather_rows(group, cp.o, cp.rows, T);
  std::map<std::string, std::vector<double>> grads;
  if (s.backward) {
    each_gradient(cp.grads, [&](const char* name, const char*, const auto& view) {
      grads[name] = gather_rows(group, view, cp.rows, T);
    });
  }
  auto fwd = ctxpar::cli::gather_seconds(group, cp.forward_seconds);
  auto bwd = ctxpar::cli::gather_seconds(group, cp.backward_seconds);
  // Before the single-rank check, which only rank 0 runs.
  const auto peak_rss = ctxpar::cli::gather_counts(group, ctxpar::cli::peak_rss_bytes());
  const auto steady = cp.steady.to_json(group);
  int verdict = 0;
  if (group.rank() == 0)
    verdict = check_and_keep<Scalar>(group.size(), backend, s, f, cu, cp, o, grads, traffic, fwd,
                                     bwd, peak_rss, steady, out);
  out.commit();
  MPI_Bcast(&verdict, 1, MPI_INT, 0, group.mpi_comm());
  return verdict;
}

template <class Scalar>
int dispatch_policy(const ctxpar::Group& group, const Settings& s,
                    std::map<std::string, NpyArray>& f, const std::vector<std::int64_t>& cu,
                    ctxpar::cli::OutputDir& out) {
  const cw::BackendOptions options{s.chunk, s.scale, s.products};
  // The composition table is named in full inside the lambda: clang (hipcc) refuses a local
  // reference to it there, as a use of an enclosing function's variable.
  return families.visit(families.index(s.family), [&](auto family) {
    const auto backend = decltype(family)::template backend<Scalar>(s, options);
    using B = std::decay_t<decltype(backend)>;
    const int compose = ctxpar::cli::compositions.index(s.compose);
    return ctxpar::cli::compositions.visit(compose, [&](auto policy) {
      return run_typed<decltype(policy), Scalar, B>(group, backend, s, f, cu, out);
    });
  });
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// Reads the input files and checks each one's shape and dtype against the others before any
// collective: q gives T, H, K; v gives V; --householder gives n_h; cu_seqlens gives N. Every rank
// reads the same files, and the verdict is agreed (a file that differs between ranks stops every
// rank the same way): throws the same ctxpar::Error on every rank.
std::map<std::string, NpyArray> read_files(const ctxpar::Group& group, const Settings& s,
                                           std::vector<std::int64_t>& cu) {
  ctxpar::Preconditions chk(group, "ctxpar chunkwise");
  std::map<std::string, NpyArray> f;
  const bool gated = s.family == "gdn" || s.family == "gdp", product = s.family == "gdp";
  for (const char* name : {"q", "k", "v", "g", "beta", "h0", "dout", "dht", "cu_seqlens"}) {
    const std::string path = s.in + "/" + name + ".npy", n = name;
    const bool required = n == "q" || n == "k" || n == "v" || n == "g" || (n == "beta" && gated);
    if (n == "beta" && !gated) continue;
    if (!required && !file_exists(path)) continue;
    try {
      f[name] = ctxpar::cli::read_npy(path);
    } catch (const ctxpar::Error& e) {
      chk.require(false, "cannot read " + path + ": " + e.condition(), e.expected(), e.actual());
    }
  }
  const NpyArray none;
  auto get = [&](const char* name) -> const NpyArray& { return f.count(name) ? f.at(name) : none; };
  const NpyArray &q = get("q"), &v = get("v");
  const std::int64_t T = q.rank() == 3 ? q.extent(0) : 0, H = q.rank() == 3 ? q.extent(1) : 0,
                     K = q.rank() == 3 ? q.extent(2) : 0,
                     V = v.rank() >= 1 ? v.extent(v.rank() - 1) : 0, M = s.householder;
  chk.require(q.rank() == 3, "q.npy must be [T, H, K]", "3 dimensions", shape_text(q.shape()));
  // Zero sizes are refused by the file that sets them, before the operator sees them.
  chk.require(q.rank() != 3 || (T >= 1 && H >= 1 && K >= 1), "q.npy: T, H and K must be at least 1",
              "[T, H, K] >= 1", shape_text(q.shape()));
  chk.require(v.rank() == 0 || V >= 1, "v.npy: V (its last dimension) must be at least 1", ">= 1",
              shape_text(v.shape()));
  const NpyArray* cu_file = f.count("cu_seqlens") ? &f.at("cu_seqlens") : nullptr;
  const std::int64_t N = cu_file && cu_file->rank() == 1 ? cu_file->extent(0) - 1 : 1;
  using Shape = std::vector<std::int64_t>;
  const std::map<std::string, std::pair<Shape, const char*>> expected{
      {"k", product ? std::make_pair(Shape{T, M, H, K}, "[T, n_h, H, K]")
                    : std::make_pair(Shape{T, H, K}, "[T, H, K]")},
      {"v", product ? std::make_pair(Shape{T, M, H, V}, "[T, n_h, H, V]")
                    : std::make_pair(Shape{T, H, V}, "[T, H, V]")},
      {"g", s.family == "diagonal" ? std::make_pair(Shape{T, H, K}, "[T, H, K]")
                                   : std::make_pair(Shape{T, H}, "[T, H]")},
      {"beta", product ? std::make_pair(Shape{T, M, H}, "[T, n_h, H]")
                       : std::make_pair(Shape{T, H}, "[T, H]")},
      {"dout", {Shape{T, H, V}, "[T, H, V]"}},
      {"h0", {Shape{N, H, K, V}, "[N, H, K, V]"}},
      {"dht", {Shape{N, H, K, V}, "[N, H, K, V]"}}};
  const char* sizes =
      " (T, H, K from q.npy, V from v.npy, n_h from --householder, N from cu_seqlens.npy)";
  using ctxpar::cli::Dtype;
  const bool sixteen_bit = q.dtype() == Dtype::float16 || q.dtype() == Dtype::bfloat16;
  chk.require(q.dtype() != Dtype::int32, "q.npy must be float32, float64, float16 or bfloat16",
              "'<f4', '<f8', '<f2' or '<u2' (bfloat16 bit patterns)",
              ctxpar::cli::descr(q.dtype()));
  for (const auto& [name, file] : f) {
    if (name == "cu_seqlens") {
      chk.require(
          file.dtype() == ctxpar::cli::Dtype::int32 && file.rank() == 1 && file.extent(0) >= 2,
          "cu_seqlens.npy must be int32 [N + 1]", "int32 [N + 1], N >= 1",
          std::string(ctxpar::cli::descr(file.dtype())) + " " + shape_text(file.shape()));
      continue;
    }
    // q.npy sets the dtype, so its own dtype is checked before the others are compared with it:
    // an int32 q.npy is blamed on q.npy, not on the first file that differs from it.
    if (name == "q") continue;
    // States and their gradients stay fp32 on 16-bit tensors (the plan's contract).
    const bool state = name == "h0" || name == "dht";
    const Dtype want = state && sixteen_bit ? Dtype::float32 : q.dtype();
    chk.require(q.dtype() == Dtype::int32 || file.dtype() == want,
                state && sixteen_bit
                    ? name + ".npy must be float32 (states stay fp32 on 16-bit q.npy)"
                    : name + ".npy must have the dtype of q.npy",
                ctxpar::cli::descr(want), ctxpar::cli::descr(file.dtype()));
    const auto& [shape, symbols] = expected.at(name);
    chk.require(file.shape() == shape, name + ".npy must be " + symbols + sizes, shape_text(shape),
                shape_text(file.shape()));
  }
  // Log-decays are <= 0 (a decay factor exp(g) in (0, 1]); a positive or NaN one grows the state
  // without bound, so it is refused by file and index rather than turned into NaN outputs.
  if (f.count("g") && q.dtype() != Dtype::int32 && f.at("g").dtype() == q.dtype()) {
    const std::vector<double> values = ctxpar::cli::values_as_double(f.at("g"), "g.npy");
    const auto bad = std::find_if(values.begin(), values.end(), [](double x) { return !(x <= 0); });
    chk.require(
        bad == values.end(),
        "g.npy: log-decays must be <= 0 (element " + std::to_string(bad - values.begin()) + ")",
        "<= 0 (or -inf)", bad == values.end() ? 0.0 : *bad);
  }
  chk.agree();
  cu = {0, T};
  if (cu_file) {
    const auto c = cu_file->values<std::int32_t>("cu_seqlens.npy");
    cu.assign(c.begin(), c.end());
  }
  return f;
}

int run_chunkwise(const ctxpar::cli::Args& args, const ctxpar::Group& group) {
  Settings s;
  // What the plans will agree on (CTXPAR_HOST_ISA is checked here, before any file is read).
  s.host_isa = ctxpar::host_isa_name(ctxpar::agreed_host_isa(group, "ctxpar chunkwise"));
  s.in = args.get<std::string>("in");
  s.out = args.get<std::string>("out");
  s.householder = args.get<int>("householder", 1);
  s.chunk = args.get<int>("chunk", 64);
  s.scale = args.get<double>("scale", 0.0);
  s.backward = args.has("backward");
  s.repeat = args.get_in<int>("repeat", 0, 0, 1000000);
  auto usage = [](bool ok, const std::string& what, const std::string& expected,
                  const std::string& got) {
    if (!ok) throw ctxpar::cli::UsageError("ctxpar chunkwise", -1, what, expected, got);
  };
  using ctxpar::cli::choose;
  s.family = families.name(choose(args, "family", families));
  s.compose =
      ctxpar::cli::compositions.name(choose(args, "compose", ctxpar::cli::compositions, "gather"));
  s.layout = ctxpar::cli::layouts.name(choose(args, "layout", ctxpar::cli::layouts, "contiguous"));
  s.products = ctxpar::cli::chunk_products.visit(
      choose(args, "products", ctxpar::cli::chunk_products, "automatic"),
      [](auto tag) { return decltype(tag)::value; });
  usage(s.householder >= 1 && s.householder <= 3, "--householder must be 1, 2 or 3", "1..3",
        std::to_string(s.householder));
  // The per-chunk C×C matrices grow with the square of the chunk: past 4096 they alone need
  // 64 MiB per head and chunk, far beyond any useful chunk size.
  usage(s.chunk >= 1 && s.chunk <= 4096, "--chunk must be in [1, 4096]", "1..4096",
        std::to_string(s.chunk));
  s.perturb_rank = args.get_in<int>("perturb-rank", -1, -1, group.size() - 1,
                                    "names a rank that does not exist (-1: none)");
  ctxpar::cli::OutputDir out(group, "ctxpar chunkwise", s.out);

  std::map<std::string, NpyArray> f;
  std::vector<std::int64_t> cu;
  try {
    f = read_files(group, s, cu);
  } catch (const ctxpar::Error& e) {
    // The verdict is agreed: every rank reports it and returns, none is left in a collective.
    // One write per rank: the ranks print at the same moment, and piecewise output interleaves.
    const std::string line =
        "ctxpar chunkwise: rank " + std::to_string(group.rank()) + " stops: " + e.what() + "\n";
    std::cerr << line << std::flush;
    return 2;
  }
  switch (f["q"].dtype()) {
    case ctxpar::cli::Dtype::float64:
      return dispatch_policy<double>(group, s, f, cu, out);
    case ctxpar::cli::Dtype::float16:
      return dispatch_policy<ctxpar::float16>(group, s, f, cu, out);
    case ctxpar::cli::Dtype::bfloat16:
      return dispatch_policy<ctxpar::bfloat16>(group, s, f, cu, out);
    default:
      return dispatch_policy<float>(group, s, f, cu, out);
  }
}

// ---- the demo part: a gated delta rule CP run checked against the single-rank path --------------

template <class Policy>
bool demo_run(const ctxpar::Group& group, bool zigzag, std::ostream& report) {
  const std::int64_t T = 192, H = 2, K = 16, V = 16;
  const std::vector<std::int64_t> cu{0, 70, 71, 150, T};
  auto value = [](std::uint64_t seed, std::int64_t i) {
    std::uint64_t z =
        seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i) + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-52 - 1.0;
  };
  std::map<std::string, NpyArray> f;
  std::vector<float> q(T * H * K), k(T * H * K), v(T * H * V), g(T * H), beta(T * H),
      dout(T * H * V);
  for (std::int64_t i = 0; i < T * H * K; ++i) q[i] = static_cast<float>(value(1, i));
  for (std::int64_t t = 0; t < T * H; ++t) {
    double norm = 0;
    for (std::int64_t j = 0; j < K; ++j) norm += value(2, t * K + j) * value(2, t * K + j);
    for (std::int64_t j = 0; j < K; ++j)
      k[t * K + j] = static_cast<float>(value(2, t * K + j) / std::sqrt(norm));
    g[t] = static_cast<float>(-0.02 - 0.05 * (value(4, t) + 1));
    beta[t] = static_cast<float>(0.5 + 0.45 * value(5, t));
  }
  for (std::int64_t i = 0; i < T * H * V; ++i) {
    v[i] = static_cast<float>(value(3, i));
    dout[i] = static_cast<float>(value(6, i));
  }
  f["q"] = NpyArray::from_values({T, H, K}, q);
  f["k"] = NpyArray::from_values({T, H, K}, k);
  f["v"] = NpyArray::from_values({T, H, V}, v);
  f["g"] = NpyArray::from_values({T, H}, g);
  f["beta"] = NpyArray::from_values({T, H}, beta);
  f["dout"] = NpyArray::from_values({T, H, V}, dout);
  Settings s;
  s.family = "gdn";
  s.chunk = 32;
  s.backward = true;
  s.layout = zigzag ? "zigzag" : "contiguous";
  const cw::GatedDeltaRuleBackend<float, mem> backend(cw::BackendOptions{s.chunk, 0.0});
  group.reset_traffic();
  Pass<Policy, float, cw::GatedDeltaRuleBackend<float, mem>> cp;
  cp.run(group, backend, s, f, cu);
  const auto summary_bytes = group.traffic(ctxpar::CollectiveKind::allgather).bytes_sent +
                             group.traffic(ctxpar::CollectiveKind::scan).bytes_sent;
  const ctxpar::Group self(MPI_COMM_SELF);
  Pass<cw::GatherFold, float, cw::GatedDeltaRuleBackend<float, mem>> one;
  Settings single = s;
  single.layout = "contiguous";
  one.run(self, backend, single, f, cu);
  // Compare this rank's rows with the single-rank rows.
  Compare out_check, grad_check;
  const auto o_cp = host_values(cp.o), o_one = host_values(one.o);
  std::int64_t at = 0;
  const std::int64_t per = H * V;
  for (auto r : cp.rows) {
    for (std::int64_t t = r.first; t < r.second; ++t, ++at) {
      out_check.add(std::vector<double>(o_cp.begin() + at * per, o_cp.begin() + (at + 1) * per),
                    std::vector<double>(o_one.begin() + t * per, o_one.begin() + (t + 1) * per));
    }
  }
  const auto dq_cp = host_values(cp.grads.dq), dq_one = host_values(one.grads.dq);
  at = 0;
  for (auto r : cp.rows) {
    for (std::int64_t t = r.first; t < r.second; ++t, ++at) {
      grad_check.add(
          std::vector<double>(dq_cp.begin() + at * H * K, dq_cp.begin() + (at + 1) * H * K),
          std::vector<double>(dq_one.begin() + t * H * K, dq_one.begin() + (t + 1) * H * K));
    }
  }
  grad_check.add(host_values(cp.ht), host_values(one.ht));
  // fp32 kernels whose composed state crosses ranks in fp32: a relative L2 well under 1e-4 is the
  // design's bar for moderate lengths.
  const bool ok = out_check.relative_l2() < 1e-4 && grad_check.relative_l2() < 1e-4;
  report << "  gdn chunkwise CP (" << Policy::name << ", " << s.layout << ", " << group.size()
         << " ranks, T=" << T << ", 4 packed sequences): rel L2 vs single-rank outputs "
         << out_check.relative_l2() << ", dq+ht " << grad_check.relative_l2()
         << ", summary bytes sent " << summary_bytes << (ok ? "  ok" : "  MISMATCH") << "\n";
  return ok;
}

bool demo_chunkwise(const ctxpar::Group& group, std::ostream& report) {
  bool ok = demo_run<cw::GatherFold>(group, false, report);
  ok = demo_run<cw::ScanCompose>(group, true, report) && ok;
  return ok;
}

}  // namespace

CTXPAR_CLI_COMMAND(
    "chunkwise", "chunkwise linear-attention / SSM context parallelism on .npy tensors",
    "--family scalar|diagonal|gdn|gdp --in DIR --out DIR [--householder M] [--compose "
    "gather|scan]\n"
    "    [--layout contiguous|zigzag] [--chunk C] [--scale S] [--products P] [--backward]\n"
    "    [--perturb-rank R] [--repeat N]\n\n"
    "options [default]:\n"
    "  --family F        scalar decay, diagonal gate, gdn (gated delta rule), gdp (gated delta\n"
    "                    product) (required)\n"
    "  --in DIR          directory of the input files below (required)\n"
    "  --out DIR         output directory, created if absent (required)\n"
    "  --householder M   gdp: householder copies n_h, 1..3 [1]\n"
    "  --compose C       gather (all-gather and fold) or scan [gather]\n"
    "  --layout L        contiguous or zigzag shards [contiguous]\n"
    "  --chunk C         chunk length of the kernels, 1..4096 [64]\n"
    "  --scale S         query scale, finite; 0 = 1/sqrt(K) [0]\n"
    "  --products P      gdn, gdp: exact (fp32 FMA) or the intra-chunk products on tensor cores\n"
    "                    with tf32, bfloat16 or float16 operands (emulated on a CPU build:\n"
    "                    slow, for testing); automatic = q's own type for 16-bit q on a GPU\n"
    "                    with tensor cores, exact otherwise [automatic]\n"
    "  --backward        also the gradients [off]\n"
    "  --perturb-rank R  test hook: corrupts one output value of rank R, so the check must fail;\n"
    "                    -1 = none [-1]\n"
    "  --repeat N        N more calls on the same plan after the checked one (its warm-up):\n"
    "                    chunkwise.json's steady_state has each rank's fastest forward and\n"
    "                    backward and what the operator calls allocated in them [0]\n\n"
    "input files in --in (C order, little-endian; T tokens, H heads, K key and V value dims):\n"
    "  q.npy           [T, H, K]   float32, float64, float16 ('<f2') or bfloat16 (its bit\n"
    "                  patterns as '<u2'); sets the others' dtype (h0, dht: float32 when 16-bit)\n"
    "  k.npy           [T, H, K] (gdp [T, n_h, H, K])\n"
    "  v.npy           [T, H, V] (gdp [T, n_h, H, V])\n"
    "  g.npy           [T, H] log-decays (diagonal [T, H, K]); <= 0\n"
    "  beta.npy        gdn [T, H], gdp [T, n_h, H]   (gdn and gdp only)\n"
    "  cu_seqlens.npy  [N + 1] int32, optional: packed sequences, 0 = c_0 <= ... <= c_N = T [0, "
    "T]\n"
    "  h0.npy          [N, H, K, V], optional: initial states [zero]\n"
    "  dout.npy        [T, H, V], optional: gradient of o for --backward [ones]\n"
    "  dht.npy         [N, H, K, V], optional: gradient of the final states [zero]\n\n"
    "output files in --out (written by rank 0 after the run, dtype of q; the states ht and dh0\n"
    "float32 when q is 16-bit):\n"
    "  o.npy [T, H, V], ht.npy [N, H, K, V]; with --backward dq, dk, dv, dg, dbeta (.npy, shapes\n"
    "  of q, k, v, g, beta) and dh0.npy [N, H, K, V]; chunkwise.json: sizes, times, traffic, peak\n"
    "  memory per rank, the\n"
    "  check: relative L2 of outputs, states and gradients against single-rank <= 1e-4 (16-bit\n"
    "  outputs and gradients: 1e-4 plus two roundings: 7.9e-3 bfloat16, 1.1e-3 float16); with\n"
    "  products other than exact (chunkwise.json: products), plus 16 u_p (outputs, states) or\n"
    "  64 u_p (gradients), u_p the products' unit roundoff (2^-11 tf32 and float16, 2^-8 "
    "bfloat16)\n"
    "\n"
    "exit status: 0 the run passed its check; 1 the distributed result differs from the "
    "single-rank\n"
    "one (outputs are still written, with the verdict in the summary); 2 a bad option or input "
    "file,\n"
    "named in the message (nothing is written). Non-finite inputs are propagated as the "
    "single-rank\n"
    "operator propagates them: the check passes only when NaN/Inf appear in the same elements of\n"
    "both results, and the summary counts them.\n",
    run_chunkwise);
CTXPAR_CLI_DEMO_PART("chunkwise", demo_chunkwise);
