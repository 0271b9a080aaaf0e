/// \file
/// Storage of chunkwise state summaries (per head, fp32, contiguous) in packed (`[dS | M]`,
/// `[γ | Mᵀ]`: one buffer, one collective) and unpacked (two buffers) forms, their validation and
/// their all-gather.
///
/// A forward summary `(M, dS)` of a fragment means `S_out = M·S_in + dS`; a backward summary
/// `(Mᵀ, γ)` means `dS_in = Mᵀ·dS_out + γ`. Both are stored the same way: the *state* part (`dS` or
/// `γ`, `K·V` floats per head, row-major `[K, V]`) first, then the *transition* part (`M` or `Mᵀ`,
/// `Transition::m_size(K)` floats per head).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "ctxpar/chunkwise/transition.hpp"
#include "ctxpar/comm/allgather.hpp"
#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/view_checks.hpp"

namespace ctxpar::chunkwise {

/// How summaries are stored and communicated.
enum class SummaryForm {
  packed,   ///< one buffer `[records, H, K·V + m]`: one collective moves state and transition
  unpacked  ///< two buffers `[records, H, K·V]` and `[records, H, m]`: two collectives
};

/// Printable name of a summary form.
inline const char* to_string(SummaryForm form) {
  return form == SummaryForm::packed ? "packed" : "unpacked";
}

/// The two parts of one summary record as a backend writes them, whatever the storage form:
/// `state` is `[H, K·V]` (`dS` forward, `γ` backward) and `transition` is `[H, m]` (`M` forward,
/// `Mᵀ` backward; `m = Transition::m_size(K)`, zero columns for the identity).
template <class MemorySpace>
struct SummaryViews {
  /// `[H, K·V]` fp32: `dS` (forward) or `γ` (backward), row-major `[K, V]` per head.
  Kokkos::View<float**, Kokkos::LayoutStride, MemorySpace> state;
  /// `[H, m]` fp32: `M` (forward) or `Mᵀ` (backward), row-major `[K, K]` per head when dense.
  Kokkos::View<float**, Kokkos::LayoutStride, MemorySpace> transition;
};

/// `count` summary records of `H` heads in packed or unpacked form, fp32 and contiguous.
/// Allocated by the driver; a backend only sees `SummaryViews` of one record.
template <class Transition, class MemorySpace>
class SummaryStore {
  static_assert(is_transition_v<Transition>,
                "ctxpar::chunkwise::SummaryStore: Transition must be one of IdentityTransition, "
                "ScalarTransition, DiagonalTransition, DenseTransition");

 public:
  /// Memory space of the buffers.
  using memory_space = MemorySpace;
  /// The transition structure.
  using transition_type = Transition;
  /// Rank-3 fp32 buffer type `[records, H, width]`.
  using buffer_type = Kokkos::View<float***, Kokkos::LayoutRight, MemorySpace>;

  SummaryStore() = default;

  /// Allocates `count` zeroed records for `heads` heads, key dim `k`, value dim `v`.
  SummaryStore(SummaryForm form, int count, std::int64_t heads, std::int64_t k, std::int64_t v,
               const std::string& label = "ctxpar::chunkwise::summaries")
      : form_(form), count_(count), heads_(heads), k_(k), v_(v) {
    if (form == SummaryForm::packed) {
      packed_ = buffer_type(label + "::packed", count, heads, k * v + Transition::m_size(k));
    } else {
      state_ = buffer_type(label + "::state", count, heads, k * v);
      transition_ = buffer_type(label + "::transition", count, heads, Transition::m_size(k));
    }
  }

  /// Storage form.
  SummaryForm form() const noexcept { return form_; }
  /// Number of records.
  int count() const noexcept { return count_; }
  /// Heads per record.
  std::int64_t heads() const noexcept { return heads_; }
  /// Key dimension `K`.
  std::int64_t key_dim() const noexcept { return k_; }
  /// Value dimension `V`.
  std::int64_t value_dim() const noexcept { return v_; }
  /// Floats of `M` per head.
  std::int64_t m_size() const noexcept { return Transition::m_size(k_); }
  /// Floats per head of a record: `K·V + m`.
  std::int64_t floats_per_head() const noexcept { return k_ * v_ + m_size(); }
  /// Bytes of one record (all heads): what one rank contributes per summary it sends.
  std::int64_t bytes_per_record() const noexcept {
    return heads_ * floats_per_head() * static_cast<std::int64_t>(sizeof(float));
  }

  /// The packed buffer `[count, H, K·V + m]` (packed form only).
  const buffer_type& packed() const noexcept { return packed_; }
  /// The state buffer `[count, H, K·V]` (unpacked form only).
  const buffer_type& states() const noexcept { return state_; }
  /// The transition buffer `[count, H, m]` (unpacked form only).
  const buffer_type& transitions() const noexcept { return transition_; }

  /// The two parts of record `i`.
  SummaryViews<MemorySpace> operator[](int i) const {
    SummaryViews<MemorySpace> out;
    if (form_ == SummaryForm::packed) {
      const std::int64_t kv = k_ * v_;
      out.state = Kokkos::subview(packed_, i, Kokkos::ALL, std::make_pair(std::int64_t{0}, kv));
      out.transition = Kokkos::subview(packed_, i, Kokkos::ALL, std::make_pair(kv, kv + m_size()));
    } else {
      out.state = Kokkos::subview(state_, i, Kokkos::ALL, Kokkos::ALL);
      out.transition = Kokkos::subview(transition_, i, Kokkos::ALL, Kokkos::ALL);
    }
    return out;
  }

 private:
  SummaryForm form_ = SummaryForm::packed;
  int count_ = 0;
  std::int64_t heads_ = 0, k_ = 0, v_ = 0;
  buffer_type packed_, state_, transition_;
};

/// Records into `chk` whether `view` is a valid summary buffer: fp32, contiguous, rank 3 with
/// extents `[records, heads, width]`, in memory space `MemorySpace`. `what` names the argument.
template <class MemorySpace, class View>
void check_summary_buffer(Preconditions& chk, const std::string& what, const View& view,
                          std::int64_t records, std::int64_t heads, std::int64_t width) {
  using value_type = std::remove_const_t<typename View::value_type>;
  chk.require(std::is_same_v<value_type, float>, what + " must hold fp32 summaries", "float",
              sizeof(value_type) == 8 ? "a 64-bit element type" : "a non-float element type");
  chk.require(std::is_same_v<typename View::memory_space, MemorySpace>,
              what + " must live in the same memory space as the other summaries",
              MemorySpace::name(), View::memory_space::name());
  chk.require(compat::view_rank<View> == 3, what + " must be a rank-3 view [records, H, width]", 3,
              compat::view_rank<View>);
  chk.require(view.span_is_contiguous(), what + " must be contiguous", "a contiguous view",
              "a strided view");
  if constexpr (compat::view_rank<View> == 3) {
    chk.require(ctxpar::impl::has_extents(view, records, heads, width),
                what + " has the wrong shape", ctxpar::impl::shape_text({records, heads, width}),
                ctxpar::impl::shape_text(view));
  }
}

/// All-gathers packed summaries: `local` is `[c, H, K·V + m]` on every rank, `gathered` is
/// `[P·c, H, K·V + m]` (rank-major). Validates both buffers collectively (fp32, contiguous, shapes,
/// memory space) so a bad buffer on one rank makes every rank throw the same `Error`. One
/// all-gather call. Collective.
template <class Transition, class ExecutionSpace, class LocalView, class GatheredView>
void gather_summaries(const ExecutionSpace& space, const Group& group, const LocalView& local,
                      const GatheredView& gathered, std::int64_t heads, std::int64_t k,
                      std::int64_t v) {
  const std::string op = "ctxpar::chunkwise::gather_summaries";
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::chunkwise::gather_summaries", ExecutionSpace, LocalView);
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::chunkwise::gather_summaries", ExecutionSpace, GatheredView);
  const std::int64_t width = k * v + Transition::m_size(k);
  const std::int64_t c = compat::view_rank<LocalView> >= 1 ? local.extent(0) : 0;
  Preconditions chk(group, op);
  chk.require_same("the number of summary records per rank", c);
  check_summary_buffer<typename ExecutionSpace::memory_space>(chk, "the local packed summaries",
                                                              local, c, heads, width);
  check_summary_buffer<typename ExecutionSpace::memory_space>(
      chk, "the gathered packed summaries", gathered, c * group.size(), heads, width);
  chk.agree();
  if constexpr (compat::view_rank<LocalView> == 3 && compat::view_rank<GatheredView> == 3) {
    allgather(space, group, local, gathered, unchecked);
  }
}

namespace impl {

// All-gather of a SummaryStore into another, without re-validating (the driver allocated both).
template <class ExecutionSpace, class Transition, class MemorySpace>
void gather_store(const ExecutionSpace& space, const Group& group,
                  const SummaryStore<Transition, MemorySpace>& local,
                  const SummaryStore<Transition, MemorySpace>& gathered) {
  if (local.form() == SummaryForm::packed) {
    allgather(space, group, local.packed(), gathered.packed(), unchecked);
  } else {
    allgather(space, group, local.states(), gathered.states(), unchecked);
    if (local.m_size() > 0)
      allgather(space, group, local.transitions(), gathered.transitions(), unchecked);
  }
}

}  // namespace impl

}  // namespace ctxpar::chunkwise
