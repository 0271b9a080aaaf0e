// ctxpar::assign refuses a destination the execution space cannot access.
#include "ctxpar/expr/expr.hpp"
#include "fake_space.hpp"

void use() {
  Kokkos::View<double*, Kokkos::HostSpace> in("in", 4);
#ifdef SHOULD_FAIL
  Kokkos::View<double*, ctxpar::test::FakeDeviceSpace> out;
#else
  Kokkos::View<double*, Kokkos::HostSpace> out("out", 4);
#endif
  ctxpar::assign(Kokkos::DefaultHostExecutionSpace(), out, ctxpar::expr::exp(in));
}
