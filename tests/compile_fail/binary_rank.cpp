// + - * / refuse operands of different ranks (neither a scalar).
#include "ctxpar/expr/expr.hpp"

void use() {
  Kokkos::View<float**> a("a", 4, 3);
  Kokkos::View<float*> b("b", 3);
#ifdef SHOULD_FAIL
  (void)(ctxpar::expr::view(a) * b);
#else
  (void)(ctxpar::expr::view(a) * ctxpar::expr::broadcast<0>(b, 4));
#endif
}
