// CTXPAR_ASSERT_ACCESSIBLE refuses a view whose memory the execution space cannot access.
#include "ctxpar/core/view_checks.hpp"
#include "fake_space.hpp"

template <class ExecutionSpace, class View>
void operation(const ExecutionSpace&, const View&) {
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::test::operation", ExecutionSpace, View);
}

void use() {
#ifdef SHOULD_FAIL
  operation(Kokkos::DefaultHostExecutionSpace(),
            Kokkos::View<double*, ctxpar::test::FakeDeviceSpace>());
#else
  operation(Kokkos::DefaultHostExecutionSpace(), Kokkos::View<double*, Kokkos::HostSpace>());
#endif
}
