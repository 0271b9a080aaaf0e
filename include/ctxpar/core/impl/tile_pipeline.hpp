/// \file
/// Staging tiles into team scratch ahead of their use: 16-byte copies from global memory that
/// complete asynchronously, in groups (`AsyncCopies`), and the loop that stages tile `t + 1` into
/// one buffer while the team computes on tile `t` in the other (`pipelined_tiles`).
///
/// On a CUDA device of compute capability 8.0 or more a copy is `cp.async.cg` (global to shared
/// memory without passing through registers or L1), a group is `cp.async.commit_group`, and a
/// wait is `cp.async.wait_group`. Other devices copy at once. On the host spaces a copy is
/// deferred until the wait that retires its group: the latest moment the hardware may complete
/// it, so a kernel that reads a staged tile before waiting for it reads stale data in CPU CI
/// too, not only on a GPU.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>

namespace ctxpar::impl {

/// Bytes of one asynchronous copy: 16, the width `cp.async.cg` takes and `ldmatrix` reads by.
inline constexpr int async_copy_bytes = 16;

/// True when `p` may be the source or destination of an asynchronous copy (16-byte aligned).
KOKKOS_INLINE_FUNCTION bool async_copy_aligned(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % async_copy_bytes == 0;
}

/// Stores 16 zero bytes at `dst` (16-byte aligned) at once: the part of a staged tile no copy
/// fills.
KOKKOS_FORCEINLINE_FUNCTION void store_zero_piece(void* dst) {
  struct alignas(16) Piece {
    std::uint32_t word[4];
  };
  *static_cast<Piece*>(dst) = Piece{{0, 0, 0, 0}};
}

/// 1 in device code whose copies are `cp.async` (CUDA sm_80 and later), 0 elsewhere.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define CTXPAR_ASYNC_COPY_INSTRUCTIONS 1
#else
#define CTXPAR_ASYNC_COPY_INSTRUCTIONS 0
#endif

/// 1 in host code, where copies are deferred to their wait; 0 in any device code.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__SYCL_DEVICE_ONLY__)
#define CTXPAR_ASYNC_COPY_DEFERRED 0
#else
#define CTXPAR_ASYNC_COPY_DEFERRED 1
#endif

/// One thread's asynchronous copies of 16 bytes from global memory into level-0 team scratch
/// (both addresses 16-byte aligned), in groups: `copy` issues one, `commit` closes the group of
/// those issued since the last, `wait<Pending>()` returns when at most `Pending` of the thread's
/// groups are incomplete. A copy's bytes are visible to other threads of the team after the
/// wait that retires it and a team barrier. `Capacity`: the most copies the thread has issued and
/// not yet retired, which the host's deferred copies hold.
template <int Capacity>
class AsyncCopies {
 public:
  static_assert(Capacity > 0, "AsyncCopies: a capacity of at least one copy");

  /// Issues the copy of the 16 bytes at `src` (global memory) to `dst` (level-0 team scratch).
  KOKKOS_FORCEINLINE_FUNCTION void copy(void* dst, const void* src) {
#if CTXPAR_ASYNC_COPY_INSTRUCTIONS
    const auto shared = static_cast<std::uint32_t>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared), "l"(src));
#elif CTXPAR_ASYNC_COPY_DEFERRED
    if (issued_ == Capacity) Kokkos::abort("ctxpar: AsyncCopies capacity exceeded");
    pending_[issued_].dst = dst;
    pending_[issued_].src = src;
    ++issued_;
#else
    *static_cast<Piece*>(dst) = *static_cast<const Piece*>(src);
#endif
  }

  /// Closes the group of the copies issued since the last `commit`.
  KOKKOS_FORCEINLINE_FUNCTION void commit() {
#if CTXPAR_ASYNC_COPY_INSTRUCTIONS
    asm volatile("cp.async.commit_group;\n" ::);
#elif CTXPAR_ASYNC_COPY_DEFERRED
    if (groups_ == max_groups) Kokkos::abort("ctxpar: AsyncCopies has too many open groups");
    group_end_[groups_++] = issued_;
#endif
  }

  /// Returns when at most `Pending` of the committed groups are incomplete: on the host, the
  /// older groups' copies happen now.
  template <int Pending>
  KOKKOS_FORCEINLINE_FUNCTION void wait() {
    static_assert(Pending >= 0 && Pending < max_groups, "AsyncCopies::wait: pending groups");
#if CTXPAR_ASYNC_COPY_INSTRUCTIONS
    asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
#elif CTXPAR_ASYNC_COPY_DEFERRED
    if (groups_ <= Pending) return;
    const int retired = groups_ - Pending;
    const int done = group_end_[retired - 1];
    for (int i = 0; i < done; ++i) std::memcpy(pending_[i].dst, pending_[i].src, async_copy_bytes);
    for (int i = done; i < issued_; ++i) pending_[i - done] = pending_[i];
    issued_ -= done;
    for (int g = retired; g < groups_; ++g) group_end_[g - retired] = group_end_[g] - done;
    groups_ -= retired;
#endif
  }

  /// Copies issued and not yet retired by a wait (0 on a device, which does not count them).
  KOKKOS_INLINE_FUNCTION int outstanding() const {
#if CTXPAR_ASYNC_COPY_DEFERRED
    return issued_;
#else
    return 0;
#endif
  }

 private:
  /// The most groups the host holds open: `pipelined_tiles` keeps two.
  static constexpr int max_groups = 4;
  struct alignas(16) Piece {
    std::uint32_t word[4];
  };
#if CTXPAR_ASYNC_COPY_DEFERRED
  struct Pending {
    void* dst;
    const void* src;
  };
  Pending pending_[Capacity];
  int group_end_[max_groups];
  int issued_ = 0, groups_ = 0;
#endif
};

/// Runs `use(t, b)` for the tiles `t = 0 .. n - 1` of a team, each after `stage(t, b)` has staged
/// it into buffer `b` (issuing its copies through `copies`, and any plain stores) and the team
/// has seen it. With `Stages == 2` tile `t + 1` is staged into the other buffer before the team
/// waits for tile `t`, so its copies proceed while the team computes on tile `t`; with 1, each
/// tile is staged, waited for and used in turn. A team barrier follows every `use`, so a buffer
/// is restaged only after every thread is done with it. Every thread of the team calls it.
template <int Stages, class Member, class Copies, class Stage, class Use>
KOKKOS_FORCEINLINE_FUNCTION void pipelined_tiles(const Member& team, Copies& copies, std::int64_t n,
                                                 const Stage& stage, const Use& use) {
  static_assert(Stages == 1 || Stages == 2, "pipelined_tiles: one or two buffers");
  if (Stages == 2 && n > 0) {
    stage(std::int64_t(0), 0);
    copies.commit();
  }
  for (std::int64_t t = 0; t < n; ++t) {
    const int b = Stages == 2 ? static_cast<int>(t % 2) : 0;
    if constexpr (Stages == 1) {
      stage(t, 0);
      copies.commit();
      copies.template wait<0>();
    } else if (t + 1 < n) {
      stage(t + 1, 1 - b);
      copies.commit();
      copies.template wait<1>();
    } else {
      copies.template wait<0>();
    }
    team.team_barrier();
    use(t, b);
    team.team_barrier();
  }
}

}  // namespace ctxpar::impl
