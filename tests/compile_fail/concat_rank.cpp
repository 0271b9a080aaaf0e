// concat refuses parts of different ranks: a [H, K, V] part must be flattened to [H, K·V] first.
#include "ctxpar/expr/expr.hpp"

void use() {
  Kokkos::View<float***> state("state", 2, 4, 3);
  Kokkos::View<float**> transition("transition", 2, 4);
#ifdef SHOULD_FAIL
  (void)ctxpar::expr::concat(state, transition);
#else
  (void)ctxpar::expr::concat(ctxpar::expr::flatten(state), transition);
#endif
}
