// ctxpar::assign refuses a destination of const values.
#include "ctxpar/expr/expr.hpp"

void use() {
  Kokkos::View<double*> data("data", 4);
#ifdef SHOULD_FAIL
  Kokkos::View<const double*> out = data;
#else
  Kokkos::View<double*> out = data;
#endif
  ctxpar::assign(Kokkos::DefaultHostExecutionSpace(), out, 1.0);
}
