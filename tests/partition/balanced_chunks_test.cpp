// BalancedChunks against a literal torch.chunk: hand out ceil(L/P) elements per shard until the
// axis is used up, for every L <= 40 and P <= 8.
#include <cstdint>
#include <vector>

#include "ctxpar/partition/balanced_chunks.hpp"
#include "ctxpar_test/harness.hpp"

BOOST_AUTO_TEST_SUITE(balanced_chunks)

BOOST_AUTO_TEST_CASE(matches_torch_chunk_for_all_small_sizes) {
  bool ok = true;
  for (int p = 1; p <= 8; ++p) {
    for (std::int64_t length = 0; length <= 40; ++length) {
      const ctxpar::BalancedChunks plan{length, p};
      const std::int64_t chunk = (length + p - 1) / p;
      std::vector<std::int64_t> sizes;
      std::vector<int> owner;
      std::int64_t left = length;
      for (int r = 0; r < p; ++r) {
        const std::int64_t n = left < chunk ? left : chunk;
        sizes.push_back(n);
        owner.insert(owner.end(), static_cast<std::size_t>(n), r);
        left -= n;
      }
      int nonempty = 0;
      std::int64_t begin = 0;
      const auto counts = plan.counts(3);
      for (int r = 0; r < p; ++r) {
        ok = ok && plan.begin(r) == begin && plan.size(r) == sizes[r] &&
             plan.end(r) == begin + sizes[r] && counts[r] == 3 * sizes[r];
        begin += sizes[r];
        nonempty += sizes[r] > 0 ? 1 : 0;
      }
      for (std::int64_t i = 0; i < length; ++i) ok = ok && plan.owner(i) == owner[i];
      ok = ok && plan.nonempty() == nonempty && plan.chunk() == chunk;
      if (!ok) {
        BOOST_TEST_MESSAGE("mismatch at length " << length << ", P " << p);
        break;
      }
    }
  }
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_SUITE_END()
