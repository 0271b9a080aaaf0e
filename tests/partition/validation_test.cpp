// Collective validation of the partition plans: each bad input is given to ONE rank only, at every
// rank count, and every rank must throw the same ctxpar::Error naming that rank.
#include <cstdint>
#include <string>
#include <vector>

#include "ctxpar/partition/head_partition.hpp"
#include "ctxpar/partition/packed_metadata.hpp"
#include "ctxpar/partition/zigzag.hpp"
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
                               ": sequence ids must be non-decreasing (expected " + at +
                               " >= " + std::to_string(ids[ids.size() - 2]) + ", got " + at +
                               " = -1)";
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
    const std::string needle =
        "on rank " + std::to_string(bad) +
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
    CTXPAR_TEST_ALL(
        g, throws_everywhere(g, call, "at least one token (T >= 1) (expected >= 1, got 0)", bad));
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
    CTXPAR_TEST_ALL(
        g,
        throws_everywhere(g, call, "every rank must agree on the sequence ids (fingerprint)", bad));
  }
}

BOOST_AUTO_TEST_CASE(dense_zigzag_length_on_one_rank) {
  const auto& g = world();
  const std::int64_t two_p = 2 * g.size();
  const auto layout = ctxpar::ZigzagLayout::create(g, 3 * two_p);
  CTXPAR_TEST_ALL(g, layout.parts() == g.size() && layout.chunk() == 3);
  for (int bad = 0; bad < g.size(); ++bad) {
    auto call = [&] {
      ctxpar::ZigzagLayout::create(g, g.rank() == bad ? 3 * two_p + 1 : 3 * two_p,
                                   "ctxpar::heads::to_head_parallel");
    };
    const std::string needle =
        "ctxpar::heads::to_head_parallel: on rank " + std::to_string(bad) +
        ": the zigzag layout needs a sequence length that is a positive multiple of 2P (expected "
        "a positive multiple of " +
        std::to_string(two_p) + ", got " + std::to_string(3 * two_p + 1) + ")";
    CTXPAR_TEST_ALL(g, throws_everywhere(g, call, needle, bad));
  }
  for (int bad = 1; bad < g.size(); ++bad) {
    auto call = [&] { ctxpar::ZigzagLayout::create(g, g.rank() == bad ? 4 * two_p : 3 * two_p); };
    CTXPAR_TEST_ALL(
        g, throws_everywhere(g, call, "every rank must agree on the sequence length", bad));
  }
}

BOOST_AUTO_TEST_CASE(packed_zigzag_length_on_one_rank) {
  const auto& g = world();
  const int two_p = 2 * g.size();
  for (int bad = 0; bad < g.size(); ++bad) {
    auto call = [&] {
      std::vector<int> cu{0, two_p, 3 * two_p, 4 * two_p};
      if (g.rank() == bad) cu[2] += 1;  // sequence 1 gets 2·2P + 1 tokens, sequence 2 gets 2P - 1
      ctxpar::ZigzagPerSequenceLayout<>::create(g, cu);
    };
    const std::string needle = "on rank " + std::to_string(bad) +
                               ": every packed sequence length must be divisible by 2P for the "
                               "zigzag layout (sequence 1 has "
                               "length " +
                               std::to_string(2 * two_p + 1) + ")";
    CTXPAR_TEST_ALL(g, throws_everywhere(g, call, needle, bad));
  }
  for (int bad = 1; bad < g.size(); ++bad) {
    auto call = [&] {
      std::vector<int> cu{0, two_p, 3 * two_p};
      if (g.rank() == bad) cu = {0, 2 * two_p, 3 * two_p};  // valid, but not what the others hold
      ctxpar::ZigzagPerSequenceLayout<>::create(g, cu);
    };
    CTXPAR_TEST_ALL(
        g, throws_everywhere(g, call, "every rank must agree on cu_seqlens (fingerprint)", bad));
  }
}

BOOST_AUTO_TEST_CASE(head_counts_on_one_rank) {
  const auto& g = world();
  const int p = g.size();
  // Valid everywhere: ngroups < P (repeat) or ngroups == P.
  const auto kp = ctxpar::KeyGroupPartition::create(g, 2 * p, 1);
  CTXPAR_TEST_ALL(g, kp.size(g.rank()) == 1 && kp.begin(g.rank()) == 0 && kp.repeat() == p);
  for (int bad = 0; bad < g.size(); ++bad) {
    // nheads not a multiple of ngroups on one rank (applies at every P).
    auto groups = [&] {
      ctxpar::KeyGroupPartition::create(g, 2 * p, g.rank() == bad ? 4 * p + 1 : 1);
    };
    CTXPAR_TEST_ALL(
        g,
        throws_everywhere(g, groups,
                          "on rank " + std::to_string(bad) +
                              ": the number of heads must be divisible by the number of key groups",
                          bad));
    if (p > 1) {
      auto heads = [&] { ctxpar::HeadPartition::create(g, g.rank() == bad ? 2 * p + 1 : 2 * p); };
      CTXPAR_TEST_ALL(
          g, throws_everywhere(
                 g, heads,
                 "on rank " + std::to_string(bad) +
                     ": the number of heads must be divisible by the number of ranks P (or "
                     "choose ctxpar::UnevenHeads) (expected a multiple of P = " +
                     std::to_string(p) + ", got nheads = " + std::to_string(2 * p + 1) + ")",
                 bad));
      // The uneven policy accepts the same count, but every rank must agree on it.
      auto disagree = [&] {
        ctxpar::HeadPartition::create(g, g.rank() == bad ? 2 * p + 1 : 2 * p,
                                      ctxpar::UnevenHeads{});
      };
      if (bad > 0) {
        CTXPAR_TEST_ALL(
            g, throws_everywhere(g, disagree, "every rank must agree on the number of heads", bad));
      }
    }
  }
}
