// The gated delta rule and product backends on one rank (no communication), against the fp64
// token-by-token oracle: outputs, final states, both summaries, and every gradient (dq, dk, dv, dg,
// dβ, initial states, ds_in), at lengths around the chunk size (1, 63, 64, 65, 257), packed
// sequences, n_h = 1..3, odd K and V, float and double, every host backend.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <random>

#include "chunkwise/gated_delta_support.hpp"
#include "ctxpar/chunkwise/impl/gated_delta_reference.hpp"

namespace gd = ctxpar::test::gated_delta;
using ctxpar::chunkwise::LocalSequences;

namespace {

// The oracle's M of one sequence: the homogeneous recurrence (v = 0) started from the identity.
std::vector<double> oracle_transition(const gd::Problem& p, int seq) {
  gd::Problem m = p;
  const int b = p.cu_seqlens[seq], e = p.cu_seqlens[seq + 1];
  m.tokens = e - b;
  m.cu_seqlens = {0, e - b};
  m.value_dim = p.key_dim;
  const std::size_t H = p.heads, K = p.key_dim, N = p.n_h;
  m.q.assign(m.q.size(), 0.0);
  m.k.assign(p.k.begin() + std::size_t(b) * N * H * K, p.k.begin() + std::size_t(e) * N * H * K);
  m.beta.assign(p.beta.begin() + std::size_t(b) * N * H, p.beta.begin() + std::size_t(e) * N * H);
  m.g.assign(p.g.begin() + std::size_t(b) * H, p.g.begin() + std::size_t(e) * H);
  m.q.assign(std::size_t(m.tokens) * H * K, 0.0);
  m.v.assign(std::size_t(m.tokens) * N * H * K, 0.0);
  m.h0.assign(H * K * K, 0.0);
  for (std::size_t h = 0; h < H; ++h)
    for (std::size_t a = 0; a < K; ++a) m.h0[(h * K + a) * K + a] = 1.0;
  return gd::forward(m).ht;
}

std::vector<double> row(const std::vector<double>& x, std::size_t i, std::size_t width) {
  return std::vector<double>(x.begin() + i * width, x.begin() + (i + 1) * width);
}

std::vector<double> transpose_heads(const std::vector<double>& m, std::size_t H, std::size_t K) {
  std::vector<double> t(m.size());
  for (std::size_t h = 0; h < H; ++h)
    for (std::size_t a = 0; a < K; ++a)
      for (std::size_t b = 0; b < K; ++b) t[(h * K + a) * K + b] = m[(h * K + b) * K + a];
  return t;
}

template <class Scalar>
double round_to(double x) {
  return static_cast<double>(static_cast<Scalar>(x));
}

template <class Exec, class Scalar, bool Product>
bool run_case(std::uint64_t seed, std::vector<int> cu, int n_h, int H, int K, int V, int chunk,
              bool with_sin, bool with_h0) {
  using memory_space = typename Exec::memory_space;
  using family = gd::Family<Scalar, memory_space, Product>;
  namespace cw = ctxpar::chunkwise;
  const int T = cu.back(), N = static_cast<int>(cu.size()) - 1;
  const std::size_t KV = std::size_t(K) * V, HKV = std::size_t(H) * KV;
  gd::Problem p = gd::make_problem(seed, T, n_h, H, K, V, cu, true);
  for (auto& x : p.h0) x = round_to<Scalar>(x);
  const std::vector<double> h0_rows = p.h0;
  // The state entering sequence 0 is s_in (fp32, from other shards) plus its own initial state;
  // the other sequences start from their initial states.
  std::vector<double> sin_vals(HKV);
  for (std::size_t i = 0; i < HKV; ++i)
    sin_vals[i] = with_sin ? round_to<float>(0.5 * ctxpar::test::uniform(seed + 9, i)) : 0.0;
  for (std::size_t i = 0; i < p.h0.size(); ++i) p.h0[i] = with_h0 ? h0_rows[i] : 0.0;
  for (std::size_t i = 0; i < HKV; ++i) p.h0[i] += sin_vals[i];
  for (auto& x : p.q) x = round_to<Scalar>(x);
  for (auto& x : p.k) x = round_to<Scalar>(x);
  for (auto& x : p.v) x = round_to<Scalar>(x);
  for (auto& x : p.g) x = round_to<Scalar>(x);
  for (auto& x : p.beta) x = round_to<Scalar>(x);
  std::vector<double> dout(std::size_t(T) * H * V), dht(std::size_t(N) * HKV), ds_out_vals(HKV);
  for (std::size_t i = 0; i < dout.size(); ++i)
    dout[i] = round_to<Scalar>(ctxpar::test::uniform(seed + 7, i));
  for (std::size_t i = 0; i < dht.size(); ++i)
    dht[i] = round_to<Scalar>(0.5 * ctxpar::test::uniform(seed + 8, i));
  for (std::size_t i = 0; i < HKV; ++i)
    ds_out_vals[i] = round_to<float>(0.5 * ctxpar::test::uniform(seed + 10, i));
  // The gradient arriving at the end of the last sequence: ds_out plus its own final-state grad.
  std::vector<double> dht_total = dht;
  for (std::size_t i = 0; i < HKV; ++i) dht_total[std::size_t(N - 1) * HKV + i] += ds_out_vals[i];

  const gd::Forward f = gd::forward(p);
  const gd::Gradients gr = gd::backward(p, dout, dht_total);
  const gd::Gradients gr0 = gd::backward(p, dout, {});  // no gradient at any sequence end

  Exec space;
  const auto backend = family::make(n_h, cw::BackendOptions{chunk, 0.0});
  const auto in = family::make_inputs(p);
  const LocalSequences seqs =
      LocalSequences::from_cu_seqlens(std::vector<std::int64_t>(cu.begin(), cu.end()));
  typename decltype(backend)::saved_type saved;
  const auto table = backend.make_table(seqs, backend.shape(in));
  cw::SummaryStore<cw::DenseTransition, memory_space> fwd(cw::SummaryForm::packed, 1, H, K, V),
      bwd(cw::SummaryForm::unpacked, 1, H, K, V);
  backend.forward_prepare(space, in, seqs, table, fwd[0], saved);

  cw::state_view<memory_space> s_in("s_in", H, K, V);
  {
    auto h = Kokkos::create_mirror_view(s_in);
    for (std::size_t i = 0; i < HKV; ++i) h.data()[i] = static_cast<float>(sin_vals[i]);
    Kokkos::deep_copy(s_in, h);
  }
  cw::sequence_states_view<Scalar, memory_space> h0;
  if (with_h0) h0 = gd::to_view<Scalar, memory_space, decltype(h0)>(h0_rows, "h0", N, H, K, V);
  cw::token_view<Scalar, memory_space> o("o", T, H, V);
  cw::sequence_states_view<Scalar, memory_space> ht("ht", N, H, K, V);
  backend.forward_apply(space, in, seqs, table, s_in, h0, o, ht, saved);

  const auto dout_view =
      gd::to_view<Scalar, memory_space, cw::const_token_view<Scalar, memory_space>>(dout, "dout", T,
                                                                                    H, V);
  backend.backward_prepare(space, saved, dout_view, seqs, table, bwd[0]);
  cw::state_view<memory_space> ds_out("ds_out", H, K, V), ds_in("ds_in", H, K, V);
  {
    auto h = Kokkos::create_mirror_view(ds_out);
    for (std::size_t i = 0; i < HKV; ++i) h.data()[i] = static_cast<float>(ds_out_vals[i]);
    Kokkos::deep_copy(ds_out, h);
  }
  const auto dht_view =
      gd::to_view<Scalar, memory_space, cw::const_sequence_states_view<Scalar, memory_space>>(
          dht, "dht", N, H, K, V);
  auto grads = family::make_gradients(p);
  cw::sequence_states_view<Scalar, memory_space> dh0("dh0", N, H, K, V);
  backend.backward_apply(space, saved, dout_view, seqs, table, ds_out, dht_view, grads, dh0, ds_in);
  space.fence();

  const int rows = chunk * n_h;
  const double fb = gd::rel_bound<Scalar>(rows, K, V, 8),
               bb = gd::rel_bound<Scalar>(rows, K, V, 16);
  // Summaries and ds_in are stored in fp32 whatever Scalar is: one more rounding of each element.
  const double fs = fb + 2 * ctxpar::test::unit_roundoff<float>(),
               bs = bb + 2 * ctxpar::test::unit_roundoff<float>();
  const std::string tag =
      std::string(Product ? "gdp" : "gdn") + " T=" + std::to_string(T) + " N=" + std::to_string(N) +
      " n_h=" + std::to_string(n_h) + " C=" + std::to_string(chunk) + " K=" + std::to_string(K) +
      " V=" + std::to_string(V) + " " + (sizeof(Scalar) == 4 ? "float" : "double") + ": ";
  bool ok = true;
  ok = gd::rel_l2_close(tag + "o", gd::to_vector(o), f.o, fb) && ok;
  ok = gd::rel_l2_close(tag + "final states", gd::to_vector(ht), f.ht, fb) && ok;
  // Forward summary of the trailing sequence: dS = its end state from zero, M its transition.
  {
    gd::Problem z = p;
    z.h0.assign(z.h0.size(), 0.0);
    const auto fz = gd::forward(z);
    const auto packed = gd::to_vector(fwd.packed());
    const std::size_t per_head = KV + std::size_t(K) * K;
    std::vector<double> ds, m;
    for (int h = 0; h < H; ++h) {
      for (std::size_t i = 0; i < KV; ++i) ds.push_back(packed[h * per_head + i]);
      for (std::size_t i = 0; i < std::size_t(K) * K; ++i)
        m.push_back(packed[h * per_head + KV + i]);
    }
    ok = gd::rel_l2_close(tag + "summary dS", ds, row(fz.ht, N - 1, HKV), fs) && ok;
    ok = gd::rel_l2_close(tag + "summary M", m, oracle_transition(p, N - 1), fs) && ok;
  }
  // Backward summary of the leading sequence: γ with no gradient at its end, Mᵀ.
  ok = gd::rel_l2_close(tag + "summary gamma", gd::to_vector(bwd.states()), row(gr0.dh0, 0, HKV),
                        bs) &&
       ok;
  ok = gd::rel_l2_close(tag + "summary M^T", gd::to_vector(bwd.transitions()),
                        transpose_heads(oracle_transition(p, 0), H, K), fs) &&
       ok;
  ok = gd::rel_l2_close(tag + "dq", gd::to_vector(grads.dq), gr.dq, bb) && ok;
  ok = gd::rel_l2_close(tag + "dk", gd::to_vector(grads.dk), gr.dk, bb) && ok;
  ok = gd::rel_l2_close(tag + "dv", gd::to_vector(grads.dv), gr.dv, bb) && ok;
  ok = gd::rel_l2_close(tag + "dg", gd::to_vector(grads.dg), gr.dg, bb) && ok;
  ok = gd::rel_l2_close(tag + "dbeta", gd::to_vector(grads.dbeta), gr.dbeta, bb) && ok;
  ok = gd::rel_l2_close(tag + "d initial states", gd::to_vector(dh0), gr.dh0, bb) && ok;
  ok = gd::rel_l2_close(tag + "ds_in", gd::to_vector(ds_in), row(gr.dh0, 0, HKV), bs) && ok;
  return ok;
}

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(gdn_lengths_around_the_chunk, Case, ctxpar::test::cases) {
  using exec = typename Case::execution_space;
  using scalar = typename Case::scalar_type;
  bool ok = true;
  for (int T : {1, 63, 64, 65, 257})
    ok = run_case<exec, scalar, false>(100 + T, {0, T}, 1, 2, 16, 8, 64, true, false) && ok;
  ok = run_case<exec, scalar, false>(7, {0, 65}, 1, 1, 12, 10, 16, false, false) && ok;
  // Wide enough for full register tiles of every host vector width (NR up to 32, MR up to 8).
  ok = run_case<exec, scalar, false>(8, {0, 100}, 1, 1, 64, 40, 64, true, false) && ok;
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(gdn_packed_sequences, Case, ctxpar::test::cases) {
  using exec = typename Case::execution_space;
  using scalar = typename Case::scalar_type;
  bool ok = true;
  ok = run_case<exec, scalar, false>(21, {0, 5, 70, 71, 140}, 1, 2, 16, 8, 16, true, true) && ok;
  ok = run_case<exec, scalar, false>(22, {0, 33, 40}, 1, 3, 8, 12, 8, false, true) && ok;
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(gdp_householder_steps, Case, ctxpar::test::cases) {
  using exec = typename Case::execution_space;
  using scalar = typename Case::scalar_type;
  bool ok = true;
  for (int n_h = 1; n_h <= 3; ++n_h) {
    for (int T : {1, 63, 65})
      ok = run_case<exec, scalar, true>(300 + 10 * n_h + T, {0, T}, n_h, 2, 16, 8, 64 / n_h, true,
                                        false) &&
           ok;
    ok =
        run_case<exec, scalar, true>(40 + n_h, {0, 7, 30, 33}, n_h, 2, 12, 10, 8, true, true) && ok;
  }
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

// The benchmark entry points: the local chunkwise forward (with and without the summary) and the
// token-by-token baseline give the oracle's outputs.
template <bool Product>
bool entry_points_match(int n_h) {
  using exec = Kokkos::DefaultHostExecutionSpace;
  using memory_space = exec::memory_space;
  using family = gd::Family<float, memory_space, Product>;
  const int T = 70, H = 2, K = 16, V = 12;
  gd::Problem p = gd::make_problem(55 + n_h, T, n_h, H, K, V, {0, T}, false);
  for (auto* a : {&p.q, &p.k, &p.v, &p.g, &p.beta})
    for (auto& x : *a) x = round_to<float>(x);
  const gd::Forward f = gd::forward(p);
  const auto backend = family::make(n_h, ctxpar::chunkwise::BackendOptions{32, 0.0});
  const auto in = family::make_inputs(p);
  ctxpar::chunkwise::token_view<float, memory_space> o("o", T, H, V);
  const double bound = gd::rel_bound<float>(32 * n_h, K, V, 8);
  bool ok = true;
  for (bool summary : {true, false}) {
    Kokkos::deep_copy(o, 0.0f);
    ctxpar::chunkwise::impl::reference_local_forward(exec(), backend, in, o, summary);
    ok = gd::rel_l2_close("reference_local_forward", gd::to_vector(o), f.o, bound) && ok;
  }
  Kokkos::deep_copy(o, 0.0f);
  ctxpar::chunkwise::impl::reference_recurrence_forward(exec(), backend, in, o);
  // The recurrence rounds once per sub-step: T·n_h chained updates of K-term sums.
  ok = gd::rel_l2_close("reference_recurrence_forward", gd::to_vector(o), f.o,
                        8.0 * (T * n_h + K + V) * ctxpar::test::unit_roundoff<float>()) &&
       ok;
  return ok;
}

BOOST_AUTO_TEST_CASE(benchmark_entry_points_match_the_oracle) {
  bool ok = entry_points_match<false>(1);
  for (int n_h = 1; n_h <= 3; ++n_h) ok = entry_points_match<true>(n_h) && ok;
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE(flop_model_is_the_documented_sum) {
  // The FLOP model of docs/chunkwise.md §5 term by term at C = 64, K = V = 128, for 2 heads and
  // 130 tokens (two full chunks and a ragged chunk of 2).
  auto model = [](double C, double K, double V) {
    const double A = C * C * K, T = C * C * C / 3, UW = 2 * C * C * V + 2 * C * C * K,
                 QK = 2 * C * C * K, U = 2 * C * K * V, O = 2 * C * K * V + 2 * C * C * V,
                 SM = 2 * C * K * V + 2 * C * K * K, chain = 2 * K * K * K;
    return A + T + UW + QK + U + O + SM + chain;
  };
  const double expected = 2 * (2 * model(64, 128, 128) + model(2, 128, 128));
  const double got = ctxpar::chunkwise::gated_delta_forward_flops(130, 2, 128, 128, 64);
  CTXPAR_TEST_ALL(ctxpar::test::world(), std::fabs(got - expected) <= 1e-12 * expected);
}

// The decayed Gram and score rows of a chunk, and the decays alone: the host fast path's vector
// form (whole vectors of j, `simd_exp`) gives the same bits as the portable pair-by-pair loop, for
// chunk sizes that are and are not a multiple of the vector width, ragged chunks (n < C), hard
// resets inside the chunk (rs_i >= 0) and decays that underflow to zero; negative entries check the
// sign of masked zeros.
BOOST_AUTO_TEST_CASE(vector_decay_rows_equal_the_portable_loop) {
  namespace impl = ctxpar::impl::gated_delta;
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), gate(-1.0f, 0.0f);
  bool ok = true;
  int compared = 0, nonzero = 0;
  for (const int C : {16, 37, 64}) {
    for (const int n : {C, C - 3, 1}) {
      std::vector<float> gam(C), lo(C);
      std::vector<int> rs(C);
      float acc = 0;
      int last_reset = -1;
      for (int i = 0; i < C; ++i) {
        if (i == C / 2) last_reset = i, acc = 0;  // a hard reset mid-chunk
        acc += i == C / 4 ? -100.0f : gate(gen);  // decays across it underflow to zero
        gam[i] = acc;
        lo[i] = 1e-7f * unit(gen);
        rs[i] = last_reset;
      }
      for (int i = 0; i < C; ++i) {
        std::vector<float> a(C), p(C);
        for (int j = 0; j < C; ++j) a[j] = unit(gen), p[j] = unit(gen);
        auto va = a, vp = p;
        const float bi = 0.5f + 0.5f * unit(gen);
        impl::decay_rows<false>(i, n, C, bi, gam.data(), lo.data(), rs.data(), a.data(), p.data());
        impl::decay_rows<true>(i, n, C, bi, gam.data(), lo.data(), rs.data(), va.data(), vp.data());
        // The decays alone (the backward's pair terms): the same two paths.
        std::vector<float> l(C, -1.0f), vl(C, -2.0f);
        impl::decay_row<false>(i, n, C, gam.data(), lo.data(), rs.data(), l.data());
        impl::decay_row<true>(i, n, C, gam.data(), lo.data(), rs.data(), vl.data());
        for (int j = 0; j < C; ++j) {
          ok = ok && std::memcmp(&a[j], &va[j], sizeof(float)) == 0 &&
               std::memcmp(&p[j], &vp[j], sizeof(float)) == 0 &&
               std::memcmp(&l[j], &vl[j], sizeof(float)) == 0;
          nonzero += p[j] != 0.0f;
          ++compared;
        }
      }
    }
  }
  if (!ok) std::cerr << "decay rows: the vector path differs from the portable loop\n";
  // Enough live pairs that a wrong mask or exponential would show (about 1 in 8: the lower
  // triangle, cut by the reset and by the underflowing gate).
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok && nonzero > compared / 10);
}

// The triangular inverse X = (I + A)⁻¹ row by row: the host fast path's rows held in registers
// (whole vectors, masked to j < m) give the same bits as the scalar loop, for chunk sizes that
// are multiples of the vector width (the register path) and that are not (the loop on both), and
// X·(I + A) is the identity (so neither path can be wrong in the same way).
BOOST_AUTO_TEST_CASE(vector_inverse_rows_equal_the_scalar_loop) {
  namespace impl = ctxpar::impl::gated_delta;
  std::mt19937 gen(9);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  bool same = true, inverse = true;
  for (const int C : {8, 16, 32, 37, 64}) {
    std::vector<float> a(std::size_t(C) * C, 0.0f);
    for (int i = 0; i < C; ++i)
      for (int j = 0; j < i; ++j) a[std::size_t(i) * C + j] = 0.3f * unit(gen);
    std::vector<float> x(a.size()), vx(a.size());
    for (int i = 0; i < C; ++i) {
      const float* ai = a.data() + std::size_t(i) * C;
      impl::unit_lower_inverse_row<false>(i, C, 0, C, ai, x.data(), x.data() + std::size_t(i) * C);
      impl::unit_lower_inverse_row<true>(i, C, 0, C, ai, vx.data(), vx.data() + std::size_t(i) * C);
    }
    same = same && std::memcmp(x.data(), vx.data(), x.size() * sizeof(float)) == 0;
    for (int i = 0; i < C; ++i)
      for (int j = 0; j < C; ++j) {
        double s = x[std::size_t(i) * C + j];  // (X·(I + A))_ij = X_ij + Σ_m X_im A_mj
        for (int m = 0; m < C; ++m)
          s += double(x[std::size_t(i) * C + m]) * a[std::size_t(m) * C + j];
        inverse = inverse && std::abs(s - (i == j ? 1.0 : 0.0)) < 1e-4;
      }
  }
  if (!same) std::cerr << "inverse rows: the vector path differs from the scalar loop\n";
  if (!inverse) std::cerr << "inverse rows: X (I + A) is not the identity\n";
  CTXPAR_TEST_ALL(ctxpar::test::world(), same && inverse);
}

// Streaming: a sequence processed in three consecutive calls, each starting from the previous
// call's final state (and, backward, handing its initial-state gradient to the previous call as a
// final-state gradient), equals one pass over the whole stream, forward and backward.
// A saved bundle reused for a second forward_apply on the same buffers holding new values must
// not return the first call's per-chunk work (caching by data pointer alone gave stale outputs).
BOOST_AUTO_TEST_CASE(reused_bundle_sees_new_values_in_old_buffers) {
  using exec = Kokkos::DefaultHostExecutionSpace;
  using mem = exec::memory_space;
  using family = gd::Family<double, mem, false>;
  namespace cw = ctxpar::chunkwise;
  const int T = 70, H = 2, K = 8, V = 6, C = 16;
  const gd::Problem first = gd::make_problem(301, T, 1, H, K, V, {0, T}, false);
  const gd::Problem second = gd::make_problem(302, T, 1, H, K, V, {0, T}, false);
  const auto backend = family::make(1, cw::BackendOptions{C, 0.0});
  const exec space;
  const auto seqs = cw::LocalSequences::single(T);
  const cw::state_view<mem> zero("zero", H, K, V);
  const cw::sequence_states_view<double, mem> no_h0;
  auto in = family::make_inputs(first);
  const auto fresh_in = family::make_inputs(second);
  // One table for both bundles, as a plan shares its slot's table among contexts.
  const auto table = backend.make_table(seqs, backend.shape(in));
  auto run = [&](const auto& inputs, auto& saved) {
    cw::token_view<double, mem> o("o", T, H, V);
    cw::sequence_states_view<double, mem> ht("ht", 1, H, K, V);
    backend.forward_apply(space, inputs, seqs, table, zero, no_h0, o, ht, saved);
    space.fence();
    return gd::to_vector(o);
  };
  typename family::backend::saved_type reused, fresh;
  run(in, reused);
  // Overwrite every input in place with the second problem's values.
  auto overwrite = [](const auto& dst, const auto& src) {
    std::copy(src.data(), src.data() + src.span(), const_cast<double*>(dst.data()));
  };
  overwrite(in.q, fresh_in.q);
  overwrite(in.k, fresh_in.k);
  overwrite(in.v, fresh_in.v);
  overwrite(in.g, fresh_in.g);
  overwrite(in.beta, fresh_in.beta);
  const auto again = run(in, reused);
  const auto expected = run(fresh_in, fresh);
  CTXPAR_TEST_ALL(ctxpar::test::world(), again == expected);
}

BOOST_AUTO_TEST_CASE(streaming_with_carried_state_equals_one_pass) {
  using exec = Kokkos::DefaultHostExecutionSpace;
  using mem = exec::memory_space;
  using family = gd::Family<double, mem, false>;
  namespace cw = ctxpar::chunkwise;
  const int T = 150, H = 2, K = 16, V = 8, C = 16;
  const std::vector<int> cuts{0, 37, 101, T};
  gd::Problem whole = gd::make_problem(91, T, 1, H, K, V, {0, T}, true);
  std::vector<double> dout(std::size_t(T) * H * V), dht(std::size_t(H) * K * V);
  for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = ctxpar::test::uniform(92, i);
  for (std::size_t i = 0; i < dht.size(); ++i) dht[i] = ctxpar::test::uniform(93, i);
  const gd::Forward f = gd::forward(whole);
  const gd::Gradients g = gd::backward(whole, dout, dht);

  const auto backend = family::make(1, cw::BackendOptions{C, 0.0});
  const exec space;
  const std::size_t HKV = std::size_t(H) * K * V;
  std::vector<double> o_all, dq_all, dk_all, dv_all, dg_all, db_all;
  std::vector<double> state = whole.h0;
  std::vector<typename family::backend::saved_type> saved(3);
  std::vector<typename family::backend::table_type> tables;
  std::vector<typename family::inputs> ins;
  for (int piece = 0; piece < 3; ++piece) {
    gd::Problem p = gd::make_problem(91, cuts[piece + 1] - cuts[piece], 1, H, K, V,
                                     {0, cuts[piece + 1] - cuts[piece]}, false, cuts[piece]);
    ins.push_back(family::make_inputs(p));
    const auto h0 = gd::to_view<double, mem, cw::const_sequence_states_view<double, mem>>(
        state, "h0", 1, H, K, V);
    cw::sequence_states_view<double, mem> ht("ht", 1, H, K, V);
    cw::token_view<double, mem> o("o", p.tokens, H, V);
    const auto seqs = cw::LocalSequences::single(p.tokens);
    tables.push_back(backend.make_table(seqs, backend.shape(ins.back())));
    backend.forward_apply(space, ins.back(), seqs, tables.back(),
                          cw::state_view<mem>("zero", H, K, V), h0, o, ht, saved[piece]);
    const auto ov = gd::to_vector(o);
    o_all.insert(o_all.end(), ov.begin(), ov.end());
    state = gd::to_vector(ht);
  }
  std::vector<double> carried = dht;
  std::vector<std::vector<double>> parts[5];
  for (int piece = 2; piece >= 0; --piece) {
    const int n = cuts[piece + 1] - cuts[piece];
    gd::Problem shape = whole;
    shape.tokens = n;
    auto grads = family::make_gradients(shape);
    const std::vector<double> piece_dout(dout.begin() + std::size_t(cuts[piece]) * H * V,
                                         dout.begin() + std::size_t(cuts[piece + 1]) * H * V);
    const auto dv =
        gd::to_view<double, mem, cw::const_token_view<double, mem>>(piece_dout, "dout", n, H, V);
    const auto dh = gd::to_view<double, mem, cw::const_sequence_states_view<double, mem>>(
        carried, "dht", 1, H, K, V);
    cw::sequence_states_view<double, mem> dh0("dh0", 1, H, K, V);
    backend.backward_apply(space, saved[piece], dv, cw::LocalSequences::single(n),
                           tables[std::size_t(piece)], cw::state_view<mem>("zero", H, K, V), dh,
                           grads, dh0, cw::state_view<mem>());
    parts[0].insert(parts[0].begin(), gd::to_vector(grads.dq));
    parts[1].insert(parts[1].begin(), gd::to_vector(grads.dk));
    parts[2].insert(parts[2].begin(), gd::to_vector(grads.dv));
    parts[3].insert(parts[3].begin(), gd::to_vector(grads.dg));
    parts[4].insert(parts[4].begin(), gd::to_vector(grads.dbeta));
    carried = gd::to_vector(dh0);
  }
  auto join = [](const std::vector<std::vector<double>>& v) {
    std::vector<double> out;
    for (const auto& x : v) out.insert(out.end(), x.begin(), x.end());
    return out;
  };
  const double fb = gd::rel_bound<double>(C, K, V, 8), bb = gd::rel_bound<double>(C, K, V, 16);
  bool ok = gd::rel_l2_close("streamed o", o_all, f.o, fb);
  ok = gd::rel_l2_close("streamed final state", state, f.ht, fb) && ok;
  ok = gd::rel_l2_close("streamed dq", join(parts[0]), g.dq, bb) && ok;
  ok = gd::rel_l2_close("streamed dk", join(parts[1]), g.dk, bb) && ok;
  ok = gd::rel_l2_close("streamed dv", join(parts[2]), g.dv, bb) && ok;
  ok = gd::rel_l2_close("streamed dg", join(parts[3]), g.dg, bb) && ok;
  ok = gd::rel_l2_close("streamed dbeta", join(parts[4]), g.dbeta, bb) && ok;
  ok = gd::rel_l2_close("streamed dh0", carried, g.dh0, bb) && ok;
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok && HKV == state.size());
}
