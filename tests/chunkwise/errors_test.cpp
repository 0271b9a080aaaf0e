// Bad input to the chunkwise driver, summaries and plans, each violated on ONE rank only: every
// rank must throw the same ctxpar::Error naming that rank (no hang, no partial output).
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "chunkwise/chunkwise_test_support.hpp"
#include "chunkwise/decay_oracle.hpp"
#include "ctxpar/partition/packed_metadata.hpp"

namespace cwt = ctxpar::test::chunkwise;
namespace cw = ctxpar::chunkwise;
using ctxpar::test::throws_everywhere;
using ctxpar::test::world;

namespace {

using exec = Kokkos::DefaultHostExecutionSpace;
using mem = exec::memory_space;
using adapter = cwt::DecayAdapter<float, mem, false>;

enum class Fault {
  none,
  k_shape,
  k_zero,
  v_zero,
  heads,
  chunk,
  family,
  nan,
  output_shape,
  tokens,
  dout_shape
};

// One forward + backward where the last rank applies `fault`.
void run(Fault fault, bool bad) {
  const auto& group = world();
  // 6 tokens per rank (so the faulty rank always has a token to poison), two sequences.
  const std::int64_t p = group.size(), T = 6 * p, H = 2, K = 4, V = 3;
  const auto plan = cw::SequenceLayout::create(group, ctxpar::Contiguous{}, {0, 3 * p + 1, T});
  const std::int64_t local = plan.local_length();
  const std::int64_t k_dim = bad && fault == Fault::k_zero ? 0 : K;
  const std::int64_t v_dim = bad && fault == Fault::v_zero ? 0 : V;
  const std::int64_t heads = bad && fault == Fault::heads ? H + 1 : H;
  const std::int64_t rows = bad && fault == Fault::tokens ? local + 1 : local;
  cw::token_view<float, mem> q("q", rows, heads, k_dim),
      k("k", rows, heads, bad && fault == Fault::k_shape ? K + 1 : k_dim),
      v("v", rows, heads, v_dim),
      o("o", bad && fault == Fault::output_shape ? rows + 2 : rows, heads, v_dim);
  cw::head_view<float, mem> g("g", rows, heads);
  Kokkos::deep_copy(q, 0.5f);
  Kokkos::deep_copy(k, 0.25f);
  Kokkos::deep_copy(v, 1.0f);
  Kokkos::deep_copy(g, -0.1f);
  if (bad && fault == Fault::nan && rows > 0) q(0, 0, 0) = std::numeric_limits<float>::quiet_NaN();
  cw::DriverOptions options;
  options.check_finite = fault == Fault::nan;
  const int chunk = bad && fault == Fault::chunk ? 8 : 16;
  if (bad && fault == Fault::family) {
    cw::DiagonalGateBackend<float, mem> backend(cw::BackendOptions{chunk, 0.0});
    cw::DiagonalGateInputs<float, mem> in{q, k, v,
                                          cw::token_view<float, mem>("g", rows, heads, k_dim)};
    cw::ChunkwiseContext<decltype(backend)> ctx;
    cw::make_cp_plan<cw::GatherFold>(exec(), group, backend, plan, backend.shape(in), options)
        .forward(in, o, ctx);
    return;
  }
  cw::ScalarDecayBackend<float, mem> backend(cw::BackendOptions{chunk, 0.0});
  cw::ScalarDecayInputs<float, mem> in{q, k, v, g};
  auto cp =
      cw::make_cp_plan<cw::GatherFold>(exec(), group, backend, plan, backend.shape(in), options);
  cw::ChunkwiseContext<decltype(backend)> ctx;
  cp.forward(in, o, ctx);
  cw::token_view<float, mem> dout("dout", bad && fault == Fault::dout_shape ? rows + 1 : rows,
                                  heads, v_dim);
  cw::ScalarDecayGradients<float, mem> grads{cw::token_view<float, mem>("dq", rows, heads, k_dim),
                                             cw::token_view<float, mem>("dk", rows, heads, k_dim),
                                             cw::token_view<float, mem>("dv", rows, heads, v_dim),
                                             cw::head_view<float, mem>("dg", rows, heads)};
  cp.backward(ctx, dout, grads);
}

// The rank an agreement failure names: the bad rank for local checks; for "every rank must agree"
// checks, the lowest rank that differs from rank 0 (rank 1 when rank 0 is the odd one out).
int named(int bad_rank, bool agreement) {
  const int p = world().size();
  if (agreement && bad_rank == 0) return p > 1 ? 1 : -1;
  return bad_rank;
}

void expect(Fault fault, const std::string& needle, bool agreement = false) {
  const auto& group = world();
  for (int bad_rank : {group.size() - 1, 0}) {
    if (agreement && group.size() == 1) return;  // one rank always agrees with itself
    const bool bad = group.rank() == bad_rank;
    BOOST_TEST_CONTEXT("fault " << static_cast<int>(fault) << " on rank " << bad_rank) {
      CTXPAR_TEST_ALL(group,
                      throws_everywhere(
                          group, [&] { run(fault, bad); }, needle, named(bad_rank, agreement)));
    }
    if (group.size() == 1) break;
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(valid_input_runs) {
  const auto& group = world();
  bool ok = true;
  try {
    run(Fault::none, false);
  } catch (const std::exception& e) {
    ok = false;
    std::cerr << e.what() << "\n";
  }
  CTXPAR_TEST_ALL(group, ok);
}

BOOST_AUTO_TEST_CASE(shape_errors_on_one_rank) {
  expect(Fault::k_shape, "k must have the shape of q");
  expect(Fault::k_zero, "the key dimension K must be positive");
  expect(Fault::v_zero, "the value dimension V must be positive");
  expect(Fault::output_shape, "the output must be [T, H, V]");
  expect(Fault::tokens, "the local token count must match");
  expect(Fault::dout_shape, "the output gradient must be [T, H, V]");
}

BOOST_AUTO_TEST_CASE(plan_fingerprint_disagreement_on_one_rank) {
  expect(Fault::heads, "every rank must agree on the head count H", true);
  expect(Fault::chunk, "every rank must agree on the chunk size", true);
  expect(Fault::family, "every rank must agree on the model family", true);
}

BOOST_AUTO_TEST_CASE(non_finite_input_behind_the_check_flag) {
  expect(Fault::nan, "the inputs must be finite");
}

BOOST_AUTO_TEST_CASE(summary_buffer_errors_on_one_rank) {
  const auto& group = world();
  const std::int64_t H = 2, K = 3, V = 2, width = K * V + 1;
  for (int bad_rank : {group.size() - 1, 0}) {
    const bool bad = group.rank() == bad_rank;
    Kokkos::View<float***, Kokkos::LayoutRight, mem> good("good", 1, H, width),
        all("all", group.size(), H, width);
    // Non-fp32 summaries.
    auto f64 = [&] {
      if (bad) {
        Kokkos::View<double***, Kokkos::LayoutRight, mem> d("d", 1, H, width);
        Kokkos::View<double***, Kokkos::LayoutRight, mem> da("da", group.size(), H, width);
        cw::gather_summaries<cw::ScalarTransition>(exec(), group, d, da, H, K, V);
      } else {
        cw::gather_summaries<cw::ScalarTransition>(exec(), group, good, all, H, K, V);
      }
    };
    CTXPAR_TEST_ALL(group, throws_everywhere(group, f64, "must hold fp32 summaries", bad_rank));
    // Non-contiguous summaries.
    auto strided = [&] {
      Kokkos::View<float***, Kokkos::LayoutRight, mem> wide("wide", 1, H, width + 1);
      Kokkos::View<float***, Kokkos::LayoutStride, mem> s =
          Kokkos::subview(wide, Kokkos::ALL, Kokkos::ALL, std::make_pair(std::int64_t{0}, width));
      if (bad) {
        cw::gather_summaries<cw::ScalarTransition>(exec(), group, s, all, H, K, V);
      } else {
        cw::gather_summaries<cw::ScalarTransition>(exec(), group, good, all, H, K, V);
      }
    };
    CTXPAR_TEST_ALL(group, throws_everywhere(group, strided, "must be contiguous", bad_rank));
    // Wrong width for the structure (a diagonal summary's M is K floats, not 1).
    auto shape = [&] {
      Kokkos::View<float***, Kokkos::LayoutRight, mem> w("w", 1, H, width + (bad ? K - 1 : 0));
      cw::gather_summaries<cw::ScalarTransition>(exec(), group, w, all, H, K, V);
    };
    CTXPAR_TEST_ALL(group, throws_everywhere(group, shape, "has the wrong shape", bad_rank));
    if (group.size() == 1) break;
  }
}

BOOST_AUTO_TEST_CASE(metadata_errors_on_one_rank) {
  const auto& group = world();
  const int p = group.size();
  for (int bad_rank : {p - 1, 0}) {
    const bool bad = group.rank() == bad_rank;
    // Decreasing cu_seqlens.
    auto decreasing = [&] {
      std::vector<std::int64_t> cu{0, 5, bad ? 3 : 9, 12};
      cw::SequenceLayout::create(group, ctxpar::Contiguous{}, cu);
    };
    CTXPAR_TEST_ALL(
        group, throws_everywhere(group, decreasing, "cu_seqlens must be non-decreasing", bad_rank));
    // Decreasing sequence ids.
    auto ids_decreasing = [&] {
      std::vector<std::int32_t> ids(static_cast<std::size_t>(4 * p), 0);
      for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i / 3);
      if (bad) ids[1] = 5;
      cw::SequenceLayout::create(group, ctxpar::Contiguous{},
                                 ctxpar::PackedMetadata::from_seq_idx(group, ids));
    };
    CTXPAR_TEST_ALL(group, throws_everywhere(group, ids_decreasing, "non-decreasing", bad_rank));
    // Ids that are not int32 values.
    auto ids_wide = [&] {
      std::vector<std::int64_t> ids(static_cast<std::size_t>(4 * p), 0);
      if (bad) ids.back() = std::int64_t{1} << 40;
      cw::SequenceLayout::create(group, ctxpar::Contiguous{},
                                 ctxpar::PackedMetadata::from_seq_idx(group, ids));
    };
    CTXPAR_TEST_ALL(group, throws_everywhere(group, ids_wide, "int32", bad_rank));
    // Metadata over the wrong number of parts (zigzag needs 2P virtual shards).
    auto parts = [&] {
      std::vector<std::int32_t> ids(static_cast<std::size_t>(4 * p), 0);
      const auto meta = ctxpar::PackedMetadata::from_seq_idx(ids, bad ? p : 2 * p);
      cw::SequenceLayout::create(group, ctxpar::Zigzag{}, meta);
    };
    CTXPAR_TEST_ALL(
        group, throws_everywhere(group, parts, "zigzag needs packed metadata built over 2P parts",
                                 bad_rank));
    // A token count the metadata cannot split (T % P != 0) on one rank.
    if (p > 1) {
      auto indivisible = [&] {
        std::vector<std::int32_t> ids(static_cast<std::size_t>(4 * p + (bad ? 1 : 0)), 0);
        ctxpar::PackedMetadata::from_seq_idx(group, ids);
      };
      CTXPAR_TEST_ALL(group, throws_everywhere(group, indivisible, "divisible", bad_rank));
    }
    if (p == 1) break;
  }
}

// The plan checks the boundaries against the token count T it is given: past T the kernels would
// read past the inputs, short of T the tail would be ignored. Violated on one rank, then on every
// rank (the lowest rank, 0, is named).
BOOST_AUTO_TEST_CASE(cu_seqlens_against_the_token_count_on_one_rank_or_all) {
  const auto& group = world();
  const int p = group.size();
  const std::int64_t T = 6 * p;
  for (int bad_rank : {p - 1, 0, -1}) {  // -1: every rank
    const bool bad = bad_rank < 0 || group.rank() == bad_rank;
    const int named = bad_rank < 0 ? 0 : bad_rank;
    for (std::int64_t end : {T + 1, T + (std::int64_t{1} << 40), T - 1}) {
      auto call = [&] {
        cw::SequenceLayout::create(group, ctxpar::Contiguous{}, T, {0, 2, bad ? end : T});
      };
      CTXPAR_TEST_ALL(
          group, throws_everywhere(group, call, "cu_seqlens must end at the token count T", named));
      auto zig = [&] {
        cw::SequenceLayout::create(group, ctxpar::Zigzag{}, T, {0, 2, bad ? end : T});
      };
      CTXPAR_TEST_ALL(
          group, throws_everywhere(group, zig, "cu_seqlens must end at the token count T", named));
    }
    auto start = [&] {
      cw::SequenceLayout::create(group, ctxpar::Contiguous{}, T, {bad ? 1 : 0, T});
    };
    CTXPAR_TEST_ALL(group, throws_everywhere(group, start, "cu_seqlens must start with 0", named));
    auto order = [&] {
      cw::SequenceLayout::create(group, ctxpar::Contiguous{}, T, {0, 4, bad ? 3 : 4, T});
    };
    CTXPAR_TEST_ALL(group,
                    throws_everywhere(group, order, "cu_seqlens must be non-decreasing", named));
    auto no_tokens = [&] { cw::SequenceLayout::create(group, ctxpar::Contiguous{}, bad ? 0 : T); };
    CTXPAR_TEST_ALL(group, throws_everywhere(group, no_tokens, "at least one token", named));
  }
}

// Just inside the bounds: boundaries that end exactly at T (with empty sequences at both ends)
// give the plan of the overload without T, and an empty cu_seqlens means one sequence of T tokens
// (as for heads::TransposePlan).
BOOST_AUTO_TEST_CASE(cu_seqlens_at_the_bounds_and_empty) {
  const auto& group = world();
  const std::int64_t T = 6 * group.size();
  bool ok = true;
  try {
    const std::vector<std::int64_t> cu{0, 0, 5, T, T};
    const auto a = cw::SequenceLayout::create(group, ctxpar::Contiguous{}, T, cu);
    const auto b = cw::SequenceLayout::create(group, ctxpar::Contiguous{}, cu);
    ok = ok && a.fingerprint() == b.fingerprint() && a.sequence_count() == 4 &&
         a.total_length() == T;
    const auto dense = cw::SequenceLayout::create(group, ctxpar::Zigzag{}, T);
    const auto explicit_dense = cw::SequenceLayout::create(group, ctxpar::Zigzag{}, {0, T});
    ok = ok && dense.fingerprint() == explicit_dense.fingerprint() && dense.sequence_count() == 1 &&
         dense.cu_seqlens() == std::vector<std::int64_t>{0, T};
  } catch (const std::exception& e) {
    std::cerr << "[rank " << group.rank() << "] " << e.what() << "\n";
    ok = false;
  }
  CTXPAR_TEST_ALL(group, ok);
  // Without T an empty cu_seqlens cannot say how many tokens there are: refused, naming it.
  // (A bare `{}` would select the token-count overload with T = 0, refused as "at least one
  // token".)
  auto empty = [&] {
    cw::SequenceLayout::create(group, ctxpar::Contiguous{}, std::vector<std::int64_t>{});
  };
  CTXPAR_TEST_ALL(group, throws_everywhere(group, empty, "an empty cu_seqlens", 0));
}

namespace {

// One scalar-decay forward over 6 tokens per rank with `options` on this rank; returns the output.
cw::token_view<float, mem> forward_with(const cw::BackendOptions& options) {
  const auto& group = world();
  const std::int64_t p = group.size(), T = 6 * p, H = 2, K = 4, V = 3;
  const auto plan = cw::SequenceLayout::create(group, ctxpar::Contiguous{}, T, {0, 3 * p + 1, T});
  const std::int64_t L = plan.local_length();
  cw::token_view<float, mem> q("q", L, H, K), k("k", L, H, K), v("v", L, H, V), o("o", L, H, V);
  cw::head_view<float, mem> g("g", L, H);
  auto fill = [&](auto view, std::uint64_t seed) {
    auto h = Kokkos::create_mirror_view(view);
    for (std::size_t i = 0; i < h.span(); ++i)
      h.data()[i] = static_cast<float>(
          ctxpar::test::uniform(seed, static_cast<std::uint64_t>(group.rank()) * 1000 + i));
    Kokkos::deep_copy(view, h);
  };
  fill(q, 1);
  fill(k, 2);
  fill(v, 3);
  Kokkos::deep_copy(g, -0.2f);
  cw::ScalarDecayBackend<float, mem> backend(options);
  cw::ScalarDecayInputs<float, mem> in{q, k, v, g};
  cw::ChunkwiseContext<decltype(backend)> ctx;
  cw::make_cp_plan<cw::GatherFold>(exec(), group, backend, plan, backend.shape(in))
      .forward(in, o, ctx);
  return o;
}

}  // namespace

// A NaN or infinite scale and a chunk size of 0 or below are refused on every rank when one rank
// (or every rank) passes them.
BOOST_AUTO_TEST_CASE(scale_and_chunk_size_on_one_rank_or_all) {
  const auto& group = world();
  const int p = group.size();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (int bad_rank : {p - 1, 0, -1}) {
    const bool bad = bad_rank < 0 || group.rank() == bad_rank;
    const int named = bad_rank < 0 ? 0 : bad_rank;
    for (double scale : {nan, inf, -inf}) {
      auto call = [&] { forward_with(cw::BackendOptions{16, bad ? scale : 0.0}); };
      CTXPAR_TEST_ALL(group, throws_everywhere(group, call, "the scale must be finite", named));
    }
    for (int chunk : {0, -5, std::numeric_limits<int>::min()}) {
      auto call = [&] { forward_with(cw::BackendOptions{bad ? chunk : 16, 0.0}); };
      CTXPAR_TEST_ALL(group,
                      throws_everywhere(group, call, "the chunk size must be positive", named));
    }
  }
}

// A chunk longer than the shard is clamped to it: INT_MAX runs (no absurd allocation) and gives
// exactly the output of a chunk of the shard's length; a chunk of 1 (the lower bound) runs too.
BOOST_AUTO_TEST_CASE(huge_chunk_is_clamped_to_the_shard) {
  const auto& group = world();
  bool ok = true;
  try {
    const auto huge = Kokkos::create_mirror_view_and_copy(
        Kokkos::HostSpace(),
        forward_with(cw::BackendOptions{std::numeric_limits<int>::max(), 0.0}));
    const auto exact = Kokkos::create_mirror_view_and_copy(
        Kokkos::HostSpace(), forward_with(cw::BackendOptions{6, 0.0}));
    for (std::size_t i = 0; i < huge.span(); ++i) ok = ok && huge.data()[i] == exact.data()[i];
    const auto one = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(),
                                                         forward_with(cw::BackendOptions{1, 0.0}));
    for (std::size_t i = 0; i < one.span(); ++i) {
      ok = ok && std::isfinite(one.data()[i]) &&
           std::abs(one.data()[i] - exact.data()[i]) <= 1e-4f * (1.0f + std::abs(exact.data()[i]));
    }
  } catch (const std::exception& e) {
    std::cerr << "[rank " << group.rank() << "] " << e.what() << "\n";
    ok = false;
  }
  CTXPAR_TEST_ALL(group, ok);
}

// Extents whose summaries could not move in one MPI message are refused before any allocation.
BOOST_AUTO_TEST_CASE(summary_size_overflow_is_refused) {
  const auto& group = world();
  const auto plan = cw::SequenceLayout::create(group, ctxpar::Contiguous{}, group.size());
  // One token and one head: K·V = 2^32 floats of summary per rank, while the inputs hold only
  // 2^16 floats each.
  const std::int64_t K = std::int64_t{1} << 16, V = std::int64_t{1} << 16;
  auto call = [&] {
    const std::int64_t L = plan.local_length();
    cw::token_view<float, mem> q("q", L, 1, K), k("k", L, 1, K), v("v", L, 1, V), o("o", L, 1, V);
    cw::head_view<float, mem> g("g", L, 1);
    cw::ScalarDecayBackend<float, mem> backend(cw::BackendOptions{16, 0.0});
    const cw::ScalarDecayInputs<float, mem> in{q, k, v, g};
    cw::ChunkwiseContext<decltype(backend)> ctx;
    cw::make_cp_plan<cw::GatherFold>(exec(), group, backend, plan, backend.shape(in))
        .forward(in, o, ctx);
  };
  CTXPAR_TEST_ALL(group, throws_everywhere(group, call, "must fit an MPI int count", 0));
}
