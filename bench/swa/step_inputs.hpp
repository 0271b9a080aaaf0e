/// \file
/// Deterministic inputs of the SWA benchmarks: values from `(seed, global index)`, so every rank
/// builds its own shard of the same stream without communication, and the shards of one
/// streaming step (cache by `BalancedChunks(c, P)`, chunk by `BalancedChunks(t, P)`).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

#include "ctxpar/swa/swa.hpp"

namespace ctxpar::bench::swa {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Tensor = ctxpar::swa::Tensor<float, Mem>;

/// A value in [-1, 1) from a splitmix64 hash of `(seed, i)`: never all zero, same on every rank.
inline float value(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0);
}

/// Rows `[first, first + n)` of a `[*, h, d]` stream tensor.
inline Tensor random_tensor(std::uint64_t seed, std::int64_t n, std::int64_t h, std::int64_t d,
                            std::int64_t first = 0) {
  Tensor t("bench", n, h, d);
  auto m = Kokkos::create_mirror_view(t);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t a = 0; a < h; ++a)
      for (std::int64_t e = 0; e < d; ++e) m(i, a, e) = value(seed, ((first + i) * h + a) * d + e);
  Kokkos::deep_copy(t, m);
  return t;
}

/// Positions `first, first + 1, …` of `n` tokens.
inline ctxpar::swa::Positions<Mem> iota(std::int64_t n, std::int64_t first) {
  ctxpar::swa::Positions<Mem> p("pos", n);
  auto m = Kokkos::create_mirror_view(p);
  for (std::int64_t i = 0; i < n; ++i) m(i) = first + i;
  Kokkos::deep_copy(p, m);
  return p;
}

/// This rank's shards of one streaming step: a cache of `c` keys and a chunk of `t` tokens.
struct StepInputs {
  ctxpar::swa::Chunk<float, Mem> chunk;  ///< the chunk's q, k, v, positions (no ids)
  ctxpar::swa::Cache<float, Mem> cache;  ///< the carried cache's k, v, positions (no ids)
};

/// Builds rank `rank`'s shards (cache by `BalancedChunks(c, ranks)`, chunk by
/// `BalancedChunks(t, ranks)`); the chunk's positions follow the cache's.
inline StepInputs step_inputs(int rank, int ranks, std::int64_t c, std::int64_t t, std::int64_t hq,
                              std::int64_t hkv, std::int64_t dim) {
  const ctxpar::BalancedChunks cs{c, ranks}, ts{t, ranks};
  StepInputs s;
  s.cache.k = random_tensor(2, cs.size(rank), hkv, dim, cs.begin(rank));
  s.cache.v = random_tensor(3, cs.size(rank), hkv, dim, cs.begin(rank));
  s.cache.pos = iota(cs.size(rank), cs.begin(rank));
  s.cache.ids = ctxpar::swa::Ids<Mem>("ids", 0);
  s.chunk.q = random_tensor(1, ts.size(rank), hq, dim, ts.begin(rank));
  s.chunk.k = random_tensor(2, ts.size(rank), hkv, dim, c + ts.begin(rank));
  s.chunk.v = random_tensor(3, ts.size(rank), hkv, dim, c + ts.begin(rank));
  s.chunk.pos = iota(ts.size(rank), c + ts.begin(rank));
  s.chunk.ids = ctxpar::swa::Ids<Mem>("ids", 0);
  return s;
}

}  // namespace ctxpar::bench::swa
