// Packed-sequence CP metadata against a literal scan of the ids, for every split of every small
// input (T = P·L with L <= 40, P <= 8), plus the worked example of docs/partition.md §3 and
// the local (communicator-free) validation errors.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ctxpar/partition/packed_metadata.hpp"
#include "ctxpar_test/harness.hpp"

BOOST_AUTO_TEST_SUITE(packed_metadata)

namespace {

using ctxpar::PackedMetadata;
using ctxpar::PackedShard;
using ids_type = std::vector<std::int32_t>;

// Everything rank r's metadata should say, found by walking the ids one token at a time.
struct Literal {
  std::vector<std::int64_t> cu;
  std::int64_t first, last;
  int preceding, following;
  bool from_previous, to_next, forward_reset, backward_reset;
};

Literal literal_scan(const ids_type& ids, int parts, int r) {
  const std::int64_t t_total = static_cast<std::int64_t>(ids.size());
  const std::int64_t l = t_total / parts;
  const std::int64_t b = r * l, e = b + l;
  Literal out{};
  out.cu.push_back(0);
  for (std::int64_t t = b + 1; t < e; ++t) {
    if (ids[t] != ids[t - 1]) out.cu.push_back(t - b);
  }
  out.cu.push_back(l);
  out.first = b;
  while (out.first > 0 && ids[out.first - 1] == ids[b]) --out.first;
  out.last = e - 1;
  while (out.last + 1 < t_total && ids[out.last + 1] == ids[e - 1]) ++out.last;
  out.preceding = static_cast<int>(out.first / l);
  out.following = static_cast<int>(out.last / l) + 1;
  out.from_previous = b > 0 && ids[b - 1] == ids[b];
  out.to_next = e < t_total && ids[e] == ids[e - 1];
  std::int64_t trailing = e - 1;
  while (trailing > 0 && ids[trailing - 1] == ids[e - 1]) --trailing;
  out.forward_reset = trailing >= b;
  std::int64_t leading = b;
  while (leading + 1 < t_total && ids[leading + 1] == ids[b]) ++leading;
  out.backward_reset = leading < e;
  return out;
}

// Compares one metadata object with the literal scan on every rank; reports the first difference.
bool matches_literal(const PackedMetadata& meta, const ids_type& ids, int parts, std::string& why) {
  const std::int64_t l = static_cast<std::int64_t>(ids.size()) / parts;
  if (meta.parts() != parts || meta.total_length() != static_cast<std::int64_t>(ids.size()) ||
      meta.local_length() != l || meta.seq_idx() != ids) {
    why = "sizes or ids";
    return false;
  }
  for (int r = 0; r < parts; ++r) {
    const Literal want = literal_scan(ids, parts, r);
    const PackedShard s = meta.shard(r);
    const ids_type local(ids.begin() + r * l, ids.begin() + (r + 1) * l);
    auto fail = [&](const std::string& what) {
      why = "rank " + std::to_string(r) + ": " + what;
      return false;
    };
    if (s.rank != r || s.begin != r * l || s.length != l) return fail("extent");
    if (s.local_seq_idx != local) return fail("local_seq_idx");
    if (s.local_cu_seqlens != want.cu) return fail("local_cu_seqlens");
    if (s.num_sequences() != static_cast<int>(want.cu.size()) - 1) return fail("num_sequences");
    if (s.first != want.first || meta.first(r) != want.first) return fail("first");
    if (s.last != want.last || meta.last(r) != want.last) return fail("last");
    if (s.preceding_rank_start != want.preceding || meta.preceding_rank_start(r) != want.preceding)
      return fail("preceding_rank_start");
    if (s.following_rank_stop != want.following || meta.following_rank_stop(r) != want.following)
      return fail("following_rank_stop");
    if (s.continues_from_previous != want.from_previous ||
        meta.starts_sequence(r) == want.from_previous)
      return fail("continues_from_previous");
    if (s.continues_to_next != want.to_next) return fail("continues_to_next");
    if (meta.forward_segment_start(r) != want.forward_reset ||
        (meta.forward_segment_starts()[r] != 0) != want.forward_reset)
      return fail("forward_segment_start");
    if (meta.backward_segment_start(r) != want.backward_reset ||
        (meta.backward_segment_starts()[r] != 0) != want.backward_reset)
      return fail("backward_segment_start");
  }
  // What a segmented scan does with the flags must reproduce the fold ranges of docs/partition.md
  // §3: the nearest reset at or before r-1 is preceding_rank_start(r), the nearest reverse reset at
  // or after r+1 is following_rank_stop(r) - 1.
  for (int r = 0; r < parts; ++r) {
    if (meta.continues_from_previous(r)) {
      int j = r - 1;
      while (j > 0 && !meta.forward_segment_start(j)) --j;
      if (j != meta.preceding_rank_start(r)) {
        why = "forward segmented scan range of rank " + std::to_string(r);
        return false;
      }
    } else if (meta.preceding_rank_start(r) != r) {
      why = "a rank that starts a sequence must have an empty prefix";
      return false;
    }
    if (meta.continues_to_next(r)) {
      int j = r + 1;
      while (j + 1 < parts && !meta.backward_segment_start(j)) ++j;
      if (j != meta.following_rank_stop(r) - 1) {
        why = "backward segmented scan range of rank " + std::to_string(r);
        return false;
      }
    } else if (meta.following_rank_stop(r) != r + 1) {
      why = "a rank that ends a sequence must have an empty suffix";
      return false;
    }
  }
  return true;
}

// Ids from sequence lengths, with non-contiguous, partly negative ids (any non-decreasing int32
// sequence is valid input), and the matching cu_seqlens.
ids_type ids_from_lengths(const std::vector<int>& lengths, std::vector<std::int64_t>& cu) {
  ids_type ids;
  cu.assign(1, 0);
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    for (int k = 0; k < lengths[s]; ++k) ids.push_back(static_cast<std::int32_t>(3 * s) - 7);
    cu.push_back(cu.back() + lengths[s]);
  }
  return ids;
}

bool check_one(const std::vector<int>& lengths, int parts, std::string& why) {
  std::vector<std::int64_t> cu;
  const ids_type ids = ids_from_lengths(lengths, cu);
  const PackedMetadata from_ids = PackedMetadata::from_seq_idx(ids, parts);
  if (!matches_literal(from_ids, ids, parts, why)) return false;
  // from_cu_seqlens numbers the sequences 0, 1, ...: compare against the same lengths renumbered.
  const PackedMetadata from_cu = PackedMetadata::from_cu_seqlens(cu, parts);
  ids_type renumbered;
  for (std::size_t s = 0; s < lengths.size(); ++s)
    renumbered.insert(renumbered.end(), lengths[s], static_cast<std::int32_t>(s));
  if (!matches_literal(from_cu, renumbered, parts, why)) {
    why = "from_cu_seqlens: " + why;
    return false;
  }
  if (from_cu.cu_seqlens() != cu || from_ids.cu_seqlens() != cu ||
      from_ids.num_sequences() != static_cast<int>(lengths.size())) {
    why = "global cu_seqlens";
    return false;
  }
  return true;
}

std::string describe(const std::vector<int>& lengths, int parts) {
  std::string s = "P=" + std::to_string(parts) + " lengths [";
  for (int x : lengths) s += std::to_string(x) + " ";
  return s + "]";
}

}  // namespace

BOOST_AUTO_TEST_CASE(worked_example_of_the_design) {
  // Sequence lengths [5, 4, 7], T = 16, P = 4 (docs/partition.md §3, table).
  const PackedMetadata meta = PackedMetadata::from_cu_seqlens(std::vector<int>{0, 5, 9, 16}, 4);
  const int preceding[] = {0, 0, 1, 2};
  const int following_minus_one[] = {1, 2, 3, 3};
  const std::vector<std::vector<std::int64_t>> cu = {{0, 4}, {0, 1, 4}, {0, 1, 4}, {0, 4}};
  bool ok = meta.local_length() == 4;
  for (int r = 0; r < 4; ++r) {
    const PackedShard s = meta.shard(r);
    ok = ok && s.preceding_rank_start == preceding[r] &&
         s.following_rank_stop - 1 == following_minus_one[r] && s.local_cu_seqlens == cu[r];
  }
  // Rank 1 continues sequence 0 from rank 0; ranks 2 and 3 continue sequences 1 and 2.
  ok = ok && !meta.continues_from_previous(0) && meta.continues_from_previous(1) &&
       meta.continues_from_previous(2) && meta.continues_from_previous(3);
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
  std::string why;
  CTXPAR_TEST_ALL(ctxpar::test::world(), check_one({5, 4, 7}, 4, why));
}

BOOST_AUTO_TEST_CASE(every_composition_of_short_inputs) {
  // Every way to cut T <= 12 tokens into sequences (2^(T-1) compositions), for every P dividing T.
  std::string why;
  bool ok = true;
  for (int t = 1; t <= 12 && ok; ++t) {
    for (std::uint32_t cuts = 0; cuts < (1u << (t - 1)) && ok; ++cuts) {
      std::vector<int> lengths{1};
      for (int i = 1; i < t; ++i) {
        if (cuts & (1u << (i - 1)))
          lengths.push_back(1);
        else
          ++lengths.back();
      }
      for (int p = 1; p <= 8 && ok; ++p) {
        if (t % p != 0) continue;
        ok = check_one(lengths, p, why);
        if (!ok) BOOST_TEST_MESSAGE("failed " << describe(lengths, p) << ": " << why);
      }
    }
  }
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE(random_cuts_of_all_small_splits) {
  // Every P <= 8 and L <= 40, with deterministic cut sets of several densities (boundaries land
  // on, just before and just after rank borders by enumeration below and by chance here).
  std::string why;
  bool ok = true;
  std::uint64_t seed = 1;
  for (int p = 1; p <= 8 && ok; ++p) {
    for (int l = 1; l <= 40 && ok; ++l) {
      const int t = p * l;
      for (int variant = 0; variant < 6 && ok; ++variant, ++seed) {
        const double density = (variant + 1) / 8.0;
        std::vector<int> lengths{1};
        for (int i = 1; i < t; ++i) {
          const double u = 0.5 * (ctxpar::test::uniform(seed, i) + 1.0);
          if (u < density)
            lengths.push_back(1);
          else
            ++lengths.back();
        }
        ok = check_one(lengths, p, why);
        if (!ok) BOOST_TEST_MESSAGE("failed " << describe(lengths, p) << ": " << why);
      }
      // One boundary at each offset -1, 0, +1 of every rank border.
      for (int border = 1; border < p && ok; ++border) {
        for (int d = -1; d <= 1 && ok; ++d) {
          const int cut = border * l + d;
          if (cut <= 0 || cut >= t) continue;
          ok = check_one({cut, t - cut}, p, why);
          if (!ok) BOOST_TEST_MESSAGE("failed " << describe({cut, t - cut}, p) << ": " << why);
        }
      }
    }
  }
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE(zero_length_sequences_in_cu_seqlens_vanish) {
  const PackedMetadata with_empty =
      PackedMetadata::from_cu_seqlens(std::vector<long>{0, 0, 3, 3, 3, 8, 8}, 2);
  const PackedMetadata without = PackedMetadata::from_cu_seqlens(std::vector<long>{0, 3, 8}, 2);
  bool ok = with_empty.num_sequences() == 2 && with_empty.cu_seqlens() == without.cu_seqlens();
  for (int r = 0; r < 2; ++r)
    ok = ok && with_empty.shard(r).local_cu_seqlens == without.shard(r).local_cu_seqlens;
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

namespace {
template <class F>
bool local_error(F&& f, const std::string& needle) {
  try {
    f();
  } catch (const ctxpar::Error& e) {
    const bool ok = e.rank() == -1 && std::string(e.what()).find(needle) != std::string::npos &&
                    e.op() == PackedMetadata::default_op;
    if (!ok) BOOST_TEST_MESSAGE("unexpected message: " << e.what());
    return ok;
  }
  BOOST_TEST_MESSAGE("no ctxpar::Error for '" << needle << "'");
  return false;
}
}  // namespace

BOOST_AUTO_TEST_CASE(local_validation_errors_name_expected_and_actual) {
  bool ok = true;
  ok &= local_error(
      [] {
        PackedMetadata::from_seq_idx(ids_type{0, 0, 1, 0}, 2);
      },
      "sequence ids must be non-decreasing (expected seq_idx[3] >= 1, got seq_idx[3] = 0)");
  ok &= local_error(
      [] {
        PackedMetadata::from_seq_idx(ids_type{0, 0, 1, 1, 1, 2}, 4);
      },
      "T must be divisible by the number of ranks P (expected a multiple of 4, got T = 6 (T % P = "
      "2))");
  ok &= local_error([] { PackedMetadata::from_seq_idx(ids_type{}, 1); },
                    "at least one token (T >= 1)");
  ok &= local_error(
      [] {
        PackedMetadata::from_seq_idx(std::vector<std::int64_t>{0, 1, std::int64_t{1} << 31, 5}, 1);
      },
      "sequence ids must be int32 values (expected [-2147483648, 2147483647], got 2147483648 at "
      "token 2)");
  ok &= local_error(
      [] {
        PackedMetadata::from_seq_idx(std::vector<std::uint32_t>{0, 4000000000u}, 1);
      },
      "got 4000000000 at token 1");
  ok &= local_error(
      [] {
        PackedMetadata::from_cu_seqlens(std::vector<int>{1, 4}, 1);
      },
      "cu_seqlens must start with 0");
  ok &= local_error(
      [] {
        PackedMetadata::from_cu_seqlens(std::vector<int>{0, 5, 3, 8}, 1);
      },
      "cu_seqlens must be non-decreasing (expected cu_seqlens[2] >= 5, got cu_seqlens[2] = 3)");
  ok &= local_error([] { PackedMetadata::from_cu_seqlens(std::vector<int>{0}, 1); }, "T >= 1");
  ok &= local_error([] { PackedMetadata::from_cu_seqlens(std::vector<int>{0, 3, 7}, 2); }, "T = 7");
  ok &= local_error(
      [] {
        PackedMetadata::from_seq_idx(ids_type{0, 1}, 2).shard(2);
      },
      "the rank must lie in [0, P)");
  // int64 ids that fit are accepted and equal their int32 twins.
  ok &= PackedMetadata::from_seq_idx(std::vector<std::int64_t>{-3, -3, 9, 9}, 2).seq_idx() ==
        ids_type{-3, -3, 9, 9};
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_SUITE_END()
