/// \file
/// `LocalSequences`: the packed sequences (or fragments of them) inside one contiguous shard, as a
/// chunkwise backend sees them. Host-side only; built by the driver from the packed metadata.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ctxpar/core/error.hpp"
#include "ctxpar/partition/packed_metadata.hpp"

namespace ctxpar::chunkwise {

/// The local sequences of one shard: boundaries, the global ordinal of each (the row of
/// `[N, H, K, V]` initial/final state arrays it uses) and whether the first/last of them continue
/// across the shard's edges.
///
/// The packed-sequence rule of the backend contract: the incoming state `S_in` feeds local sequence
/// 0 only, the outgoing gradient `dS_out` reaches local sequence `count() - 1` only; every other
/// local sequence starts from zero (or its own initial state) and ends locally.
struct LocalSequences {
  /// Local boundaries `0 = c_0 < c_1 < … < c_n = length` (no empty local sequence).
  std::vector<std::int64_t> cu_seqlens{0};
  /// Global ordinal of each local sequence (`n` entries).
  std::vector<std::int32_t> ordinals;
  /// Local sequence 0 began on an earlier shard.
  bool first_continues = false;
  /// Local sequence `n - 1` goes on to a later shard.
  bool last_continues = false;

  /// Number of local sequences `n` (0 for an empty shard).
  int count() const noexcept { return static_cast<int>(cu_seqlens.size()) - 1; }
  /// Tokens in the shard.
  std::int64_t length() const noexcept { return cu_seqlens.back(); }
  /// First local token of sequence `i`.
  std::int64_t begin(int i) const { return cu_seqlens[static_cast<std::size_t>(i)]; }
  /// One past the last local token of sequence `i`.
  std::int64_t end(int i) const { return cu_seqlens[static_cast<std::size_t>(i) + 1]; }
  /// Whether sequence `i` starts in this shard (its initial state applies here).
  bool starts_here(int i) const noexcept { return i > 0 || !first_continues; }
  /// Whether sequence `i` ends in this shard (its final state is produced here).
  bool ends_here(int i) const noexcept { return i + 1 < count() || !last_continues; }

  /// One whole sequence of `length` tokens with ordinal `ordinal`.
  static LocalSequences single(std::int64_t length, std::int32_t ordinal = 0) {
    LocalSequences s;
    s.cu_seqlens = {0, length};
    s.ordinals = {ordinal};
    if (length == 0) s = LocalSequences{};
    return s;
  }

  /// Whole local sequences from local boundaries `cu` (ordinals 0, 1, …), nothing continuing.
  static LocalSequences from_cu_seqlens(std::vector<std::int64_t> cu) {
    LocalSequences s;
    s.cu_seqlens = std::move(cu);
    for (int i = 0; i < s.count(); ++i) s.ordinals.push_back(i);
    s.validate("ctxpar::chunkwise::LocalSequences");
    return s;
  }

  /// The local sequences of rank `shard.rank` described by the foundation's packed metadata.
  static LocalSequences from_packed(const PackedMetadata& meta, const PackedShard& shard) {
    LocalSequences s;
    s.cu_seqlens = shard.local_cu_seqlens;
    const auto& starts = meta.cu_seqlens();
    for (int i = 0; i < s.count(); ++i) {
      const std::int64_t t = shard.begin + s.begin(i);
      const auto it = std::upper_bound(starts.begin(), starts.end(), t);
      s.ordinals.push_back(static_cast<std::int32_t>(it - starts.begin() - 1));
    }
    s.first_continues = shard.continues_from_previous;
    s.last_continues = shard.continues_to_next;
    return s;
  }

  /// Throws a local `Error` (naming `op`) unless the boundaries are well formed.
  void validate(const std::string& op) const {
    require_local(!cu_seqlens.empty() && cu_seqlens.front() == 0, op,
                  "local cu_seqlens must start with 0", 0,
                  cu_seqlens.empty() ? std::string("an empty vector")
                                     : ctxpar::impl::to_text(cu_seqlens.front()));
    for (int i = 0; i < count(); ++i) {
      require_local(
          end(i) > begin(i), op, "local sequences must be non-empty and increasing",
          "cu_seqlens[" + ctxpar::impl::to_text(i + 1) + "] > " + ctxpar::impl::to_text(begin(i)),
          end(i));
    }
    require_local(static_cast<int>(ordinals.size()) == count(), op,
                  "one ordinal per local sequence", count(), ordinals.size());
  }
};

}  // namespace ctxpar::chunkwise
