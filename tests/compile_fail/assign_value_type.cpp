// ctxpar::assign refuses an implicit float <-> double conversion.
#include "ctxpar/expr/expr.hpp"

void use() {
  Kokkos::View<double*> out("out", 4);
  Kokkos::View<float*> in("in", 4);
#ifdef SHOULD_FAIL
  ctxpar::assign(Kokkos::DefaultHostExecutionSpace(), out, ctxpar::expr::exp(in));
#else
  ctxpar::assign(Kokkos::DefaultHostExecutionSpace(), out,
                 ctxpar::expr::cast<double>(ctxpar::expr::exp(in)));
#endif
}
