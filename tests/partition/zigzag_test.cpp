// Contiguous, dense zigzag and packed zigzag layouts against orders built by literally
// concatenating chunk lists, for every P <= 8 and local length L <= 40; undo/redo on views over
// every backend; local validation messages.
#include <cstdint>
#include <string>
#include <vector>

#include "ctxpar/partition/zigzag.hpp"
#include "ctxpar_test/harness.hpp"

BOOST_AUTO_TEST_SUITE(zigzag)

namespace {

using order_type = std::vector<std::int64_t>;  // layout position -> natural index

// Rank r appends natural chunk r of every sequence, then chunk 2P-1-r (docs/partition.md §2).
order_type literal_packed_order(const std::vector<std::int64_t>& cu, int parts) {
  order_type order;
  for (int r = 0; r < parts; ++r) {
    for (std::size_t s = 0; s + 1 < cu.size(); ++s) {
      const std::int64_t half = (cu[s + 1] - cu[s]) / (2 * parts);
      for (std::int64_t chunk : {std::int64_t{r}, std::int64_t{2 * parts - 1 - r}}) {
        for (std::int64_t k = 0; k < half; ++k) order.push_back(cu[s] + chunk * half + k);
      }
    }
  }
  return order;
}

// Checks every map of `layout` against the literal order: to_natural, to_layout (its inverse),
// owner, local_index and global_index, on every token.
template <class Layout>
bool matches_order(const Layout& layout, const order_type& order, int parts, std::string& why) {
  const std::int64_t t = static_cast<std::int64_t>(order.size());
  if (layout.length() != t || layout.parts() != parts || layout.local_length() * parts != t) {
    why = "sizes";
    return false;
  }
  const std::int64_t l = t / parts;
  for (std::int64_t q = 0; q < t; ++q) {
    const std::int64_t i = order[q];
    if (layout.to_natural(q) != i || layout.to_layout(i) != q || layout.owner(i) != q / l ||
        layout.local_index(i) != q % l ||
        layout.global_index(static_cast<int>(q / l), q % l) != i) {
      why = "layout position " + std::to_string(q) + " (natural " + std::to_string(i) +
            "): to_natural " + std::to_string(layout.to_natural(q)) + ", to_layout " +
            std::to_string(layout.to_layout(i));
      return false;
    }
  }
  return true;
}

}  // namespace

BOOST_AUTO_TEST_CASE(chunk_order_after_all_to_all) {
  // The P = 3 example of docs/partition.md §2: chunks arrive as 1 6 2 5 3 4 (rank order), undo
  // gives 1 2 3 4 5 6 by taking positions 0, 2, 4 then 5, 3, 1.
  bool ok = true;
  for (int p = 1; p <= 8; ++p) {
    std::vector<std::int64_t> arrived;  // natural chunk at each zigzag position
    for (int r = 0; r < p; ++r) {
      arrived.push_back(r);
      arrived.push_back(2 * p - 1 - r);
    }
    std::vector<std::int64_t> take;  // positions read, in natural order
    for (int k = 0; k < p; ++k) take.push_back(2 * k);
    for (int k = 2 * p - 1; k >= 1; k -= 2) take.push_back(k);
    for (int n = 0; n < 2 * p; ++n) {
      ok = ok && arrived[take[n]] == n && ctxpar::zigzag_chunk_position(n, p) == take[n] &&
           ctxpar::zigzag_natural_chunk(take[n], p) == n &&
           ctxpar::zigzag_natural_chunk(n, p) == arrived[n];
    }
  }
  // P = 3 spelled out (1-based chunk labels as in that example).
  const std::int64_t arrived3[] = {1, 6, 2, 5, 3, 4};
  for (int n = 0; n < 6; ++n) ok = ok && arrived3[ctxpar::zigzag_chunk_position(n, 3)] == n + 1;
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE(dense_zigzag_against_concatenated_chunks) {
  bool ok = true;
  std::string why;
  for (int p = 1; p <= 8 && ok; ++p) {
    for (int c = 1; 2 * c <= 40 && ok; ++c) {
      const std::int64_t t = 2 * p * c;
      const auto layout = ctxpar::ZigzagLayout::create(t, p);
      // The dense layout is the packed layout of one sequence.
      ok = layout.chunk() == c && matches_order(layout, literal_packed_order({0, t}, p), p, why);
      if (!ok) BOOST_TEST_MESSAGE("dense P=" << p << " C=" << c << ": " << why);
    }
  }
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE(packed_zigzag_against_concatenated_chunks) {
  // Sequences of u_s units of 2P tokens, T/P = L <= 40: every composition of up to 8 units, then
  // deterministic random ones up to 20 units, with zero-length sequences sprinkled in.
  bool ok = true;
  std::string why;
  std::uint64_t seed = 11;
  auto check = [&](const std::vector<int>& units, int p) {
    std::vector<std::int64_t> cu{0};
    for (int u : units) cu.push_back(cu.back() + 2 * p * u);
    const auto layout = ctxpar::ZigzagPerSequenceLayout<>::create(cu, p);
    std::vector<std::int64_t> local_cu;
    for (std::int64_t c : cu) local_cu.push_back(c / p);
    bool good = layout.local_cu_seqlens() == local_cu &&
                layout.num_sequences() == static_cast<std::int64_t>(units.size()) &&
                matches_order(layout, literal_packed_order(cu, p), p, why);
    if (!good) {
      std::string u;
      for (int x : units) u += std::to_string(x) + " ";
      BOOST_TEST_MESSAGE("packed P=" << p << " units [" << u << "]: " << why);
    }
    return good;
  };
  for (int p = 1; p <= 8 && ok; ++p) {
    for (int total = 1; total <= 8 && ok; ++total) {
      for (std::uint32_t cuts = 0; cuts < (1u << (total - 1)) && ok; ++cuts) {
        std::vector<int> units{1};
        for (int i = 1; i < total; ++i) {
          if (cuts & (1u << (i - 1)))
            units.push_back(1);
          else
            ++units.back();
        }
        ok = check(units, p);
      }
    }
    for (int total = 9; total <= 20 && ok; ++total) {
      for (int variant = 0; variant < 8 && ok; ++variant, ++seed) {
        std::vector<int> units{1};
        for (int i = 1; i < total; ++i) {
          const double u = ctxpar::test::uniform(seed, i);
          if (u < -0.6) units.push_back(0);  // an empty sequence in between
          if (u < 0.0)
            units.push_back(1);
          else
            ++units.back();
        }
        if (variant % 2 == 0) units.insert(units.begin(), 0);
        if (variant % 3 == 0) units.push_back(0);
        ok = check(units, p);
      }
    }
  }
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE(contiguous_layout_follows_balanced_chunks) {
  bool ok = true;
  for (int p = 1; p <= 8; ++p) {
    for (int t = 0; t <= 40; ++t) {
      const auto layout = ctxpar::ContiguousLayout::create(t, p);
      const ctxpar::BalancedChunks chunks{t, p};
      std::int64_t sum = 0;
      for (int r = 0; r < p; ++r) {
        sum += layout.local_length(r);
        for (std::int64_t j = 0; j < layout.local_length(r); ++j) {
          const std::int64_t i = layout.global_index(r, j);
          ok = ok && i == chunks.begin(r) + j && layout.owner(i) == r &&
               layout.local_index(i) == j && layout.to_layout(i) == i && layout.to_natural(i) == i;
        }
      }
      ok = ok && sum == t;
    }
  }
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(undo_redo_on_views, Exec, ctxpar::test::execution_spaces) {
  using memory_space = typename Exec::memory_space;
  bool ok = true;
  for (int p : {1, 2, 3, 5}) {
    for (int variant = 0; variant < 2; ++variant) {
      std::vector<std::int64_t> cu =
          variant == 0 ? std::vector<std::int64_t>{0, 2 * p * 3}
                       : std::vector<std::int64_t>{0, 2 * p, 2 * p, 2 * p * 4, 2 * p * 6};
      const auto layout = ctxpar::ZigzagPerSequenceLayout<memory_space>::create(cu, p);
      const std::int64_t t = cu.back(), cols = 3;
      const order_type order = literal_packed_order(cu, p);
      Kokkos::View<double**, memory_space> natural("natural", t, cols), zig("zig", t, cols),
          back("back", t, cols);
      Kokkos::View<int*, memory_space> natural1("natural1", t), zig1("zig1", t), back1("back1", t);
      for (std::int64_t i = 0; i < t; ++i) {
        natural1(i) = static_cast<int>(1000 * ctxpar::test::uniform(p, i));
        for (std::int64_t c = 0; c < cols; ++c)
          natural(i, c) = ctxpar::test::uniform(p + 100, i * cols + c);
      }
      Exec space;
      ctxpar::redo_zigzag(space, layout, natural, zig);
      ctxpar::undo_zigzag(space, layout, zig, back);
      ctxpar::redo_zigzag(space, layout, natural1, zig1);
      ctxpar::undo_zigzag(space, layout, zig1, back1);
      space.fence();
      for (std::int64_t q = 0; q < t; ++q) {
        ok = ok && zig1(q) == natural1(order[q]) && back1(q) == natural1(q);
        for (std::int64_t c = 0; c < cols; ++c) {
          ok = ok && zig(q, c) == natural(order[q], c) && back(q, c) == natural(q, c);
        }
      }
      // The dense layout on the single-sequence case gives the same permutation.
      if (variant == 0) {
        Kokkos::View<double**, memory_space> dense("dense", t, cols);
        ctxpar::redo_zigzag(space, ctxpar::ZigzagLayout::create(t, p), natural, dense);
        space.fence();
        for (std::int64_t q = 0; q < t; ++q) {
          for (std::int64_t c = 0; c < cols; ++c) ok = ok && dense(q, c) == zig(q, c);
        }
      }
    }
  }
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
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
  ok &= local_error([] { ctxpar::ZigzagLayout::create(10, 3); },
                    "ctxpar::ZigzagLayout: the zigzag layout needs a sequence length that is a "
                    "positive multiple of 2P "
                    "(expected a positive multiple of 6, got 10)");
  ok &= local_error([] { ctxpar::ZigzagLayout::create(0, 2); }, "got 0");
  ok &= local_error(
      [] {
        ctxpar::ZigzagPerSequenceLayout<>::create(std::vector<int>{0, 8, 14, 22}, 2);
      },
      "ctxpar::ZigzagPerSequenceLayout: every packed sequence length must be divisible by 2P for "
      "the zigzag layout (sequence 1 has length 6) (expected a multiple of 4, got length 6 of "
      "sequence 1)");
  ok &= local_error(
      [] {
        ctxpar::ZigzagPerSequenceLayout<>::create(std::vector<int>{0, 8, 4}, 2);
      },
      "cu_seqlens must be non-decreasing");
  ok &= local_error(
      [] {
        ctxpar::ZigzagPerSequenceLayout<>::create(std::vector<int>{2, 8}, 2);
      },
      "cu_seqlens must start with 0");
  ok &= local_error(
      [] {
        ctxpar::ZigzagPerSequenceLayout<>::create(std::vector<int>{0, 0}, 2);
      },
      "at least one token");
  Kokkos::View<double*, Kokkos::HostSpace> a("a", 12), b("b", 10);
  ok &= local_error(
      [&] {
        ctxpar::undo_zigzag(Kokkos::DefaultHostExecutionSpace(),
                            ctxpar::ZigzagLayout::create(12, 2), a, b);
      },
      "out must have the extents of in");
  ok &= local_error(
      [&] {
        ctxpar::undo_zigzag(Kokkos::DefaultHostExecutionSpace(), ctxpar::ZigzagLayout::create(8, 2),
                            a, a);
      },
      "one row per token");
  ok &= local_error(
      [&] {
        ctxpar::undo_zigzag(Kokkos::DefaultHostExecutionSpace(),
                            ctxpar::ZigzagLayout::create(12, 2), a, a);
      },
      "in and out must not alias");
  CTXPAR_TEST_ALL(ctxpar::test::world(), ok);
}

BOOST_AUTO_TEST_SUITE_END()
