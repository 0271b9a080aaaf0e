// broadcast refuses a new axis beyond the operand's rank.
#include "ctxpar/expr/expr.hpp"

void use() {
  Kokkos::View<float*> b("b", 3);
#ifdef SHOULD_FAIL
  (void)ctxpar::expr::broadcast<2>(b, 4);
#else
  (void)ctxpar::expr::broadcast<1>(b, 4);
#endif
}
