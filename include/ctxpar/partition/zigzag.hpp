/// \file
/// Token layouts over ranks: contiguous and zigzag (load-balanced for causal attention), dense and
/// packed, with the undo/redo permutations between natural and zigzag order (docs/partition.md
/// §2; docs/heads.md §3 applies them around the sequence ↔ head all-to-all).
///
/// Every layout maps a token's natural (global, in-sequence) index to its position in *layout
/// order*: the concatenation of all ranks' local shards in rank order, `position = rank · L +
/// local`. That is also the order in which an all-to-all that gathers the shards of all ranks in
/// rank order delivers the full sequence, so the same maps undo/redo the zigzag after such a
/// transpose (e.g. for P = 3 the rows arrive as chunks `1 6 2 5 3 4` and undo yields `1 2 3 4 5
/// 6`).
///
/// Index maps are `KOKKOS_INLINE_FUNCTION` and pure arithmetic (the packed layout binary-searches
/// its `cu_seqlens` view), so kernels may call them.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "ctxpar/comm/group.hpp"
#include "ctxpar/comm/impl/violation.hpp"
#include "ctxpar/core/compat.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/fingerprint.hpp"
#include "ctxpar/core/host_mirror.hpp"
#include "ctxpar/core/impl/one_of.hpp"
#include "ctxpar/core/view_checks.hpp"
#include "ctxpar/core/workspace.hpp"
#include "ctxpar/partition/balanced_chunks.hpp"

namespace ctxpar {

/// Layout tag: rank `r` holds one contiguous shard (`torch.chunk` rule, see `BalancedChunks`).
struct Contiguous {};
/// Layout tag: the whole token axis (a packed batch included, sequence boundaries ignored) is cut
/// into `2P` chunks and rank `r` holds chunks `r` and `2P-1-r`, in that order (`ZigzagLayout`; the
/// chunkwise `SequenceLayout` and `ShortConvPlan`).
struct Zigzag {};
/// Layout tag: every sequence of a packed batch is cut into `2P` chunks on its own and rank `r`
/// holds chunks `r` and `2P-1-r` of each, sequence after sequence (`ZigzagPerSequenceLayout`; the
/// head transposes). For a single sequence it is the same layout as `Zigzag`.
struct ZigzagPerSequence {};

/// True for the whole-axis token layout tags (`Contiguous`, `Zigzag`).
template <class T>
inline constexpr bool is_token_layout_v = impl::is_one_of_v<T, Contiguous, Zigzag>;

/// Zigzag position (0-based, in rank order) of natural chunk `n` of `2P`: `2n` for `n < P`,
/// `4P - 2n - 1` otherwise.
KOKKOS_INLINE_FUNCTION std::int64_t zigzag_chunk_position(std::int64_t n, int parts) {
  return n < parts ? 2 * n : 4 * static_cast<std::int64_t>(parts) - 2 * n - 1;
}

/// Natural chunk at zigzag position `z` of `2P` (inverse of `zigzag_chunk_position`): even
/// positions hold chunk `z / 2`, odd ones chunk `2P - 1 - z / 2`.
KOKKOS_INLINE_FUNCTION std::int64_t zigzag_natural_chunk(std::int64_t z, int parts) {
  return z % 2 == 0 ? z / 2 : 2 * static_cast<std::int64_t>(parts) - 1 - z / 2;
}

/// The contiguous layout as a (trivial) permutation, so code can be written once for both layouts.
/// Shards follow `BalancedChunks` (uneven and empty shards allowed).
struct ContiguousLayout {
  using layout_tag = Contiguous;  ///< which layout this is
  BalancedChunks chunks;          ///< the shard rule

  /// Layout over `length` tokens and `parts` ranks.
  static ContiguousLayout create(std::int64_t length, int parts) {
    require_local(length >= 0 && parts >= 1, "ctxpar::ContiguousLayout",
                  "the length must be >= 0 and P >= 1", ">= 0 tokens, >= 1 rank",
                  "length " + impl::to_text(length) + ", P " + impl::to_text(parts));
    return ContiguousLayout{BalancedChunks{length, parts}};
  }
  /// Total tokens.
  KOKKOS_INLINE_FUNCTION std::int64_t length() const { return chunks.length; }
  /// Number of ranks.
  KOKKOS_INLINE_FUNCTION int parts() const { return chunks.parts; }
  /// Tokens held by rank `r`.
  KOKKOS_INLINE_FUNCTION std::int64_t local_length(int r) const { return chunks.size(r); }
  /// Rank holding natural token `i`.
  KOKKOS_INLINE_FUNCTION int owner(std::int64_t i) const { return chunks.owner(i); }
  /// Index of natural token `i` in its owner's shard.
  KOKKOS_INLINE_FUNCTION std::int64_t local_index(std::int64_t i) const {
    return i - chunks.begin(owner(i));
  }
  /// Position in layout order of natural token `i` (the identity).
  KOKKOS_INLINE_FUNCTION std::int64_t to_layout(std::int64_t i) const { return i; }
  /// Natural index of the token at layout position `q` (the identity).
  KOKKOS_INLINE_FUNCTION std::int64_t to_natural(std::int64_t q) const { return q; }
  /// Natural index of local token `j` of rank `r`.
  KOKKOS_INLINE_FUNCTION std::int64_t global_index(int r, std::int64_t j) const {
    return chunks.begin(r) + j;
  }
};

namespace impl {
/// The dense zigzag layout's precondition: `length` is a positive multiple of `2 * parts`.
inline std::optional<Violation> check_dense_zigzag(std::int64_t length, int parts) {
  if (parts < 1) return Violation{"the number of ranks must be positive", ">= 1", to_text(parts)};
  const std::int64_t two_p = 2 * static_cast<std::int64_t>(parts);
  if (length < two_p || length % two_p != 0) {
    return Violation{"the zigzag layout needs a sequence length that is a positive multiple of 2P",
                     "a positive multiple of " + to_text(two_p), to_text(length)};
  }
  return std::nullopt;
}

/// The maps every zigzag layout derives from its `to_layout` / `to_natural` permutation: its
/// shards are equal (`Layout::local_length()` on every rank), so layout position `q` is local
/// token `q % L` of rank `q / L`.
template <class Layout>
struct EqualShardMaps {
  /// Rank holding natural token `i`.
  KOKKOS_INLINE_FUNCTION int owner(std::int64_t i) const {
    return static_cast<int>(self().to_layout(i) / self().local_length());
  }
  /// Index of natural token `i` in its owner's shard.
  KOKKOS_INLINE_FUNCTION std::int64_t local_index(std::int64_t i) const {
    return self().to_layout(i) % self().local_length();
  }
  /// Natural index of local token `j` of rank `r`.
  KOKKOS_INLINE_FUNCTION std::int64_t global_index(int r, std::int64_t j) const {
    return self().to_natural(r * self().local_length() + j);
  }

 private:
  KOKKOS_INLINE_FUNCTION const Layout& self() const { return static_cast<const Layout&>(*this); }
};

}  // namespace impl

/// Dense zigzag layout: `T` tokens (a positive multiple of `2P`), chunk `C = T / (2P)`, every rank
/// holds `2C` tokens: natural chunk `r` then natural chunk `2P-1-r`.
struct ZigzagLayout : impl::EqualShardMaps<ZigzagLayout> {
  using layout_tag = Zigzag;  ///< which layout this is
  std::int64_t total = 0;     ///< total tokens `T`
  int nparts = 1;             ///< ranks `P`

  /// Local build; throws a local `Error` unless `length` is a positive multiple of `2 * parts`.
  static ZigzagLayout create(std::int64_t length, int parts,
                             const std::string& op = "ctxpar::ZigzagLayout") {
    impl::throw_if_bad(impl::check_dense_zigzag(length, parts), op);
    return ZigzagLayout{{}, length, parts};
  }
  /// Collective build over `group` (`P = group.size()`); every rank throws the same `Error` if the
  /// length is bad on any rank or differs between ranks.
  static ZigzagLayout create(const Group& group, std::int64_t length,
                             const std::string& op = "ctxpar::ZigzagLayout") {
    impl::agree_on(group, impl::check_dense_zigzag(length, group.size()), op,
                   {{"the sequence length", length}});
    return ZigzagLayout{{}, length, group.size()};
  }

  /// Total tokens.
  KOKKOS_INLINE_FUNCTION std::int64_t length() const { return total; }
  /// Number of ranks.
  KOKKOS_INLINE_FUNCTION int parts() const { return nparts; }
  /// Tokens per chunk, `T / (2P)`.
  KOKKOS_INLINE_FUNCTION std::int64_t chunk() const {
    return total / (2 * static_cast<std::int64_t>(nparts));
  }
  /// Tokens held by rank `r` (the same on every rank).
  KOKKOS_INLINE_FUNCTION std::int64_t local_length(int = 0) const { return 2 * chunk(); }
  /// Position in layout order of natural token `i`.
  KOKKOS_INLINE_FUNCTION std::int64_t to_layout(std::int64_t i) const {
    const std::int64_t c = chunk();
    return zigzag_chunk_position(i / c, nparts) * c + i % c;
  }
  /// Natural index of the token at layout position `q`.
  KOKKOS_INLINE_FUNCTION std::int64_t to_natural(std::int64_t q) const {
    const std::int64_t c = chunk();
    return zigzag_natural_chunk(q / c, nparts) * c + q % c;
  }
};

/// The per-sequence zigzag layout of a packed ("THD") batch: every sequence is zigzagged on its
/// own. Sequence `s` with start `c_s` and length `L_s` (each a multiple of `2P`) is cut into `2P`
/// chunks of `half = L_s / (2P)`; rank `r`'s shard is, for each sequence in order, its natural
/// chunks `r` and `2P-1-r`. Every rank therefore holds `T / P` tokens with the same local sequence
/// boundaries `c_s / P`.
///
/// Closed form (docs/partition.md §2): position `p` of sequence `s` has natural chunk `n = p /
/// half`, zigzag chunk `z = zigzag_chunk_position(n)`, owner `z / 2`, layout position
/// `owner · (T/P) + c_s / P + (z mod 2) · half + (p mod half)`.
///
/// Holds `cu_seqlens` in a view of `MemorySpace` (and nothing host-only), so the layout can be
/// copied into kernels of that space; copies are cheap (the view is shared).
template <class MemorySpace = Kokkos::HostSpace>
class ZigzagPerSequenceLayout : public impl::EqualShardMaps<ZigzagPerSequenceLayout<MemorySpace>> {
 public:
  using layout_tag = ZigzagPerSequence;  ///< which layout this is
  using memory_space = MemorySpace;      ///< where `cu_seqlens` lives

  ZigzagPerSequenceLayout() = default;

  /// Local build from `cu_seqlens = [0, c_1, …, T]`; throws a local `Error` naming the first
  /// sequence whose length is not a multiple of `2P`.
  template <class Integer>
  static ZigzagPerSequenceLayout create(const std::vector<Integer>& cu_seqlens, int parts,
                                        const std::string& op = "ctxpar::ZigzagPerSequenceLayout") {
    impl::throw_if_bad(check(cu_seqlens, parts), op);
    return ZigzagPerSequenceLayout(cu_seqlens, parts);
  }
  /// Collective build over `group`; every rank throws the same `Error` if any rank's input is bad
  /// or the ranks disagree on `cu_seqlens`.
  template <class Integer>
  static ZigzagPerSequenceLayout create(const Group& group, const std::vector<Integer>& cu_seqlens,
                                        const std::string& op = "ctxpar::ZigzagPerSequenceLayout") {
    impl::agree_on(group, check(cu_seqlens, group.size()), op,
                   {{"cu_seqlens (fingerprint)", ctxpar::fingerprint(cu_seqlens)}});
    return ZigzagPerSequenceLayout(cu_seqlens, group.size());
  }

  /// Total tokens.
  KOKKOS_INLINE_FUNCTION std::int64_t length() const { return total_; }
  /// Number of ranks.
  KOKKOS_INLINE_FUNCTION int parts() const { return nparts_; }
  /// Number of sequences (zero-length ones included).
  KOKKOS_INLINE_FUNCTION std::int64_t num_sequences() const {
    return static_cast<std::int64_t>(cu_.extent(0)) - 1;
  }
  /// Tokens held by rank `r` (the same on every rank), `T / P`.
  KOKKOS_INLINE_FUNCTION std::int64_t local_length(int = 0) const { return total_ / nparts_; }
  /// The global `cu_seqlens`, in `MemorySpace`.
  Kokkos::View<const std::int64_t*, MemorySpace> cu_seqlens() const { return cu_; }
  /// Local sequence boundaries, identical on every rank: `c_s / P` (host copy).
  std::vector<std::int64_t> local_cu_seqlens() const {
    auto host = ctxpar::impl::host_copy(cu_);
    std::vector<std::int64_t> local(host.extent(0));
    for (std::size_t s = 0; s < local.size(); ++s) local[s] = host(s) / nparts_;
    return local;
  }

  /// Position in layout order of natural token `i`.
  KOKKOS_INLINE_FUNCTION std::int64_t to_layout(std::int64_t i) const {
    const std::int64_t s = sequence_of(i);
    const std::int64_t start = cu_(s);
    const std::int64_t half = (cu_(s + 1) - start) / (2 * static_cast<std::int64_t>(nparts_));
    const std::int64_t p = i - start;
    const std::int64_t z = zigzag_chunk_position(p / half, nparts_);
    return (z / 2) * local_length() + start / nparts_ + (z % 2) * half + p % half;
  }
  /// Natural index of the token at layout position `q`.
  KOKKOS_INLINE_FUNCTION std::int64_t to_natural(std::int64_t q) const {
    const std::int64_t r = q / local_length();
    const std::int64_t local = q % local_length();
    // Local boundaries are c_s / P: find the sequence whose local range holds `local`.
    std::int64_t lo = 0, hi = num_sequences();  // cu_(lo)/P <= local < cu_(hi)/P
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (cu_(mid) / nparts_ <= local)
        lo = mid;
      else
        hi = mid;
    }
    const std::int64_t start = cu_(lo);
    const std::int64_t half = (cu_(lo + 1) - start) / (2 * static_cast<std::int64_t>(nparts_));
    const std::int64_t offset = local - start / nparts_;
    const std::int64_t n = zigzag_natural_chunk(2 * r + offset / half, nparts_);
    return start + n * half + offset % half;
  }

 private:
  template <class Integer>
  static std::optional<impl::Violation> check(const std::vector<Integer>& cu, int parts) {
    static_assert(std::is_integral_v<Integer>,
                  "ctxpar::ZigzagPerSequenceLayout: cu_seqlens must be integers");
    if (parts < 1)
      return impl::Violation{"the number of ranks must be positive", ">= 1", impl::to_text(parts)};
    if (cu.size() < 2 || cu.front() != 0) {
      return impl::Violation{"cu_seqlens must start with 0 and hold at least one sequence",
                             "[0, c_1, ..., T]",
                             cu.empty() ? std::string("an empty list")
                                        : "cu_seqlens[0] = " + impl::to_text(+cu.front()) +
                                              " with " + impl::to_text(cu.size()) + " entries"};
    }
    const std::int64_t two_p = 2 * static_cast<std::int64_t>(parts);
    for (std::size_t s = 0; s + 1 < cu.size(); ++s) {
      const auto len = static_cast<std::int64_t>(cu[s + 1]) - static_cast<std::int64_t>(cu[s]);
      if (len < 0) {
        return impl::Violation{
            "cu_seqlens must be non-decreasing",
            "cu_seqlens[" + impl::to_text(s + 1) + "] >= " + impl::to_text(+cu[s]),
            "cu_seqlens[" + impl::to_text(s + 1) + "] = " + impl::to_text(+cu[s + 1])};
      }
      if (len % two_p != 0) {
        return impl::Violation{
            "every packed sequence length must be divisible by 2P for the zigzag layout "
            "(sequence " +
                impl::to_text(s) + " has length " + impl::to_text(len) + ")",
            "a multiple of " + impl::to_text(two_p),
            "length " + impl::to_text(len) + " of sequence " + impl::to_text(s)};
      }
    }
    if (cu.back() <= 0) {
      return impl::Violation{"packed input must hold at least one token", "T >= 1",
                             impl::to_text(+cu.back())};
    }
    return std::nullopt;
  }

  template <class Integer>
  ZigzagPerSequenceLayout(const std::vector<Integer>& cu, int parts)
      : total_(static_cast<std::int64_t>(cu.back())), nparts_(parts) {
    impl::upload(std::vector<std::int64_t>(cu.begin(), cu.end()), cu_,
                 "ctxpar::partition::zigzag_cu_seqlens");
  }

  // The sequence holding natural token i: the last s with cu_(s) <= i, skipping empty sequences.
  KOKKOS_INLINE_FUNCTION std::int64_t sequence_of(std::int64_t i) const {
    std::int64_t lo = 0, hi = num_sequences();  // cu_(lo) <= i < cu_(hi)
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (cu_(mid) <= i)
        lo = mid;
      else
        hi = mid;
    }
    return lo;
  }

  Kokkos::View<std::int64_t*, MemorySpace> cu_;
  std::int64_t total_ = 0;
  int nparts_ = 1;
};

namespace impl {

// Copies rows: out row `i` = in row `source(i)`; `to_natural` selects the direction.
template <class Layout, class In, class Out, bool ToNatural>
struct PermuteRows {
  Layout layout;
  In in;
  Out out;
  std::int64_t cols;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t flat) const {
    const std::int64_t row = flat / cols, col = flat % cols;
    const std::int64_t source = ToNatural ? layout.to_layout(row) : layout.to_natural(row);
    if constexpr (compat::view_rank<Out> == 1) {
      out(row) = in(source);
    } else {
      out(row, col) = in(source, col);
    }
  }
};

template <bool ToNatural, class ExecutionSpace, class Layout, class In, class Out>
void permute_rows(const ExecutionSpace& space, const Layout& layout, const In& in, const Out& out,
                  const std::string& api) {
  static_assert(compat::view_rank<In> == compat::view_rank<Out> &&
                    (compat::view_rank<In> == 1 || compat::view_rank<In> == 2),
                "ctxpar::undo_zigzag/redo_zigzag: in and out must both be rank-1 or both rank-2 "
                "views (rows = tokens)");
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::undo_zigzag/redo_zigzag", ExecutionSpace, In);
  CTXPAR_ASSERT_ACCESSIBLE("ctxpar::undo_zigzag/redo_zigzag", ExecutionSpace, Out);
  const std::int64_t rows = static_cast<std::int64_t>(in.extent(0));
  const std::int64_t cols =
      compat::view_rank<In> == 2 ? static_cast<std::int64_t>(in.extent(1)) : 1;
  require_local(rows == layout.length(), api, "the views must hold one row per token of the layout",
                layout.length(), rows);
  require_local(out.extent(0) == in.extent(0) &&
                    (compat::view_rank<In> == 1 || out.extent(1) == in.extent(1)),
                api, "out must have the extents of in", impl::to_text(in.extent(0)) + " rows",
                impl::to_text(out.extent(0)) + " rows");
  require_local(in.data() == nullptr || in.data() != out.data(), api, "in and out must not alias",
                "distinct views", "the same memory");
  if (rows * cols == 0) return;
  Kokkos::parallel_for(
      api,
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows * cols),
      PermuteRows<Layout, In, Out, ToNatural>{layout, in, out, cols});
}

}  // namespace impl

/// Undo: `in` holds a whole sequence in layout order (rows = tokens, e.g. what an all-to-all
/// gathering every rank's shard in rank order delivers); `out` receives it in natural order,
/// `out(i) = in(layout.to_layout(i))`. Asynchronous on `space`; `in` and `out` must not alias.
template <class ExecutionSpace, class Layout, class In, class Out>
void undo_zigzag(const ExecutionSpace& space, const Layout& layout, const In& in, const Out& out) {
  impl::permute_rows<true>(space, layout, in, out, "ctxpar::partition::undo_zigzag");
}

/// Redo: the inverse of `undo_zigzag`, natural order → layout order, `out(q) =
/// in(layout.to_natural(q))`. Asynchronous on `space`; `in` and `out` must not alias.
template <class ExecutionSpace, class Layout, class In, class Out>
void redo_zigzag(const ExecutionSpace& space, const Layout& layout, const In& in, const Out& out) {
  impl::permute_rows<false>(space, layout, in, out, "ctxpar::partition::redo_zigzag");
}

}  // namespace ctxpar
