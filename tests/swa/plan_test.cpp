// The step plan's memory: after one warm-up pass of a stream (forward through every step, then the
// chained backward), repeating it allocates nothing — no Kokkos allocation on any rank, for every
// policy and layout — and leaves the results bitwise unchanged, even when a stream with other
// values runs on the same plan in between. The workspace only grows.
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "ctxpar/core/allocation_counter.hpp"
#include "ctxpar/core/plan.hpp"
#include "ctxpar/swa/distributed_step.hpp"
#include "ctxpar_test/harness.hpp"
#include "fixtures.hpp"

namespace ts = ctxpar::test::swa;
using ctxpar::BalancedChunks;
using ctxpar::test::world;

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Scalar = double;

// Every policy and layout has the contract's surface (core/plan.hpp).
template <class Layout>
constexpr bool every_policy_follows_the_contract = ctxpar::follows_plan_contract<
    ctxpar::swa::StepPlan<ctxpar::swa::RopeBeforeGather, Layout, Exec, Scalar>>&&
    ctxpar::follows_plan_contract<
        ctxpar::swa::StepPlan<ctxpar::swa::RopeAfterGather, Layout, Exec, Scalar>>&& ctxpar::
        follows_plan_contract<ctxpar::swa::StepPlan<ctxpar::swa::HaloKV, Layout, Exec, Scalar>>;
static_assert(every_policy_follows_the_contract<ctxpar::swa::SegmentChunks> &&
                  every_policy_follows_the_contract<ctxpar::swa::WholeAxisChunks>,
              "ctxpar::swa::StepPlan must follow the plan contract");

/// Every step's inputs on this rank (its shards), cut once from a stream.
template <class T>
struct StreamInputs {
  std::vector<ctxpar::swa::Chunk<T, Mem>> chunks;
  std::vector<ctxpar::swa::Tensor<T, Mem>> douts;
};

template <class T>
StreamInputs<T> inputs_of(const ts::Stream& s, std::int64_t tokens, std::int64_t step) {
  const auto& g = world();
  StreamInputs<T> in;
  for (std::int64_t from = 0; from < tokens; from += step) {
    const BalancedChunks split{std::min(step, tokens - from), g.size()};
    const std::int64_t first = from + split.begin(g.rank()), n = split.size(g.rank());
    in.chunks.push_back(ts::chunk_of<T, Mem>(s.problem, first, n));
    in.douts.push_back(ts::to_view<T, Mem>(s.dout, first, n));
  }
  return in;
}

/// A stream on one plan: the caller-owned caches, states, outputs and gradients of every step.
template <class Policy, class Layout, class T>
struct StreamOnPlan {
  ctxpar::swa::StepPlan<Policy, Layout, Exec, T> plan;
  std::vector<ctxpar::swa::Cache<T, Mem>> caches;
  std::vector<ctxpar::swa::DistributedState<T, Mem>> states;
  std::vector<ctxpar::swa::Tensor<T, Mem>> outs;
  std::vector<ctxpar::swa::StepGradients<T, Mem>> grads;

  StreamOnPlan(const ctxpar::swa::StepShape& shape, const ctxpar::swa::Options& o,
               std::size_t steps)
      : plan(Exec(), world(), shape, o) {
    // Sized here rather than in the initialiser list: GCC 12 cannot bound `steps` through the
    // inlined vector constructors there and warns (-Walloc-size-larger-than) on a path that
    // cannot happen.
    caches.resize(steps + 1);
    states.resize(steps);
    outs.resize(steps);
    grads.resize(steps);
    caches[0] = ctxpar::swa::empty_cache<T, Mem>(shape.kv_heads, shape.head_dim);
  }

  // The caller's outputs and gradients are allocated on the first run (an unallocated view has
  // no heads) and reused by every later one.
  void run(const StreamInputs<T>& in) {
    for (std::size_t k = 0; k < states.size(); ++k) {
      if (outs[k].extent(1) == 0)
        outs[k] = ctxpar::swa::allocate_output<T, Mem>(plan.shape(), in.chunks[k].length());
      plan.forward(in.chunks[k], caches[k], outs[k], caches[k + 1], states[k]);
    }
    ctxpar::swa::CacheGradient<T, Mem> carried;
    for (std::size_t k = states.size(); k-- > 0;) {
      if (grads[k].dq.extent(1) == 0)
        grads[k] = ctxpar::swa::allocate_gradients(plan.shape(), states[k]);
      plan.backward(states[k], in.douts[k], carried, grads[k]);
      carried = {grads[k].dk_cache, grads[k].dv_cache};
    }
    Exec().fence();
  }

  // Every result's bytes (the 16-bit types have no ==).
  std::vector<char> results() const {
    std::vector<char> all;
    auto append = [&](const ctxpar::swa::Tensor<T, Mem>& v) {
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
      const char* bytes = reinterpret_cast<const char*>(h.data());
      all.insert(all.end(), bytes, bytes + h.span() * sizeof(T));
    };
    for (std::size_t k = 0; k < states.size(); ++k) {
      append(outs[k]);
      append(grads[k].dq);
      append(grads[k].dk);
      append(grads[k].dv);
      append(grads[k].dk_cache);
      append(grads[k].dv_cache);
    }
    return all;
  }
};

template <class Policy, class Layout, class T>
bool steady_state_case(const char* name,
                       ctxpar::swa::KernelChoice kernels = ctxpar::swa::default_kernel_choice) {
  const auto& g = world();
  ts::StreamSpec spec;
  spec.tokens = 61;  // steps of 13: the cache grows over the first steps, the last chunk is short
  spec.window = 17;
  spec.hq = 4;
  spec.hkv = 2;
  spec.dim = 8;
  spec.document_starts = {20, 44};
  spec.seed = 11;
  const std::int64_t step = 13;
  const auto s = ts::make_stream<T>(spec);
  spec.seed = 12;
  const auto other = ts::make_stream<T>(spec);
  const StreamInputs<T> in = inputs_of<T>(s, spec.tokens, step),
                        in_other = inputs_of<T>(other, spec.tokens, step);
  ctxpar::swa::Options o;
  o.window = spec.window;
  o.kernels = kernels;
  StreamOnPlan<Policy, Layout, T> stream({spec.hq, spec.hkv, spec.dim}, o, in.chunks.size());
  stream.run(in);  // warm-up: outputs, states, tables and workspaces are allocated here
  const auto first = stream.results();
  const std::size_t workspace = stream.plan.workspace_bytes();
  std::int64_t allocations = 0;
  {
    ctxpar::AllocationCounter counter;
    for (int repeat = 0; repeat < 2; ++repeat) {
      stream.run(in_other);
      stream.run(in);
    }
    allocations = counter.allocations();
    if (allocations != 0) {
      std::cerr << "[rank " << g.rank() << "] " << name << ": " << allocations
                << " allocations in steady state:";
      for (const auto& [label, n] : counter.labels()) std::cerr << " " << label << " x" << n;
      std::cerr << "\n";
    }
  }
  const bool same = stream.results() == first;
  if (!same)
    std::cerr << "[rank " << g.rank() << "] " << name << ": a repeat changed the results\n";
  const bool kept = workspace > 0 && stream.plan.workspace_bytes() == workspace;
  if (!kept)
    std::cerr << "[rank " << g.rank() << "] " << name << ": workspace " << workspace << " -> "
              << stream.plan.workspace_bytes() << " bytes\n";
  return allocations == 0 && same && kept;
}

}  // namespace

template <class T>
bool every_policy_steady(const std::string& type) {
  using namespace ctxpar::swa;
  bool ok = steady_state_case<RopeBeforeGather, SegmentChunks, T>(
      (type + " RopeBeforeGather/SegmentChunks").c_str());
  ok = steady_state_case<RopeAfterGather, SegmentChunks, T>(
           (type + " RopeAfterGather/SegmentChunks").c_str()) &&
       ok;
  ok = steady_state_case<HaloKV, SegmentChunks, T>((type + " HaloKV/SegmentChunks").c_str()) && ok;
  ok = steady_state_case<RopeBeforeGather, WholeAxisChunks, T>(
           (type + " RopeBeforeGather/WholeAxisChunks").c_str()) &&
       ok;
  ok = steady_state_case<RopeAfterGather, WholeAxisChunks, T>(
           (type + " RopeAfterGather/WholeAxisChunks").c_str()) &&
       ok;
  ok = steady_state_case<HaloKV, WholeAxisChunks, T>((type + " HaloKV/WholeAxisChunks").c_str()) &&
       ok;
  return ok;
}

BOOST_AUTO_TEST_CASE(steady_state_allocates_nothing) {
  CTXPAR_TEST_ALL(world(), every_policy_steady<Scalar>("double"));
}

// 16-bit tensors take the same memory path (16-bit records, fp32 gradients): also allocation-free.
BOOST_AUTO_TEST_CASE(sixteen_bit_steady_state_allocates_nothing) {
  CTXPAR_TEST_ALL(world(), every_policy_steady<ctxpar::bfloat16>("bfloat16"));
}

// The tensor-core kernels (emulated on the host) keep everything in team scratch and registers.
BOOST_AUTO_TEST_CASE(tensor_core_steady_state_allocates_nothing) {
  using namespace ctxpar::swa;
  const auto tc = KernelChoice::tensor_core;
  bool ok = steady_state_case<RopeBeforeGather, SegmentChunks, ctxpar::bfloat16>(
      "bfloat16 tensor_core RopeBeforeGather/SegmentChunks", tc);
  ok = steady_state_case<HaloKV, SegmentChunks, float>("float tensor_core HaloKV/SegmentChunks",
                                                       tc) &&
       ok;
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE(workspace_grows_to_the_largest_step_and_never_shrinks) {
  const auto& g = world();
  ts::StreamSpec spec;
  spec.tokens = 40;
  spec.window = 0;
  spec.seed = 3;
  const auto s = ts::make_stream<Scalar>(spec);
  ctxpar::swa::Options o;
  ctxpar::swa::StepPlan<ctxpar::swa::RopeBeforeGather, ctxpar::swa::SegmentChunks, Exec, Scalar>
      plan(Exec(), g, {spec.hq, spec.hkv, spec.dim}, o);
  auto step_of = [&](std::int64_t t) {
    const BalancedChunks split{t, g.size()};
    const auto out = ctxpar::swa::allocate_output<Scalar, Mem>(plan.shape(), split.size(g.rank()));
    ctxpar::swa::Cache<Scalar, Mem> next;
    ctxpar::swa::DistributedState<Scalar, Mem> state;
    plan.forward(ts::chunk_of<Scalar, Mem>(s.problem, split.begin(g.rank()), split.size(g.rank())),
                 ctxpar::swa::empty_cache<Scalar, Mem>(spec.hkv, spec.dim), out, next, state);
    const auto grads = ctxpar::swa::allocate_gradients(plan.shape(), state);
    // With the backward: a rank alone gathers nothing, so its forward alone may need no
    // workspace (the portable attention kernel has none); its backward always does.
    plan.backward(state,
                  ts::to_view<Scalar, Mem>(s.dout, split.begin(g.rank()), split.size(g.rank())), {},
                  grads);
    return plan.workspace_bytes();
  };
  const std::size_t small = step_of(8), large = step_of(40), again = step_of(8);
  const bool ok = small > 0 && large > small && again == large;
  if (!ok)
    std::cerr << "[rank " << g.rank() << "] workspace " << small << ", " << large << ", " << again
              << " bytes\n";
  CTXPAR_TEST_ALL(g, ok);
}

BOOST_AUTO_TEST_CASE(a_state_moves_between_plans) {
  // A state last filled by another plan (another policy, same lengths) must not lend that plan's
  // exchange tables to this one: the results equal those on a fresh state.
  const auto& g = world();
  ts::StreamSpec spec;
  spec.tokens = 30;
  spec.window = 7;
  spec.seed = 21;
  const auto s = ts::make_stream<Scalar>(spec);
  ctxpar::swa::Options o;
  o.window = spec.window;
  const ctxpar::swa::StepShape shape{spec.hq, spec.hkv, spec.dim};
  using namespace ctxpar::swa;
  StepPlan<RopeBeforeGather, SegmentChunks, Exec, Scalar> gather(Exec(), g, shape, o);
  StepPlan<HaloKV, SegmentChunks, Exec, Scalar> halo(Exec(), g, shape, o);
  const BalancedChunks split{spec.tokens, g.size()};
  const auto chunk =
      ts::chunk_of<Scalar, Mem>(s.problem, split.begin(g.rank()), split.size(g.rank()));
  const auto dout = ts::to_view<Scalar, Mem>(s.dout, split.begin(g.rank()), split.size(g.rank()));
  const auto empty = empty_cache<Scalar, Mem>(spec.hkv, spec.dim);
  auto run = [&](DistributedState<Scalar, Mem>& state) {
    const auto out = allocate_output<Scalar, Mem>(shape, chunk.length());
    Cache<Scalar, Mem> next;
    halo.forward(chunk, empty, out, next, state);
    const auto grads = allocate_gradients(shape, state);
    halo.backward(state, dout, {}, grads);
    std::vector<Scalar> all;
    for (const auto& v : {out, grads.dq, grads.dk, grads.dv}) {
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
      all.insert(all.end(), h.data(), h.data() + h.span());
    }
    return all;
  };
  DistributedState<Scalar, Mem> fresh, moved;
  {
    const auto out = allocate_output<Scalar, Mem>(shape, chunk.length());
    Cache<Scalar, Mem> next;
    gather.forward(chunk, empty, out, next, moved);
  }
  const bool same = run(moved) == run(fresh);
  if (!same) std::cerr << "[rank " << g.rank() << "] a state moved between plans changed results\n";
  CTXPAR_TEST_ALL(g, same);
}
