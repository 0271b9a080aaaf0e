// ctxpar::assign refuses an expression whose rank differs from the destination's.
#include "ctxpar/expr/expr.hpp"

void use() {
  Kokkos::View<float**> out("out", 4, 3);
  Kokkos::View<float*> bias("bias", 3);
#ifdef SHOULD_FAIL
  ctxpar::assign(Kokkos::DefaultHostExecutionSpace(), out, ctxpar::expr::sigmoid(bias));
#else
  ctxpar::assign(Kokkos::DefaultHostExecutionSpace(), out,
                 ctxpar::expr::sigmoid(ctxpar::expr::broadcast<0>(bias, 4)));
#endif
}
