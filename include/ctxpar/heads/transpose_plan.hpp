/// \file
/// `TransposePlan`: sequence-sharded `[T/P, C]` ⇄ head-sharded `[T, C_j]` as pack → one
/// all-to-all → unpack, with the zigzag undo/redo fused into the unpack/pack.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "ctxpar/comm/alltoall.hpp"
#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/impl/mpi_count.hpp"
#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar/core/checked_product.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/fingerprint.hpp"
#include "ctxpar/core/plan.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar/core/view_checks.hpp"
#include "ctxpar/core/workspace.hpp"
#include "ctxpar/heads/channel_layout.hpp"
#include "ctxpar/heads/impl/transpose_kernels.hpp"
#include "ctxpar/heads/policies.hpp"
#include "ctxpar/partition/head_partition.hpp"
#include "ctxpar/partition/zigzag.hpp"

namespace ctxpar::heads {

/// The plan of one head transpose over a `ChannelLayout`, for activations of `Scalar` in
/// `MemorySpace`, run on the `ExecutionSpace` instance it is built with. Construction is
/// collective: it checks the layout, the policies and the token layout on every rank, agrees on
/// the verdict (every rank throws the same `ctxpar::Error`), and allocates its two labelled
/// buffers once. The transposes reuse them. It follows the plan contract (`core/plan.hpp`): a
/// linear map, so `saved_type` is `NoSavedState` and the calls take no saved object.
///
/// Sequence-parallel side: rank `i` holds rows `[row_begin(i), row_end(i))` of the sequence in
/// sequence-parallel order (natural order under `Contiguous`, zigzag order under
/// `ZigzagPerSequence`), all `channels()` channels. Head-parallel side: every rank holds all
/// `tokens()` rows in natural order and its `local_channels()` channels (section by section, copy
/// by copy, its head block or its key groups; see `ChannelLayout::channel_map`).
template <class HeadPolicy, class TokenOrder, class ExecutionSpace, class Scalar,
          class MemorySpace = typename ExecutionSpace::memory_space>
class TransposePlan {
  static_assert(std::is_floating_point_v<Scalar> || std::is_integral_v<Scalar> ||
                    is_narrow_storage_v<Scalar>,
                "ctxpar::heads::TransposePlan: Scalar must be an arithmetic type or a 16-bit "
                "storage type (ctxpar::bfloat16, ctxpar::float16)");
  static_assert(is_head_policy_v<HeadPolicy>,
                "ctxpar::heads::TransposePlan: HeadPolicy must be EvenHeads or UnevenHeads");
  static_assert(is_token_order_v<TokenOrder>,
                "ctxpar::heads::TransposePlan: TokenOrder must be Contiguous or ZigzagPerSequence");
  static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, MemorySpace>::accessible,
                "ctxpar::heads::TransposePlan: the memory space must be accessible from the "
                "execution space");

 public:
  using execution_space = ExecutionSpace;  ///< where the kernels and the exchange run
  using scalar_type = Scalar;              ///< element type of the activations
  using value_type = Scalar;               ///< element type of the activations
  using memory_space = MemorySpace;        ///< where the buffers live
  using saved_type = NoSavedState;         ///< a linear map: the backward needs no saved state
  using head_policy = HeadPolicy;          ///< EvenHeads or UnevenHeads
  using token_order = TokenOrder;          ///< Contiguous or ZigzagPerSequence
  /// Sequence-sharded or head-sharded activations, `[rows, channels]`.
  using view_type = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace>;

  /// Collective. `space` runs every kernel and exchange of the plan; `tokens` is the global token
  /// count `T`; `cu_seqlens` (optional, global, the same on every rank) describes packed
  /// sequences: starts at 0, non-decreasing, ends at `T`. Under `ZigzagPerSequence` every sequence
  /// is zigzagged on its own, so packed input needs it.
  TransposePlan(const ExecutionSpace& space, const Group& group, ChannelLayout layout,
                std::int64_t tokens, std::vector<std::int64_t> cu_seqlens = {})
      : space_(space),
        group_(group),
        layout_(std::move(layout)),
        tokens_(tokens),
        cu_(std::move(cu_seqlens)) {
    const std::string op = "ctxpar::heads::TransposePlan";
    check_plan();
    if (cu_.empty()) cu_ = {0, tokens_};
    const int p = group_.size();
    blocks_ = KeyGroupPartition{HeadPartition{layout_.nheads(), p}, layout_.ngroups()};
    split_rows();
    const std::vector<std::int64_t> offset = build_channel_runs(op);
    if constexpr (std::is_same_v<TokenOrder, ZigzagPerSequence>) {
      // A dense sequence is one packed sequence: the same closed form covers both.
      order_ = ZigzagPerSequenceLayout<MemorySpace>::create(cu_, p, op);
      order_host_ = ZigzagPerSequenceLayout<Kokkos::HostSpace>::create(cu_, p, op);
    }

    for (int j = 0; j < p; ++j) {
      send_seq_.push_back(ctxpar::impl::mpi_count(local_rows() * (offset[j + 1] - offset[j]), op,
                                                  "an all-to-all block"));
      recv_head_.push_back(
          ctxpar::impl::mpi_count(rows(j) * local_channels(), op, "an all-to-all block"));
    }
    buf_seq_ = Kokkos::View<wide_type*, MemorySpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "ctxpar::heads::sequence_buffer"),
        local_rows() * offset[p]);
    buf_head_ = Kokkos::View<wide_type*, MemorySpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "ctxpar::heads::head_buffer"),
        tokens_ * local_channels());
  }

  /// Plans own their buffers: movable, not copyable (a copy would share them).
  TransposePlan(const TransposePlan&) = delete;
  TransposePlan& operator=(const TransposePlan&) = delete;
  TransposePlan(TransposePlan&&) = default;             ///< moves the buffers
  TransposePlan& operator=(TransposePlan&&) = default;  ///< moves the buffers

 private:
  // The agreed checks of the constructor: the layout, T, the policies' divisibility and the
  // packed sequences, each against this rank's view of the arguments.
  void check_plan() const {
    Preconditions chk(group_, "ctxpar::heads::TransposePlan");
    const int p = group_.size();
    check_layout(chk, layout_, p);
    chk.require(tokens_ >= 0, "the token count must be non-negative", ">= 0", tokens_);
    // Every transpose moves `T · channels` elements through int MPI counts per rank pair; a
    // product that wraps int64 would size the buffers with garbage.
    chk.require(
        ctxpar::impl::checked_product({tokens_, layout_.channels()}) >= 0,
        "T * channels must fit in int64",
        "at most " + std::to_string(std::numeric_limits<std::int64_t>::max()),
        "T = " + std::to_string(tokens_) + ", channels = " + std::to_string(layout_.channels()));
    if constexpr (std::is_same_v<HeadPolicy, EvenHeads> ||
                  std::is_same_v<TokenOrder, ZigzagPerSequence>) {
      chk.require(tokens_ % p == 0,
                  "T % P == 0 (EvenHeads and ZigzagPerSequence need equal token shards)",
                  "a multiple of " + std::to_string(p), tokens_);
    }
    const bool packed = !cu_.empty();
    if (packed) {
      bool valid = cu_.front() == 0 && cu_.back() == tokens_;
      for (std::size_t s = 1; s < cu_.size(); ++s) valid = valid && cu_[s] >= cu_[s - 1];
      chk.require(valid, "cu_seqlens must start at 0, not decrease and end at T",
                  "0 ... " + std::to_string(tokens_), describe(cu_));
      if constexpr (std::is_same_v<TokenOrder, ZigzagPerSequence>) {
        for (std::size_t s = 1; valid && s < cu_.size(); ++s) {
          const std::int64_t len = cu_[s] - cu_[s - 1];
          chk.require(
              len % (2 * p) == 0,
              "every packed sequence length must be divisible by 2P under ZigzagPerSequence "
              "(sequence " +
                  std::to_string(s - 1) + ")",
              "a multiple of " + std::to_string(2 * p), len);
        }
      }
    } else if constexpr (std::is_same_v<TokenOrder, ZigzagPerSequence>) {
      chk.require(tokens_ % (2 * p) == 0 && tokens_ > 0,
                  "T % 2P == 0 (and T > 0) under ZigzagPerSequence",
                  "a positive multiple of " + std::to_string(2 * p), tokens_);
    }
    chk.require_same(
        "the plan (layout, T, cu_seqlens, policies)",
        ctxpar::fingerprint({layout_.fingerprint_value(), tokens_, ctxpar::fingerprint(cu_),
                             std::is_same_v<HeadPolicy, UnevenHeads> ? 1 : 0,
                             std::is_same_v<TokenOrder, ZigzagPerSequence> ? 1 : 0}));
    chk.agree();
  }

  static void check_layout(Preconditions& chk, const ChannelLayout& layout, int p) {
    const int h = layout.nheads(), g = layout.ngroups();
    chk.require(h >= 1 && g >= 1 && h % g == 0, "nheads must be a positive multiple of ngroups",
                "ngroups | nheads",
                "nheads " + std::to_string(h) + ", ngroups " + std::to_string(g));
    bool sections_ok = !layout.sections().empty();
    for (const Section& s : layout.sections())
      sections_ok = sections_ok && s.copies >= 1 && s.width >= 1 &&
                    s.units == (s.kind == SectionKind::heads ? h : g);
    chk.require(sections_ok,
                "every section must have copies, width >= 1 and units = nheads or ngroups",
                "valid sections", "an inconsistent section");
    if constexpr (std::is_same_v<HeadPolicy, EvenHeads>) {
      chk.require(h % p == 0, "nheads % P == 0 (choose UnevenHeads for other head counts)",
                  "a multiple of " + std::to_string(p), h);
      bool has_groups = false;
      for (const Section& s : layout.sections())
        has_groups = has_groups || s.kind == SectionKind::groups;
      if (has_groups && g < p) {
        chk.require(p % g == 0,
                    "P % ngroups == 0 when ngroups < P (each group is repeated P/ngroups times)",
                    "a divisor of " + std::to_string(p), g);
      } else if (has_groups) {
        chk.require(g % p == 0, "ngroups % P == 0 when ngroups >= P",
                    "a multiple of " + std::to_string(p), g);
      }
    }
  }

  // The sequence-parallel row split: equal shards, or the torch.chunk rule under uneven heads with
  // contiguous tokens.
  void split_rows() {
    const int p = group_.size();
    row_begin_.resize(p + 1);
    const std::int64_t chunk =
        std::is_same_v<TokenOrder, ZigzagPerSequence> || std::is_same_v<HeadPolicy, EvenHeads>
            ? tokens_ / p
            : (tokens_ + p - 1) / p;  // the torch.chunk rule
    for (int i = 0; i <= p; ++i) row_begin_[i] = std::min<std::int64_t>(chunk * i, tokens_);
    row_begin_[p] = tokens_;
  }

  // The channel map of every rank as contiguous runs, uploaded; whether the transposes are the
  // identity. Returns each rank's first map entry (and the total at `[P]`).
  std::vector<std::int64_t> build_channel_runs(const std::string& op) {
    const int p = group_.size();
    std::vector<std::int64_t> map, offset(p + 1, 0);
    std::vector<int> owner;  // destination rank of every map entry
    for (int j = 0; j < p; ++j) {
      std::vector<std::int64_t> mj = layout_.channel_map(blocks_, j);
      map.insert(map.end(), mj.begin(), mj.end());
      owner.insert(owner.end(), mj.size(), j);
      offset[j + 1] = static_cast<std::int64_t>(map.size());
    }
    offset_host_ = offset;
    // Contiguous runs of the map, split where the owner changes, the source jumps, or a channel
    // switches between its first appearance and a repeat (a key group held by several ranks).
    std::vector<char> seen(layout_.channels(), 0);
    std::vector<impl::ChannelRun> runs;
    for (std::size_t k = 0; k < map.size(); ++k) {
      const int first = seen[map[k]] ? 0 : 1;
      seen[map[k]] = 1;
      if (!runs.empty()) {
        impl::ChannelRun& last = runs.back();
        if (last.owner == owner[k] && last.first == first && last.source + last.length == map[k] &&
            last.target + last.length == static_cast<std::int64_t>(k)) {
          ++last.length;
          continue;
        }
      }
      runs.push_back(impl::ChannelRun{map[k], static_cast<std::int64_t>(k), 1, owner[k], first});
    }
    bool covered = true;
    for (char c : seen) covered = covered && c;
    require_local(covered, op, "every channel of the layout must reach some rank",
                  "a covering partition", "a channel no rank holds");
    // Where each run lands in the flat buffer: row t of rank j's block [rows, C_j] starts at
    // rows·offset(j) + t·C_j, so the kernels need one multiply-add per run and row.
    for (impl::ChannelRun& run : runs) {
      const std::int64_t o = offset[run.owner];
      run.block_stride = offset[run.owner + 1] - o;
      run.block_base = local_rows() * o + (run.target - o);
    }
    ctxpar::impl::upload(runs, runs_, "ctxpar::heads::channel_runs");
    identity_ = p == 1 && std::is_same_v<TokenOrder, Contiguous>;
    for (std::size_t k = 0; identity_ && k < map.size(); ++k)
      identity_ = map[k] == static_cast<std::int64_t>(k);

    return offset;
  }

 public:
  /// The execution space instance the plan runs on.
  const execution_space& space() const { return space_; }
  /// The communicator.
  const Group& group() const { return group_; }
  /// Bytes of the device buffers the plan owns (send and receive buffers, the channel runs).
  std::size_t workspace_bytes() const {
    return (buf_seq_.span() + buf_head_.span()) * sizeof(wide_type) +
           runs_.span() * sizeof(impl::ChannelRun);
  }
  /// Whether both transposes are the identity (one rank, natural token order, every channel in
  /// its own place): a caller may then use one view for both sides instead of transposing.
  bool identity() const { return identity_; }
  /// The channel layout.
  const ChannelLayout& layout() const { return layout_; }
  /// Heads and key groups per rank.
  const KeyGroupPartition& blocks() const { return blocks_; }
  /// Global token count `T`.
  std::int64_t tokens() const { return tokens_; }
  /// `cu_seqlens` of the packed sequences (`{0, T}` for a dense sequence).
  const std::vector<std::int64_t>& cu_seqlens() const { return cu_; }
  /// Channels at `P = 1`.
  std::int64_t channels() const { return layout_.channels(); }
  /// Channels this rank holds on the head-parallel side.
  std::int64_t local_channels() const { return local_channels(group_.rank()); }
  /// Channels rank `j` holds on the head-parallel side.
  std::int64_t local_channels(int j) const { return offset_host_[j + 1] - offset_host_[j]; }
  /// First sequence-parallel row of rank `i`.
  std::int64_t row_begin(int i) const { return row_begin_[i]; }
  /// Sequence-parallel rows of rank `i`.
  std::int64_t rows(int i) const { return row_begin_[i + 1] - row_begin_[i]; }
  /// Sequence-parallel rows of this rank.
  std::int64_t local_rows() const { return rows(group_.rank()); }
  /// The natural token index of row `t` of rank `i`'s sequence-parallel shard (host).
  std::int64_t natural_row(int i, std::int64_t t) const {
    if constexpr (std::is_same_v<TokenOrder, ZigzagPerSequence>) {
      return order_host_.to_natural(row_begin_[i] + t);
    } else {
      return row_begin_[i] + t;
    }
  }
  /// Payload bytes this rank sends to other ranks in one `to_head_parallel`.
  std::int64_t bytes_per_transpose() const {
    return local_rows() * (offset_host_.back() - local_channels()) * std::int64_t(sizeof(Scalar));
  }

  /// Collective. `x [local_rows(), channels()]` (sequence-parallel) → `y [tokens(),
  /// local_channels()]` (head-parallel, natural order).
  template <class SeqView, class HeadView>
  void to_head_parallel(const SeqView& x, const HeadView& y) const {
    const ExecutionSpace& space = space_;
    CTXPAR_ASSERT_ACCESSIBLE("ctxpar::heads::to_head_parallel", ExecutionSpace, SeqView);
    CTXPAR_ASSERT_ACCESSIBLE("ctxpar::heads::to_head_parallel", ExecutionSpace, HeadView);
    compat::ScopedRegion region("ctxpar::heads::to_head_parallel");
    require_views("ctxpar::heads::to_head_parallel", x, y);
    // A group of one would exchange its whole send buffer with itself: the pack writes straight
    // into what the exchange would have received (the same elements in the same places), unless
    // the caller transposes in place.
    using T = typename SeqView::non_const_value_type;
    const bool alone = group_.size() == 1 && !overlap(x, y);
    constexpr bool contiguous = std::is_same_v<TokenOrder, Contiguous>;
    const buffer<T> seq = as<T>(buf_seq_), head = as<T>(buf_head_);
    const buffer<T> packed = alone && contiguous ? flat(y) : seq;
    if (local_rows() > 0)
      impl::for_each_row(
          "ctxpar::heads::pack_sequence", space, local_rows(),
          impl::PackSequence<SeqView, buffer<T>, MemorySpace, ExecutionSpace>{x, packed, runs_});
    if constexpr (contiguous) {
      if (!alone) exchange(seq, send_seq_, flat(y), recv_head_);
    } else {
      if (!alone) exchange(seq, send_seq_, head, recv_head_);
      if (tokens_ > 0)
        impl::for_each_row(
            "ctxpar::heads::unpack_head_zigzag_undo", space, tokens_,
            impl::UnpackHead<const_buffer<T>, HeadView, ZigzagPerSequenceLayout<MemorySpace>,
                             ExecutionSpace>{alone ? const_buffer<T>(seq) : const_buffer<T>(head),
                                             y, order_, local_channels()});
    }
  }

  /// The local first half of `to_head_parallel` alone: packs `x` into the plan's send buffer (no
  /// communication). For measuring the pack bandwidth; `to_head_parallel` does this itself.
  template <class SeqView>
  void pack(const SeqView& x) const {
    if (local_rows() > 0)
      impl::for_each_row("ctxpar::heads::pack_sequence", space_, local_rows(),
                         impl::PackSequence<SeqView, buffer<Scalar>, MemorySpace, ExecutionSpace>{
                             x, as<Scalar>(buf_seq_), runs_});
  }
  /// The local second half of `to_head_parallel` under `ZigzagPerSequence` alone: unpacks the
  /// plan's receive buffer into `y` with the zigzag undo (no communication). For measuring the
  /// unpack bandwidth.
  template <class HeadView>
  void unpack(const HeadView& y) const {
    if (tokens_ > 0)
      impl::for_each_row(
          "ctxpar::heads::unpack_head_zigzag_undo", space_, tokens_,
          impl::UnpackHead<buffer<Scalar>, HeadView, ZigzagPerSequenceLayout<MemorySpace>,
                           ExecutionSpace>{as<Scalar>(buf_head_), y, order_, local_channels()});
  }

  /// Collective. The inverse of `to_head_parallel`: `y [tokens(), local_channels()]` →
  /// `x [local_rows(), channels()]`; a channel repeated on several ranks takes the copy of the
  /// lowest rank. Without repeats it is also the adjoint (the backward of `to_head_parallel`).
  template <class HeadView, class SeqView>
  void to_sequence_parallel(const HeadView& y, const SeqView& x) const {
    reverse("ctxpar::heads::to_sequence_parallel", y, x, false);
  }

  /// Collective. The adjoint of `to_head_parallel` (its backward): like `to_sequence_parallel`, but
  /// the copies of a repeated channel are summed in rank order. A plan of a 16-bit `Scalar` sums
  /// in its compute type: pass fp32 gradients (`core/storage.hpp`).
  template <class HeadView, class SeqView>
  void adjoint_to_head_parallel(const HeadView& dy, const SeqView& dx) const {
    static_assert(!is_narrow_storage_v<typename SeqView::non_const_value_type>,
                  "ctxpar::heads::adjoint_to_head_parallel sums: pass gradients in the compute "
                  "type (fp32), not in 16 bits");
    reverse("ctxpar::heads::adjoint_to_head_parallel", dy, dx, true);
  }

 private:
  template <class HeadView, class SeqView>
  void reverse(const char* op, const HeadView& y, const SeqView& x, bool sum_repeats) const {
    const ExecutionSpace& space = space_;
    CTXPAR_ASSERT_ACCESSIBLE("ctxpar::heads::to_sequence_parallel", ExecutionSpace, SeqView);
    CTXPAR_ASSERT_ACCESSIBLE("ctxpar::heads::to_sequence_parallel", ExecutionSpace, HeadView);
    compat::ScopedRegion region(op);
    require_views(op, x, y);
    using T = typename SeqView::non_const_value_type;
    const buffer<T> seq = as<T>(buf_seq_), head = as<T>(buf_head_);
    // A group of one unpacks from what it would have sent itself (see `to_head_parallel`).
    const bool alone = group_.size() == 1 && !overlap(x, y);
    const_buffer<T> received = seq;
    if constexpr (std::is_same_v<TokenOrder, Contiguous>) {
      if (alone)
        received = flat(y);
      else
        exchange(flat(y), recv_head_, seq, send_seq_);
    } else {
      if (tokens_ > 0)
        impl::for_each_row("ctxpar::heads::pack_head_zigzag_redo", space, tokens_,
                           impl::PackHead<HeadView, buffer<T>, ZigzagPerSequenceLayout<MemorySpace>,
                                          ExecutionSpace>{y, head, order_, local_channels()});
      if (alone)
        received = head;
      else
        exchange(head, recv_head_, seq, send_seq_);
    }
    if (local_rows() > 0)
      impl::for_each_row(
          "ctxpar::heads::unpack_sequence", space, local_rows(),
          impl::UnpackSequence<const_buffer<T>, SeqView, MemorySpace, ExecutionSpace>{
              x, received, runs_, sum_repeats});
  }

 public:
  /// Collective. The checks of a transpose between `x` (sequence-parallel) and `y`
  /// (head-parallel), without the transpose: for a caller that uses one view for both sides of
  /// an `identity()` plan. Throws `ctxpar::Error` naming `op` on every rank.
  template <class SeqView, class HeadView>
  void require_views(const std::string& op, const SeqView& x, const HeadView& y) const {
    static_assert(compat::view_rank<SeqView> == 2 && compat::view_rank<HeadView> == 2,
                  "ctxpar::heads transposes: views must be rank 2 [rows, channels]");
    using T = typename SeqView::non_const_value_type;
    static_assert(std::is_same_v<T, typename HeadView::non_const_value_type> &&
                      (std::is_same_v<T, Scalar> || std::is_same_v<T, wide_type>),
                  "ctxpar::heads transposes: both views must hold the plan's Scalar (or, for a "
                  "16-bit Scalar, its compute type)");
    static_assert(std::is_same_v<typename HeadView::array_layout, Kokkos::LayoutRight>,
                  "ctxpar::heads transposes: the head-parallel view must be LayoutRight");
    Preconditions chk(group_, op);
    chk.require(static_cast<std::int64_t>(x.extent(1)) == channels(),
                "the sequence-parallel channel count must match the layout", channels(),
                x.extent(1));
    chk.require(static_cast<std::int64_t>(x.extent(0)) == local_rows(),
                "the sequence-parallel shard must hold this rank's rows", local_rows(),
                x.extent(0));
    chk.require(static_cast<std::int64_t>(y.extent(0)) == tokens_,
                "the head-parallel view must hold every token", tokens_, y.extent(0));
    chk.require(static_cast<std::int64_t>(y.extent(1)) == local_channels(),
                "the head-parallel channel count must match this rank's share of the layout",
                local_channels(), y.extent(1));
    chk.require(y.span_is_contiguous(), "the head-parallel view must be contiguous", "contiguous",
                "strided");
    // The kernels copy runs between raw row pointers.
    chk.require(x.extent(1) <= 1 || x.stride(1) == 1,
                "the sequence-parallel view's channels must be contiguous (unit stride)", 1,
                x.stride(1));
    chk.agree();
  }

 private:
  template <class Send, class Recv>
  void exchange(const Send& send, const std::vector<int>& send_counts, const Recv& recv,
                const std::vector<int>& recv_counts) const {
    if constexpr (std::is_same_v<HeadPolicy, EvenHeads>) {
      alltoall(space_, group_, send, recv, unchecked);
    } else {
      alltoallv(space_, group_, send, send_counts, recv, recv_counts, unchecked);
    }
  }

  // Whether the memory of `a` and `b` overlaps.
  template <class A, class B>
  static bool overlap(const A& a, const B& b) {
    const auto a0 = reinterpret_cast<std::uintptr_t>(a.data());
    const auto b0 = reinterpret_cast<std::uintptr_t>(b.data());
    return a0 < b0 + b.span() * sizeof(typename B::value_type) &&
           b0 < a0 + a.span() * sizeof(typename A::value_type);
  }
  // The widest element the plan moves: a 16-bit plan moves its activations in 16 bits and the
  // gradients of its adjoint in their compute type; the buffers are sized for the wider.
  using wide_type = std::conditional_t<is_narrow_storage_v<Scalar>, float, Scalar>;
  // A plan buffer, or the caller's view flattened: unmanaged, so that either can stand in.
  template <class T>
  using buffer = Kokkos::View<T*, MemorySpace, Kokkos::MemoryUnmanaged>;
  template <class T>
  using const_buffer = Kokkos::View<const T*, MemorySpace, Kokkos::MemoryUnmanaged>;
  // A plan buffer's memory as elements of `T` (at most `wide_type`'s bytes each).
  template <class T>
  static buffer<T> as(const Kokkos::View<wide_type*, MemorySpace>& b) {
    static_assert(sizeof(T) <= sizeof(wide_type), "the plan's buffers hold wide_type elements");
    return buffer<T>(reinterpret_cast<T*>(b.data()), b.span());
  }

  template <class View>
  static auto flat(const View& v) {
    return Kokkos::View<typename View::value_type*, typename View::memory_space,
                        Kokkos::MemoryUnmanaged>(v.data(), v.span());
  }

  static std::string describe(const std::vector<std::int64_t>& cu) {
    std::string s;
    for (std::size_t i = 0; i < cu.size() && i < 8; ++i)
      s += (i ? "," : "") + std::to_string(cu[i]);
    return s + (cu.size() > 8 ? ",..." : "");
  }

  ExecutionSpace space_;
  Group group_;
  ChannelLayout layout_;
  std::int64_t tokens_;
  std::vector<std::int64_t> cu_;
  KeyGroupPartition blocks_;
  std::vector<std::int64_t> row_begin_, offset_host_;
  std::vector<int> send_seq_, recv_head_;
  Kokkos::View<impl::ChannelRun*, MemorySpace> runs_;
  ZigzagPerSequenceLayout<MemorySpace> order_;
  ZigzagPerSequenceLayout<Kokkos::HostSpace> order_host_;
  Kokkos::View<wide_type*, MemorySpace> buf_seq_, buf_head_;
  bool identity_ = false;
};

}  // namespace ctxpar::heads
