// GPU compile check of mechanism C (head partitioning): the transpose plan under every policy
// pair (pack, one all-to-all, unpack, zigzag undo/redo, the adjoint), and the GDP layer end to
// end (pre/post_conv_ssm, parameter slicing and gradient fold, conv, gates through the expression
// layer, L2 norm, the chunkwise GDP recurrence, the skip term D, forward and backward), for
// Kokkos::DefaultExecutionSpace in float and double. Nothing here runs.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

#include "ctxpar/heads/gdp_context_parallel.hpp"
#include "ctxpar/heads/transpose_plan.hpp"

namespace ctxpar::gpu_check {

namespace ch = ::ctxpar::heads;
using exec = Kokkos::DefaultExecutionSpace;
using mem = exec::memory_space;

template <class T, class HeadPolicy, class TokenOrder>
void instantiate_heads(const Group& group) {
  const exec space;
  const ch::GdpShape s{2 * group.size(), 4, 1, 4, 2, 4, ch::SkipTerm::per_head};
  const std::int64_t t = 4 * group.size();
  using matrix = Kokkos::View<T**, Kokkos::LayoutRight, mem>;
  ch::TransposePlan<HeadPolicy, TokenOrder, exec, T> plan(space, group, s.input_layout(), t);
  matrix x("x", plan.local_rows(), plan.channels()), u("u", t, plan.local_channels());
  plan.to_head_parallel(x, u);
  plan.to_sequence_parallel(u, x);
  plan.adjoint_to_head_parallel(u, x);

  ch::GdpContextParallel<HeadPolicy, TokenOrder, exec, T> cp(space, group, s, t,
                                                             std::vector<std::int64_t>{0, t});
  ch::GdpSaved<T, mem> saved;
  auto params = ch::GdpParameters<T, mem>::allocate(s),
       grads = ch::GdpParameters<T, mem>::allocate(s, "grads");
  const std::int64_t rows = cp.input_plan().local_rows();
  matrix y("y", rows, s.d_inner()), z("z", rows, s.d_inner()), dx("dx", rows, plan.channels());
  cp.forward(x, params, y, z, saved);
  cp.backward(saved, y, z, dx, grads);
  Kokkos::View<T*, mem> d("d", s.nheads), dl("dl", cp.local_dims().heads);
  cp.slice_vector(d, dl, false);
}

}  // namespace ctxpar::gpu_check

void ctxpar_gpu_check_heads(const ctxpar::Group& group) {
  using namespace ctxpar::gpu_check;
  instantiate_heads<float, ctxpar::EvenHeads, ctxpar::Contiguous>(group);
  instantiate_heads<float, ctxpar::UnevenHeads, ctxpar::ZigzagPerSequence>(group);
  instantiate_heads<double, ctxpar::EvenHeads, ctxpar::ZigzagPerSequence>(group);
  instantiate_heads<double, ctxpar::UnevenHeads, ctxpar::Contiguous>(group);
}
