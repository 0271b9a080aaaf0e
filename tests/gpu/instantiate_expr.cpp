// GPU compile check of the expression layer: every element-wise node and function, broadcasts
// along each axis, the batched contraction, concatenation and flatten, and assign at ranks 1..3,
// instantiated for Kokkos::DefaultExecutionSpace (CUDA or HIP in the compile-check presets) in
// float and double.
#include <Kokkos_Core.hpp>

#include <cstdint>

#include "ctxpar/expr/expr.hpp"

namespace {

namespace ex = ctxpar::expr;
using exec = Kokkos::DefaultExecutionSpace;
using mem = exec::memory_space;

template <class T>
void instantiate_expressions() {
  const exec space;
  const std::int64_t t = 8, h = 4, d = 2;
  Kokkos::View<T*, mem> v("v", h), out1("out1", h);
  Kokkos::View<T**, mem> a("a", t, h), out2("out2", t, h);
  Kokkos::View<T***, mem> x("x", t, h, d), out3("out3", t, h, d);
  Kokkos::View<T**, mem> table("table", t, d);
  ctxpar::assign(
      space, out1,
      ex::exp(v) + ex::log1p(v) - ex::sigmoid(v) * ex::softplus(v) / ex::rsqrt(ex::silu(v) + T(2)));
  ctxpar::assign(space, out1, -ex::view(v) * T(0.5));
  ctxpar::assign(space, out1, T(1));
  ctxpar::assign(space, out1, v);
  ctxpar::assign(space, out2,
                 ex::exp(-ex::exp(ex::broadcast<0>(v, t)) *
                         ex::softplus(ex::view(a) + ex::broadcast<0>(v, t))));
  ctxpar::assign(space, out3, ex::view(x) * ex::broadcast<1>(table, h) + ex::broadcast<2>(a, d));
  ctxpar::assign(space, out3, ex::silu(x) * ex::broadcast<0>(ex::broadcast<0>(v, h), t) + x);
  // The batched contraction (summary algebra): rank 3 with an addend, rank 2 of expressions.
  Kokkos::View<T***, mem> m("m", t, h, h), s("s", t, h, d);
  ctxpar::assign(space, out3, ex::contract(m, s, x));
  ctxpar::assign(space, out2, ex::contract(ex::view(a) * T(2), ex::broadcast<0>(v, h), T(1)));
  // A packed record in one kernel: concat(flatten(m·s + x), flatten(m·m)) into [t, h·d + h·h],
  // and the rank-1 and rank-3 forms.
  Kokkos::View<T**, mem> record("record", t, h * d + h * h);
  ctxpar::assign(space, record,
                 ex::concat(ex::flatten(ex::contract(m, s, x)), ex::flatten(ex::contract(m, m))));
  Kokkos::View<T*, mem> pair("pair", h + t * d);
  ctxpar::assign(space, pair, ex::concat(ex::view(v) * T(2), ex::flatten(table)));
  Kokkos::View<T***, mem> side("side", t, h, d + h);
  ctxpar::assign(space, side, ex::concat(x, m));
  Kokkos::View<double*, mem> wide("wide", h);
  ctxpar::assign(space, wide, ex::cast<double>(v) * 2.0);
  space.fence();
}

}  // namespace

void ctxpar_gpu_check_expr() {
  instantiate_expressions<float>();
  instantiate_expressions<double>();
}
