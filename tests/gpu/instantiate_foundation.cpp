// GPU compile check of the foundation: instantiates the communication layer, the partition plans
// and the mask expressions for Kokkos::DefaultExecutionSpace (CUDA or HIP in the compile-check
// presets), so device-code mistakes (host-only calls in kernels, captured `this`, non-trivially
// copyable functors) fail the build instead of a user's. Nothing here runs.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

#include "ctxpar/ctxpar.hpp"
#include "ctxpar/expr/mask.hpp"
#include "ctxpar/partition/head_partition.hpp"
#include "ctxpar/partition/packed_metadata.hpp"
#include "ctxpar/partition/zigzag.hpp"

namespace ctxpar::gpu_check {

using exec = Kokkos::DefaultExecutionSpace;
using memory = exec::memory_space;
template <class T>
using Vec = Kokkos::View<T*, memory>;
template <class T>
using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, memory>;

// Scan composition as device code: inout := earlier + inout on every element of the record.
template <class T>
struct AddRecords {
  Vec<T> earlier, inout;
  KOKKOS_INLINE_FUNCTION void operator()(int i) const { inout(i) += earlier(i); }
};

template <class T>
struct Compose {
  void operator()(const Vec<T>& earlier, const Vec<T>& inout) const {
    Kokkos::parallel_for("ctxpar::gpu_check::compose",
                         Kokkos::RangePolicy<exec>(0, static_cast<int>(inout.extent(0))),
                         AddRecords<T>{earlier, inout});
  }
};

// Every collective for one scalar type, on device views of rank 1 and 3.
template <class T>
void collectives(const Group& group) {
  const exec space;
  const BalancedChunks plan{10, group.size()};
  Vec<T> a("a", 8), b("b", 8 * group.size()), c("c", 8 * group.size());
  Tensor3<T> t("t", 2, 3, 4), u("u", 2 * group.size(), 3, 4);
  allgather(space, group, a, b);
  allgather(space, group, t, u);
  allgatherv(space, group, a, b, plan.counts());
  alltoall(space, group, b, c);
  alltoallv(space, group, a, plan.counts(), b, plan.counts());
  reduce_scatter(space, group, b, a, plan.counts());
  allreduce_sum(space, group, t);
  sendrecv(space, group, a, no_rank, b, no_rank, 3);
  exclusive_scan(space, group, a, Compose<T>{}, ScanDirection::reverse);
  inclusive_scan(space, group, a, Compose<T>{});
}

// Partition plans and composed masks evaluated inside a device kernel.
struct MaskedCount {
  BalancedChunks plan;
  decltype(mask::causal() && (mask::sliding_window(4) || mask::all()) &&
           mask::same_sequence()) predicate;
  Vec<std::int32_t> seq;
  KOKKOS_INLINE_FUNCTION void operator()(int i, std::int64_t& count) const {
    const mask::Token q{plan.begin(plan.owner(i)) + i % 3, seq(i)};
    for (int j = 0; j <= i; ++j) count += predicate(q, mask::Token{j, seq(j)}) ? 1 : 0;
  }
};

std::int64_t masks_and_plans() {
  Vec<std::int32_t> seq("seq", 16);
  std::int64_t count = 0;
  const BalancedChunks plan{16, 3};
  const auto predicate =
      mask::causal() && (mask::sliding_window(4) || mask::all()) && mask::same_sequence();
  Kokkos::parallel_reduce("ctxpar::gpu_check::masks", Kokkos::RangePolicy<exec>(0, 16),
                          MaskedCount{plan, predicate, seq}, count);
  const auto meta = PackedMetadata::from_seq_idx(std::vector<std::int32_t>{0, 0, 1, 1}, 2);
  return count + meta.local_length();
}

// Every token layout and the head/key-group plans evaluated inside a device kernel: each index map
// must be device code, and the packed layout's cu_seqlens must live in device memory.
template <class Layout>
struct LayoutRoundTrip {
  Layout layout;
  HeadPartition heads;
  KeyGroupPartition groups;
  KOKKOS_INLINE_FUNCTION void operator()(int i, std::int64_t& wrong) const {
    const int r = layout.owner(i);
    const std::int64_t back = layout.global_index(r, layout.local_index(i));
    wrong += (back != i || layout.to_natural(layout.to_layout(i)) != i) ? 1 : 0;
    const int h = i % heads.nheads;
    wrong += heads.owner(h) < heads.parts() ? 0 : 1;
    wrong += groups.group_of(h) < groups.ngroups ? 0 : groups.repeat();
  }
};

template <class Layout>
std::int64_t round_trip(const Layout& layout) {
  std::int64_t wrong = 0;
  const auto heads = HeadPartition::create(8, 4);
  const auto groups = KeyGroupPartition::create(8, 2, 4);
  Kokkos::parallel_reduce("ctxpar::gpu_check::layouts",
                          Kokkos::RangePolicy<exec>(0, static_cast<int>(layout.length())),
                          LayoutRoundTrip<Layout>{layout, heads, groups}, wrong);
  return wrong;
}

std::int64_t layouts(const Group& group) {
  return round_trip(ContiguousLayout::create(13, 4)) + round_trip(ZigzagLayout::create(16, 4)) +
         round_trip(ZigzagLayout::create(group, 16)) +
         round_trip(
             ZigzagPerSequenceLayout<memory>::create(std::vector<std::int32_t>{0, 8, 24}, 4));
}

void instantiate(const Group& group) {
  layouts(group);
  collectives<float>(group);
  collectives<double>(group);
  collectives<std::int32_t>(group);
  masks_and_plans();
}

}  // namespace ctxpar::gpu_check
