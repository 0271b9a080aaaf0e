// Independent index oracles for the head transposes: which P = 1 channels each rank should hold
// (written from the layout's definition, not from ChannelLayout::channel_map) and where each token
// sits in sequence-parallel order (the design's closed form, natural → shard position).
#pragma once

#include <cstdint>
#include <vector>

namespace heads_test {

/// Heads of rank j: even split, or the first H % P ranks one more.
inline std::pair<int, int> head_range(int h, int p, int j, bool uneven) {
  if (!uneven) return {j * (h / p), (j + 1) * (h / p)};
  int b = 0;
  for (int r = 0; r < j; ++r) b += h / p + (r < h % p ? 1 : 0);
  return {b, b + h / p + (j < h % p ? 1 : 0)};
}

/// Key groups rank j reads: the groups of its heads.
inline std::pair<int, int> group_range(int h, int g, int p, int j, bool uneven) {
  const auto [hb, he] = head_range(h, p, j, uneven);
  if (hb == he) return {0, 0};
  const int per = h / g;
  std::vector<bool> used(g, false);
  for (int x = hb; x < he; ++x) used[x / per] = true;
  int lo = g, hi = 0;
  for (int x = 0; x < g; ++x)
    if (used[x]) {
      lo = std::min(lo, x);
      hi = x + 1;
    }
  return {lo, hi};
}

/// GDP input channels on rank j: [z | V | K | Q | b | a], copies slowest inside V, K, b.
inline std::vector<std::int64_t> gdp_channels(int h, int d, int g, int n, int m_copies, int p,
                                              int j, bool uneven) {
  const auto [hb, he] = head_range(h, p, j, uneven);
  const auto [gb, ge] = group_range(h, g, p, j, uneven);
  const std::int64_t di = std::int64_t(h) * d;
  const std::int64_t z0 = 0, v0 = di, k0 = v0 + di * m_copies,
                     q0 = k0 + std::int64_t(g) * n * m_copies, b0 = q0 + std::int64_t(g) * n,
                     a0 = b0 + std::int64_t(h) * m_copies;
  std::vector<std::int64_t> out;
  for (std::int64_t c = hb * d; c < he * d; ++c) out.push_back(z0 + c);
  for (int m = 0; m < m_copies; ++m)
    for (std::int64_t c = hb * d; c < he * d; ++c) out.push_back(v0 + m * di + c);
  for (int m = 0; m < m_copies; ++m)
    for (std::int64_t c = std::int64_t(gb) * n; c < std::int64_t(ge) * n; ++c)
      out.push_back(k0 + m * std::int64_t(g) * n + c);
  for (std::int64_t c = std::int64_t(gb) * n; c < std::int64_t(ge) * n; ++c) out.push_back(q0 + c);
  for (int m = 0; m < m_copies; ++m)
    for (int x = hb; x < he; ++x) out.push_back(b0 + std::int64_t(m) * h + x);
  for (int x = hb; x < he; ++x) out.push_back(a0 + x);
  return out;
}

/// Sequence-parallel position (rank-major) of every natural token. Contiguous: identity.
/// ZigzagPerSequence: per sequence (start c, length L, half = L/2P), natural chunk n goes to zigzag
/// chunk z = 2n (n < P) or 4P - 2n - 1, owner z/2, index owner·T/P + c/P + (z mod 2)·half + p mod
/// half.
inline std::vector<std::int64_t> shard_position(std::int64_t t_total, int p, bool zigzag,
                                                const std::vector<std::int64_t>& cu) {
  std::vector<std::int64_t> pos(t_total);
  for (std::int64_t x = 0; x < t_total; ++x) pos[x] = x;
  if (!zigzag) return pos;
  for (std::size_t s = 0; s + 1 < cu.size(); ++s) {
    const std::int64_t c = cu[s], len = cu[s + 1] - cu[s];
    if (len == 0) continue;
    const std::int64_t half = len / (2 * p);
    for (std::int64_t q = 0; q < len; ++q) {
      const std::int64_t n = q / half;
      const std::int64_t z = n < p ? 2 * n : 4 * p - 2 * n - 1;
      pos[c + q] = (z / 2) * (t_total / p) + c / p + (z % 2) * half + q % half;
    }
  }
  return pos;
}

}  // namespace heads_test
