/// \file
/// `PackedMetadata`: what each rank needs to know about packed (varlen) sequences when `T` tokens
/// are split contiguously over `P` ranks, `L = T / P` tokens each (docs/partition.md §3).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/impl/violation.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/fingerprint.hpp"

namespace ctxpar {

/// The packed-sequence metadata of one rank. Host-side only; it never enters a kernel.
struct PackedShard {
  int rank = 0;                             ///< the rank this describes
  std::int64_t begin = 0;                   ///< global index of the rank's first token, `rank * L`
  std::int64_t length = 0;                  ///< tokens on the rank, `L`
  std::vector<std::int32_t> local_seq_idx;  ///< sequence ids of the rank's tokens
  std::vector<std::int64_t> local_cu_seqlens;  ///< `0`, every local index where the id changes, `L`
  std::int64_t first =
      0;                  ///< global index of the first token with the id of the rank's first token
  std::int64_t last = 0;  ///< global index of the last token with the id of the rank's last token
  int preceding_rank_start = 0;          ///< `first / L`: inclusive start of the forward prefix
  int following_rank_stop = 1;           ///< `last / L + 1`: exclusive end of the backward suffix
  bool continues_from_previous = false;  ///< the first local sequence began on an earlier rank
  bool continues_to_next = false;        ///< the last local sequence goes on to a later rank

  /// Number of (possibly partial) sequences on the rank.
  int num_sequences() const { return static_cast<int>(local_cu_seqlens.size()) - 1; }
};

namespace impl {

/// Checks the split itself: at least one token and `T % P == 0`.
inline std::optional<Violation> check_split(std::int64_t total, int parts) {
  if (parts < 1) return Violation{"the number of ranks must be positive", ">= 1", to_text(parts)};
  if (total < 1) {
    return Violation{"packed input must hold at least one token (T >= 1)", ">= 1", to_text(total)};
  }
  if (total % parts != 0) {
    return Violation{"the token count T must be divisible by the number of ranks P",
                     "a multiple of " + to_text(parts),
                     "T = " + to_text(total) + " (T % P = " + to_text(total % parts) + ")"};
  }
  return std::nullopt;
}

/// Converts typed ids to int32, checking range and order; `ids` receives the converted values.
template <class Integer>
std::optional<Violation> convert_seq_idx(const Integer* data, std::int64_t n,
                                         std::vector<std::int32_t>& ids) {
  ids.clear();
  if (n > 0) ids.reserve(static_cast<std::size_t>(n));
  constexpr auto lo = std::numeric_limits<std::int32_t>::min();
  constexpr auto hi = std::numeric_limits<std::int32_t>::max();
  for (std::int64_t i = 0; i < n; ++i) {
    const Integer v = data[i];
    bool fits = true;
    if constexpr (std::is_signed_v<Integer>) {
      fits = static_cast<long long>(v) >= lo && static_cast<long long>(v) <= hi;
    } else {
      fits = static_cast<unsigned long long>(v) <= static_cast<unsigned long long>(hi);
    }
    if (!fits) {
      return Violation{"sequence ids must be int32 values",
                       "[" + to_text(lo) + ", " + to_text(hi) + "]",
                       to_text(+v) + " at token " + to_text(i)};
    }
    const auto id = static_cast<std::int32_t>(v);
    if (i > 0 && id < ids.back()) {
      return Violation{"sequence ids must be non-decreasing",
                       "seq_idx[" + to_text(i) + "] >= " + to_text(ids.back()),
                       "seq_idx[" + to_text(i) + "] = " + to_text(id)};
    }
    ids.push_back(id);
  }
  return std::nullopt;
}

/// Expands cumulative sequence lengths into per-token ids (sequence `s` gets id `s`; empty
/// sequences simply own no token).
template <class Integer>
std::optional<Violation> expand_cu_seqlens(const std::vector<Integer>& cu,
                                           std::vector<std::int32_t>& ids) {
  static_assert(std::is_integral_v<Integer>, "ctxpar::PackedMetadata: cu_seqlens must be integers");
  ids.clear();
  if (cu.empty() || cu.front() != 0) {
    return Violation{"cu_seqlens must start with 0", "cu_seqlens[0] = 0",
                     cu.empty() ? std::string("an empty cu_seqlens")
                                : "cu_seqlens[0] = " + to_text(+cu.front())};
  }
  if (cu.size() - 1 > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    return Violation{"the number of sequences must fit in int32",
                     "at most " + to_text(std::numeric_limits<std::int32_t>::max()),
                     to_text(cu.size() - 1)};
  }
  for (std::size_t s = 1; s < cu.size(); ++s) {
    if (cu[s] < cu[s - 1]) {
      return Violation{"cu_seqlens must be non-decreasing",
                       "cu_seqlens[" + to_text(s) + "] >= " + to_text(+cu[s - 1]),
                       "cu_seqlens[" + to_text(s) + "] = " + to_text(+cu[s])};
    }
  }
  const auto total = static_cast<long long>(cu.back());
  if (total > (std::int64_t{1} << 40)) {
    return Violation{"cu_seqlens describes an implausibly long input", "at most 2^40 tokens",
                     to_text(total)};
  }
  ids.reserve(static_cast<std::size_t>(total));
  for (std::size_t s = 1; s < cu.size(); ++s) {
    for (auto t = static_cast<long long>(cu[s - 1]); t < static_cast<long long>(cu[s]); ++t) {
      ids.push_back(static_cast<std::int32_t>(s - 1));
    }
  }
  return std::nullopt;
}

}  // namespace impl

/// Packed-sequence context-parallel metadata for all ranks of a contiguous split.
///
/// Input: per-token sequence ids (int32, non-decreasing; a change of id starts a new sequence) of
/// all `T` tokens, split contiguously over `P` ranks with `L = T / P` each (`T % P == 0`, `T >=
/// 1`). Per rank `r` (see `PackedShard`): `first` / `last` are the global extents of the sequences
/// its first / last token belong to, `preceding_rank_start = first / L`, `following_rank_stop =
/// last / L + 1`. A rank's forward summary describes its trailing fragment, its composed incoming
/// state feeds its first local sequence; backward mirrors this (docs/chunkwise.md §3).
///
/// The `*_segment_start` flags are what a segmented scan over ranks needs: a rank whose flag is set
/// resets whatever was composed before it.
class PackedMetadata {
 public:
  /// Default operator name in error messages.
  static constexpr const char* default_op = "ctxpar::PackedMetadata";

  /// Local build from per-token ids; throws a local `Error` (rank -1) on bad input. Any integer
  /// type is accepted, its values must be int32.
  template <class Integer>
  static PackedMetadata from_seq_idx(const std::vector<Integer>& seq_idx, int parts,
                                     const std::string& op = default_op) {
    return from_seq_idx(seq_idx.data(), static_cast<std::int64_t>(seq_idx.size()), parts, op);
  }

  /// Local build from `n` per-token ids at `seq_idx` (host memory).
  template <class Integer>
  static PackedMetadata from_seq_idx(const Integer* seq_idx, std::int64_t n, int parts,
                                     const std::string& op = default_op) {
    static_assert(std::is_integral_v<Integer>,
                  "ctxpar::PackedMetadata: sequence ids must be integers");
    std::vector<std::int32_t> ids;
    auto bad = impl::convert_seq_idx(seq_idx, n, ids);
    if (!bad) bad = impl::check_split(n, parts);
    impl::throw_if_bad(bad, op);
    return PackedMetadata(std::move(ids), parts);
  }

  /// Collective build over `group` (`P = group.size()`): every rank passes the ids of all `T`
  /// tokens; a violation on any rank (including ranks given different ids) makes every rank throw
  /// the same `Error`.
  template <class Integer>
  static PackedMetadata from_seq_idx(const Group& group, const std::vector<Integer>& seq_idx,
                                     const std::string& op = default_op) {
    static_assert(std::is_integral_v<Integer>,
                  "ctxpar::PackedMetadata: sequence ids must be integers");
    std::vector<std::int32_t> ids;
    auto bad =
        impl::convert_seq_idx(seq_idx.data(), static_cast<std::int64_t>(seq_idx.size()), ids);
    if (!bad) bad = impl::check_split(static_cast<std::int64_t>(ids.size()), group.size());
    return agreed(group, std::move(ids), bad, op);
  }

  /// Local build from cumulative sequence lengths `[0, c1, …, T]` (zero-length sequences allowed).
  template <class Integer>
  static PackedMetadata from_cu_seqlens(const std::vector<Integer>& cu_seqlens, int parts,
                                        const std::string& op = default_op) {
    std::vector<std::int32_t> ids;
    auto bad = impl::expand_cu_seqlens(cu_seqlens, ids);
    if (!bad) bad = impl::check_split(static_cast<std::int64_t>(ids.size()), parts);
    impl::throw_if_bad(bad, op);
    return PackedMetadata(std::move(ids), parts);
  }

  /// Collective build from cumulative sequence lengths, as `from_seq_idx(group, …)`.
  template <class Integer>
  static PackedMetadata from_cu_seqlens(const Group& group, const std::vector<Integer>& cu_seqlens,
                                        const std::string& op = default_op) {
    std::vector<std::int32_t> ids;
    auto bad = impl::expand_cu_seqlens(cu_seqlens, ids);
    if (!bad) bad = impl::check_split(static_cast<std::int64_t>(ids.size()), group.size());
    return agreed(group, std::move(ids), bad, op);
  }

  /// Number of ranks `P`.
  int parts() const noexcept { return parts_; }
  /// Total tokens `T`.
  std::int64_t total_length() const noexcept { return static_cast<std::int64_t>(ids_.size()); }
  /// Tokens per rank `L = T / P`.
  std::int64_t local_length() const noexcept { return total_length() / parts_; }
  /// The per-token ids of all tokens.
  const std::vector<std::int32_t>& seq_idx() const noexcept { return ids_; }
  /// Global boundaries of the sequences actually present: `0`, every index where the id changes,
  /// `T`.
  const std::vector<std::int64_t>& cu_seqlens() const noexcept { return starts_; }
  /// Number of (non-empty) sequences.
  int num_sequences() const noexcept { return static_cast<int>(starts_.size()) - 1; }

  /// Global index of the first token of the sequence rank `r`'s first token belongs to.
  std::int64_t first(int r) const { return sequence_begin(sequence_of(begin(r))); }
  /// Global index of the last token of the sequence rank `r`'s last token belongs to.
  std::int64_t last(int r) const {
    return sequence_end(sequence_of(begin(r) + local_length() - 1)) - 1;
  }
  /// `first(r) / L`: the first rank whose forward summary contributes to rank `r`'s incoming state.
  int preceding_rank_start(int r) const { return static_cast<int>(first(r) / local_length()); }
  /// `last(r) / L + 1`: one past the last rank whose backward summary reaches rank `r`.
  int following_rank_stop(int r) const { return static_cast<int>(last(r) / local_length()) + 1; }

  /// Whether rank `r`'s first local sequence began on rank `r - 1` (false on rank 0).
  bool continues_from_previous(int r) const {
    return r > 0 && ids_[idx(begin(r) - 1)] == ids_[idx(begin(r))];
  }
  /// Whether rank `r`'s last local sequence goes on to rank `r + 1` (false on the last rank).
  bool continues_to_next(int r) const {
    return r + 1 < parts_ && ids_[idx(begin(r + 1) - 1)] == ids_[idx(begin(r + 1))];
  }
  /// Whether rank `r`'s first local sequence starts on it, i.e. its incoming state is zero (or the
  /// user's initial state of that sequence).
  bool starts_sequence(int r) const { return !continues_from_previous(r); }
  /// Forward segmented scan flag: rank `r`'s forward summary (its trailing fragment) starts a new
  /// sequence, so the scan restarts at `r`. Equals "the last local sequence begins on rank `r`".
  bool forward_segment_start(int r) const {
    return sequence_begin(sequence_of(begin(r) + local_length() - 1)) >= begin(r);
  }
  /// Backward (reverse-order) segmented scan flag: rank `r`'s backward summary (its leading
  /// fragment) ends its sequence, so the reverse scan restarts at `r`. Equals "the first local
  /// sequence ends on rank `r`".
  bool backward_segment_start(int r) const {
    return sequence_end(sequence_of(begin(r))) <= begin(r) + local_length();
  }
  /// `forward_segment_start(r)` for every rank.
  std::vector<std::uint8_t> forward_segment_starts() const {
    return flags(&PackedMetadata::forward_segment_start);
  }
  /// `backward_segment_start(r)` for every rank.
  std::vector<std::uint8_t> backward_segment_starts() const {
    return flags(&PackedMetadata::backward_segment_start);
  }

  /// Everything rank `r` needs, gathered in one value.
  PackedShard shard(int r) const {
    require_local(r >= 0 && r < parts_, default_op, "the rank must lie in [0, P)",
                  "[0, " + impl::to_text(parts_) + ")", r);
    PackedShard s;
    s.rank = r;
    s.begin = begin(r);
    s.length = local_length();
    s.local_seq_idx.assign(ids_.begin() + s.begin, ids_.begin() + s.begin + s.length);
    s.local_cu_seqlens.push_back(0);
    for (std::int64_t i = 1; i < s.length; ++i) {
      if (s.local_seq_idx[idx(i)] != s.local_seq_idx[idx(i - 1)]) s.local_cu_seqlens.push_back(i);
    }
    s.local_cu_seqlens.push_back(s.length);
    s.first = first(r);
    s.last = last(r);
    s.preceding_rank_start = preceding_rank_start(r);
    s.following_rank_stop = following_rank_stop(r);
    s.continues_from_previous = continues_from_previous(r);
    s.continues_to_next = continues_to_next(r);
    return s;
  }

 private:
  PackedMetadata(std::vector<std::int32_t> ids, int parts) : ids_(std::move(ids)), parts_(parts) {
    starts_.push_back(0);
    for (std::size_t i = 1; i < ids_.size(); ++i) {
      if (ids_[i] != ids_[i - 1]) starts_.push_back(static_cast<std::int64_t>(i));
    }
    starts_.push_back(static_cast<std::int64_t>(ids_.size()));
  }

  static PackedMetadata agreed(const Group& group, std::vector<std::int32_t> ids,
                               const std::optional<impl::Violation>& bad, const std::string& op) {
    impl::agree_on(group, bad, op,
                   {{"the token count T", static_cast<std::int64_t>(ids.size())},
                    {"the sequence ids (fingerprint)", ctxpar::fingerprint(ids)}});
    return PackedMetadata(std::move(ids), group.size());
  }

  static std::size_t idx(std::int64_t i) { return static_cast<std::size_t>(i); }
  std::int64_t begin(int r) const { return static_cast<std::int64_t>(r) * local_length(); }
  // Index of the sequence holding global token t (binary search over the boundaries).
  std::size_t sequence_of(std::int64_t t) const {
    std::size_t lo = 0, hi = starts_.size() - 1;  // starts_[lo] <= t < starts_[hi]
    while (hi - lo > 1) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (starts_[mid] <= t)
        lo = mid;
      else
        hi = mid;
    }
    return lo;
  }
  std::int64_t sequence_begin(std::size_t s) const { return starts_[s]; }
  std::int64_t sequence_end(std::size_t s) const { return starts_[s + 1]; }
  std::vector<std::uint8_t> flags(bool (PackedMetadata::*f)(int) const) const {
    std::vector<std::uint8_t> out(static_cast<std::size_t>(parts_));
    for (int r = 0; r < parts_; ++r) out[idx(r)] = (this->*f)(r) ? 1 : 0;
    return out;
  }

  std::vector<std::int32_t> ids_;
  std::vector<std::int64_t> starts_;
  int parts_ = 1;
};

}  // namespace ctxpar
