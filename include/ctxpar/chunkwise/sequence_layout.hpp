/// \file
/// `SequenceLayout`: which tokens each rank holds and how its packed sequences continue across
/// ranks, as *virtual shards* in causal order (contiguous: `P` shards, shard `r` on rank `r`;
/// zigzag: `2P` shards, rank `r` holds shards `r` and `2P-1-r`, in that local order).
///
/// For every virtual shard `v` the layout knows the packed-sequence metadata of
/// docs/chunkwise.md §3: its local `cu_seqlens`, `preceding_start(v)` (first shard whose forward
/// summary reaches `v`'s incoming state), `following_stop(v)` (one past the last shard whose
/// backward summary reaches `v`), and the segmented-scan flags. Host-side only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ctxpar/chunkwise/local_sequences.hpp"
#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/preconditions.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/partition/balanced_chunks.hpp"
#include "ctxpar/partition/packed_metadata.hpp"
#include "ctxpar/partition/zigzag.hpp"

namespace ctxpar::chunkwise {

/// The sequence layout of one chunkwise CP call, identical on every rank.
class SequenceLayout {
 public:
  SequenceLayout() = default;

  /// Contiguous shards (`torch.chunk` rule: uneven and empty shards allowed) of packed sequences
  /// with global boundaries `cu_seqlens` (`[0, …, T]`, non-decreasing; one sequence when
  /// `{0, T}`). Sequence ordinals (rows of `[N, H, K, V]` state arrays) are the positions in
  /// `cu_seqlens`, empty sequences included. Collective: ranks must pass the same boundaries.
  static SequenceLayout create(const Group& group, Contiguous,
                               const std::vector<std::int64_t>& cu_seqlens) {
    return agreed(group, false, cu_seqlens, 1);
  }

  /// Zigzag shards: the token stream is cut into `2P` chunks (`torch.chunk` rule) and rank `r`
  /// holds chunks `r` and `2P-1-r`, concatenated in that order. Collective.
  static SequenceLayout create(const Group& group, Zigzag,
                               const std::vector<std::int64_t>& cu_seqlens) {
    return agreed(group, true, cu_seqlens, 2);
  }

  /// Contiguous shards of `tokens` tokens (`T`, global) in packed sequences `cu_seqlens`, checked
  /// against `T`: the boundaries must start at 0, not decrease and end exactly at `T` (boundaries
  /// past `T` would make the kernels read past the inputs; boundaries short of `T` would leave the
  /// tail unread). An empty `cu_seqlens` means one sequence of all `T` tokens, as in
  /// `heads::TransposePlan`. Collective: ranks must pass the same `T` and boundaries.
  static SequenceLayout create(const Group& group, Contiguous, std::int64_t tokens,
                               const std::vector<std::int64_t>& cu_seqlens = {}) {
    return agreed(group, false, with_tokens(tokens, cu_seqlens), 1, tokens);
  }

  /// Zigzag shards of `tokens` tokens in packed sequences `cu_seqlens`, checked against `T` as for
  /// `Contiguous`; an empty `cu_seqlens` means one sequence of `T` tokens. Collective.
  static SequenceLayout create(const Group& group, Zigzag, std::int64_t tokens,
                               const std::vector<std::int64_t>& cu_seqlens = {}) {
    return agreed(group, true, with_tokens(tokens, cu_seqlens), 2, tokens);
  }

  /// Contiguous plan from the foundation's packed metadata (`meta.parts()` must equal
  /// `group.size()`; shards of `T / P` tokens). Collective.
  static SequenceLayout create(const Group& group, Contiguous, const PackedMetadata& meta) {
    return from_metadata(group, false, meta);
  }

  /// Zigzag plan from packed metadata built over `2P` parts (virtual shard `v` is the metadata's
  /// rank `v`). Collective.
  static SequenceLayout create(const Group& group, Zigzag, const PackedMetadata& meta) {
    return from_metadata(group, true, meta);
  }

  /// Whether shards are zigzag.
  bool zigzag() const noexcept { return zigzag_; }
  /// Ranks `P`.
  int parts() const noexcept { return parts_; }
  /// This rank.
  int rank() const noexcept { return rank_; }
  /// Virtual shards: `P` (contiguous) or `2P` (zigzag).
  int virtual_count() const noexcept { return static_cast<int>(offsets_.size()) - 1; }
  /// Virtual shards per rank: 1 or 2.
  int slots() const noexcept { return zigzag_ ? 2 : 1; }
  /// Total tokens `T`.
  std::int64_t total_length() const noexcept { return offsets_.back(); }
  /// Sequences `N` (rows of state arrays, empty sequences included).
  int sequence_count() const noexcept { return static_cast<int>(cu_.size()) - 1; }
  /// Global sequence boundaries.
  const std::vector<std::int64_t>& cu_seqlens() const noexcept { return cu_; }

  /// Virtual shard held by rank `r` in local slot `slot`.
  int virtual_shard(int r, int slot) const noexcept { return slot == 0 ? r : 2 * parts_ - 1 - r; }
  /// (rank, slot) of virtual shard `v`.
  std::pair<int, int> holder(int v) const noexcept {
    if (!zigzag_ || v < parts_) return {v, 0};
    return {2 * parts_ - 1 - v, 1};
  }
  /// Global first token of virtual shard `v`.
  std::int64_t shard_begin(int v) const { return offsets_[static_cast<std::size_t>(v)]; }
  /// Tokens of virtual shard `v`.
  std::int64_t shard_length(int v) const { return shard_begin(v + 1) - shard_begin(v); }
  /// Offset of local slot `slot` in this rank's local arrays.
  std::int64_t local_offset(int slot) const {
    return slot == 0 ? 0 : shard_length(virtual_shard(rank_, 0));
  }
  /// Tokens on this rank (all slots).
  std::int64_t local_length() const {
    std::int64_t n = 0;
    for (int s = 0; s < slots(); ++s) n += shard_length(virtual_shard(rank_, s));
    return n;
  }

  /// The local sequences of virtual shard `v` (empty for an empty shard).
  LocalSequences local_sequences(int v) const {
    LocalSequences s;
    const std::int64_t b = shard_begin(v), e = shard_begin(v + 1);
    if (b == e) return s;
    s.cu_seqlens.clear();
    for (int n = sequence_at(b); n < sequence_count() && cu_[idx(n)] < e; ++n) {
      if (cu_[idx(n) + 1] == cu_[idx(n)]) continue;  // empty sequence: owns no token
      s.cu_seqlens.push_back(std::max(cu_[idx(n)], b) - b);
      s.ordinals.push_back(n);
    }
    s.cu_seqlens.push_back(e - b);
    s.first_continues = cu_[idx(s.ordinals.front())] < b;
    s.last_continues = cu_[idx(s.ordinals.back()) + 1] > e;
    return s;
  }

  /// Inclusive first virtual shard whose forward summary feeds `v` (`v` itself when its first
  /// sequence starts in it).
  int preceding_start(int v) const {
    if (shard_length(v) == 0) return v;
    return shard_of(cu_[idx(sequence_at(shard_begin(v)))]);
  }
  /// Exclusive end of the virtual shards whose backward summaries reach `v`.
  int following_stop(int v) const {
    if (shard_length(v) == 0) return v + 1;
    return shard_of(cu_[idx(sequence_at(shard_begin(v + 1) - 1)) + 1] - 1) + 1;
  }
  /// Forward segmented-scan flag: the trailing fragment of `v` starts in `v`.
  bool forward_reset(int v) const {
    if (shard_length(v) == 0) return false;
    return cu_[idx(sequence_at(shard_begin(v + 1) - 1))] >= shard_begin(v);
  }
  /// Backward segmented-scan flag: the leading fragment of `v` ends in `v`.
  bool backward_reset(int v) const {
    if (shard_length(v) == 0) return false;
    return cu_[idx(sequence_at(shard_begin(v))) + 1] <= shard_begin(v + 1);
  }
  /// Ordinals of the empty sequences (their final state is their initial state).
  std::vector<int> empty_sequences() const {
    std::vector<int> out;
    for (int n = 0; n < sequence_count(); ++n) {
      if (cu_[idx(n)] == cu_[idx(n) + 1]) out.push_back(n);
    }
    return out;
  }
  /// A fingerprint of the layout (T, sequence boundaries, zigzag) for `Preconditions`.
  std::int64_t fingerprint() const {
    return ctxpar::fingerprint(
        {zigzag_ ? 1 : 0, ctxpar::fingerprint(offsets_), ctxpar::fingerprint(cu_)});
  }

 private:
  static std::size_t idx(std::int64_t i) { return static_cast<std::size_t>(i); }

  // Sequence (ordinal) holding global token t: the last n with cu[n] <= t < cu[n+1].
  int sequence_at(std::int64_t t) const {
    const auto it = std::upper_bound(cu_.begin(), cu_.end(), t);
    int n = static_cast<int>(it - cu_.begin()) - 1;
    while (n + 1 < static_cast<int>(cu_.size()) - 1 && cu_[idx(n) + 1] <= t) ++n;
    return n;
  }
  // Non-empty virtual shard holding global token t.
  int shard_of(std::int64_t t) const {
    const auto it = std::upper_bound(offsets_.begin(), offsets_.end(), t);
    return static_cast<int>(it - offsets_.begin()) - 1;
  }

  // The boundaries the token-count overloads describe: `{0, T}` for an empty `cu_seqlens`.
  static std::vector<std::int64_t> with_tokens(std::int64_t tokens,
                                               const std::vector<std::int64_t>& cu) {
    if (cu.empty()) return {0, tokens};
    return cu;
  }

  // `tokens` < 0: the overloads without a token count (T is `cu.back()`).
  static SequenceLayout agreed(const Group& group, bool zigzag, const std::vector<std::int64_t>& cu,
                               int per_rank, std::int64_t tokens = -1) {
    const std::string op = "ctxpar::chunkwise::SequenceLayout";
    Preconditions chk(group, op);
    if (tokens >= 0 && !cu.empty()) {
      chk.require(cu.back() == tokens,
                  "cu_seqlens must end at the token count T (cu_seqlens[N] == T)",
                  "cu_seqlens[" + ctxpar::impl::to_text(cu.size() - 1) +
                      "] = " + ctxpar::impl::to_text(tokens),
                  "cu_seqlens[" + ctxpar::impl::to_text(cu.size() - 1) +
                      "] = " + ctxpar::impl::to_text(cu.back()));
    }
    chk.require(cu.empty() || cu.size() - 1 <= static_cast<std::size_t>(
                                                   std::numeric_limits<std::int32_t>::max()),
                "the number of sequences N = cu_seqlens.size() - 1 must fit in int32",
                "at most " + ctxpar::impl::to_text(std::numeric_limits<std::int32_t>::max()),
                cu.empty() ? 0 : cu.size() - 1);
    chk.require(!cu.empty() && cu.front() == 0, "cu_seqlens must start with 0", "cu_seqlens[0] = 0",
                cu.empty() ? std::string("an empty cu_seqlens")
                           : "cu_seqlens[0] = " + ctxpar::impl::to_text(cu.front()));
    bool sorted = true;
    std::size_t bad = 0;
    for (std::size_t i = 1; i < cu.size() && sorted; ++i) {
      if (cu[i] < cu[i - 1]) {
        sorted = false;
        bad = i;
      }
    }
    chk.require(sorted, "cu_seqlens must be non-decreasing",
                sorted ? std::string()
                       : "cu_seqlens[" + ctxpar::impl::to_text(bad) +
                             "] >= " + ctxpar::impl::to_text(cu[bad - 1]),
                sorted ? std::string()
                       : "cu_seqlens[" + ctxpar::impl::to_text(bad) +
                             "] = " + ctxpar::impl::to_text(cu[bad]));
    chk.require(cu.size() >= 2 && cu.back() >= 1, "the input must hold at least one token (T >= 1)",
                ">= 1", cu.empty() ? 0 : cu.back());
    SequenceLayout plan;
    plan.zigzag_ = zigzag;
    plan.parts_ = group.size();
    plan.rank_ = group.rank();
    plan.cu_ = cu;
    const std::int64_t total = cu.empty() ? 0 : cu.back();
    const BalancedChunks chunks{total, group.size() * per_rank};
    plan.offsets_.clear();
    for (int v = 0; v <= chunks.parts; ++v)
      plan.offsets_.push_back(v < chunks.parts ? chunks.begin(v) : total);
    chk.require_same("the chunkwise sequence layout (T, cu_seqlens, zigzag)", plan.fingerprint());
    chk.agree();
    return plan;
  }

  static SequenceLayout from_metadata(const Group& group, bool zigzag, const PackedMetadata& meta) {
    const std::string op = "ctxpar::chunkwise::SequenceLayout";
    Preconditions chk(group, op);
    const int want = group.size() * (zigzag ? 2 : 1);
    chk.require(meta.parts() == want,
                zigzag ? "zigzag needs packed metadata built over 2P parts"
                       : "the packed metadata must be built over P = group size parts",
                want, meta.parts());
    SequenceLayout plan;
    plan.zigzag_ = zigzag;
    plan.parts_ = group.size();
    plan.rank_ = group.rank();
    plan.cu_ = meta.cu_seqlens();
    plan.offsets_.clear();
    for (int v = 0; v <= meta.parts(); ++v) plan.offsets_.push_back(v * meta.local_length());
    chk.require_same("the chunkwise sequence layout (T, cu_seqlens, zigzag)", plan.fingerprint());
    chk.agree();
    return plan;
  }

  bool zigzag_ = false;
  int parts_ = 1;
  int rank_ = 0;
  std::vector<std::int64_t> cu_{0, 0};
  std::vector<std::int64_t> offsets_{0, 0};
};

}  // namespace ctxpar::chunkwise
