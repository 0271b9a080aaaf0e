// GPU compile check of the tensor-core tile product (core/impl/mma_fragment.hpp): one warp's
// m16n8k16 product, bfloat16 and IEEE half (and the m16n8k8 TF32 product on fp32), through the
// fragment loads (from global memory, and from team scratch by ldmatrix), the instruction (sm_80
// and later) and the fragment store, with the 32 lanes as the threads of one team.
// scripts/gpu-compile-check cuda compiles this file once more keeping its PTX and ptxas report, and
// requires the three `mma.sync` instructions and the `ldmatrix` in the PTX and no register spills;
// the attention kernels, the gated delta per-chunk kernels and state passes and the decay
// families' team kernels, whose products (`ChunkProducts`) run on `team_mma_gemm` for each
// operand type, must issue mma.sync, and their SASS the HMMA of each operand type
// (scripts/sass_check.py).
// Nothing here runs.
#include <Kokkos_Core.hpp>

#include "ctxpar/chunkwise/impl/decay_kernels.hpp"
#include "ctxpar/chunkwise/impl/gated_delta_kernels.hpp"
#include "ctxpar/core/bfloat16.hpp"
#include "ctxpar/core/float16.hpp"
#include "ctxpar/core/impl/mma_fragment.hpp"
#include "ctxpar/swa/attention_kernel.hpp"

namespace ctxpar::gpu_check {

using exec = Kokkos::DefaultExecutionSpace;
template <class T>
using Vec = Kokkos::View<T*, exec::memory_space>;

template <class T>
struct WarpProduct {
  static constexpr int scratch_bytes = 16 * 24 * sizeof(T);
  Vec<T> a, b;
  Vec<float> d;
  KOKKOS_INLINE_FUNCTION void operator()(const Kokkos::TeamPolicy<exec>::member_type& team) const {
    const int lane = team.team_rank();
    impl::Fragment<T, 8> fa;
    impl::Fragment<T, 4> fb;
    float fc[4] = {0, 0, 0, 0};
    impl::load_a(lane, a.data(), 16, fa);
    impl::load_b(lane, b.data(), 16, fb);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // A staged through team scratch (rows padded to 24) and read back by ldmatrix.
    // int{...}: a value, so device code does not odr-use the static member.
    T* tile = static_cast<T*>(team.team_shmem().get_shmem_aligned(int{scratch_bytes}, 16));
    for (int i = lane; i < 16 * 16; i += 32) tile[(i / 16) * 24 + i % 16] = a(i);
    team.team_barrier();
    using X4 = impl::LdMatrixX4;
    impl::ldmatrix_x4(tile + X4::a_row(lane) * 24 + X4::a_col(lane), fa);
    impl::mma(fc, fa, fb);
    // The result fed back as the A operand of a second product, from registers.
    impl::Fragment<T, 8> fp;
    impl::results_as_a(fc, fc, fp);
    impl::mma(fc, fp, fb);
#endif
    impl::store_c(lane, fc, d.data(), 8);
  }
};

template <class T>
void warp_product() {
  const Vec<T> a("a", 16 * 16), b("b", 8 * 16);
  const Vec<float> d("d", 16 * 8);
  Kokkos::parallel_for("ctxpar::gpu_check::warp_product",
                       Kokkos::TeamPolicy<exec>(1, 32).set_scratch_size(
                           0, Kokkos::PerTeam(WarpProduct<T>::scratch_bytes + 16)),
                       WarpProduct<T>{a, b, d});
}

// The TF32 product on fp32 data: rounded as cvt.rna.tf32.f32 rounds, multiplied by the m16n8k8
// instruction.
struct Tf32WarpProduct {
  Vec<float> a, b, d;
  KOKKOS_INLINE_FUNCTION void operator()(const Kokkos::TeamPolicy<exec>::member_type& team) const {
    using L = impl::MmaM16N8K8Tf32;
    const int lane = team.team_rank();
    impl::Fragment<float, 4> fa;
    impl::Fragment<float, 2> fb;
    float fc[4] = {0, 0, 0, 0};
    impl::load_a<L>(lane, a.data(), 8, fa);
    impl::load_b<L>(lane, b.data(), 8, fb);
    for (float& x : fa.value) x = impl::to_tf32(x);
    for (float& x : fb.value) x = impl::to_tf32(x);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    impl::mma(fc, fa, fb);
#endif
    impl::store_c(lane, fc, d.data(), 8);
  }
};

// The sliding-window attention forward and backward on tensor-core products
// (swa/impl/tensor_core_forward.hpp, tensor_core_backward.hpp) for each storage type they take;
// their dispatch instantiates the kernels for head dimensions up to 64, 128 and 256.
template <class Scalar>
void swa_forward() {
  using Tensor = Kokkos::View<Scalar***, Kokkos::LayoutRight, exec::memory_space>;
  ctxpar::swa::AttentionInputs<Scalar, exec::memory_space> in;
  in.q = Tensor("q", 64, 2, 64);
  in.k = Tensor("k", 64, 1, 64);
  in.v = Tensor("v", 64, 1, 64);
  in.q_pos = Kokkos::View<std::int64_t*, exec::memory_space>("q_pos", 64);
  in.k_pos = Kokkos::View<std::int64_t*, exec::memory_space>("k_pos", 64);
  const Tensor out("out", 64, 2, 64);
  const Kokkos::View<float**, Kokkos::LayoutRight, exec::memory_space> lse("lse", 64, 2);
  ctxpar::swa::AttentionWorkspace<exec::memory_space> workspace;
  ctxpar::swa::attention_forward(exec(), ctxpar::swa::document_mask(), in, out, lse, workspace,
                                 ctxpar::swa::KernelChoice::tensor_core);
  using Grad = Kokkos::View<float***, Kokkos::LayoutRight, exec::memory_space>;
  const Grad dq("dq", 64, 2, 64), dk("dk", 64, 1, 64), dv("dv", 64, 1, 64);
  using Const = Kokkos::View<const Scalar***, Kokkos::LayoutRight, exec::memory_space>;
  ctxpar::swa::attention_backward(
      exec(), ctxpar::swa::document_mask(), in, Const(out),
      Kokkos::View<const float**, Kokkos::LayoutRight, exec::memory_space>(lse), Const(out), dq, dk,
      dv, workspace, ctxpar::swa::KernelChoice::tensor_core);
}

// A per-chunk gated delta kernel (`IntraChunk`, `ChunkGradients`) on fp32 data, whose products
// choose at run time between the exact team product and the tensor-core one for TF32, bfloat16
// and float16 operands.
template <template <class, class, class> class Kernel, class... Extra>
void gated_delta_per_chunk(const char* label, const Extra&... extra) {
  using kernel = Kernel<float, exec, exec::memory_space>;
  impl::gated_delta::Problem<float> pb;
  pb.products = chunkwise::ChunkProducts::bfloat16;
  Kokkos::parallel_for(
      label,
      Kokkos::TeamPolicy<exec>(1, 128).set_scratch_size(
          1, Kokkos::PerTeam(kernel::scratch_bytes(64, 64, 64))),
      kernel{pb, impl::gated_delta::ChunkData<float, exec::memory_space>{}, extra...});
}

// A gated delta state pass (`ForwardPass`, `ReversePass`) on fp32 data, choosing its products at
// run time as the per-chunk kernels do, with the device's column block.
template <class Pass>
void gated_delta_pass(const char* label) {
  impl::gated_delta::Problem<float> pb;
  pb.products = chunkwise::ChunkProducts::bfloat16;
  const int block = impl::gated_delta::pass_block<exec>();
  Kokkos::parallel_for(label,
                       Kokkos::TeamPolicy<exec>(1, 128).set_scratch_size(
                           1, Kokkos::PerTeam(Pass::scratch_bytes(64, 128, block))),
                       Pass{pb, impl::gated_delta::ChunkData<float, exec::memory_space>{},
                            impl::gated_delta::PassTargets<float>{}, 1, block});
}

// A decay-family team kernel (chunk updates, outputs, gradient tiles) as the backends launch it,
// its products chosen at run time like the gated delta kernels'.
template <class Kernel>
void decay_team_kernel(const char* label) {
  Kernel kernel{};
  kernel.products = chunkwise::ChunkProducts::bfloat16;
  chunkwise::impl::launch_chunk_teams(exec(), label, 1, 64 * 1024, kernel, kernel.products);
}

template <bool Diagonal>
void decay_family() {
  using mem = exec::memory_space;
  decay_team_kernel<chunkwise::impl::ChunkUpdateTiles<float, exec, mem, Diagonal>>(
      "ctxpar::gpu_check::decay_chunk_update");
  decay_team_kernel<chunkwise::impl::OutputTiles<float, exec, mem, Diagonal>>(
      "ctxpar::gpu_check::decay_output");
  if constexpr (Diagonal)
    decay_team_kernel<chunkwise::impl::DiagonalGradientTiles<float, exec, mem>>(
        "ctxpar::gpu_check::decay_gradients");
  else
    decay_team_kernel<chunkwise::impl::ScalarGradientTiles<float, exec, mem>>(
        "ctxpar::gpu_check::decay_gradients");
}

void instantiate() {
  decay_family<false>();
  decay_family<true>();
  gated_delta_pass<impl::gated_delta::ForwardPass<float, exec, exec::memory_space>>(
      "ctxpar::gpu_check::forward_pass");
  gated_delta_pass<impl::gated_delta::ReversePass<float, exec, exec::memory_space>>(
      "ctxpar::gpu_check::reverse_pass");
  gated_delta_per_chunk<impl::gated_delta::IntraChunk>("ctxpar::gpu_check::intra_chunk");
  gated_delta_per_chunk<impl::gated_delta::ChunkGradients>("ctxpar::gpu_check::chunk_gradients",
                                                           impl::gated_delta::GradTargets<float>{});
  warp_product<bfloat16>();
  warp_product<float16>();
  swa_forward<bfloat16>();
  swa_forward<float16>();
  swa_forward<float>();
  const Vec<float> a("a", 16 * 8), b("b", 8 * 8), d("d", 16 * 8);
  Kokkos::parallel_for("ctxpar::gpu_check::tf32_warp_product", Kokkos::TeamPolicy<exec>(1, 32),
                       Tf32WarpProduct{a, b, d});
}

}  // namespace ctxpar::gpu_check
