/// \file
/// Head and key-group partitions for head-parallel context parallelism (docs/partition.md §4):
/// which contiguous block of heads each rank owns after the sequence → head all-to-all, and which
/// key groups (shared by several heads) each rank needs, including the group repeat when there are
/// fewer groups than ranks.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/impl/mpi_count.hpp"
#include "ctxpar/comm/impl/violation.hpp"
#include "ctxpar/core/error.hpp"

namespace ctxpar {

/// Head policy tag: every rank gets `nheads / P` heads; `nheads % P == 0` is required (one
/// `MPI_Alltoall` with equal blocks), and for key groups `ngroups % P == 0`, or `P % ngroups == 0`
/// when `ngroups < P` (each group repeated `P / ngroups` times).
struct EvenHeads {};
/// Head policy tag: as even as possible — the first `nheads % P` ranks get `ceil(nheads / P)`
/// heads, the others `floor(nheads / P)` (so no rank is idle while another holds two more heads;
/// ranks get no head only when `nheads < P`). Needs `MPI_Alltoallv`. Each rank's key groups are the
/// range its heads use; a group is sent to every rank that uses it.
struct UnevenHeads {};

namespace impl {
/// The first violated precondition of a head (and key-group) partition, if any; `even` adds the
/// `EvenHeads` divisibility rules.
inline std::optional<Violation> check_heads(int nheads, int ngroups, int parts, bool even) {
  if (parts < 1) return Violation{"the number of ranks must be positive", ">= 1", to_text(parts)};
  if (nheads < 1) return Violation{"the number of heads must be positive", ">= 1", to_text(nheads)};
  if (ngroups < 1)
    return Violation{"the number of key groups must be positive", ">= 1", to_text(ngroups)};
  if (nheads % ngroups != 0) {
    return Violation{"the number of heads must be divisible by the number of key groups",
                     "a multiple of ngroups = " + to_text(ngroups), "nheads = " + to_text(nheads)};
  }
  if (!even) return std::nullopt;
  if (nheads % parts != 0) {
    return Violation{
        "the number of heads must be divisible by the number of ranks P (or choose "
        "ctxpar::UnevenHeads)",
        "a multiple of P = " + to_text(parts), "nheads = " + to_text(nheads)};
  }
  if (ngroups < parts && parts % ngroups != 0) {
    return Violation{
        "with fewer key groups than ranks, P must be divisible by the number of key groups "
        "(each group is repeated P / ngroups times)",
        "a divisor of P = " + to_text(parts), "ngroups = " + to_text(ngroups)};
  }
  if (ngroups >= parts && ngroups % parts != 0) {
    return Violation{
        "with at least as many key groups as ranks, the number of key groups must be "
        "divisible by P",
        "a multiple of P = " + to_text(parts), "ngroups = " + to_text(ngroups)};
  }
  return std::nullopt;
}
}  // namespace impl

/// Contiguous blocks of heads over `P` ranks, as even as possible (`EvenHeads` additionally
/// requires `nheads % P == 0`, validated at creation). Usable inside kernels.
struct HeadPartition {
  int nheads = 1;  ///< total heads
  int nparts = 1;  ///< ranks `P`

  /// Local build; throws a local `Error` on a bad count.
  template <class Policy = EvenHeads>
  static HeadPartition create(int nheads, int parts, Policy = {},
                              const std::string& op = "ctxpar::HeadPartition") {
    impl::throw_if_bad(impl::check_heads(nheads, 1, parts, std::is_same_v<Policy, EvenHeads>), op);
    return HeadPartition{nheads, parts};
  }
  /// Collective build over `group`: every rank throws the same `Error` on a bad or disagreeing
  /// count.
  template <class Policy = EvenHeads>
  static HeadPartition create(const Group& group, int nheads, Policy = {},
                              const std::string& op = "ctxpar::HeadPartition") {
    impl::agree_on(group,
                   impl::check_heads(nheads, 1, group.size(), std::is_same_v<Policy, EvenHeads>),
                   op, {{"the number of heads", nheads}, {"the number of key groups", 1}});
    return HeadPartition{nheads, group.size()};
  }

  /// Number of ranks.
  KOKKOS_INLINE_FUNCTION int parts() const { return nparts; }
  /// First head of rank `r`.
  KOKKOS_INLINE_FUNCTION int begin(int r) const {
    const int q = nheads / nparts, rem = nheads % nparts;
    return r * q + (r < rem ? r : rem);
  }
  /// One past the last head of rank `r`.
  KOKKOS_INLINE_FUNCTION int end(int r) const { return begin(r + 1); }
  /// Heads of rank `r` (possibly zero with `UnevenHeads` when `nheads < P`).
  KOKKOS_INLINE_FUNCTION int size(int r) const { return end(r) - begin(r); }
  /// Rank owning head `h`.
  KOKKOS_INLINE_FUNCTION int owner(int h) const {
    const int q = nheads / nparts, rem = nheads % nparts;
    const int big = rem * (q + 1);  // heads held by the ranks with one extra head
    return h < big ? h / (q + 1) : rem + (h - big) / q;
  }
  /// Whether every rank holds the same number of heads.
  KOKKOS_INLINE_FUNCTION bool even() const { return nheads % nparts == 0; }
  /// Per-rank head counts times `per_head` (e.g. `headdim`), as counts for the v-collectives.
  std::vector<int> counts(std::int64_t per_head = 1) const {
    std::vector<int> c(static_cast<std::size_t>(nparts));
    for (int r = 0; r < nparts; ++r)
      c[static_cast<std::size_t>(r)] = impl::mpi_count(
          size(r) * per_head, "ctxpar::HeadPartition::counts", "a collective count");
    return c;
  }
};

/// Which key groups each rank needs when head `h` uses group `h / (nheads / ngroups)` and heads are
/// partitioned by a `HeadPartition`. Rank `r` needs the contiguous group range its heads use; with
/// `EvenHeads` this is `ngroups / P` groups when `ngroups >= P`, and exactly one group, repeated
/// on `P / ngroups` consecutive ranks, when `ngroups < P`. Local group `g` of rank `r` is a copy of
/// source group `begin(r) + g`. Usable inside kernels.
struct KeyGroupPartition {
  HeadPartition heads;  ///< the head partition the groups follow
  int ngroups = 1;      ///< total key groups

  /// Local build; throws a local `Error` on bad counts (see `EvenHeads` / `UnevenHeads`).
  template <class Policy = EvenHeads>
  static KeyGroupPartition create(int nheads, int ngroups, int parts, Policy = {},
                                  const std::string& op = "ctxpar::KeyGroupPartition") {
    impl::throw_if_bad(impl::check_heads(nheads, ngroups, parts, std::is_same_v<Policy, EvenHeads>),
                       op);
    return KeyGroupPartition{HeadPartition{nheads, parts}, ngroups};
  }
  /// Collective build over `group`: every rank throws the same `Error` on bad or disagreeing
  /// counts.
  template <class Policy = EvenHeads>
  static KeyGroupPartition create(const Group& group, int nheads, int ngroups, Policy = {},
                                  const std::string& op = "ctxpar::KeyGroupPartition") {
    impl::agree_on(
        group, impl::check_heads(nheads, ngroups, group.size(), std::is_same_v<Policy, EvenHeads>),
        op, {{"the number of heads", nheads}, {"the number of key groups", ngroups}});
    return KeyGroupPartition{HeadPartition{nheads, group.size()}, ngroups};
  }

  /// Heads sharing one key group.
  KOKKOS_INLINE_FUNCTION int heads_per_group() const { return heads.nheads / ngroups; }
  /// Key group used by head `h`.
  KOKKOS_INLINE_FUNCTION int group_of(int h) const { return h / heads_per_group(); }
  /// First (source) group rank `r` needs; `0` for a rank without heads.
  KOKKOS_INLINE_FUNCTION int begin(int r) const {
    return heads.size(r) == 0 ? 0 : group_of(heads.begin(r));
  }
  /// One past the last group rank `r` needs (`begin(r)` for a rank without heads).
  KOKKOS_INLINE_FUNCTION int end(int r) const {
    return heads.size(r) == 0 ? 0 : group_of(heads.end(r) - 1) + 1;
  }
  /// Number of local groups on rank `r` (`ngroups_local`).
  KOKKOS_INLINE_FUNCTION int size(int r) const { return end(r) - begin(r); }
  /// Source group of local group copy `g` on rank `r`.
  KOKKOS_INLINE_FUNCTION int source_group(int r, int g) const { return begin(r) + g; }
  /// Local group (on rank `r`) used by local head `local_head` of rank `r`.
  KOKKOS_INLINE_FUNCTION int local_group_of_head(int r, int local_head) const {
    return group_of(heads.begin(r) + local_head) - begin(r);
  }
  /// How many ranks hold a copy of each group under `EvenHeads`: `P / ngroups` when `ngroups < P`,
  /// else 1.
  KOKKOS_INLINE_FUNCTION int repeat() const {
    return ngroups < heads.nparts ? heads.nparts / ngroups : 1;
  }
  /// Per-rank local group counts times `per_group` (e.g. `d_state`), as counts for the
  /// v-collectives.
  std::vector<int> counts(std::int64_t per_group = 1) const {
    std::vector<int> c(static_cast<std::size_t>(heads.nparts));
    for (int r = 0; r < heads.nparts; ++r) {
      c[static_cast<std::size_t>(r)] = impl::mpi_count(
          size(r) * per_group, "ctxpar::KeyGroupPartition::counts", "a collective count");
    }
    return c;
  }
};

}  // namespace ctxpar
