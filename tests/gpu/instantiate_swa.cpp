// GPU compile check of sliding-window attention (mechanism A): instantiates RoPE, the attention
// kernels, the single-rank step and the distributed step with each policy under both key/value
// layouts, for float and double, on Kokkos::DefaultExecutionSpace (CUDA or HIP in the
// compile-check presets). Nothing here runs.
#include <Kokkos_Core.hpp>

#include "ctxpar/swa/impl/reference_step.hpp"
#include "ctxpar/swa/swa.hpp"

namespace ctxpar::gpu_check::swa {

using exec = Kokkos::DefaultExecutionSpace;
using memory = exec::memory_space;

template <class Scalar, class Policy, class Layout>
void distributed(const Group& group, const ctxpar::swa::Chunk<Scalar, memory>& chunk,
                 const ctxpar::swa::Cache<Scalar, memory>& cache,
                 const ctxpar::swa::Options& options) {
  ctxpar::swa::StepPlan<Policy, Layout, exec, Scalar> plan(exec(), group, {2, 1, 8}, options);
  const auto out = ctxpar::swa::allocate_output<Scalar, memory>(plan.shape(), chunk.length());
  ctxpar::swa::Cache<Scalar, memory> next_cache;
  ctxpar::swa::DistributedState<Scalar, memory> state;
  plan.forward(chunk, cache, out, next_cache, state);
  ctxpar::swa::CacheGradient<Scalar, memory> d_next{next_cache.k, next_cache.v};
  plan.backward(state, out, d_next, ctxpar::swa::allocate_gradients(plan.shape(), state));
}

template <class Scalar>
void all(const Group& group) {
  ctxpar::swa::Chunk<Scalar, memory> chunk;
  chunk.q = ctxpar::swa::Tensor<Scalar, memory>("q", 4, 2, 8);
  chunk.k = ctxpar::swa::Tensor<Scalar, memory>("k", 4, 1, 8);
  chunk.v = ctxpar::swa::Tensor<Scalar, memory>("v", 4, 1, 8);
  chunk.pos = ctxpar::swa::Positions<memory>("pos", 4);
  chunk.ids = ctxpar::swa::Ids<memory>("ids", 4);
  auto cache = ctxpar::swa::empty_cache<Scalar, memory>(1, 8);
  ctxpar::swa::Options options;
  options.window = 3;
  ctxpar::swa::rope_forward(exec(), chunk.q, chunk.pos, options.rope_base, chunk.q);
  ctxpar::swa::rope_backward(exec(), chunk.q, chunk.pos, options.rope_base, chunk.q);
  auto r = ctxpar::swa::impl::reference_step_forward(exec(), chunk, cache, options);
  ctxpar::swa::impl::reference_step_backward(
      exec(), r.state, r.out,
      ctxpar::swa::CacheGradient<Scalar, memory>{r.next_cache.k, r.next_cache.v});
  using ctxpar::swa::SegmentChunks;
  using ctxpar::swa::WholeAxisChunks;
  distributed<Scalar, ctxpar::swa::RopeBeforeGather, SegmentChunks>(group, chunk, cache, options);
  distributed<Scalar, ctxpar::swa::RopeAfterGather, SegmentChunks>(group, chunk, cache, options);
  distributed<Scalar, ctxpar::swa::HaloKV, SegmentChunks>(group, chunk, cache, options);
  // The whole-axis layout adds the owner re-shard all-to-all on both passes.
  distributed<Scalar, ctxpar::swa::RopeBeforeGather, WholeAxisChunks>(group, chunk, cache, options);
  distributed<Scalar, ctxpar::swa::RopeAfterGather, WholeAxisChunks>(group, chunk, cache, options);
  distributed<Scalar, ctxpar::swa::HaloKV, WholeAxisChunks>(group, chunk, cache, options);
}

void instantiate(const Group& group) {
  all<float>(group);
  all<double>(group);
}

}  // namespace ctxpar::gpu_check::swa
