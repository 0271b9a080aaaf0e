// Helper of the `ctxpar chunkwise` command-line tests: writes deterministic inputs as .npy files,
// and checks what the tool wrote against the fp64 token-by-token recurrence oracles of
// tests/chunkwise (decay_oracle.hpp, gated_delta_oracle.hpp) within their error bounds.
//
//   chunkwise_cli_oracle gen     FAMILY DIR DTYPE PACKED      inputs (q, k, v, g, beta, dout, and
//                                                               with PACKED=1 cu_seqlens, h0, dht)
//   chunkwise_cli_oracle check   FAMILY DIR DTYPE PACKED SHARDS OUT [PRODUCTS]   o, ht, dq, dk,
//                                                               dv, dg, dbeta, dh0 in OUT vs the
//                                                               oracle (PRODUCTS: the run's
//                                                               --products, exact when absent)
//   chunkwise_cli_oracle corrupt DIR                            rewrites g.npy one head too wide
//
// FAMILY is scalar, diagonal, gdn or gdp (n_h = 2); DTYPE float32, float64, bfloat16 or float16
// (the states h0, dht, ht, dh0 float32 then, as the plans keep them); SHARDS the number of virtual
// shards of the run (P contiguous, 2P zigzag), which the bounds grow with. The oracles run on the
// values the files hold (the inputs rounded to DTYPE).
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "choice.hpp"
#include "chunkwise/decay_oracle.hpp"
#include "chunkwise/gated_delta_oracle.hpp"
#include "chunkwise/gated_delta_support.hpp"
#include "ctxpar/chunkwise/backend.hpp"
#include "ctxpar_test/roundoff.hpp"
#include "npy.hpp"

namespace {

namespace cwt = ctxpar::test::chunkwise;
namespace gd = ctxpar::test::gated_delta;
using ctxpar::cli::NpyArray;
using Shape = std::vector<std::int64_t>;

// Small, but every boundary kind occurs at P = 1..3 (contiguous and zigzag): a one-token
// document, an empty one, a document boundary on a zigzag part border (8) and one just before it
// (7), and documents spanning two and three ranks. chunk 8 < the local lengths (not multiples).
constexpr std::int64_t T = 45, H = 2, K = 8, V = 6, chunk = 8;
const std::vector<std::int64_t> packed_cu{0, 7, 8, 8, 23, 45};

std::vector<std::int64_t> cu_of(bool packed) {
  return packed ? packed_cu : std::vector<std::int64_t>{0, T};
}

int householder(const std::string& family) {
  return family == "gdp" ? 2 : 1;
}

using ctxpar::cli::Dtype;

Dtype dtype_named(const std::string& name) {
  for (Dtype d : {Dtype::float32, Dtype::float64, Dtype::bfloat16, Dtype::float16})
    if (name == ctxpar::cli::dtype_name(d)) return d;
  throw std::invalid_argument("unknown DTYPE " + name);
}

// The dtype of the states and their gradients: fp32 for 16-bit tensors.
Dtype state_dtype(Dtype d) {
  return d == Dtype::bfloat16 || d == Dtype::float16 ? Dtype::float32 : d;
}

// Every value of `x` replaced by the nearest value of `d` (what its file will hold).
void round_to(std::vector<double>& x, Dtype d) {
  ctxpar::cli::with_float_type(d, [&](auto tag) {
    using T = decltype(tag);
    for (auto& e : x) e = static_cast<double>(ctxpar::widen(ctxpar::narrow<T>(e)));
  });
}

void write(const std::string& path, const std::vector<double>& x, Shape shape, Dtype d) {
  ctxpar::cli::with_float_type(d, [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> values(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) values[i] = ctxpar::narrow<T>(x[i]);
    ctxpar::cli::write_npy(path, NpyArray::from_values(std::move(shape), values));
  });
}

std::vector<double> read(const std::string& path, const Shape& shape, Dtype d) {
  const NpyArray a = ctxpar::cli::read_npy(path);
  a.require_shape(shape, path);
  if (a.dtype() != d)
    throw std::runtime_error(path + " is " + ctxpar::cli::dtype_name(a.dtype()) + ", expected " +
                             ctxpar::cli::dtype_name(d));
  return ctxpar::cli::values_as_double(a, path);
}

// The problem of a family as fp64 arrays in the tool's file layouts, the oracle's results and
// per-element absolute bounds.
struct Case {
  std::vector<std::int64_t> cu;
  std::vector<double> q, k, v, g, beta, dout, h0, dht;
  Shape k_shape, v_shape, g_shape, beta_shape;
  cwt::Result want, bound;
};

// The bound of a result stored in `d` (a 16-bit output or gradient: its fp32 bound `b` and one
// rounding, `stored_once_bound`).
void add_storage_rounding(std::vector<double>& b, const std::vector<double>& x, Dtype d) {
  ctxpar::cli::with_float_type(d, [&](auto tag) {
    for (std::size_t i = 0; i < b.size(); ++i)
      b[i] = ctxpar::test::stored_once_bound<decltype(tag)>(x[i], b[i]);
  });
}

// The inputs rounded to the files' dtypes, then the oracle's results and bounds; `Scalar` is the
// arithmetic type of the run (fp32 for the 16-bit tensors).
// `products_roundoff`: the unit roundoff of the run's chunk products (0 for exact).
template <class Scalar>
Case make_case(const std::string& family, bool packed, int shards, Dtype d,
               double products_roundoff);

Case make_case(const std::string& family, bool packed, int shards, Dtype d,
               double products_roundoff = 0) {
  Case c = d == Dtype::float64 ? make_case<double>(family, packed, shards, d, products_roundoff)
                               : make_case<float>(family, packed, shards, d, products_roundoff);
  add_storage_rounding(c.bound.output, c.want.output, d);
  for (std::size_t i = 0; i < c.bound.grads.size(); ++i)
    add_storage_rounding(c.bound.grads[i].values, c.want.grads[i].values, d);
  return c;
}

template <class Scalar>
Case make_case(const std::string& family, bool packed, int shards, Dtype d,
               double products_roundoff) {
  Case c;
  c.cu = cu_of(packed);
  const std::int64_t N = static_cast<std::int64_t>(c.cu.size()) - 1, M = householder(family);
  if (family == "scalar" || family == "diagonal") {
    const bool diagonal = family == "diagonal";
    cwt::DecayProblem p = cwt::make_decay_problem(H, K, V, diagonal, c.cu, 41, chunk);
    for (auto* x : {&p.q, &p.k, &p.v, &p.g, &p.dout}) round_to(*x, d);
    for (auto* x : {&p.h0, &p.dht}) round_to(*x, state_dtype(d));
    c.q = p.q, c.k = p.k, c.v = p.v, c.g = p.g, c.dout = p.dout;
    if (packed) c.h0 = p.h0, c.dht = p.dht;
    c.k_shape = {T, H, K};
    c.v_shape = {T, H, V};
    c.g_shape = diagonal ? Shape{T, H, K} : Shape{T, H};
    c.want = cwt::decay_oracle(p, packed, packed, false).result;
    c.bound = cwt::decay_bounds<Scalar>(p, packed, packed, shards, products_roundoff);
    return c;
  }
  const std::vector<int> cu_int(c.cu.begin(), c.cu.end());
  gd::Problem p =
      gd::make_problem(43, static_cast<int>(T), static_cast<int>(M), static_cast<int>(H),
                       static_cast<int>(K), static_cast<int>(V), cu_int, packed);
  for (auto* x : {&p.q, &p.k, &p.v, &p.g, &p.beta}) round_to(*x, d);
  round_to(p.h0, state_dtype(d));
  c.q = p.q, c.k = p.k, c.v = p.v, c.g = p.g, c.beta = p.beta, c.h0 = p.h0;
  c.dout.resize(static_cast<std::size_t>(T * H * V));
  for (std::size_t i = 0; i < c.dout.size(); ++i) c.dout[i] = ctxpar::test::uniform(47, i);
  round_to(c.dout, d);
  if (packed) {
    c.dht.resize(static_cast<std::size_t>(N * H * K * V));
    for (std::size_t i = 0; i < c.dht.size(); ++i) c.dht[i] = 0.5 * ctxpar::test::uniform(53, i);
    round_to(c.dht, state_dtype(d));
  }
  c.k_shape = M > 1 ? Shape{T, M, H, K} : Shape{T, H, K};
  c.v_shape = M > 1 ? Shape{T, M, H, V} : Shape{T, H, V};
  c.g_shape = {T, H};
  c.beta_shape = M > 1 ? Shape{T, M, H} : Shape{T, H};
  const gd::Forward f = gd::forward(p);
  const gd::Gradients gr = gd::backward(p, c.dout, c.dht);
  c.want.output = f.o;
  c.want.final_states = f.ht;
  c.want.initial_state_grads = gr.dh0;
  c.want.grads = {{"dq", gr.dq}, {"dk", gr.dk}, {"dv", gr.dv}, {"dg", gr.dg}, {"dbeta", gr.dbeta}};
  // As tests/chunkwise/gated_delta_cp_test.cpp: the normwise bound of each tensor for each of its
  // elements, 8 (C·n_h + K + V)·u forward and twice that backward, plus the fp32 summaries, plus
  // ctxpar::chunkwise::products_roundoff_factor·u_p for tensor-core chunk products over the
  // chunks of the longest sequence (T, two pieces per shard at most: zigzag).
  const double fp32 = (16.0 + 4.0 * shards) * ctxpar::test::unit_roundoff<float>();
  const double chain = double(ctxpar::chunkwise::chained_chunks(T, chunk, 2 * shards));
  const double ef = gd::rel_bound<Scalar>(static_cast<int>(chunk * M), K, V, 8) + fp32 +
                    ctxpar::chunkwise::products_roundoff_factor(false, chain) * products_roundoff;
  const double eb = gd::rel_bound<Scalar>(static_cast<int>(chunk * M), K, V, 16) + fp32 +
                    ctxpar::chunkwise::products_roundoff_factor(true, chain) * products_roundoff;
  auto fill = [](std::vector<double> x, double eps) {
    double n2 = 0;
    for (double e : x) n2 += e * e;
    for (auto& e : x) e = eps * std::sqrt(n2) + 1e-300;
    return x;
  };
  c.bound.output = fill(c.want.output, ef);
  c.bound.final_states = fill(c.want.final_states, ef);
  c.bound.initial_state_grads = fill(c.want.initial_state_grads, eb);
  for (const auto& a : c.want.grads) c.bound.grads.push_back({a.name, fill(a.values, eb)});
  return c;
}

int generate(const std::string& family, const std::string& dir, Dtype d, bool packed) {
  const Case c = make_case(family, packed, 1, d);
  const std::int64_t N = static_cast<std::int64_t>(c.cu.size()) - 1;
  write(dir + "/q.npy", c.q, {T, H, K}, d);
  write(dir + "/k.npy", c.k, c.k_shape, d);
  write(dir + "/v.npy", c.v, c.v_shape, d);
  write(dir + "/g.npy", c.g, c.g_shape, d);
  if (!c.beta.empty()) write(dir + "/beta.npy", c.beta, c.beta_shape, d);
  write(dir + "/dout.npy", c.dout, {T, H, V}, d);
  if (packed) {
    const std::vector<std::int32_t> cu(c.cu.begin(), c.cu.end());
    ctxpar::cli::write_npy(dir + "/cu_seqlens.npy",
                           NpyArray::from_values({static_cast<std::int64_t>(cu.size())}, cu));
    write(dir + "/h0.npy", c.h0, {N, H, K, V}, state_dtype(d));
    write(dir + "/dht.npy", c.dht, {N, H, K, V}, state_dtype(d));
  }
  return 0;
}

// |got - want| <= bound element by element; prints the worst element relative to its bound.
bool compare(const std::string& what, const std::vector<double>& got,
             const std::vector<double>& want, const std::vector<double>& bound) {
  double worst = -1;
  std::size_t at = 0;
  bool ok = got.size() == want.size() && bound.size() == want.size();
  for (std::size_t i = 0; ok && i < want.size(); ++i) {
    const double r = std::fabs(got[i] - want[i]) / bound[i];
    if (!(r <= worst)) worst = r, at = i;  // also catches NaN
  }
  ok = ok && worst <= 1.0;
  std::cout << what << ": " << (ok ? "ok" : "MISMATCH") << ", worst |error|/bound " << worst;
  if (!want.empty() && at < got.size())
    std::cout << " at flat index " << at << " (got " << got[at] << ", expected " << want[at]
              << ", bound " << bound[at] << ")";
  if (got.size() != want.size())
    std::cout << " (" << got.size() << " values, expected " << want.size() << ")";
  std::cout << "\n";
  return ok;
}

int check(const std::string& family, Dtype d, bool packed, int shards, const std::string& out,
          const std::string& products) {
  const int index = ctxpar::cli::chunk_products.index(products);
  if (index < 0) throw std::invalid_argument("unknown products " + products);
  const double up = ctxpar::chunkwise::products_unit_roundoff(
      ctxpar::cli::chunk_products.visit(index, [](auto tag) { return decltype(tag)::value; }));
  const Case c = make_case(family, packed, shards, d, up);
  const std::int64_t N = static_cast<std::int64_t>(c.cu.size()) - 1;
  const Shape state{N, H, K, V};
  bool ok = compare("o", read(out + "/o.npy", {T, H, V}, d), c.want.output, c.bound.output);
  ok = compare("ht", read(out + "/ht.npy", state, state_dtype(d)), c.want.final_states,
               c.bound.final_states) &&
       ok;
  ok = compare("dh0", read(out + "/dh0.npy", state, state_dtype(d)), c.want.initial_state_grads,
               c.bound.initial_state_grads) &&
       ok;
  const Shape shapes[] = {{T, H, K}, c.k_shape, c.v_shape, c.g_shape, c.beta_shape};
  for (std::size_t i = 0; i < c.want.grads.size(); ++i) {
    const std::string name = c.want.grads[i].name;
    ok = compare(name, read(out + "/" + name + ".npy", shapes[i], d), c.want.grads[i].values,
                 c.bound.grads[i].values) &&
         ok;
  }
  return ok ? 0 : 1;
}

// g.npy one head too wide: a shape the tool must refuse on every rank.
int corrupt(const std::string& dir) {
  const NpyArray g = ctxpar::cli::read_npy(dir + "/g.npy");
  Shape shape = g.shape();
  shape[1] += 1;
  std::int64_t n = 1;
  for (auto e : shape) n *= e;
  write(dir + "/g.npy", std::vector<double>(static_cast<std::size_t>(n), -0.01), shape, g.dtype());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The oracle headers use the test harness (MPI rank in messages); one process, no Kokkos views.
  MPI_Init(&argc, &argv);
  int status = 2;
  const std::vector<std::string> a(argv + 1, argv + argc);
  try {
    if (a.size() == 5 && a[0] == "gen") {
      status = generate(a[1], a[2], dtype_named(a[3]), a[4] == "1");
    } else if ((a.size() == 7 || a.size() == 8) && a[0] == "check") {
      status = check(a[1], dtype_named(a[3]), a[4] == "1", std::stoi(a[5]), a[6],
                     a.size() == 8 ? a[7] : "exact");
    } else if (a.size() == 2 && a[0] == "corrupt") {
      status = corrupt(a[1]);
    } else {
      std::cerr << "usage: chunkwise_cli_oracle gen FAMILY DIR DTYPE PACKED | check FAMILY DIR "
                   "DTYPE PACKED SHARDS OUT [PRODUCTS] | corrupt DIR\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "chunkwise_cli_oracle: " << e.what() << "\n";
    status = 2;
  }
  MPI_Finalize();
  return status;
}
