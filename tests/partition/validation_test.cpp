// Collective validation of the partition plans: each bad input is given to ONE rank only, at every
// rank count, and every rank must throw the same ctxpar::Error naming that rank.
#include <cstdint>
#include <string>
#include <vector>

#include "ctxpar/partition/packed_metadata.hpp"
#include "ctxpar_test/harness.hpp"

using ctxpar::PackedMetadata;
using ctxpar::test::throws_everywhere;
using ctxpar::test::world;

namespace {
// Valid ids for P ranks: three sequences over 2P tokens, with a boundary inside rank 0's shard
// at P = 1 and on rank borders otherwise.
std::vector<std::int32_t> good_ids(int parts) {
  std::vector<std::int32_t> ids;
  for (int t = 0; t < 2 * parts; ++t) ids.push_back(t < 1 ? 0 : (t < parts + 1 ? 1 : 2));
  return ids;
}
}  // namespace

BOOST_AUTO_TEST_CASE(good_ids_agree_and_build_everywhere) {
  const auto& g = world();
  const PackedMetadata meta = PackedMetadata::from_seq_idx(g, good_ids(g.size()));
  const PackedMetadata local = PackedMetadata::from_seq_idx(good_ids(g.size()), g.size());
  bool ok = meta.parts() == g.size() && meta.local_length() == 2;
  for (int r = 0; r < g.size(); ++r) {
    ok = ok && meta.shard(r).local_cu_seqlens == local.shard(r).local_cu_seqlens &&
         meta.preceding_rank_start(r) == local.preceding_rank_start(r);
  }
  CTXPAR_TEST_ALL(g, ok);
}

BOOST_AUTO_TEST_CASE(decreasing_ids_on_one_rank) {
  const auto& g = world();
  for (int bad = 0; bad < g.size(); ++bad) {
    auto call = [&] {
      auto ids = good_ids(g.size());
      if (g.rank() == bad) ids.back() = -1;
      PackedMetadata::from_seq_idx(g, ids, "ctxpar::chunkwise::forward");
    };
    const auto ids = good_ids(g.size());
    const std::string at = "seq_idx[" + std::to_string(ids.size() - 1) + "]";
    const std::string needle = "ctxpar::chunkwise::forward: on rank " + std::to_string(bad) +
                               ": sequence ids must be non-decreasing (expected " + at + " >= " +
                               std::to_string(ids[ids.size() - 2]) + ", got " + at + " = -1)";
    CTXPAR_TEST_ALL(g, throws_everywhere(g, call, needle, bad));
  }
}

BOOST_AUTO_TEST_CASE(token_count_not_divisible_on_one_rank) {
  const auto& g = world();
  if (g.size() == 1) return;  // every T is divisible by 1; the empty input case below covers np 1
  for (int bad = 0; bad < g.size(); ++bad) {
    auto call = [&] {
      auto ids = good_ids(g.size());
      if (g.rank() == bad) ids.push_back(7);
      PackedMetadata::from_seq_idx(g, ids);
    };
    const std::string needle = "on rank " + std::to_string(bad) +
                               ": the token count T must be divisible by the number of ranks P (expected a multiple of " +
                               std::to_string(g.size()) + ", got T = " + std::to_string(2 * g.size() + 1);
    CTXPAR_TEST_ALL(g, throws_everywhere(g, call, needle, bad));
  }
}

BOOST_AUTO_TEST_CASE(empty_input_on_one_rank) {
  const auto& g = world();
  for (int bad = 0; bad < g.size(); ++bad) {
    auto call = [&] {
      std::vector<int> cu{0, 1, 2 * g.size()};
      if (g.rank() == bad) cu = {0};
      PackedMetadata::from_cu_seqlens(g, cu);
    };
    CTXPAR_TEST_ALL(g, throws_everywhere(g, call, "at least one token (T >= 1) (expected >= 1, got 0)", bad));
  }
}

BOOST_AUTO_TEST_CASE(non_int32_id_on_one_rank) {
  const auto& g = world();
  for (int bad = 0; bad < g.size(); ++bad) {
    auto call = [&] {
      const auto good = good_ids(g.size());
      std::vector<std::int64_t> ids(good.begin(), good.end());
      if (g.rank() == bad) ids.back() = std::int64_t{3} << 32;
      PackedMetadata::from_seq_idx(g, ids);
    };
    CTXPAR_TEST_ALL(g, throws_everywhere(g, call, "sequence ids must be int32 values", bad));
  }
}

BOOST_AUTO_TEST_CASE(different_valid_ids_on_one_rank) {
  const auto& g = world();
  if (g.size() == 1) return;
  for (int bad = 1; bad < g.size(); ++bad) {
    auto call = [&] {
      auto ids = good_ids(g.size());
      if (g.rank() == bad) ids.back() = 9;  // still valid, but not what the others hold
      PackedMetadata::from_seq_idx(g, ids);
    };
    CTXPAR_TEST_ALL(g, throws_everywhere(g, call, "every rank must agree on the sequence ids (fingerprint)", bad));
  }
}
