// Chunkwise CP on 16-bit tensors (bfloat16, float16; `chunkwise/narrow_plan.hpp`) for every family
// (scalar decay, diagonal gates, gated delta rule, gated delta product with n_h = 2), both
// composition policies, contiguous and zigzag layouts, one and packed sequences, with and without
// states, on every rank:
// - bitwise: the output and every gradient are the fp32 plan's (same rank count, policy and
//   layout, on the exactly widened inputs) rounded once to the storage type; states and their
//   gradients are the fp32 plan's bits;
// - against the fp64 oracle fed the same (16-bit) values, within the fp32 bound of the existing
//   CP tests plus the one final rounding, plus the chunk products' rounding where the plan's
//   products are not exact: the default (`automatic`) is the storage type's own tensor-core
//   products for every family on a device and exact on the host, so each run compares
//   with the fp32 plan of the products the 16-bit plan resolved, and the explicit bfloat16 and
//   float16 products (a device's default) run on the host too;
// - a 16-bit input or output of the wrong shape, a wrong-shaped 16-bit gradient, a strided 16-bit
//   input or gradient and a NaN under check_finite, on one rank, are refused on every rank with
//   the same ctxpar::Error;
// - a second forward + backward with the same shapes allocates nothing.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <type_traits>
#include <vector>

#include "chunkwise/chunkwise_test_support.hpp"
#include "chunkwise/decay_oracle.hpp"
#include "chunkwise/gated_delta_cp_support.hpp"
#include "ctxpar/chunkwise/driver.hpp"
#include "ctxpar/core/allocation_counter.hpp"
#include "ctxpar/core/plan.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar_test/roundoff.hpp"

namespace cwt = ctxpar::test::chunkwise;
namespace cw = ctxpar::chunkwise;
using ctxpar::bfloat16;
using ctxpar::float16;
using ctxpar::test::world;

namespace {

// The default space: the device in a CUDA/HIP build.
using exec = Kokkos::DefaultExecutionSpace;
using mem = exec::memory_space;

// The class of each 16-bit backend is complete (its declarations hold for 16-bit views), and the
// plan make_cp_plan deduces for it is the 16-bit one, which follows the plan contract.
static_assert(sizeof(cw::ScalarDecayBackend<bfloat16, mem>) > 0 &&
              sizeof(cw::DiagonalGateBackend<float16, mem>) > 0 &&
              sizeof(cw::GatedDeltaRuleBackend<bfloat16, mem>) > 0 &&
              sizeof(cw::GatedDeltaProductBackend<float16, mem>) > 0);
using narrow_plan = decltype(cw::make_cp_plan<cw::GatherFold>(
    exec(), std::declval<const ctxpar::Group&>(),
    std::declval<const cw::GatedDeltaRuleBackend<bfloat16, mem>&>(),
    std::declval<const cw::SequenceLayout&>(), cw::ChunkwiseShape{}));
static_assert(
    std::is_same_v<narrow_plan::compute_type, float> &&
    std::is_same_v<narrow_plan::wide_backend_type, cw::GatedDeltaRuleBackend<float, mem>>);
static_assert(ctxpar::follows_plan_contract<narrow_plan>);
static_assert(ctxpar::follows_plan_contract<
              cw::CpPlan<cw::ScanCompose, cw::DiagonalGateBackend<float16, mem>, exec>>);

template <class Storage>
const char* type_name() {
  return std::is_same_v<Storage, bfloat16> ? "bfloat16" : "float16";
}

// Every value of `x` replaced by a value of `Storage`: the inputs are generated in the storage
// type, and the oracle and the fp32 plan read exactly these values.
template <class Storage>
void round_to(std::vector<double>& x) {
  for (auto& e : x) e = static_cast<double>(ctxpar::widen(ctxpar::narrow<Storage>(e)));
}

// The scalar-decay (Diagonal = false) and diagonal-gate families in the form the checks below use.
template <bool Diagonal>
struct DecayFamily {
  using problem = cwt::DecayProblem;
  template <class Scalar>
  using adapter = cwt::DecayAdapter<Scalar, mem, Diagonal>;
  static std::string name() { return Diagonal ? "diagonal" : "scalar"; }
  template <class Storage>
  static problem make(const std::vector<std::int64_t>& cu, int chunk, std::uint64_t seed,
                      int key_dim = 8) {
    problem p = cwt::make_decay_problem(2, key_dim, 6, Diagonal, cu, seed, chunk);
    for (auto* x : {&p.q, &p.k, &p.v, &p.g, &p.dout}) round_to<Storage>(*x);
    return p;
  }
  static cwt::Result oracle(const problem& p, bool states) {
    return cwt::decay_oracle(p, states, states, false).result;
  }
  static constexpr bool tensor_core_products = true;
  static cwt::Result bound(const problem& p, const cwt::Result&, bool states, int shards,
                           cw::ChunkProducts products) {
    return cwt::decay_bounds<float>(p, states, states, shards,
                                    cw::products_unit_roundoff(products));
  }
};

// The gated delta rule (Product = false) and the gated delta product with n_h = 2.
template <bool Product>
struct GatedDeltaFamily {
  using problem = cwt::GdCpProblem;
  template <class Scalar>
  using adapter = cwt::GdAdapter<Scalar, Product, mem>;
  static std::string name() { return Product ? "gdp n_h=2" : "gdn"; }
  template <class Storage>
  static problem make(const std::vector<std::int64_t>& cu, int chunk, std::uint64_t seed,
                      int key_dim = 8) {
    problem p = cwt::make_cp_problem(seed, cu, Product ? 2 : 1, 2, key_dim, 6, chunk);
    for (auto* x : {&p.p.q, &p.p.k, &p.p.v, &p.p.g, &p.p.beta, &p.dout}) round_to<Storage>(*x);
    return p;
  }
  static cwt::Result oracle(const problem& p, bool states) {
    return cwt::oracle(p, states, states);
  }
  static constexpr bool tensor_core_products = true;
  static cwt::Result bound(const problem& p, const cwt::Result& want, bool, int shards,
                           cw::ChunkProducts products) {
    return cwt::bounds<float>(p, want, shards, products);
  }
};

// The bound of a 16-bit result against the oracle value x: the plan's result is narrow(y), y the
// fp32 plan's result on the same inputs within the fp32 bound b of the CP tests, rounded once
// (`stored_once_bound`). States and their gradients stay fp32: b.
template <class Storage>
cwt::Result sixteen_bit_bound(const cwt::Result& fp32, const cwt::Result& want) {
  auto add = [&](std::vector<double>& b, const std::vector<double>& x) {
    for (std::size_t i = 0; i < b.size(); ++i)
      b[i] = ctxpar::test::stored_once_bound<Storage>(x[i], b[i]);
  };
  cwt::Result b = fp32;
  add(b.output, want.output);
  for (std::size_t g = 0; g < b.grads.size(); ++g) add(b.grads[g].values, want.grads[g].values);
  return b;
}

// Whether `got` (a 16-bit run) holds exactly the values of `wide` (the fp32 run) rounded once to
// `Storage`: the output and the gradients; states and their gradients bit for bit.
template <class Storage>
bool rounded_bitwise(const std::string& what, const cwt::Result& got, const cwt::Result& wide) {
  bool ok = true;
  auto same = [&](const std::string& name, const std::vector<double>& a,
                  const std::vector<double>& w, bool round) {
    if (a.size() != w.size()) {
      std::cerr << "[rank " << world().rank() << "] " << what << " " << name << ": " << a.size()
                << " values, the fp32 run has " << w.size() << "\n";
      ok = false;
      return;
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double want =
          round ? static_cast<double>(ctxpar::widen(ctxpar::narrow<Storage>(w[i]))) : w[i];
      if (a[i] != want) {
        std::cerr << "[rank " << world().rank() << "] " << what << " " << name << "[" << i
                  << "]: " << a[i] << ", the rounded fp32 value is " << want << " (fp32 " << w[i]
                  << ")\n";
        ok = false;
        return;
      }
    }
  };
  same("output", got.output, wide.output, true);
  for (std::size_t g = 0; g < wide.grads.size(); ++g)
    same(wide.grads[g].name, got.grads.at(g).values, wide.grads[g].values, true);
  same("final states", got.final_states, wide.final_states, false);
  same("initial-state gradients", got.initial_state_grads, wide.initial_state_grads, false);
  return ok;
}

// One problem of a family on one storage type: both policies, contiguous and zigzag, without and
// with states, each run in 16 bits with chunk products `requested` and in fp32 with the products
// the 16-bit plan resolves them to, and checked as the header says.
template <class Family, class Storage>
bool check_problem(const std::vector<std::int64_t>& cu, int chunk, std::uint64_t seed,
                   cw::ChunkProducts requested = cw::ChunkProducts::automatic) {
  const cw::ChunkProducts resolved =
      cw::resolve_chunk_products<exec, Storage>(requested, Family::tensor_core_products);
  using adapter16 = typename Family::template adapter<Storage>;
  using adapter32 = typename Family::template adapter<float>;
  const auto& group = world();
  const auto prob = Family::template make<Storage>(cu, chunk, seed);
  bool ok = true;
  for (int states = 0; states < 2; ++states) {
    const bool with = states == 1;
    const cwt::Result want = Family::oracle(prob, with);
    for (int zig = 0; zig < 2; ++zig) {
      cwt::CaseOptions o;
      o.chunk = chunk;
      o.zigzag = zig == 1;
      o.initial_states = o.final_state_grads = with;
      o.products = requested;
      cwt::CaseOptions o32 = o;
      o32.products = resolved;
      const int shards = group.size() * (o.zigzag ? 2 : 1);
      const cwt::Result bound =
          sixteen_bit_bound<Storage>(Family::bound(prob, want, with, shards, resolved), want);
      std::string what = Family::name() + "/" + type_name<Storage>() + "/" +
                         (o.zigzag ? "zigzag" : "contiguous") + (with ? "/states" : "") +
                         " chunk " + std::to_string(chunk) + " T " + std::to_string(prob.T) +
                         " products " + cw::to_string(requested) + " (" + cw::to_string(resolved) +
                         ")";
      std::vector<cwt::Range> rows;
      const cwt::Result gf16 = cwt::run_cp<adapter16, cw::GatherFold>(group, prob, o, &rows);
      const cwt::Result gf32 = cwt::run_cp<adapter32, cw::GatherFold>(group, prob, o32);
      ok = rounded_bitwise<Storage>(what + "/gather vs fp32", gf16, gf32) && ok;
      ok = cwt::check_against(what + "/gather vs oracle", gf16, want, bound, rows, prob.T) && ok;
      const cwt::Result sc16 = cwt::run_cp<adapter16, cw::ScanCompose>(group, prob, o);
      const cwt::Result sc32 = cwt::run_cp<adapter32, cw::ScanCompose>(group, prob, o32);
      ok = rounded_bitwise<Storage>(what + "/scan vs fp32", sc16, sc32) && ok;
      ok = cwt::check_against(what + "/scan vs oracle", sc16, want, bound, rows, prob.T) && ok;
    }
  }
  return ok;
}

template <class Family>
void run_family() {
  const auto& group = world();
  const int p = group.size();
  // One sequence, uneven split, T not a multiple of the chunk.
  CTXPAR_TEST_ALL(group, (check_problem<Family, bfloat16>({0, 21 * p + 5}, 8, 11)));
  CTXPAR_TEST_ALL(group, (check_problem<Family, float16>({0, 21 * p + 5}, 8, 12)));
  // Packed: a single-token document, one spanning several ranks.
  const auto packed = cwt::cu_from_lengths({30, 1, 17, 45, 4});
  CTXPAR_TEST_ALL(group, (check_problem<Family, bfloat16>(packed, 16, 13)));
  CTXPAR_TEST_ALL(group, (check_problem<Family, float16>(packed, 16, 14)));
  if constexpr (Family::tensor_core_products) {
    // What a device runs by default, by name on every space.
    CTXPAR_TEST_ALL(group, (check_problem<Family, bfloat16>({0, 21 * p + 5}, 8, 15,
                                                            cw::ChunkProducts::bfloat16)));
    CTXPAR_TEST_ALL(group,
                    (check_problem<Family, float16>(packed, 16, 16, cw::ChunkProducts::float16)));
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(scalar_decay_sixteen_bit_is_the_rounded_fp32_plan) {
  run_family<DecayFamily<false>>();
}

BOOST_AUTO_TEST_CASE(diagonal_gate_sixteen_bit_is_the_rounded_fp32_plan) {
  run_family<DecayFamily<true>>();
}

BOOST_AUTO_TEST_CASE(gated_delta_rule_sixteen_bit_is_the_rounded_fp32_plan) {
  run_family<GatedDeltaFamily<false>>();
}

BOOST_AUTO_TEST_CASE(gated_delta_product_sixteen_bit_is_the_rounded_fp32_plan) {
  run_family<GatedDeltaFamily<true>>();
}

// What `automatic` chunk products resolve to, by storage type, space and family; and what the
// plans built with the default options report on this space, on every rank.
BOOST_AUTO_TEST_CASE(automatic_chunk_products_resolve_by_storage_space_and_family) {
  using P = cw::ChunkProducts;
  BOOST_TEST((cw::resolve_chunk_products<bfloat16>(P::automatic, true) == P::bfloat16));
  BOOST_TEST((cw::resolve_chunk_products<float16>(P::automatic, true) == P::float16));
  BOOST_TEST((cw::resolve_chunk_products<float>(P::automatic, true) == P::exact));
  BOOST_TEST((cw::resolve_chunk_products<double>(P::automatic, true) == P::exact));
  BOOST_TEST((cw::resolve_chunk_products<bfloat16>(P::automatic, false) == P::exact));
  BOOST_TEST((cw::resolve_chunk_products<float16>(P::automatic, true, false) == P::exact));
  BOOST_TEST((cw::resolve_chunk_products<bfloat16>(P::tf32, false) == P::tf32));
  BOOST_TEST((cw::resolve_chunk_products<float>(P::float16, true) == P::float16));
  // The host spaces emulate the products only when asked by name.
  BOOST_TEST(!ctxpar::impl::tensor_cores_by_default_v<Kokkos::DefaultHostExecutionSpace>);
  const auto& group = world();
  const std::vector<std::int64_t> cu{0, 9 * group.size() + 2};
  const auto layout = cw::SequenceLayout::create(group, ctxpar::Contiguous{}, cu);
  const cw::ChunkwiseShape shape{layout.local_length(), 2, 8, 6};
  bool ok = true;
  auto expect = [&](const char* what, P got, P want) {
    if (got == want) return;
    std::cerr << "[rank " << group.rank() << "] " << what << ": " << cw::to_string(got)
              << ", expected " << cw::to_string(want) << "\n";
    ok = false;
  };
  {
    cw::CpPlan<cw::GatherFold, cw::GatedDeltaRuleBackend<bfloat16, mem>, exec> plan(
        exec(), group, cw::GatedDeltaRuleBackend<bfloat16, mem>(), layout, shape);
    expect("gdn bfloat16", plan.products(),
           cw::resolve_chunk_products<exec, bfloat16>(P::automatic));
  }
  {
    cw::CpPlan<cw::ScanCompose, cw::GatedDeltaProductBackend<float16, mem>, exec> plan(
        exec(), group, cw::GatedDeltaProductBackend<float16, mem>(2), layout, shape);
    expect("gdp float16", plan.products(), cw::resolve_chunk_products<exec, float16>(P::automatic));
  }
  {
    cw::CpPlan<cw::GatherFold, cw::ScalarDecayBackend<bfloat16, mem>, exec> plan(
        exec(), group, cw::ScalarDecayBackend<bfloat16, mem>(), layout, shape);
    expect("scalar decay bfloat16", plan.products(),
           cw::resolve_chunk_products<exec, bfloat16>(P::automatic));
  }
  {
    cw::BackendOptions named;
    named.products = P::float16;
    cw::CpPlan<cw::GatherFold, cw::GatedDeltaRuleBackend<bfloat16, mem>, exec> plan(
        exec(), group, cw::GatedDeltaRuleBackend<bfloat16, mem>(named), layout, shape);
    expect("gdn bfloat16, float16 by name", plan.products(), P::float16);
  }
  CTXPAR_TEST_ALL(group, ok);
}

namespace {

// The rank's 16-bit inputs, output, output gradient and gradients of one problem, and a plan.
template <class Family, class Storage, class Policy>
struct Setup {
  using adapter = typename Family::template adapter<Storage>;
  using backend = typename adapter::backend;
  typename Family::problem prob;
  cw::SequenceLayout layout;
  std::vector<cwt::Range> rows;
  typename backend::inputs_type in;
  cw::token_view<Storage, mem> out;
  cw::const_token_view<Storage, mem> dout;
  typename backend::gradients_type grads;
  cw::CpPlan<Policy, backend, exec> cp;

  Setup(const std::vector<std::int64_t>& cu, bool zigzag, const cw::DriverOptions& options = {},
        int key_dim = 8)
      : prob(Family::template make<Storage>(cu, 8, 5, key_dim)),
        layout(zigzag ? cw::SequenceLayout::create(world(), ctxpar::Zigzag{}, cu)
                      : cw::SequenceLayout::create(world(), ctxpar::Contiguous{}, cu)),
        rows(cwt::owned_rows(layout, world().rank())),
        in(adapter::inputs(prob, rows)),
        out("o", layout.local_length(), prob.H, prob.V),
        dout(cwt::upload_rows<cw::const_token_view<Storage, mem>>(prob.dout, prob.H * prob.V, rows,
                                                                  "dout", prob.H, prob.V)),
        grads(adapter::gradients(prob, layout.local_length())),
        cp(exec(), world(), adapter::make_backend(prob, cw::BackendOptions{8, 0.0}), layout,
           cw::ChunkwiseShape{layout.local_length(), prob.H, prob.K, prob.V}, options) {}
};

// A view of the extents of `v` with its first extent one larger (a wrong-shaped argument).
template <class View>
View one_more_token(const View& v) {
  using made = typename View::non_const_type;
  if constexpr (View::rank == 2)
    return made("wrong", v.extent(0) + 1, v.extent(1));
  else if constexpr (View::rank == 3)
    return made("wrong", v.extent(0) + 1, v.extent(1), v.extent(2));
  else
    return made("wrong", v.extent(0) + 1, v.extent(1), v.extent(2), v.extent(3));
}

template <class Family, class Storage>
bool refuses_bad_input(const std::string& k_message, const std::string& gradient_message,
                       const std::string& strided_input_message,
                       const std::string& strided_gradient_message) {
  const auto& group = world();
  const int bad = group.size() - 1;  // one rank only
  const bool mine = group.rank() == bad;
  const std::vector<std::int64_t> cu{0, 9 * group.size() + 2};
  // The operator, the rank and the message, as the fp32 plan words them.
  const std::string on = ": on rank " + std::to_string(bad) + ": ",
                    fwd = "ctxpar::chunkwise::CpPlan::forward" + on,
                    bwd = "ctxpar::chunkwise::CpPlan::backward" + on;
  bool ok = true;
  {
    Setup<Family, Storage, cw::GatherFold> s(cu, false);
    typename decltype(s.cp)::context_type ctx;
    // k of the wrong shape (one token too many) on one rank.
    auto in = s.in;
    if (mine) in.k = one_more_token(s.in.k);
    ok = ctxpar::test::throws_everywhere(
             group, [&] { s.cp.forward(in, s.out, ctx); }, fwd + k_message, bad) &&
         ok;
    // The 16-bit output of the wrong shape.
    auto out = mine ? one_more_token(s.out) : s.out;
    ok = ctxpar::test::throws_everywhere(
             group, [&] { s.cp.forward(s.in, out, ctx); }, fwd + "the output must be [T, H, V]",
             bad) &&
         ok;
    // A 16-bit gradient of the wrong shape, after a good forward.
    s.cp.forward(s.in, s.out, ctx);
    auto grads = s.grads;
    if (mine) grads.dq = one_more_token(s.grads.dq);
    ok = ctxpar::test::throws_everywhere(
             group, [&] { s.cp.backward(ctx, s.dout, grads); }, bwd + gradient_message, bad) &&
         ok;
    // A context no forward of this plan filled.
    typename decltype(s.cp)::context_type fresh;
    ok = ctxpar::test::throws_everywhere(
             group, [&] { s.cp.backward(fresh, s.dout, s.grads); },
             "the context must come from a forward of this plan", 0) &&
         ok;
  }
  {
    // A strided 16-bit q, and then dq, on one rank: each view is widened as one flat span, so a
    // padded one would be read out of place. Kokkos pads a LayoutRight view's rows only past 32
    // 16-bit values, hence K = 40 here (rows of 64).
    Setup<Family, Storage, cw::GatherFold> s(cu, false, {}, 40);
    typename decltype(s.cp)::context_type ctx;
    auto padded_like = [](const auto& v) {
      typename std::decay_t<decltype(v)>::non_const_type p(
          Kokkos::view_alloc("padded", Kokkos::AllowPadding), v.extent(0), v.extent(1),
          v.extent(2));
      Kokkos::deep_copy(p, v);
      return p;
    };
    auto in = s.in;
    const auto q = padded_like(s.in.q);
    if (mine) in.q = q;
    if (q.span_is_contiguous()) {
      std::cerr << "[rank " << group.rank() << "] the padded q is contiguous: nothing is tested\n";
      ok = false;
    }
    ok = ctxpar::test::throws_everywhere(
             group, [&] { s.cp.forward(in, s.out, ctx); }, fwd + strided_input_message, bad) &&
         ok;
    s.cp.forward(s.in, s.out, ctx);
    auto grads = s.grads;
    if (mine) grads.dq = padded_like(s.grads.dq);
    ok = ctxpar::test::throws_everywhere(
             group, [&] { s.cp.backward(ctx, s.dout, grads); }, bwd + strided_gradient_message,
             bad) &&
         ok;
    // The contiguous views still pass.
    s.cp.backward(ctx, s.dout, s.grads);
  }
  {
    cw::DriverOptions options;
    options.check_finite = true;
    Setup<Family, Storage, cw::ScanCompose> s(cu, true, options);
    typename decltype(s.cp)::context_type ctx;
    // A NaN in the 16-bit values on one rank (a rank that holds tokens).
    using value = Storage;
    auto v = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s.in.v);
    auto nan = typename decltype(v)::non_const_type("nan", v.extent(0), v.extent(1), v.extent(2));
    Kokkos::deep_copy(nan, v);
    if (mine && nan.size() > 0) nan.data()[nan.size() / 2] = ctxpar::narrow<value>(std::nanf(""));
    auto in = s.in;
    auto nan_device = Kokkos::create_mirror_view_and_copy(mem(), nan);
    in.v = nan_device;
    ok = ctxpar::test::throws_everywhere(
             group, [&] { s.cp.forward(in, s.out, ctx); },
             fwd + "the inputs must be finite (check_finite)", bad) &&
         ok;
    // The same inputs without the NaN pass.
    s.cp.forward(s.in, s.out, ctx);
    s.cp.backward(ctx, s.dout, s.grads);
  }
  return ok;
}

}  // namespace

BOOST_AUTO_TEST_CASE(sixteen_bit_bad_input_is_refused_on_every_rank) {
  const auto& group = world();
  // The strided views are refused by the family's own checks where it has them (the gated delta
  // rule's inputs and gradients, the decay family's inputs), else by the 16-bit plan's.
  CTXPAR_TEST_ALL(
      group,
      (refuses_bad_input<GatedDeltaFamily<false>, bfloat16>(
          "k must be [T, H, K] like q", "dq, dk, dv, dg and dbeta must have the shapes",
          "q, k, v, g and beta must be contiguous", "the gradient views must be contiguous")));
  CTXPAR_TEST_ALL(group, (refuses_bad_input<DecayFamily<false>, float16>(
                             "k must have the shape of q", "dq, dk, dv and dg must have the shapes",
                             "q, k, v and g must be contiguous",
                             "the output gradient and the gradients must be contiguous")));
}

namespace {

// After a warm-up, forward + backward with the same shapes allocate nothing, leave the results
// bitwise unchanged and the plan's workspace as it was.
template <class Family, class Storage, class Policy>
bool steady(const std::string& name, bool zigzag) {
  const auto& group = world();
  const std::int64_t p = group.size();
  using setup = Setup<Family, Storage, Policy>;
  setup s(cwt::cu_from_lengths({5, 7 * p, 6 * p + 1}), zigzag);
  typename decltype(s.cp)::context_type ctx;
  using state = cw::sequence_states_view<float, mem>;
  const std::int64_t n = s.layout.sequence_count(), H = s.prob.H, K = s.prob.K, V = s.prob.V;
  const state h0("h0", n, H, K, V), ht("ht", n, H, K, V), dht("dht", n, H, K, V),
      dh0("dh0", n, H, K, V);
  Kokkos::deep_copy(h0, 0.25f);
  Kokkos::deep_copy(dht, -0.5f);
  auto call = [&] {
    s.cp.forward(s.in, s.out, ctx, {h0, ht});
    s.cp.backward(ctx, s.dout, s.grads, {dht, dh0});
    exec().fence();
  };
  auto results = [&] {
    std::vector<std::vector<double>> r{cwt::to_host(s.out), cwt::to_host(ht), cwt::to_host(dh0)};
    for (auto& a : setup::adapter::gradient_arrays(s.grads)) r.push_back(a.values);
    return r;
  };
  call();  // warm-up: the plan's and the context's memory is taken here
  const auto first = results();
  const std::size_t workspace = s.cp.workspace_bytes();
  std::int64_t allocations = 0;
  {
    ctxpar::AllocationCounter counter;
    call();
    call();
    allocations = counter.allocations();
    if (allocations != 0) {
      std::cerr << "[rank " << group.rank() << "] " << name << ": " << allocations
                << " allocations in steady state:";
      for (const auto& [label, count] : counter.labels())
        std::cerr << " " << label << " x" << count;
      std::cerr << "\n";
    }
  }
  const bool same = results() == first;
  if (!same) std::cerr << "[rank " << group.rank() << "] " << name << ": results changed\n";
  const bool held = workspace > 0 && s.cp.workspace_bytes() == workspace;
  if (!held)
    std::cerr << "[rank " << group.rank() << "] " << name << ": workspace " << workspace
              << " bytes after the warm-up, " << s.cp.workspace_bytes() << " after the repeats\n";
  return allocations == 0 && same && held;
}

}  // namespace

BOOST_AUTO_TEST_CASE(sixteen_bit_steady_state_allocates_nothing) {
  bool ok = steady<GatedDeltaFamily<true>, bfloat16, cw::GatherFold>("gdp bfloat16 gather", false);
  ok = steady<GatedDeltaFamily<false>, float16, cw::ScanCompose>("gdn float16 scan", true) && ok;
  ok = steady<DecayFamily<true>, bfloat16, cw::ScanCompose>("diagonal bfloat16 scan", false) && ok;
  ok = steady<DecayFamily<false>, float16, cw::GatherFold>("scalar float16 gather", true) && ok;
  CTXPAR_TEST_ALL(world(), ok);
}
