// Bad input for mechanism C, each violated on one rank only at every rank count: every rank throws
// the same ctxpar::Error naming that rank (no hang, no partial output).
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ctxpar/heads/gdp_context_parallel.hpp"
#include "ctxpar_test/harness.hpp"

namespace {

using ctxpar::test::throws_everywhere;
using ctxpar::test::world;
namespace ch = ctxpar::heads;
using exec_space = Kokkos::DefaultExecutionSpace;
using mem = exec_space::memory_space;
using transpose_plan = ch::TransposePlan<ch::EvenHeads, ch::Contiguous, exec_space, double>;
using gdp_plan = ch::GdpContextParallel<ch::EvenHeads, ch::Contiguous, exec_space, double>;
using zigzag_gdp_plan =
    ch::GdpContextParallel<ch::EvenHeads, ch::ZigzagPerSequence, exec_space, double>;

// The layer follows the plan contract, with its saved state the caller's.
static_assert(ctxpar::follows_plan_contract<gdp_plan>);
static_assert(std::is_same_v<gdp_plan::saved_type, ch::GdpSaved<double, mem>>);
using matrix = Kokkos::View<double**, Kokkos::LayoutRight, mem>;

template <class HeadPolicy = ch::EvenHeads, class TokenOrder = ch::Contiguous>
void make_plan(const ch::GdpShape& s, std::int64_t t, std::vector<std::int64_t> cu = {}) {
  ch::TransposePlan<HeadPolicy, TokenOrder, exec_space, double> plan(
      exec_space(), world(), s.input_layout(), t, std::move(cu));
}

// Runs `body(bad_rank)` for every choice of the one bad rank and expects `needle` from
// `expected(bad)`.
template <class Body, class Expected>
void each_bad_rank(const std::string& needle, Body body, Expected expected) {
  const auto& group = world();
  for (int bad = 0; bad < group.size(); ++bad) {
    BOOST_TEST_CONTEXT("bad rank " << bad << ": " << needle) {
      CTXPAR_TEST_ALL(group, throws_everywhere(
                                 group, [&] { body(bad); }, needle, expected(bad)));
    }
  }
}
auto same_rank = [](int bad) { return bad; };

// As `each_bad_rank`, then once more with every rank bad (`bad == -1`; rank 0 is named).
template <class Body>
void each_bad_rank_or_all(const std::string& needle, Body body) {
  each_bad_rank(needle, body, same_rank);
  BOOST_TEST_CONTEXT("every rank bad: " << needle) {
    CTXPAR_TEST_ALL(world(), throws_everywhere(
                                 world(), [&] { body(-1); }, needle, 0));
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(heads_not_divisible_without_uneven_policy) {
  const int p = world().size(), me = world().rank();
  if (p == 1) return;  // every head count divides 1
  each_bad_rank(
      "nheads % P == 0",
      [&](int bad) {
        make_plan(ch::GdpShape{me == bad ? 2 * p + 1 : 2 * p, 2, 1, 3, 2, 4}, 4 * p);
      },
      same_rank);
}

BOOST_AUTO_TEST_CASE(groups_not_dividing_p) {
  const int p = world().size(), me = world().rank();
  if (p < 3) return;  // needs 1 < ngroups < P with P % ngroups != 0
  const int g = p - 1, h = p * (p - 1);
  each_bad_rank(
      "P % ngroups == 0",
      [&](int bad) {
        make_plan(ch::GdpShape{h, 2, me == bad ? g : 1, 3, 2, 4}, 4 * p);
      },
      same_rank);
}

BOOST_AUTO_TEST_CASE(groups_not_multiple_of_p) {
  const int p = world().size(), me = world().rank();
  if (p == 1) return;
  const int h = p * (p + 1);
  each_bad_rank(
      "ngroups % P == 0",
      [&](int bad) {
        make_plan(ch::GdpShape{h, 2, me == bad ? p + 1 : p, 3, 2, 4}, 4 * p);
      },
      same_rank);
}

BOOST_AUTO_TEST_CASE(tokens_not_divisible) {
  const int p = world().size(), me = world().rank();
  if (p == 1) return;
  each_bad_rank(
      "T % P == 0",
      [&](int bad) {
        make_plan(ch::GdpShape{2 * p, 2, 1, 3, 2, 4}, me == bad ? 4 * p + 1 : 4 * p);
      },
      same_rank);
}

BOOST_AUTO_TEST_CASE(packed_lengths_not_divisible_by_2p_under_zigzag) {
  const int p = world().size(), me = world().rank();
  each_bad_rank(
      "divisible by 2P",
      [&](int bad) {
        std::vector<std::int64_t> cu = me == bad ? std::vector<std::int64_t>{0, 2 * p - 1, 4 * p}
                                                 : std::vector<std::int64_t>{0, 2 * p, 4 * p};
        make_plan<ch::EvenHeads, ch::ZigzagPerSequence>(ch::GdpShape{2 * p, 2, 1, 3, 2, 4}, 4 * p,
                                                        cu);
      },
      same_rank);
}

BOOST_AUTO_TEST_CASE(ranks_disagree_on_the_layout) {
  const int p = world().size(), me = world().rank();
  if (p == 1) return;
  // A valid but different layout on one rank: the fingerprint check finds it (rank 0 is the
  // reference, so a bad rank 0 is reported by rank 1).
  each_bad_rank(
      "every rank must agree on the plan",
      [&](int bad) {
        make_plan(ch::GdpShape{2 * p, me == bad ? 3 : 2, 1, 3, 2, 4}, 4 * p);
      },
      [](int bad) { return bad == 0 ? 1 : bad; });
}

BOOST_AUTO_TEST_CASE(channel_count_not_matching_the_layout) {
  const int p = world().size(), me = world().rank();
  const ch::GdpShape s{2 * p, 2, 1, 3, 2, 4};
  transpose_plan plan(exec_space(), world(), s.input_layout(), 4 * p);
  matrix y("y", 4 * p, plan.local_channels());
  each_bad_rank(
      "channel count must match the layout",
      [&](int bad) {
        matrix x("x", plan.local_rows(), plan.channels() + (me == bad ? 1 : 0));
        plan.to_head_parallel(x, y);
      },
      same_rank);
}

BOOST_AUTO_TEST_CASE(packed_input_without_metadata) {
  const int p = world().size(), me = world().rank();
  const ch::GdpShape s{2 * p, 2, 1, 3, 2, 4};
  const std::int64_t t = 4 * p;
  zigzag_gdp_plan cp(exec_space(), world(), s, t);  // built dense
  auto params = ch::GdpParameters<double, mem>::allocate(s);
  ch::GdpSaved<double, mem> saved;
  const std::int64_t rows = cp.input_plan().local_rows();
  matrix x("x", rows, s.input_layout().channels()), y("y", rows, s.d_inner()),
      z("z", rows, s.d_inner());
  each_bad_rank(
      "packed input under ZigzagPerSequence needs its sequence metadata",
      [&](int bad) {
        const std::vector<std::int64_t> cu =
            me == bad ? std::vector<std::int64_t>{0, 2 * p, t} : std::vector<std::int64_t>{};
        cp.forward(x, params, y, z, saved, cu);
      },
      same_rank);
}

BOOST_AUTO_TEST_CASE(parameter_shapes) {
  const int p = world().size(), me = world().rank();
  const ch::GdpShape s{2 * p, 2, 1, 3, 2, 4};
  gdp_plan cp(exec_space(), world(), s, 4 * p);
  ch::GdpSaved<double, mem> saved;
  const std::int64_t rows = cp.input_plan().local_rows();
  matrix x("x", rows, s.input_layout().channels()), y("y", rows, s.d_inner()),
      z("z", rows, s.d_inner());
  each_bad_rank(
      "dt_bias and A_log must be [nheads]",
      [&](int bad) {
        auto params = ch::GdpParameters<double, mem>::allocate(s);
        if (me == bad) params.a_log = Kokkos::View<double*, mem>("short", s.nheads - 1);
        cp.forward(x, params, y, z, saved);
      },
      same_rank);
}

// The same refusal through pre_conv_ssm / post_conv_ssm when the caller hands the batch's packed
// metadata to the transposes alone (the reference's packed_seq_params).
BOOST_AUTO_TEST_CASE(packed_input_without_metadata_in_the_transposes) {
  const int p = world().size(), me = world().rank();
  const ch::GdpShape s{2 * p, 2, 1, 3, 2, 4};
  const std::int64_t t = 4 * p;
  zigzag_gdp_plan cp(exec_space(), world(), s, t);  // built dense
  const std::int64_t rows = cp.input_plan().local_rows();
  ch::GdpSaved<double, mem> saved;
  matrix x("x", rows, s.input_layout().channels()), u("u", t, cp.input_plan().local_channels()),
      y("y", t, cp.output_plan().local_channels()), out("out", rows, s.d_inner());
  auto cu_for = [&](int bad) {
    return me == bad ? std::vector<std::int64_t>{0, 2 * p, t} : std::vector<std::int64_t>{0, t};
  };
  each_bad_rank(
      "packed input under ZigzagPerSequence needs its sequence metadata",
      [&](int bad) { cp.pre_conv_ssm(x, u, cu_for(bad)); }, same_rank);
  each_bad_rank(
      "packed input under ZigzagPerSequence needs its sequence metadata",
      [&](int bad) { cp.post_conv_ssm(y, out, cu_for(bad)); }, same_rank);
}

// A packed plan handed a batch with other (or dense) metadata, under Contiguous too: the conv and
// the recurrence would reset their state at the wrong tokens.
BOOST_AUTO_TEST_CASE(batch_metadata_not_the_plans) {
  const int p = world().size(), me = world().rank();
  const ch::GdpShape s{2 * p, 2, 1, 3, 2, 4};
  const std::int64_t t = 4 * p;
  const std::vector<std::int64_t> cu{0, 2 * p, t};
  gdp_plan cp(exec_space(), world(), s, t, cu);
  ch::GdpSaved<double, mem> saved;
  auto params = ch::GdpParameters<double, mem>::allocate(s);
  const std::int64_t rows = cp.input_plan().local_rows();
  matrix x("x", rows, s.input_layout().channels()), y("y", rows, s.d_inner()),
      z("z", rows, s.d_inner());
  each_bad_rank(
      "the batch's cu_seqlens must be the plan's",
      [&](int bad) {
        cp.forward(x, params, y, z, saved, me == bad ? std::vector<std::int64_t>{0, t} : cu);
      },
      same_rank);
}

// The layer's outputs and the backward's gradients one row short on one rank: refused on every
// rank before anything is written past them. At P = 1 the layer writes y, z and dx and reads dy
// and dz in place (identity transposes), so these checks are all that guards them there.
BOOST_AUTO_TEST_CASE(output_and_gradient_rows) {
  const int p = world().size(), me = world().rank();
  const ch::GdpShape s{2 * p, 2, 1, 3, 2, 4};
  gdp_plan cp(exec_space(), world(), s, 4 * p);
  ch::GdpSaved<double, mem> saved;
  auto params = ch::GdpParameters<double, mem>::allocate(s);
  auto grads = ch::GdpParameters<double, mem>::allocate(s);
  const std::int64_t rows = cp.input_plan().local_rows(), c = s.input_layout().channels();
  const auto rows_of = [&](int bad) { return me == bad ? rows - 1 : rows; };
  const matrix x("x", rows, c), dx("dx", rows, c), y("y", rows, s.d_inner()),
      z("z", rows, s.d_inner());
  const std::string needle = "the sequence-parallel shard must hold this rank's rows";
  each_bad_rank(
      needle,
      [&](int bad) { cp.forward(x, params, matrix("y", rows_of(bad), s.d_inner()), z, saved); },
      same_rank);
  each_bad_rank(
      needle,
      [&](int bad) { cp.forward(x, params, y, matrix("z", rows_of(bad), s.d_inner()), saved); },
      same_rank);
  cp.forward(x, params, y, z, saved);
  each_bad_rank(
      needle,
      [&](int bad) { cp.backward(saved, matrix("dy", rows_of(bad), s.d_inner()), z, dx, grads); },
      same_rank);
  each_bad_rank(
      needle,
      [&](int bad) { cp.backward(saved, y, matrix("dz", rows_of(bad), s.d_inner()), dx, grads); },
      same_rank);
  each_bad_rank(
      needle, [&](int bad) { cp.backward(saved, y, z, matrix("dx", rows_of(bad), c), grads); },
      same_rank);
}

// A backward handed a saved state that no forward of the plan filled (an empty one, or one sized
// by a plan of another shape), on one rank or on all: refused on every rank, naming `saved`,
// before any buffer of it is read.
BOOST_AUTO_TEST_CASE(backward_without_its_forward) {
  const int p = world().size(), me = world().rank();
  const ch::GdpShape s{2 * p, 2, 1, 3, 2, 4}, other{2 * p, 2, 1, 3, 2, 2};
  gdp_plan cp(exec_space(), world(), s, 4 * p), cp_other(exec_space(), world(), other, 4 * p);
  auto params = ch::GdpParameters<double, mem>::allocate(s);
  auto grads = ch::GdpParameters<double, mem>::allocate(s, "grads");
  auto params_other = ch::GdpParameters<double, mem>::allocate(other);
  const std::int64_t rows = cp.input_plan().local_rows(), c = s.input_layout().channels();
  const matrix x("x", rows, c), dx("dx", rows, c), y("y", rows, s.d_inner()),
      z("z", rows, s.d_inner());
  const matrix x_other("x", rows, other.input_layout().channels());
  ch::GdpSaved<double, mem> filled, foreign;
  cp.forward(x, params, y, z, filled);
  cp_other.forward(x_other, params_other, y, z, foreign);
  const std::string needle = "saved must hold a forward of this plan";
  each_bad_rank_or_all(needle, [&](int bad) {
    ch::GdpSaved<double, mem> empty;
    cp.backward(bad < 0 || me == bad ? empty : filled, y, z, dx, grads);
  });
  each_bad_rank(
      needle, [&](int bad) { cp.backward(me == bad ? foreign : filled, y, z, dx, grads); },
      same_rank);
  // The filled one still works after the refusals.
  bool ok = true;
  try {
    cp.backward(filled, y, z, dx, grads);
  } catch (const std::exception& e) {
    std::cerr << "[rank " << me << "] " << e.what() << "\n";
    ok = false;
  }
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE(skip_term_shape) {
  const int p = world().size(), me = world().rank();
  for (ch::SkipTerm skip : {ch::SkipTerm::per_head, ch::SkipTerm::per_channel}) {
    const ch::GdpShape s{2 * p, 2, 1, 3, 2, 4, skip};
    gdp_plan cp(exec_space(), world(), s, 4 * p);
    ch::GdpSaved<double, mem> saved;
    const std::int64_t rows = cp.input_plan().local_rows();
    matrix x("x", rows, s.input_layout().channels()), y("y", rows, s.d_inner()),
        z("z", rows, s.d_inner());
    each_bad_rank(
        "D must have the skip term's size",
        [&](int bad) {
          auto params = ch::GdpParameters<double, mem>::allocate(s);
          // The other D shape (or none) on the bad rank.
          if (me == bad)
            params.d = Kokkos::View<double*, mem>("other",
                                                  skip == ch::SkipTerm::per_head ? s.d_inner() : 0);
          cp.forward(x, params, y, z, saved);
        },
        same_rank);
  }
}

BOOST_AUTO_TEST_CASE(ranks_disagree_on_the_skip_term) {
  const int p = world().size(), me = world().rank();
  if (p == 1) return;
  each_bad_rank(
      "every rank must agree on the skip term D",
      [&](int bad) {
        const ch::GdpShape s{
            2 * p, 2, 1, 3, 2, 4, me == bad ? ch::SkipTerm::per_head : ch::SkipTerm::none};
        gdp_plan cp(exec_space(), world(), s, 4 * p);
        ch::GdpSaved<double, mem> saved;
        const std::int64_t rows = cp.input_plan().local_rows();
        matrix x("x", rows, s.input_layout().channels()), y("y", rows, s.d_inner()),
            z("z", rows, s.d_inner());
        auto params = ch::GdpParameters<double, mem>::allocate(s);
        cp.forward(x, params, y, z, saved);
      },
      [](int bad) { return bad == 0 ? 1 : bad; });
}

// cu_seqlens must start at 0, not decrease and end exactly at T (past T the transposes would read
// past the input, short of T the tail would be dropped): one rank, then every rank (rank 0 named).
BOOST_AUTO_TEST_CASE(cu_seqlens_against_the_token_count) {
  const int p = world().size(), me = world().rank();
  const ch::GdpShape s{2 * p, 2, 1, 3, 2, 4};
  const std::int64_t t = 4 * p;
  for (std::int64_t end : {t + 1, t - 1, t + (std::int64_t{1} << 40)}) {
    each_bad_rank(
        "cu_seqlens must start at 0, not decrease and end at T",
        [&](int bad) {
          make_plan(s, t, {0, 2, me == bad ? end : t});
        },
        same_rank);
    CTXPAR_TEST_ALL(world(), throws_everywhere(
                                 world(),
                                 [&] {
                                   make_plan(s, t, {0, 2, end});
                                 },
                                 "cu_seqlens must start at 0, not decrease and end at T", 0));
  }
}

// An empty cu_seqlens means one sequence of all T tokens, as for chunkwise::SequenceLayout.
BOOST_AUTO_TEST_CASE(empty_cu_seqlens_is_one_dense_sequence) {
  const int p = world().size();
  const ch::GdpShape s{2 * p, 2, 1, 3, 2, 4};
  const std::int64_t t = 4 * p;
  transpose_plan dense(exec_space(), world(), s.input_layout(), t);
  transpose_plan explicit_dense(exec_space(), world(), s.input_layout(), t, {0, t});
  const std::vector<std::int64_t> one_sequence{0, t};
  const bool same = dense.cu_seqlens() == one_sequence &&
                    explicit_dense.cu_seqlens() == dense.cu_seqlens() &&
                    dense.local_rows() == explicit_dense.local_rows();
  CTXPAR_TEST_ALL(world(), same);
}

// T · channels that wraps int64 is refused before any buffer is sized from it; a huge T whose
// product still fits is not refused by this check.
BOOST_AUTO_TEST_CASE(token_channel_product_overflow) {
  const int p = world().size(), me = world().rank();
  const ch::GdpShape s{2 * p, 2, 1, 3, 2, 4};
  // A multiple of P near 2^62: T · channels >= 2^63 for any layout of 2 or more channels.
  const std::int64_t huge = p * ((std::int64_t{1} << 62) / p);
  each_bad_rank_or_all("T * channels must fit in int64",
                       [&](int bad) { make_plan(s, bad < 0 || me == bad ? huge : 4 * p); });
}

// Options that make the layer NaN or allocate nothing sensible: eps 0, negative or NaN, chunk
// size 0 or negative, on one rank; eps and chunk just inside the bounds still build.
BOOST_AUTO_TEST_CASE(layer_options) {
  const int p = world().size(), me = world().rank();
  const ch::GdpShape s{2 * p, 2, 1, 3, 2, 4};
  const std::int64_t t = 4 * p;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<std::pair<std::string, std::function<void(ch::GdpOptions&)>>> faults{
      {"options.l2_eps must be finite and positive", [](ch::GdpOptions& o) { o.l2_eps = 0.0; }},
      {"options.l2_eps must be finite and positive", [](ch::GdpOptions& o) { o.l2_eps = -1e-6; }},
      {"options.l2_eps must be finite and positive", [nan](ch::GdpOptions& o) { o.l2_eps = nan; }},
      {"options.chunk_size must be positive", [](ch::GdpOptions& o) { o.chunk_size = 0; }},
      {"options.chunk_size must be positive", [](ch::GdpOptions& o) { o.chunk_size = -3; }}};
  for (const auto& fault : faults) {
    // Named members, not structured bindings: a lambda may capture those only from C++20.
    const auto& spoil = fault.second;
    each_bad_rank_or_all(fault.first, [&](int bad) {
      ch::GdpOptions o;
      if (bad < 0 || me == bad) spoil(o);
      gdp_plan cp(exec_space(), world(), s, t, {}, o);
      ch::GdpSaved<double, mem> saved;
    });
  }
  bool ok = true;
  try {
    ch::GdpOptions o;
    o.l2_eps = std::numeric_limits<double>::denorm_min();
    o.chunk_size = 1;
    gdp_plan cp(exec_space(), world(), s, t, {}, o);
    ch::GdpSaved<double, mem> saved;
  } catch (const std::exception& e) {
    std::cerr << "[rank " << me << "] " << e.what() << "\n";
    ok = false;
  }
  CTXPAR_TEST_ALL(world(), ok);
}
