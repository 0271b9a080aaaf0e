// GPU compile check of mechanism B (chunkwise CP): every kernel of the summaries, composition
// (all four transition structures), driver (both policies), the scalar-decay, diagonal-gate, gated
// delta rule and gated delta product backends (forward and backward), and the short-conv halo,
// instantiated for Kokkos::DefaultExecutionSpace in float and double; the driver of every family
// also on bfloat16 and float16 tensors (the 16-bit plan's widen/narrow kernels). Nothing here runs.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

#include "ctxpar/chunkwise/compose.hpp"
#include "ctxpar/chunkwise/diagonal_gate.hpp"
#include "ctxpar/chunkwise/driver.hpp"
#include "ctxpar/chunkwise/gated_delta_product.hpp"
#include "ctxpar/chunkwise/gated_delta_rule.hpp"
#include "ctxpar/chunkwise/scalar_decay.hpp"
#include "ctxpar/chunkwise/short_conv.hpp"
#include "ctxpar/chunkwise/summary.hpp"
#include "ctxpar/core/storage.hpp"

namespace ctxpar::gpu_check {

namespace cw = ::ctxpar::chunkwise;
using exec = Kokkos::DefaultExecutionSpace;
using mem = exec::memory_space;

template <class Transition>
void instantiate_algebra(const Group& group) {
  const exec space;
  const std::int64_t h = 2, k = 4, v = 3;
  cw::SummaryStore<Transition, mem> a(cw::SummaryForm::packed, 1, h, k, v),
      b(cw::SummaryForm::unpacked, 1, h, k, v), out(cw::SummaryForm::packed, 1, h, k, v);
  cw::identity_summary<Transition>(space, a[0], k, v);
  cw::compose_summaries<Transition>(space, a[0], b[0], out[0], k, v);
  Kokkos::View<float**, Kokkos::LayoutRight, mem> s("s", h, k * v), t("t", h, k * v);
  cw::apply_summary<Transition>(space, a[0], s, t, k, v);
  cw::SummaryStore<Transition, mem> all(cw::SummaryForm::packed, group.size(), h, k, v);
  cw::gather_summaries<Transition>(space, group, a.packed(), all.packed(), h, k, v);
}

template <class Policy, class Backend, class Inputs, class Gradients>
void instantiate_driver(const Group& group, const Backend& backend, const Inputs& in,
                        const Gradients& grads, std::int64_t t, std::int64_t h, std::int64_t k,
                        std::int64_t v) {
  using scalar = typename Backend::scalar_type;
  using state = ctxpar::compute_t<scalar>;  // fp32 for 16-bit tensors
  const exec space;
  const auto plan = cw::SequenceLayout::create(group, Contiguous{},
                                               std::vector<std::int64_t>{0, t * group.size()});
  cw::token_view<scalar, mem> o("o", t, h, v);
  cw::ForwardStates<state, mem> fs{cw::const_sequence_states_view<state, mem>(
                                       cw::sequence_states_view<state, mem>("h0", 1, h, k, v)),
                                   cw::sequence_states_view<state, mem>("ht", 1, h, k, v)};
  cw::CpPlan<Policy, Backend, exec> cp(space, group, backend, plan, cw::ChunkwiseShape{t, h, k, v});
  typename decltype(cp)::context_type ctx;
  cp.forward(in, o, ctx, fs);
  cw::BackwardStates<state, mem> bs{cw::const_sequence_states_view<state, mem>(fs.final_states),
                                    cw::sequence_states_view<state, mem>("dh0", 1, h, k, v)};
  cp.backward(ctx, cw::const_token_view<scalar, mem>(o), grads, bs);
}

// The CP driver of every family on tensors of type T.
template <class T>
void instantiate_families(const Group& group) {
  const std::int64_t t = 8, h = 2, k = 4, v = 3, nh = 2;
  cw::token_view<T, mem> q("q", t, h, k), key("k", t, h, k), val("v", t, h, v), gk("g", t, h, k);
  cw::head_view<T, mem> g("g", t, h), beta("beta", t, h);
  cw::token_view<T, mem> dq("dq", t, h, k), dk("dk", t, h, k), dv("dv", t, h, v),
      dgk("dg", t, h, k);
  cw::head_view<T, mem> dg("dg", t, h), dbeta("dbeta", t, h);
  const cw::BackendOptions options{4, 0.0};

  const cw::ScalarDecayBackend<T, mem> scalar(options);
  const cw::ScalarDecayInputs<T, mem> sin{q, key, val, g};
  const cw::ScalarDecayGradients<T, mem> sgr{dq, dk, dv, dg};
  instantiate_driver<cw::GatherFold>(group, scalar, sin, sgr, t, h, k, v);
  instantiate_driver<cw::ScanCompose>(group, scalar, sin, sgr, t, h, k, v);

  const cw::DiagonalGateBackend<T, mem> diagonal(options);
  const cw::DiagonalGateInputs<T, mem> din{q, key, val, gk};
  const cw::DiagonalGateGradients<T, mem> dgr{dq, dk, dv, dgk};
  instantiate_driver<cw::GatherFold>(group, diagonal, din, dgr, t, h, k, v);
  instantiate_driver<cw::ScanCompose>(group, diagonal, din, dgr, t, h, k, v);

  const cw::GatedDeltaRuleBackend<T, mem> gdn(options);
  const cw::GatedDeltaRuleInputs<T, mem> gin{q, key, val, g, beta};
  const cw::GatedDeltaRuleGradients<T, mem> ggr{dq, dk, dv, dg, dbeta};
  instantiate_driver<cw::GatherFold>(group, gdn, gin, ggr, t, h, k, v);
  instantiate_driver<cw::ScanCompose>(group, gdn, gin, ggr, t, h, k, v);

  const cw::GatedDeltaProductBackend<T, mem> gdp(static_cast<int>(nh), options);
  Kokkos::View<T****, Kokkos::LayoutRight, mem> pk("k", t, nh, h, k), pv("v", t, nh, h, v),
      pdk("dk", t, nh, h, k), pdv("dv", t, nh, h, v);
  cw::token_view<T, mem> pbeta("beta", t, nh, h), pdbeta("dbeta", t, nh, h);
  const cw::GatedDeltaProductInputs<T, mem> pin{q, pk, pv, g, pbeta};
  const cw::GatedDeltaProductGradients<T, mem> pgr{dq, pdk, pdv, dg, pdbeta};
  instantiate_driver<cw::GatherFold>(group, gdp, pin, pgr, t, h, k, v);
  instantiate_driver<cw::ScanCompose>(group, gdp, pin, pgr, t, h, k, v);
}

template <class T>
void instantiate_backends(const Group& group) {
  instantiate_families<T>(group);
  const std::int64_t t = 8;

  // Short-conv halo, forward and backward, with sequence ids, through both layouts' plans (the
  // zigzag halo routing, two chunks per rank, is a separate code path).
  const exec space;
  const std::int64_t c = 6, w = 4;
  Kokkos::View<T**, Kokkos::LayoutRight, mem> x("x", t, c), y("y", t, c), wt("w", c, w),
      dx("dx", t, c), dw("dw", c, w);
  Kokkos::View<T*, mem> bias("b", c), dbias("db", c);
  Kokkos::View<std::int32_t*, mem> ids("ids", t);
  using cx = Kokkos::View<const T**, Kokkos::LayoutRight, mem>;
  const cw::ShortConvShape shape{t, c, w, true, true};
  auto conv = [&](auto layout) {
    cw::ShortConvPlan<decltype(layout), exec, T, mem> plan(space, group, shape, layout);
    typename decltype(plan)::saved_type saved;
    plan.forward(cx(x), cx(wt), Kokkos::View<const T*, mem>(bias),
                 Kokkos::View<const std::int32_t*, mem>(ids), y, saved);
    plan.backward(saved, cx(y), dx, dw, dbias);
  };
  conv(ctxpar::Contiguous{});
  conv(ctxpar::Zigzag{});
}

}  // namespace ctxpar::gpu_check

void ctxpar_gpu_check_chunkwise(const ctxpar::Group& group) {
  using namespace ctxpar::gpu_check;
  instantiate_algebra<ctxpar::chunkwise::IdentityTransition>(group);
  instantiate_algebra<ctxpar::chunkwise::ScalarTransition>(group);
  instantiate_algebra<ctxpar::chunkwise::DiagonalTransition>(group);
  instantiate_algebra<ctxpar::chunkwise::DenseTransition>(group);
  instantiate_backends<float>(group);
  instantiate_backends<double>(group);
  instantiate_families<ctxpar::bfloat16>(group);
  instantiate_families<ctxpar::float16>(group);
}
