/// \file
/// The mask of one key tile in the host attention kernels: the tile's key tokens, and the scores
/// a query row may not see set to `masked_score`, by a lane range per row where the window cuts a
/// one-document tile (`window_runs`), pair by pair otherwise.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

#include "ctxpar/expr/mask.hpp"
#include "ctxpar/swa/attention_inputs.hpp"
#include "ctxpar/swa/document_mask.hpp"
#include "ctxpar/swa/impl/attention_tiles.hpp"
#include "ctxpar/swa/impl/host_kernel.hpp"
#include "ctxpar/swa/impl/kernel_math.hpp"
#include "ctxpar/swa/impl/window_range.hpp"

CTXPAR_WIDE_VECTORS_BEGIN
namespace ctxpar::swa::impl {

/// Key tokens and validity of the packed tile starting at local key `j0`; keys outside
/// `[lo, hi)` are invalid.
template <class Scalar, class MemorySpace>
void host_key_tokens(const AttentionInputs<Scalar, MemorySpace>& in, std::int64_t j0,
                     std::int64_t lo, std::int64_t hi, mask::Token* tok, bool* valid) {
  for (int j = 0; j < key_tile; ++j) {
    const std::int64_t g = j0 + j;
    valid[j] = g >= lo && g < hi;
    tok[j] = valid[j] ? key_token(in, g) : mask::Token{0, 0};
  }
}

/// Scores of `rows` rows (in `p`, row stride `key_tile`) set to `masked_score` where the pair is
/// not visible (`visible`); rows past `valid_rows` are masked entirely.
template <class Mask, class T>
void host_mask_rows(const Mask& mask, const WindowRange& range, const mask::Token* qtok, int rows,
                    int valid_rows, const mask::Token* ktok, const bool* kvalid, T* p) {
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < key_tile; ++j)
      if (!(r < valid_rows && kvalid[j] && visible(mask, range, qtok[r], ktok[j])))
        p[r * key_tile + j] = masked_score<T>();
}

/// The visible keys of one key tile as a run of lanes per query row, for `DocumentMask` when the
/// tile's valid keys and the rows all belong to one sequence (`window_runs` returns false
/// otherwise, and the caller evaluates the mask pair by pair). Keys are sorted by position, so
/// the keys row `r` sees are the lanes `[lo[r], hi[r])` that `range` gives; rows past
/// `valid_rows` see none. Masking a lane range in registers gives the same `masked_score` bits
/// as `host_mask_rows`, without the per-pair calls or the round trip through memory.
template <class Mask>
bool window_runs(const Mask& mask, const WindowRange& range, const mask::Token* qtok, int rows,
                 int valid_rows, const mask::Token* ktok, const bool* kvalid, int* lo, int* hi) {
  (void)mask;
  if constexpr (std::is_same_v<Mask, DocumentMask>) {
    int first = 0, end = key_tile;  // the valid keys are one run (an interval of the axis)
    while (first < key_tile && !kvalid[first]) ++first;
    while (end > first && !kvalid[end - 1]) --end;
    if (first == end) return false;
    const std::int32_t id = ktok[first].seq;
    for (int j = first; j < end; ++j)
      if (!kvalid[j] || ktok[j].seq != id) return false;
    for (int r = 0; r < rows && r < valid_rows; ++r)
      if (qtok[r].seq != id) return false;
    const auto lane_pos = [&](std::int64_t j) { return ktok[j].pos; };
    for (int r = 0; r < rows; ++r) {
      if (r >= valid_rows) {
        lo[r] = hi[r] = 0;
        continue;
      }
      std::int64_t a, b;
      range.keys(lane_pos, first, end, qtok[r].pos, qtok[r].pos, a, b);
      lo[r] = static_cast<int>(a);
      hi[r] = static_cast<int>(b);
    }
    return true;
  } else {
    (void)range, (void)qtok, (void)rows, (void)valid_rows, (void)ktok, (void)kvalid, (void)lo,
        (void)hi;
    return false;
  }
}

/// Masks the scores `s` of `Rows` query rows against one key tile in registers: a tile the window
/// cuts (`window_runs`) by a lane range per row, any other mask pair by pair through `p` (scratch
/// of `Rows * key_tile`). Rows past `valid_rows` are masked entirely.
template <int Rows, class Mask, class T, class V, int Vectors>
void host_mask_scores(const Mask& mask, const WindowRange& range, const mask::Token* qtok,
                      int valid_rows, const mask::Token* ktok, const bool* kvalid,
                      V (&s)[Rows][Vectors], T* p) {
  constexpr int nv = Vectors, lanes = simd_lanes<V>, bytes = static_cast<int>(sizeof(V));
  int lo[Rows], hi[Rows];
  if (window_runs(mask, range, qtok, Rows, valid_rows, ktok, kvalid, lo, hi)) {
    alignas(64) T lane_index[key_tile];  // 0, 1, ..., key_tile - 1 (exact in any float type)
    for (int j = 0; j < key_tile; ++j) lane_index[j] = static_cast<T>(j);
    for (int r = 0; r < Rows; ++r)
      for (int c = 0; c < nv; ++c) {
        const V j = simd_load<T, bytes>(lane_index + c * lanes);
        s[r][c] = ((j >= static_cast<T>(lo[r])) & (j < static_cast<T>(hi[r])))
                      ? s[r][c]
                      : simd_broadcast<T, bytes>(masked_score<T>());
      }
  } else {
    for (int r = 0; r < Rows; ++r)
      for (int c = 0; c < nv; ++c) simd_store(p + r * key_tile + c * lanes, s[r][c]);
    host_mask_rows(mask, range, qtok, Rows, valid_rows, ktok, kvalid, p);
    for (int r = 0; r < Rows; ++r)
      for (int c = 0; c < nv; ++c) s[r][c] = simd_load<T, bytes>(p + r * key_tile + c * lanes);
  }
}

}  // namespace ctxpar::swa::impl
CTXPAR_WIDE_VECTORS_END
