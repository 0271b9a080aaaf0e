// contract refuses factors of different ranks (a batched factor times an unbatched one).
#include "ctxpar/expr/expr.hpp"

void use() {
  Kokkos::View<float***> a("a", 2, 4, 3);
  Kokkos::View<float**> b("b", 3, 5);
  Kokkos::View<float***> batched_b("batched_b", 2, 3, 5);
#ifdef SHOULD_FAIL
  (void)ctxpar::expr::contract(a, b);
#else
  (void)ctxpar::expr::contract(a, batched_b);
  (void)b;
#endif
}
