// Mask && and || refuse an operand that is not a mask expression.
#include "ctxpar/expr/mask.hpp"

void use() {
#ifdef SHOULD_FAIL
  (void)(ctxpar::mask::causal() && true);
#else
  (void)(ctxpar::mask::causal() && ctxpar::mask::sliding_window(8));
#endif
}
