// + - * / refuse operands of different value types.
#include "ctxpar/expr/expr.hpp"

void use() {
  Kokkos::View<float*> a("a", 4);
#ifdef SHOULD_FAIL
  Kokkos::View<double*> b("b", 4);
#else
  Kokkos::View<float*> b("b", 4);
#endif
  (void)(ctxpar::expr::view(a) + b);
}
