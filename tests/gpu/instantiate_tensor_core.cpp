// GPU compile check of the tensor-core tile product (core/impl/mma_fragment.hpp): one warp's
// m16n8k16 product, bfloat16 and IEEE half (and the m16n8k8 TF32 product on fp32), through the
// fragment loads (from global memory, and from team scratch by ldmatrix), the instruction (sm_80
// and later) and the fragment store, with the 32 lanes as the threads of one team.
// scripts/gpu-compile-check cuda compiles this file once more keeping its PTX and ptxas report, and
// requires the three `mma.sync` instructions and the `ldmatrix` in the PTX (HMMA in the SASS where
// the toolkit has cuobjdump) and no register spills. Nothing here runs.
#include <Kokkos_Core.hpp>

#include "ctxpar/core/bfloat16.hpp"
#include "ctxpar/core/float16.hpp"
#include "ctxpar/core/impl/mma_fragment.hpp"

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
    T fa[8], fb[4];
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
    T fp[8];
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
    float fa[4], fb[2], fc[4] = {0, 0, 0, 0};
    impl::load_a<L>(lane, a.data(), 8, fa);
    impl::load_b<L>(lane, b.data(), 8, fb);
    for (float& x : fa) x = impl::to_tf32(x);
    for (float& x : fb) x = impl::to_tf32(x);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    impl::mma(fc, fa, fb);
#endif
    impl::store_c(lane, fc, d.data(), 8);
  }
};

void instantiate() {
  warp_product<bfloat16>();
  warp_product<float16>();
  const Vec<float> a("a", 16 * 8), b("b", 8 * 8), d("d", 16 * 8);
  Kokkos::parallel_for("ctxpar::gpu_check::tf32_warp_product", Kokkos::TeamPolicy<exec>(1, 32),
                       Tf32WarpProduct{a, b, d});
}

}  // namespace ctxpar::gpu_check
