// flatten merges the last two axes, so its operand needs at least two.
#include "ctxpar/expr/expr.hpp"

void use() {
  Kokkos::View<float*> line("line", 6);
  Kokkos::View<float**> matrix("matrix", 2, 3);
#ifdef SHOULD_FAIL
  (void)ctxpar::expr::flatten(line);
#else
  (void)ctxpar::expr::flatten(matrix);
  (void)line;
#endif
}
