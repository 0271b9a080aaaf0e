// The head-parallel GDP layer end to end (pre_conv_ssm → conv → gates → L2 norm → recurrence →
// post_conv_ssm) against the P = 1 layer (bitwise forward; backward within rounding) and an fp64
// plain-loop oracle (forward and backward, inputs and every parameter), on every rank, for
// M ∈ {1, 2, 3}, ngroups below/equal/above P, contiguous and zigzag, dense and packed, with the
// skip term D per head, per channel and absent; and the conv weight gradient's host channel
// blocking against one channel per work item.
#include <cmath>

#include "ctxpar/core/allocation_counter.hpp"
#include "ctxpar/heads/gdp_context_parallel.hpp"
#include "ctxpar_test/harness.hpp"
#include "gdp_oracle.hpp"
#include "oracle.hpp"

namespace {

using ctxpar::test::world;
namespace ch = ctxpar::heads;
constexpr double l2_eps = 1e-6;

heads_test::GdpData make_data(const ch::GdpShape& s, std::int64_t t_total, std::uint64_t seed) {
  using ctxpar::test::uniform;
  heads_test::GdpData d;
  const std::int64_t c = s.input_layout().channels(), cc = s.conv_channels();
  for (std::int64_t i = 0; i < t_total * c; ++i) d.x.push_back(uniform(seed, i));
  for (std::int64_t i = 0; i < cc * s.conv_width; ++i)
    d.conv_w.push_back(0.6 * uniform(seed + 1, i));
  for (std::int64_t i = 0; i < cc; ++i) d.conv_b.push_back(0.2 * uniform(seed + 2, i));
  for (int h = 0; h < s.nheads; ++h) d.dt.push_back(uniform(seed + 3, h));
  for (int h = 0; h < s.nheads; ++h) d.alog.push_back(0.5 * uniform(seed + 4, h));
  for (std::int64_t i = 0; i < t_total * s.d_inner(); ++i) d.dy.push_back(uniform(seed + 5, i));
  for (std::int64_t i = 0; i < t_total * s.d_inner(); ++i) d.dz.push_back(uniform(seed + 6, i));
  for (std::int64_t i = 0; i < s.skip_size(); ++i) d.D.push_back(0.8 * uniform(seed + 7, i));
  return d;
}

template <class View>
void fill(const View& v, const std::vector<double>& values) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < values.size(); ++i)
    h.data()[i] = ctxpar::narrow<typename View::value_type>(values[i]);
  Kokkos::deep_copy(v, h);
}
/// The full parameters from the test data (D only when the shape has a skip term: `d.D` is empty
/// otherwise, and so is `p.d`).
template <class Parameters>
void fill_parameters(const Parameters& p, const heads_test::GdpData& d) {
  fill(p.conv_weight, d.conv_w);
  fill(p.conv_bias, d.conv_b);
  fill(p.dt_bias, d.dt);
  fill(p.a_log, d.alog);
  fill(p.d, d.D);
}
template <class View>
std::vector<double> read(const View& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<double> out;
  for (std::size_t i = 0; i < h.span(); ++i)
    out.push_back(static_cast<double>(ctxpar::widen(h.data()[i])));
  return out;
}
// The natural token of each of rank `rank`'s sequence-parallel rows.
template <class Plan>
std::vector<std::int64_t> natural_rows(const Plan& plan, int rank) {
  std::vector<std::int64_t> natural(plan.rows(rank));
  for (std::int64_t t = 0; t < plan.rows(rank); ++t) natural[t] = plan.natural_row(rank, t);
  return natural;
}
// Rows `natural[t]` of a row-major [T, cols] array.
std::vector<double> rows_of(const std::vector<double>& a, std::int64_t cols,
                            const std::vector<std::int64_t>& natural) {
  std::vector<double> out;
  for (std::int64_t n : natural)
    out.insert(out.end(), a.begin() + n * cols, a.begin() + (n + 1) * cols);
  return out;
}

template <class Scalar, class Mem>
struct Run {
  using cp_matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, Mem>;
  std::vector<double> y, z, dx, dw, db, ddt, dalog, dd;
};

template <class Exec, class Scalar, class HeadPolicy, class TokenOrder>
Run<Scalar, typename Exec::memory_space> run_layer(const ctxpar::Group& group,
                                                   const ch::GdpShape& s, std::int64_t t_total,
                                                   const std::vector<std::int64_t>& cu,
                                                   const heads_test::GdpData& d,
                                                   const std::vector<std::int64_t>& natural) {
  using mem = typename Exec::memory_space;
  using matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, mem>;
  // A small chunk so that every sequence spans several chunks of the recurrence kernel.
  using layer = ch::GdpContextParallel<HeadPolicy, TokenOrder, Exec, Scalar>;
  layer cp(Exec(), group, s, t_total, cu, ch::GdpOptions{l2_eps, 4});
  typename layer::saved_type saved;
  const std::int64_t rows = natural.size(), c = s.input_layout().channels(), di = s.d_inner();
  matrix x("x", rows, c), y("y", rows, di), z("z", rows, di), dy("dy", rows, di),
      dz("dz", rows, di), dx("dx", rows, c);
  fill(x, rows_of(d.x, c, natural));
  fill(dy, rows_of(d.dy, di, natural));
  fill(dz, rows_of(d.dz, di, natural));
  auto params = layer::parameters::allocate(s), grads = layer::parameters::allocate(s, "grads");
  fill_parameters(params, d);
  cp.forward(x, params, y, z, saved);
  cp.backward(saved, dy, dz, dx, grads);
  Run<Scalar, mem> r;
  r.y = read(y), r.z = read(z), r.dx = read(dx);
  r.dw = read(grads.conv_weight), r.db = read(grads.conv_bias), r.ddt = read(grads.dt_bias),
  r.dalog = read(grads.a_log);
  r.dd = read(grads.d);
  return r;
}

bool close(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
           double bound_scale, const std::vector<double>* componentwise = nullptr) {
  if (got.size() != want.size()) {
    std::cerr << what << ": size " << got.size() << " vs " << want.size() << "\n";
    return false;
  }
  double norm = 0;
  for (double v : want) norm = std::max(norm, std::fabs(v));
  return ctxpar::test::all_close(
      what, got.size(), [&](std::int64_t i) { return got[i]; },
      [&](std::int64_t i) { return want[i]; },
      [&](std::int64_t i) {
        return bound_scale * (componentwise ? (*componentwise)[i] : norm) + 1e-300;
      },
      [&](std::int64_t i) { return std::to_string(i); });
}

// The natural tokens rank `me` of `p` holds, from the independent shard oracle.
template <class HeadPolicy, class TokenOrder>
std::vector<std::int64_t> tokens_of_rank(std::int64_t t_total, const std::vector<std::int64_t>& cu,
                                         int p, int me) {
  constexpr bool zigzag = std::is_same_v<TokenOrder, ch::ZigzagPerSequence>;
  const auto pos = heads_test::shard_position(t_total, p, zigzag, cu);
  const bool uneven_rows = std::is_same_v<HeadPolicy, ch::UnevenHeads> && !zigzag;
  const std::int64_t chunk = uneven_rows ? (t_total + p - 1) / p : t_total / p;
  const std::int64_t begin = std::min<std::int64_t>(chunk * me, t_total),
                     end =
                         me + 1 == p ? t_total : std::min<std::int64_t>(chunk * (me + 1), t_total);
  std::vector<std::int64_t> natural;
  for (std::int64_t q = begin; q < end; ++q)
    for (std::int64_t n = 0; n < t_total; ++n)
      if (pos[n] == q) natural.push_back(n);
  return natural;
}

template <class Exec, class Scalar, class HeadPolicy, class TokenOrder>
bool check(const ch::GdpShape& s, std::int64_t t_total, const std::vector<std::int64_t>& cu_in,
           std::uint64_t seed) {
  const auto& group = world();
  const int p = group.size(), me = group.rank();
  const std::vector<std::int64_t> cu =
      cu_in.empty() ? std::vector<std::int64_t>{0, t_total} : cu_in;
  const auto d = make_data(s, t_total, seed);
  const auto oracle = heads_test::gdp_oracle(s, cu, d, l2_eps, true);

  const std::vector<std::int64_t> natural =
      tokens_of_rank<HeadPolicy, TokenOrder>(t_total, cu, p, me);
  std::vector<std::int64_t> all(t_total);
  for (std::int64_t n = 0; n < t_total; ++n) all[n] = n;

  const auto dist =
      run_layer<Exec, Scalar, HeadPolicy, TokenOrder>(group, s, t_total, cu_in, d, natural);
  const ctxpar::Group self(MPI_COMM_SELF);
  const auto single =
      run_layer<Exec, Scalar, HeadPolicy, ch::Contiguous>(self, s, t_total, cu_in, d, all);

  const std::int64_t c = s.input_layout().channels(), di = s.d_inner();
  const double u = ctxpar::test::unit_roundoff<Scalar>();
  std::int64_t longest = 0;
  for (std::size_t q = 0; q + 1 < cu.size(); ++q) longest = std::max(longest, cu[q + 1] - cu[q]);
  // Forward: each sub-step of the recurrence costs ~ (2N + 6) roundings relative to the
  // magnitude majorant y_mag; conv, SiLU and the norm add O(w + N).
  const double gamma =
      double(longest * s.householder + 1) * (2 * s.d_state + 6) + s.conv_width + 2 * s.d_state + 20;
  bool ok = true;
  // The distributed forward is the P = 1 forward, bit for bit (same per-head arithmetic).
  ok = ok && dist.y == rows_of(single.y, di, natural) && dist.z == rows_of(single.z, di, natural);
  if (!ok) std::cerr << "[rank " << me << "] forward differs from P = 1\n";
  // Normwise: conv cancellation makes a small v (or k) carry an absolute error of the size of its
  // terms, which the componentwise majorant y_mag (built from |v|, |k̂|) does not see.
  double ymag = 0;
  for (double v : oracle.y_mag) ymag = std::max(ymag, v);
  ok = ok && close("y vs oracle", dist.y, rows_of(oracle.y, di, natural),
                   gamma * u * ymag / std::max(1e-300, [&] {
                     double m = 0;
                     for (double v : oracle.y) m = std::max(m, std::fabs(v));
                     return m;
                   }()));
  // z is the input rounded to Scalar.
  std::vector<double> zmag = rows_of(oracle.z, di, natural);
  for (double& v : zmag) v = std::fabs(v);
  ok = ok && close("z vs oracle", dist.z, rows_of(oracle.z, di, natural), u, &zmag);
  // Backward: normwise bounds (a componentwise majorant of the reverse sweep is not tracked).
  const double gb = 4 * gamma * u;
  ok = ok && close("dx vs P=1", dist.dx, rows_of(single.dx, c, natural), gb);
  ok = ok && close("dx vs oracle", dist.dx, rows_of(oracle.dx, c, natural), gb);
  ok = ok && close("dconv_w vs oracle", dist.dw, oracle.dconv_w, gb * longest);
  ok = ok && close("dconv_b vs oracle", dist.db, oracle.dconv_b, gb * longest);
  ok = ok && close("ddt_bias vs oracle", dist.ddt, oracle.ddt, gb * longest);
  ok = ok && close("dA_log vs oracle", dist.dalog, oracle.dalog, gb * longest);
  ok = ok && close("dconv_w vs P=1", dist.dw, single.dw, gb * longest);
  ok = ok && close("dA_log vs P=1", dist.dalog, single.dalog, gb * longest);
  ok = ok && close("dD vs oracle", dist.dd, oracle.dD, gb * longest);
  ok = ok && close("dD vs P=1", dist.dd, single.dd, gb * longest);
  return ok;
}

// The layer on 16-bit activations against the fp32 layer on the same values (activations drawn
// representable in `Storage`, so both layers see the same numbers): y, z and dx are the fp32
// layer's rounded once to `Storage`, and every parameter gradient is the fp32 layer's, bit for
// bit, on every rank. That pins what the 16-bit path adds (16-bit transposes, widening, one
// rounding per output, the adjoint's sums in fp32); the fp32 layer is checked against the fp64
// oracle above.
template <class Storage, class HeadPolicy, class TokenOrder>
bool sixteen_bit_case(const ch::GdpShape& s, std::int64_t t_total,
                      const std::vector<std::int64_t>& cu_in, std::uint64_t seed) {
  using exec = Kokkos::DefaultExecutionSpace;
  const auto& group = world();
  const std::vector<std::int64_t> cu =
      cu_in.empty() ? std::vector<std::int64_t>{0, t_total} : cu_in;
  auto d = make_data(s, t_total, seed);
  for (auto* a : {&d.x, &d.dy, &d.dz})
    for (double& v : *a) v = static_cast<double>(ctxpar::widen(ctxpar::narrow<Storage>(v)));
  const auto natural =
      tokens_of_rank<HeadPolicy, TokenOrder>(t_total, cu, group.size(), group.rank());
  const auto narrow_run =
      run_layer<exec, Storage, HeadPolicy, TokenOrder>(group, s, t_total, cu_in, d, natural);
  const auto wide_run =
      run_layer<exec, float, HeadPolicy, TokenOrder>(group, s, t_total, cu_in, d, natural);
  auto rounded = [](std::vector<double> v) {
    for (double& x : v)
      x = static_cast<double>(ctxpar::widen(ctxpar::narrow<Storage>(static_cast<float>(x))));
    return v;
  };
  bool ok = true;
  auto same = [&](const char* what, const std::vector<double>& got,
                  const std::vector<double>& want) {
    if (got == want) return;
    ok = false;
    std::cerr << "[rank " << group.rank() << "] " << what << " differs from the fp32 layer's\n";
  };
  same("y", narrow_run.y, rounded(wide_run.y));
  same("z", narrow_run.z, rounded(wide_run.z));
  same("dx", narrow_run.dx, rounded(wide_run.dx));
  same("dconv_w", narrow_run.dw, wide_run.dw);
  same("dconv_b", narrow_run.db, wide_run.db);
  same("ddt_bias", narrow_run.ddt, wide_run.ddt);
  same("dA_log", narrow_run.dalog, wide_run.dalog);
  same("dD", narrow_run.dd, wide_run.dd);
  return ok;
}

template <class Exec, class Scalar, class TokenOrder>
void sweep_even(std::uint64_t seed) {
  const auto& group = world();
  const int p = group.size();
  // Extended rank counts (5..8, oversubscribed) keep M = 1 and 3 to stay within the time budget.
  const std::vector<int> copies = p <= 4 ? std::vector<int>{1, 2, 3} : std::vector<int>{1, 3};
  // The skip term cycles through none / per head / per channel over the cases, so each token order
  // sees every D shape with several M and ngroups.
  const ch::SkipTerm skips[] = {ch::SkipTerm::none, ch::SkipTerm::per_head,
                                ch::SkipTerm::per_channel};
  int k = 0;
  for (int m : copies) {
    std::vector<int> groups{p, 2 * p};
    if (p > 1) groups.insert(groups.begin(), 1);
    if (p == 4) groups.insert(groups.begin(), 2);
    for (int g : groups) {
      ch::GdpShape s{4 * p, 2, g, 3, m, 3, skips[k++ % 3]};
      const std::int64_t t_dense = 6 * p;
      // Packed: an empty sequence and boundaries just before/after rank borders.
      const std::vector<std::int64_t> packed{0, 2 * p, 2 * p, 6 * p, 8 * p};
      BOOST_TEST_CONTEXT("M=" << m << " G=" << g << " D " << ch::skip_name(s.skip) << " dense") {
        CTXPAR_TEST_ALL(group,
                        (check<Exec, Scalar, ch::EvenHeads, TokenOrder>(s, t_dense, {}, seed++)));
      }
      s.skip = skips[k % 3];
      BOOST_TEST_CONTEXT("M=" << m << " G=" << g << " D " << ch::skip_name(s.skip) << " packed") {
        CTXPAR_TEST_ALL(group, (check<Exec, Scalar, ch::EvenHeads, TokenOrder>(s, packed.back(),
                                                                               packed, seed++)));
      }
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(gdp_even_contiguous_double) {
  sweep_even<Kokkos::DefaultExecutionSpace, double, ch::Contiguous>(100);
}
BOOST_AUTO_TEST_CASE(gdp_even_zigzag_double) {
  sweep_even<Kokkos::DefaultExecutionSpace, double, ch::ZigzagPerSequence>(200);
}
BOOST_AUTO_TEST_CASE(gdp_even_zigzag_float) {
  sweep_even<Kokkos::DefaultExecutionSpace, float, ch::ZigzagPerSequence>(300);
}
BOOST_AUTO_TEST_CASE(gdp_even_contiguous_serial_float) {
  sweep_even<Kokkos::Serial, float, ch::Contiguous>(400);
}

// bfloat16 and float16 activations: moved in 16 bits, computed in fp32 (`sixteen_bit_case`), with
// repeated key groups (G < P sums dx copies in the adjoint), zigzag and packed sequences, uneven
// heads.
BOOST_AUTO_TEST_CASE(gdp_sixteen_bit_activations) {
  const auto& group = world();
  const int p = group.size();
  std::uint64_t seed = 1000;
  const std::vector<std::int64_t> packed{0, 2 * p, 2 * p, 6 * p, 8 * p};
  const ch::GdpShape even{4 * p, 2, 1, 3, 2, 3, ch::SkipTerm::per_channel};
  const ch::GdpShape uneven{2 * p + 1, 2, 1, 3, 2, 4, ch::SkipTerm::per_head};
  CTXPAR_TEST_ALL(group, (sixteen_bit_case<ctxpar::bfloat16, ch::EvenHeads, ch::Contiguous>(
                             even, 6 * p, {}, seed++)));
  CTXPAR_TEST_ALL(group, (sixteen_bit_case<ctxpar::bfloat16, ch::EvenHeads, ch::ZigzagPerSequence>(
                             even, packed.back(), packed, seed++)));
  CTXPAR_TEST_ALL(group, (sixteen_bit_case<ctxpar::float16, ch::EvenHeads, ch::ZigzagPerSequence>(
                             even, 6 * p, {}, seed++)));
  CTXPAR_TEST_ALL(group, (sixteen_bit_case<ctxpar::float16, ch::UnevenHeads, ch::Contiguous>(
                             uneven, 5 * p + 2, {}, seed++)));
}

// Uneven heads (2P + 1 heads, and fewer heads than ranks) with uneven token shards.
BOOST_AUTO_TEST_CASE(gdp_uneven) {
  const auto& group = world();
  const int p = group.size();
  std::uint64_t seed = 500;
  for (int h : {2 * p + 1, std::max(1, p - 1)}) {
    for (int g : {1, h}) {
      // D per channel with 2P + 1 heads, per head when some ranks own no head.
      ch::GdpShape s{h, 2, g, 3, 2, 4, h > p ? ch::SkipTerm::per_channel : ch::SkipTerm::per_head};
      BOOST_TEST_CONTEXT("H=" << h << " G=" << g) {
        CTXPAR_TEST_ALL(
            group, (check<Kokkos::DefaultExecutionSpace, double, ch::UnevenHeads, ch::Contiguous>(
                       s, 5 * p + 2, {}, seed++)));
        CTXPAR_TEST_ALL(
            group,
            (check<Kokkos::DefaultExecutionSpace, double, ch::UnevenHeads, ch::ZigzagPerSequence>(
                s, 4 * p, {0, 2 * p, 4 * p}, seed++)));
      }
    }
  }
}

// The oracle's own gradients against central finite differences (fp64, small shape).
BOOST_AUTO_TEST_CASE(oracle_matches_finite_differences) {
  const auto& group = world();
  bool ok = true;
  for (ch::SkipTerm skip : {ch::SkipTerm::per_head, ch::SkipTerm::per_channel}) {
    ch::GdpShape s{4, 2, 2, 3, 2, 3, skip};
    const std::vector<std::int64_t> cu{0, 5, 9};
    auto d = make_data(s, 9, 7);
    const auto r = heads_test::gdp_oracle(s, cu, d, l2_eps, true);
    const double h = 1e-6;
    auto probe = [&](std::vector<double>& param, const std::vector<double>& grad,
                     const char* name) {
      for (std::size_t i = 0; i < param.size(); i += 1 + param.size() / 23) {
        const double keep = param[i];
        param[i] = keep + h;
        const double lp = heads_test::gdp_loss(s, cu, d, l2_eps);
        param[i] = keep - h;
        const double lm = heads_test::gdp_loss(s, cu, d, l2_eps);
        param[i] = keep;
        const double fd = (lp - lm) / (2 * h);
        // Truncation O(h²) plus cancellation O(u·|L|/h).
        if (std::fabs(fd - grad[i]) > 1e-6 * (1 + std::fabs(grad[i]))) {
          std::cerr << name << "[" << i << "] fd " << fd << " vs analytic " << grad[i] << "\n";
          ok = false;
        }
      }
    };
    probe(d.x, r.dx, "dx");
    probe(d.conv_w, r.dconv_w, "dconv_w");
    probe(d.conv_b, r.dconv_b, "dconv_b");
    probe(d.dt, r.ddt, "ddt_bias");
    probe(d.alog, r.dalog, "dA_log");
    probe(d.D, r.dD, "dD");
  }
  CTXPAR_TEST_ALL(group, ok);
}

// Packed isolation: perturbing one document leaves every other document's outputs bit-identical,
// and an output gradient confined to one document gives exactly zero input gradient elsewhere —
// on every rank, under zigzag (documents straddle rank borders), with the key group repeated.
BOOST_AUTO_TEST_CASE(packed_isolation) {
  using exec = Kokkos::DefaultExecutionSpace;
  using mem = exec::memory_space;
  using matrix = Kokkos::View<double**, Kokkos::LayoutRight, mem>;
  const auto& group = world();
  const int p = group.size(), me = group.rank();
  const ch::GdpShape s{2 * p, 2, 1, 3, 2, 4};
  const std::vector<std::int64_t> cu{0, 4 * p, 6 * p, 10 * p};
  const std::int64_t t_total = cu.back(), c = s.input_layout().channels(), di = s.d_inner();
  ch::GdpContextParallel<ch::EvenHeads, ch::ZigzagPerSequence, exec, double> cp(
      exec(), group, s, t_total, cu, ch::GdpOptions{l2_eps, 4});
  ch::GdpSaved<double, mem> saved;
  const auto& plan = cp.input_plan();
  const std::int64_t rows = plan.local_rows();
  auto doc_of = [&](std::int64_t n) { return n < cu[1] ? 0 : n < cu[2] ? 1 : 2; };
  auto d = make_data(s, t_total, 900);
  auto params = ch::GdpParameters<double, mem>::allocate(s),
       grads = ch::GdpParameters<double, mem>::allocate(s, "g");
  fill_parameters(params, d);
  const std::vector<std::int64_t> natural = natural_rows(plan, me);
  auto run = [&](const std::vector<double>& x_all, const std::vector<double>& dy_all,
                 std::vector<double>& y_out, std::vector<double>& dx_out) {
    matrix x("x", rows, c), y("y", rows, di), z("z", rows, di), dy("dy", rows, di),
        dz("dz", rows, di), dx("dx", rows, c);
    fill(x, rows_of(x_all, c, natural));
    fill(dy, rows_of(dy_all, di, natural));
    cp.forward(x, params, y, z, saved, cu);
    cp.backward(saved, dy, dz, dx, grads);
    y_out = read(y);
    dx_out = read(dx);
  };
  // Output gradient only in document 1.
  std::vector<double> dy_doc(d.dy);
  for (std::int64_t n = 0; n < t_total; ++n)
    if (doc_of(n) != 1)
      for (std::int64_t k = 0; k < di; ++k) dy_doc[n * di + k] = 0;
  std::vector<double> y0, dx0, y1, dx1;
  run(d.x, dy_doc, y0, dx0);
  std::vector<double> x_pert(d.x);
  for (std::int64_t n = cu[1]; n < cu[2]; ++n)
    for (std::int64_t k = 0; k < c; ++k) x_pert[n * c + k] += 0.25;
  run(x_pert, dy_doc, y1, dx1);
  bool ok = true;
  for (std::int64_t t = 0; t < rows; ++t) {
    const bool in_doc = doc_of(natural[t]) == 1;
    for (std::int64_t k = 0; k < di && !in_doc; ++k)
      if (y0[t * di + k] != y1[t * di + k]) {
        std::cerr << "y changed outside the document at token " << natural[t] << " channel " << k
                  << "\n";
        ok = false;
      }
    for (std::int64_t k = 0; k < c && !in_doc; ++k)
      if (dx0[t * c + k] != 0.0) {
        std::cerr << "dx = " << dx0[t * c + k] << " outside the document at token " << natural[t]
                  << " channel " << k << "\n";
        ok = false;
      }
    bool changed = false;
    for (std::int64_t k = 0; k < di && in_doc; ++k)
      changed = changed || y0[t * di + k] != y1[t * di + k];
    ok = ok && (!in_doc || changed);
  }
  if (!ok) std::cerr << "[rank " << me << "] a packed document leaked into another\n";
  CTXPAR_TEST_ALL(group, ok);
}

// Plans own their memory: after a warm-up call, forward + backward of the same layer object on the
// same shapes allocate nothing (counted through Kokkos's allocation hooks), on every rank, and a
// call with other values in between changes nothing in the results of the next call with the
// first values (the reused work buffers are recomputed, not stale).
// A steady-state forward + backward allocates nothing (activations of `Scalar`: the 16-bit ones
// add the layer's 16-bit buffers and conversions).
template <class Scalar>
bool steady_state_case() {
  using exec = Kokkos::DefaultExecutionSpace;
  using mem = exec::memory_space;
  using matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, mem>;
  const auto& group = world();
  const int p = group.size(), me = group.rank();
  const ch::GdpShape s{2 * p, 2, 1, 3, 2, 3, ch::SkipTerm::per_head};
  const std::vector<std::int64_t> cu{0, 2 * p, 2 * p, 6 * p, 8 * p};  // an empty one too
  const std::int64_t t_total = cu.back(), c = s.input_layout().channels(), di = s.d_inner();
  using layer = ch::GdpContextParallel<ch::EvenHeads, ch::ZigzagPerSequence, exec, Scalar>;
  layer cp(exec(), group, s, t_total, cu, ch::GdpOptions{l2_eps, 4});
  typename layer::saved_type saved;
  const auto& plan = cp.input_plan();
  const std::int64_t rows = plan.local_rows();
  const std::vector<std::int64_t> natural = natural_rows(plan, me);
  const auto d = make_data(s, t_total, 77), other = make_data(s, t_total, 78);
  auto params = layer::parameters::allocate(s), grads = layer::parameters::allocate(s, "g");
  fill_parameters(params, d);
  matrix x("x", rows, c), y("y", rows, di), z("z", rows, di), dy("dy", rows, di),
      dz("dz", rows, di), dx("dx", rows, c);
  fill(dy, rows_of(d.dy, di, natural));
  fill(dz, rows_of(d.dz, di, natural));
  // Both inputs are on the device before counting: a refill from the host would need a mirror,
  // which is an allocation on a GPU.
  matrix x_d("x_d", rows, c), x_other("x_other", rows, c);
  fill(x_d, rows_of(d.x, c, natural));
  fill(x_other, rows_of(other.x, c, natural));
  auto call = [&](const matrix& input) {
    Kokkos::deep_copy(x, input);
    cp.forward(x, params, y, z, saved, cu);
    cp.backward(saved, dy, dz, dx, grads);
    exec().fence();
  };
  auto results = [&] {
    return std::vector<std::vector<double>>{
        read(y),          read(z), read(dx), read(grads.conv_weight), read(grads.dt_bias),
        read(grads.a_log)};
  };
  call(x_d);  // warm-up: the layer's work buffers are allocated here
  const auto first = results();
  std::int64_t allocations = 0;
  {
    ctxpar::AllocationCounter counter;
    for (int repeat = 0; repeat < 2; ++repeat) {
      call(x_other);
      call(x_d);
    }
    allocations = counter.allocations();
    if (allocations != 0) {
      std::cerr << "[rank " << me << "] " << allocations << " allocations in steady state:";
      for (const auto& [label, n] : counter.labels()) std::cerr << " " << label << " x" << n;
      std::cerr << "\n";
    }
  }
  const bool same = results() == first;
  if (!same) std::cerr << "[rank " << me << "] a repeated call changed the results\n";
  return allocations == 0 && same;
}

BOOST_AUTO_TEST_CASE(steady_state_allocates_nothing) {
  CTXPAR_TEST_ALL(world(), steady_state_case<double>());
  CTXPAR_TEST_ALL(world(), steady_state_case<ctxpar::bfloat16>());
}

// Two forwards in flight, one GdpSaved each: the backward of the first reads only what that
// forward saved (bit for bit the gradients of the pair run alone), and once both saved states are
// sized, interleaved forwards and backwards allocate nothing. Uneven heads and tokens: at P = 4 a
// rank holds no head, so its saved buffers are empty and must still count as sized.
BOOST_AUTO_TEST_CASE(saved_states_in_flight) {
  using exec = Kokkos::DefaultExecutionSpace;
  using mem = exec::memory_space;
  using matrix = Kokkos::View<double**, Kokkos::LayoutRight, mem>;
  const auto& group = world();
  const int p = group.size(), me = group.rank();
  const ch::GdpShape s{3, 2, 1, 3, 2, 4, ch::SkipTerm::per_head};
  const std::int64_t t_total = 5 * p + 1, c = s.input_layout().channels(), di = s.d_inner();
  ch::GdpContextParallel<ch::UnevenHeads, ch::Contiguous, exec, double> cp(
      exec(), group, s, t_total, {}, ch::GdpOptions{l2_eps, 4});
  const auto& plan = cp.input_plan();
  const std::int64_t rows = plan.local_rows();
  const std::vector<std::int64_t> natural = natural_rows(plan, me);
  const auto da = make_data(s, t_total, 31), db = make_data(s, t_total, 32);
  auto params = ch::GdpParameters<double, mem>::allocate(s),
       grads = ch::GdpParameters<double, mem>::allocate(s, "g");
  fill_parameters(params, da);
  matrix xa("xa", rows, c), xb("xb", rows, c), ya("ya", rows, di), za("za", rows, di),
      yb("yb", rows, di), zb("zb", rows, di), dy("dy", rows, di), dz("dz", rows, di),
      dx("dx", rows, c);
  fill(xa, rows_of(da.x, c, natural));
  fill(xb, rows_of(db.x, c, natural));
  fill(dy, rows_of(da.dy, di, natural));
  fill(dz, rows_of(da.dz, di, natural));
  auto results = [&] {
    return std::vector<std::vector<double>>{read(dx),
                                            read(grads.conv_weight),
                                            read(grads.conv_bias),
                                            read(grads.dt_bias),
                                            read(grads.a_log),
                                            read(grads.d)};
  };
  ch::GdpSaved<double, mem> alone, a, b;
  cp.forward(xa, params, ya, za, alone);
  cp.backward(alone, dy, dz, dx, grads);
  const auto reference = results();
  auto interleaved = [&] {
    cp.forward(xa, params, ya, za, a);
    cp.forward(xb, params, yb, zb, b);  // would overwrite what a plan-owned state kept of xa
    cp.backward(a, dy, dz, dx, grads);
    exec().fence();
  };
  interleaved();  // sizes a and b
  bool ok = results() == reference;
  std::int64_t allocations = 0;
  {
    ctxpar::AllocationCounter counter;
    interleaved();
    allocations = counter.allocations();
  }
  ok = ok && results() == reference;
  if (!ok) std::cerr << "[rank " << me << "] a backward read another forward's saved state\n";
  if (allocations != 0)
    std::cerr << "[rank " << me << "] " << allocations << " allocations with sized saved states\n";
  CTXPAR_TEST_ALL(group, ok && allocations == 0);
}

namespace {

// The conv weight gradient's host blocking (one work item sums a block of channels in one pass
// over the rows) against one channel per item (the GPU layout) and an fp64 loop: bitwise equal
// across block sizes, over full blocks, a partial block and single channels, widths 3 and 4, two
// packed sequences (no tap reads across their border).
BOOST_AUTO_TEST_CASE(conv_weight_gradient_blocks) {
  using exec = Kokkos::DefaultExecutionSpace;
  using mem = exec::memory_space;
  using matrix = Kokkos::View<float**, Kokkos::LayoutRight, mem>;
  using vector = Kokkos::View<float*, mem>;
  using index = Kokkos::View<std::int64_t*, mem>;
  using kernel = ch::impl::ConvBackwardWeights<matrix, matrix, matrix, vector, index>;
  const auto& group = world();
  const std::int64_t tokens = 53, border = 20, off = 7, channels = 2 * kernel::max_block + 5;
  matrix dpre("dpre", tokens, channels), u("u", tokens, off + channels);
  index start("start", tokens);
  auto hd = Kokkos::create_mirror_view(dpre);
  auto hu = Kokkos::create_mirror_view(u);
  auto hs = Kokkos::create_mirror_view(start);
  for (std::int64_t t = 0; t < tokens; ++t) {
    hs(t) = t < border ? 0 : border;
    for (std::int64_t c = 0; c < channels; ++c)
      hd(t, c) = float(ctxpar::test::uniform(1, t * channels + c));
    for (std::int64_t c = 0; c < off + channels; ++c)
      hu(t, c) = float(ctxpar::test::uniform(2, t * (off + channels) + c));
  }
  Kokkos::deep_copy(dpre, hd);
  Kokkos::deep_copy(u, hu);
  Kokkos::deep_copy(start, hs);
  bool ok = true;
  for (int width : {3, 4}) {
    std::vector<std::vector<float>> results;
    for (int block : {1, kernel::max_block}) {
      matrix dw("dw", channels, width);
      vector db("db", channels);
      Kokkos::parallel_for(Kokkos::RangePolicy<exec>(0, (channels + block - 1) / block),
                           kernel{dpre, u, dw, db, start, off, tokens, width, channels, block});
      auto hw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dw);
      auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), db);
      std::vector<float> r(hw.data(), hw.data() + channels * width);
      r.insert(r.end(), hb.data(), hb.data() + channels);
      results.push_back(r);
      for (std::int64_t c = 0; c < channels; ++c) {
        // fp64 sums and the sum of |terms|: an fp32 sum of n terms is within n·u of it.
        double ref_b = 0, mag_b = 0;
        for (std::int64_t t = 0; t < tokens; ++t) ref_b += hd(t, c), mag_b += std::abs(hd(t, c));
        ok = ok && std::abs(hb(c) - ref_b) <= tokens * 6e-8 * mag_b;
        for (int k = 0; k < width; ++k) {
          double ref = 0, mag = 0;
          for (std::int64_t t = 0; t < tokens; ++t) {
            const std::int64_t src = t - (width - 1) + k;
            if (src < hs(t)) continue;
            const double term = double(hd(t, c)) * hu(src, off + c);
            ref += term;
            mag += std::abs(term);
          }
          ok = ok && std::abs(hw(c, k) - ref) <= tokens * 6e-8 * mag;
        }
      }
    }
    BOOST_TEST_CONTEXT("width " << width) {
      CTXPAR_TEST_ALL(group, ok && results[0] == results[1]);
    }
  }
}

}  // namespace
