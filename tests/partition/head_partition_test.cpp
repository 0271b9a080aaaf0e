// Head and key-group partitions against literal dealing of heads and literal lookup of the groups
// each rank's heads use, for nheads <= 40, every divisor ngroups, P <= 8, both policies.
#include <set>
#include <string>
#include <vector>

#include "ctxpar/partition/head_partition.hpp"
#include "ctxpar_test/harness.hpp"

BOOST_AUTO_TEST_SUITE(head_partition)

namespace {

// The first nheads % P ranks get one head more; heads are dealt out in order.
std::vector<int> literal_owner(int nheads, int parts) {
  std::vector<int> owner;
  for (int r = 0; r < parts; ++r) {
    const int n = nheads / parts + (r < nheads % parts ? 1 : 0);
    owner.insert(owner.end(), n, r);
  }
  return owner;
}

bool head_partition_matches(const ctxpar::HeadPartition& hp, int nheads, int parts,
                            std::string& why) {
  const std::vector<int> owner = literal_owner(nheads, parts);
  for (int h = 0; h < nheads; ++h) {
    if (hp.owner(h) != owner[h]) {
      why = "owner of head " + std::to_string(h);
      return false;
    }
  }
  const auto counts = hp.counts(7);
  int sum = 0;
  for (int r = 0; r < parts; ++r) {
    int n = 0, first = -1;
    for (int h = 0; h < nheads; ++h) {
      if (owner[h] == r) {
        if (first < 0) first = h;
        ++n;
      }
    }
    if (hp.size(r) != n || (n > 0 && hp.begin(r) != first) || hp.end(r) != hp.begin(r) + n ||
        counts[r] != 7 * n) {
      why = "range of rank " + std::to_string(r);
      return false;
    }
    sum += n;
  }
  if (sum != nheads || hp.begin(0) != 0 || hp.end(parts - 1) != nheads ||
      hp.even() != (nheads % parts == 0)) {
    why = "coverage";
    return false;
  }
  return true;
}

bool group_partition_matches(const ctxpar::KeyGroupPartition& kp, int nheads, int ngroups,
                             int parts, bool even, std::string& why) {
  const int per_group = nheads / ngroups;
  const std::vector<int> owner = literal_owner(nheads, parts);
  std::vector<int> holders(ngroups, 0);
  for (int r = 0; r < parts; ++r) {
    std::set<int> used;
    std::vector<int> local_heads;
    for (int h = 0; h < nheads; ++h) {
      if (owner[h] == r) {
        used.insert(h / per_group);
        local_heads.push_back(h);
      }
    }
    auto fail = [&](const std::string& what) {
      why = "rank " + std::to_string(r) + ": " + what;
      return false;
    };
    if (kp.size(r) != static_cast<int>(used.size())) return fail("group count");
    int g = 0;
    for (int source : used) {
      if (kp.source_group(r, g) != source)
        return fail("source of local group " + std::to_string(g));
      ++holders[source];
      ++g;
    }
    if (kp.counts(5)[r] != 5 * kp.size(r)) return fail("counts");
    for (std::size_t k = 0; k < local_heads.size(); ++k) {
      if (kp.source_group(r, kp.local_group_of_head(r, static_cast<int>(k))) !=
          local_heads[k] / per_group)
        return fail("group of local head " + std::to_string(k));
    }
    // The design's statements for the even policy.
    if (even) {
      if (ngroups >= parts &&
          (kp.size(r) != ngroups / parts || kp.begin(r) != r * (ngroups / parts)))
        return fail("even split of groups");
      if (ngroups < parts && (kp.size(r) != 1 || kp.begin(r) != r / (parts / ngroups)))
        return fail("repeated group");
    }
  }
  for (int g = 0; g < ngroups; ++g) {
    if (holders[g] < 1 || (even && holders[g] != kp.repeat())) {
      why = "group " + std::to_string(g) + " held " + std::to_string(holders[g]) + " times";
      return false;
    }
  }
  return true;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_small_head_and_group_count) {
  bool ok = true;
  std::string why;
  int even_cases = 0, uneven_cases = 0, refused = 0;
  for (int p = 1; p <= 8 && ok; ++p) {
    for (int nheads = 1; nheads <= 40 && ok; ++nheads) {
      const auto uneven = ctxpar::HeadPartition::create(nheads, p, ctxpar::UnevenHeads{});
      ok = head_partition_matches(uneven, nheads, p, why);
      bool even_ok = false;
      try {
        ok = ok && head_partition_matches(ctxpar::HeadPartition::create(nheads, p), nheads, p, why);
        even_ok = true;
      } catch (const ctxpar::Error&) {
      }
      ok = ok && even_ok == (nheads % p == 0);
      for (int ngroups = 1; ngroups <= nheads && ok; ++ngroups) {
        if (nheads % ngroups != 0) continue;
        ok = group_partition_matches(
            ctxpar::KeyGroupPartition::create(nheads, ngroups, p, ctxpar::UnevenHeads{}), nheads,
            ngroups, p, false, why);
        ++uneven_cases;
        const bool allowed = nheads % p == 0 && (ngroups < p ? p % ngroups == 0 : ngroups % p == 0);
        bool built = false;
        try {
          const auto kp =
              ctxpar::KeyGroupPartition::create(nheads, ngroups, p, ctxpar::EvenHeads{});
          built = true;
          ok = ok && group_partition_matches(kp, nheads, ngroups, p, true, why);
          ++even_cases;
        } catch (const ctxpar::Error&) {
          ++refused;
        }
        ok = ok && built == allowed;
        if (!ok)
          BOOST_TEST_MESSAGE("P=" << p << " nheads=" << nheads << " ngroups=" << ngroups << ": "
                                  << why);
      }
    }
  }
  BOOST_TEST_MESSAGE(even_cases << " even, " << uneven_cases << " uneven, " << refused
                                << " refused");
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok && even_cases > 100 && refused > 100);
}

namespace {
template <class F>
bool local_error(F&& f, const std::string& needle) {
  try {
    f();
  } catch (const ctxpar::Error& e) {
    const bool ok = e.rank() == -1 && std::string(e.what()).find(needle) != std::string::npos;
    if (!ok) BOOST_TEST_MESSAGE("unexpected message: " << e.what());
    return ok;
  }
  BOOST_TEST_MESSAGE("no ctxpar::Error for '" << needle << "'");
  return false;
}
}  // namespace

BOOST_AUTO_TEST_CASE(local_validation_errors) {
  bool ok = true;
  ok &= local_error([] { ctxpar::HeadPartition::create(6, 4); },
                    "ctxpar::HeadPartition: the number of heads must be divisible by the number of "
                    "ranks P (or choose "
                    "ctxpar::UnevenHeads) (expected a multiple of P = 4, got nheads = 6)");
  ok &= local_error(
      [] { ctxpar::KeyGroupPartition::create(12, 2, 3); },
      "P must be divisible by the number of key groups (each group is repeated P / ngroups times) "
      "(expected a divisor of P = 3, got ngroups = 2)");
  ok &= local_error([] { ctxpar::KeyGroupPartition::create(24, 6, 4); },
                    "the number of key groups must be divisible by P (expected a multiple of P = "
                    "4, got ngroups = 6)");
  ok &= local_error([] { ctxpar::KeyGroupPartition::create(12, 5, 1, ctxpar::UnevenHeads{}); },
                    "divisible by the number of key groups (expected a multiple of ngroups = 5, "
                    "got nheads = 12)");
  ok &= local_error([] { ctxpar::HeadPartition::create(0, 2, ctxpar::UnevenHeads{}); },
                    "heads must be positive");
  ok &= local_error([] { ctxpar::HeadPartition::create(4, 2).counts(std::int64_t{1} << 30); },
                    "a collective count must fit in int (expected at most 2147483647 elements, got "
                    "2147483648)");
  ok &=
      local_error([] { ctxpar::KeyGroupPartition::create(8, 4, 2).counts(std::int64_t{1} << 30); },
                  "ctxpar::KeyGroupPartition::counts: a collective count must fit in int");
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_SUITE_END()
