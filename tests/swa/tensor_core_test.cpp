// The tensor-core sliding-window attention kernels (KernelChoice::tensor_core) on bfloat16,
// float16 and float (read as TF32). On the host spaces the warp is emulated
// (core/impl/warp_lanes.hpp), so this runs the kernels' fragment loads, masking, online softmax
// and stores in CPU CI; on a CUDA device of sm_80 or later, the instructions. On every rank, at
// every rank count: forward and backward within the fp64 oracle's bound with the products'
// operand roundings counted; forward and dQ bitwise equal to the single-rank step on the same
// kernels (rank-count independence); empty axes and queries that see no key, forward and backward;
// the choice refused by name for double and for head dimensions above 256.
#include <Kokkos_Core.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "ctxpar/swa/distributed_step.hpp"
#include "ctxpar/swa/impl/reference_step.hpp"
#include "ctxpar/swa/impl/tensor_core_tiles.hpp"
#include "ctxpar_test/harness.hpp"
#include "ctxpar_test/roundoff.hpp"
#include "fixtures.hpp"

namespace ts = ctxpar::test::swa;
using ctxpar::BalancedChunks;
using ctxpar::test::world;

namespace {

constexpr auto tensor_core = ctxpar::swa::KernelChoice::tensor_core;

/// The storage types of the tensor-core kernels (bfloat16, float16, and float read as TF32) on the
/// default execution space: the device in a GPU build, the first host backend (which emulates the
/// warp) otherwise.
template <class Scalar>
using On = ctxpar::test::Case<Kokkos::DefaultExecutionSpace, Scalar>;
using tensor_core_cases = std::tuple<On<ctxpar::bfloat16>, On<ctxpar::float16>, On<float>>;

struct Variant {
  std::int64_t tokens, c, window, hq, hkv, dim, first, step;
  std::vector<std::int64_t> docs;
};

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {70, 0, 8, 4, 1, 16, 0, 1, {}},            // c = 0, GQA 4 heads per team, several blocks
      {45, 0, 1, 2, 2, 8, 0, 1, {}},             // W = 1 (self only), MHA: 4 row blocks a team
      {40, 9, 50, 4, 1, 8, 3, 2, {}},            // W >= L, positions with gaps
      {90, 30, 0, 4, 1, 8, 0, 1, {33, 34, 70}},  // unlimited window, packed ids near tile edges
      {10, 9, 10, 2, 1, 8, 0, 1, {}},            // t = 1 (decode)
      {2, 1, 3, 2, 2, 8, 5, 1, {}},              // L < P
      {230, 100, 140, 2, 2, 8, 0, 1, {170}},     // fully visible tiles next to a window edge
      {100, 20, 40, 8, 2, 72, 0, 1, {}},         // D = 72: padded to 128, a partial depth block
      {60, 10, 30, 2, 1, 136, 0, 1, {25}},       // D = 136: padded to 256
      {120, 40, 70, 4, 2, 12, 0, 1, {}},         // D = 12: rows staged element by element
  };
  return v;
}

/// One team stages a tile of `rows` (head 1 of a (32, 2, DP) view) as the tensor-core kernels do
/// (`TensorCoreTiles::stage`: by 16-byte asynchronous copies where `by_copies`, else element by
/// element), the first `valid_rows` rows and `dim` columns, and writes the tile to `out`.
template <class Exec, class Scalar, int DP>
struct StagedTile {
  using Tiles = ctxpar::swa::impl::TensorCoreTiles<Scalar, DP>;
  using Op = typename Tiles::Op;
  using Mem = typename Exec::memory_space;
  using Member = typename Kokkos::TeamPolicy<Exec>::member_type;
  Kokkos::View<const Scalar***, Kokkos::LayoutRight, Mem> rows;
  Kokkos::View<Op**, Kokkos::LayoutRight, Mem> out;
  int dim, valid_rows;
  bool by_copies;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    Op* tile = static_cast<Op*>(team.team_scratch(0).get_shmem_aligned(Tiles::tile_bytes(), 16));
    ctxpar::impl::AsyncCopies<Tiles::copies_for(Tiles::width)> copies;
    Tiles::stage(
        team, copies, by_copies, tile, dim, [&](int j) { return j < valid_rows; },
        [&](int j) { return Tiles::row_of(rows, j, 1); });
    copies.commit();
    copies.template wait<0>();
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, Tiles::width * DP), [&](const int e) {
      out(e / DP, e % DP) = tile[(e / DP) * Tiles::ld + e % DP];
    });
  }

  /// The staged tile, on the host.
  static auto run(const Kokkos::View<const Scalar***, Kokkos::LayoutRight, Mem>& rows, int dim,
                  int valid_rows, bool by_copies) {
    Kokkos::View<Op**, Kokkos::LayoutRight, Mem> out("staged", Tiles::width, DP);
    Kokkos::parallel_for(
        "ctxpar::test::staged_tile",
        Kokkos::TeamPolicy<Exec>(1, ctxpar::impl::warp_team_size<Exec>(Tiles::warps))
            .set_scratch_size(0, Kokkos::PerTeam(Tiles::tile_bytes() + 16)),
        StagedTile{rows, out, dim, valid_rows, by_copies});
    return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  }
};

template <class A, class B>
bool same_bits(const char* what, const A& a, const B& b) {
  const bool same = ts::bitwise_equal(a, b);
  if (!same) std::cerr << "[rank " << world().rank() << "] " << what << " differs bitwise\n";
  return same;
}

/// One variant under `Policy`: the distributed step and the single-rank step, both on the
/// tensor-core forward, against the oracle and each other.
template <class C, class Policy>
bool variant_case(const Variant& v, std::uint64_t seed) {
  using Scalar = typename C::scalar_type;
  using Mem = typename C::memory_space;
  using namespace ctxpar::swa;
  const auto& group = world();
  typename C::execution_space space;
  ts::StreamSpec spec;
  spec.tokens = v.tokens;
  spec.window = v.window;
  spec.hq = v.hq;
  spec.hkv = v.hkv;
  spec.dim = v.dim;
  spec.first_position = v.first;
  spec.position_step = v.step;
  spec.document_starts = v.docs;
  spec.seed = seed;
  auto s = ts::make_stream<Scalar>(spec);
  for (std::int64_t i = 0; i < v.c; ++i)
    for (std::int64_t a = 0; a < spec.hq; ++a)
      for (std::int64_t d = 0; d < spec.dim; ++d) s.dout(i, a, d) = 0;
  const auto f = ts::forward(s.problem);
  const auto g = ts::backward(s.problem, f, s.dout);
  const auto b = ts::bounds(s.problem, f, s.dout, ctxpar::test::tensor_core_roundoff<Scalar>());
  Options o;
  o.window = spec.window;
  o.rope_base = spec.base;
  o.kernels = tensor_core;
  const std::int64_t t = v.tokens - v.c;
  const int rank = group.rank(), ranks = group.size();
  const BalancedChunks cs{v.c, ranks}, qs{t, ranks};
  const std::int64_t cache_from = cs.begin(rank), chunk_from = v.c + qs.begin(rank);
  const std::int64_t q0 = qs.begin(rank), tr = qs.size(rank);
  StepPlan<Policy, SegmentChunks, typename C::execution_space, Scalar, Mem> plan(
      space, group, StepShape{spec.hq, spec.hkv, spec.dim}, o);
  const auto single =
      impl::reference_step_forward(space, ts::chunk_of<Scalar, Mem>(s.problem, v.c, t),
                                   ts::block_of<Scalar, Mem>(s.problem, 0, v.c), o);
  const auto single_g =
      impl::reference_step_backward(space, single.state, ts::to_view<Scalar, Mem>(s.dout, v.c, t));
  auto out = allocate_output<Scalar, Mem>(plan.shape(), tr);
  Cache<Scalar, Mem> next_cache;
  DistributedState<Scalar, Mem> state;
  plan.forward(ts::chunk_of<Scalar, Mem>(s.problem, chunk_from, tr),
               ts::block_of<Scalar, Mem>(s.problem, cache_from, cs.size(rank)), out, next_cache,
               state);
  auto grads = allocate_gradients(plan.shape(), state);
  plan.backward(state, ts::to_view<Scalar, Mem>(s.dout, chunk_from, tr), {}, grads);
  bool ok = true;
  ok = ts::close_to("single out", single.out, f.out, b.out, v.c) && ok;
  ok = ts::close_to("single dq", single_g.dq, g.dq, b.dq, v.c) && ok;
  ok = ts::close_to("single dk", single_g.dk, g.dk, b.dk, v.c) && ok;
  ok = ts::close_to("single dv", single_g.dv, g.dv, b.dv, v.c) && ok;
  ok = ts::close_to("single dk_cache", single_g.dk_cache, g.dk, b.dk, 0) && ok;
  ok = ts::close_to("single dv_cache", single_g.dv_cache, g.dv, b.dv, 0) && ok;
  ok = ts::close_to("out", out, f.out, b.out, chunk_from) && ok;
  ok = ts::close_to("dq", grads.dq, g.dq, b.dq, chunk_from) && ok;
  ok = ts::close_to("dk", grads.dk, g.dk, b.dk, chunk_from) && ok;
  ok = ts::close_to("dv", grads.dv, g.dv, b.dv, chunk_from) && ok;
  ok = ts::close_to("dk_cache", grads.dk_cache, g.dk, b.dk, cache_from) && ok;
  ok = ts::close_to("dv_cache", grads.dv_cache, g.dv, b.dv, cache_from) && ok;
  // Rank-count independence: forward and dQ bitwise the single-rank step's.
  ok = same_bits("distributed out vs single-rank", out, impl::tokens(single.out, q0, tr)) && ok;
  ok =
      same_bits("distributed dq vs single-rank", grads.dq, impl::tokens(single_g.dq, q0, tr)) && ok;
  if (!ok)
    std::cerr << "  [rank " << rank << "] L=" << v.tokens << " c=" << v.c << " W=" << v.window
              << " Hq=" << v.hq << " Hkv=" << v.hkv << " D=" << v.dim << "\n";
  return ok;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(swa_tensor_core_forward)

BOOST_AUTO_TEST_CASE_TEMPLATE(oracle_and_rank_count_independence, C, tensor_core_cases) {
  bool ok = true;
  std::uint64_t seed = 700;
  for (const auto& v : variants()) {
    ok = variant_case<C, ctxpar::swa::RopeBeforeGather>(v, seed) && ok;
    ok = variant_case<C, ctxpar::swa::HaloKV>(v, seed++) && ok;
  }
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(empty_axes_and_queries_without_keys, C, tensor_core_cases) {
  using Scalar = typename C::scalar_type;
  using Mem = typename C::memory_space;
  using Acc = ctxpar::swa::accumulator_t<Scalar>;
  using ConstTensor = Kokkos::View<const Scalar***, Kokkos::LayoutRight, Mem>;
  using ConstLse = Kokkos::View<const Acc**, Kokkos::LayoutRight, Mem>;
  typename C::execution_space space;
  ts::StreamSpec spec;
  spec.tokens = 80;
  spec.hq = 4;
  spec.hkv = 1;
  spec.dim = 8;
  spec.window = 0;
  spec.document_starts = {40};
  auto s = ts::make_stream<Scalar>(spec);
  const auto mask = ctxpar::swa::document_mask();
  const Acc masked = ctxpar::swa::impl::masked_score<Acc>();
  bool ok = true;
  // (queries, keys): no keys at all; queries of document 1 against keys of document 0 only (no
  // query sees a key); no queries.
  const std::array<std::array<std::int64_t, 4>, 3> shapes = {
      {{40, 40, 0, 0}, {40, 40, 0, 40}, {0, 0, 0, 40}}};
  for (const auto& sh : shapes) {
    const auto in = ts::direct_inputs<Scalar, Mem>(s, sh[0], sh[1], sh[2], sh[3]);
    const std::int64_t tq = sh[1], nk = sh[3];
    ctxpar::swa::Tensor<Scalar, Mem> out("out", tq, 4, 8);
    Kokkos::View<Acc***, Kokkos::LayoutRight, Mem> dq("dq", tq, 4, 8), dk("dk", nk, 1, 8),
        dv("dv", nk, 1, 8);
    Kokkos::View<Acc**, Kokkos::LayoutRight, Mem> lse("lse", tq, 4);
    Kokkos::deep_copy(out, ctxpar::narrow<Scalar>(7.0f));
    for (const auto& view : {dq, dk, dv}) Kokkos::deep_copy(view, Acc(7));
    ctxpar::swa::AttentionWorkspace<Mem> workspace;
    ctxpar::swa::attention_forward(space, mask, in, out, lse, workspace, tensor_core);
    auto dout = ts::to_view<Scalar, Mem>(s.dout, sh[0], tq);
    ctxpar::swa::attention_backward(space, mask, in, ConstTensor(out), ConstLse(lse),
                                    ConstTensor(dout), dq, dk, dv, workspace, tensor_core);
    bool here = ts::all_equal(out, 0) && ts::all_equal(lse, double(masked));
    here = ts::all_equal(dq, 0) && ts::all_equal(dk, 0) && ts::all_equal(dv, 0) && here;
    if (!here)
      std::cerr << "[rank " << world().rank() << "] tq=" << tq << " nk=" << sh[3]
                << ": not zeros / masked lse, forward or backward\n";
    ok = here && ok;
  }
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(staging_by_copies_is_staging_by_elements, C, tensor_core_cases) {
  // A tile staged by 16-byte asynchronous copies (16-bit rows, 16-byte aligned, whole copies per
  // row) holds the same bits as one staged element by element: the rows' values where a row is
  // valid and below `dim`, zeros elsewhere. Where the rows do not allow copies (a `dim` that is
  // not whole copies, a misaligned view, TF32 operands rounded on the way in) the kernels are
  // told to stage element by element.
  using Scalar = typename C::scalar_type;
  using Exec = typename C::execution_space;
  using Mem = typename C::memory_space;
  constexpr int DP = 64;
  using Probe = StagedTile<Exec, Scalar, DP>;
  using Tiles = typename Probe::Tiles;
  using Op = typename Tiles::Op;
  constexpr bool sixteen_bit = sizeof(Scalar) == 2;
  Kokkos::View<Scalar***, Kokkos::LayoutRight, Mem> rows("rows", Tiles::width, 2, DP);
  auto host = Kokkos::create_mirror_view(rows);
  for (int j = 0; j < Tiles::width; ++j)
    for (int h = 0; h < 2; ++h)
      for (int d = 0; d < DP; ++d)
        host(j, h, d) = ctxpar::narrow<Scalar>(0.25f * float((j * 7 + h * 3 + d * 5) % 61 - 30));
  Kokkos::deep_copy(rows, host);
  const Kokkos::View<const Scalar***, Kokkos::LayoutRight, Mem> in = rows;
  bool ok = true;
  const auto bits = [](Op x) {
    std::uint32_t b = 0;
    std::memcpy(&b, &x, sizeof x);
    return b;
  };
  for (const int dim : {8, 16, 40, 64}) {
    const int valid_rows = dim == 40 ? 29 : Tiles::width;
    ok = Tiles::copies_rows(dim, in) == sixteen_bit && ok;
    const auto by_elements = Probe::run(in, dim, valid_rows, false);
    const auto by_copies = Probe::run(in, dim, valid_rows, Tiles::copies_rows(dim, in));
    for (int j = 0; j < Tiles::width; ++j)
      for (int d = 0; d < DP; ++d) {
        const bool inside = j < valid_rows && d < dim;
        const Op expected = inside ? Tiles::Operands::operand(host(j, 1, d)) : Op{};
        if (bits(by_elements(j, d)) != bits(expected) || bits(by_copies(j, d)) != bits(expected)) {
          if (ok)
            std::cerr << "dim " << dim << ": staged element (" << j << ", " << d
                      << ") is not the row's value or zero\n";
          ok = false;
        }
      }
  }
  // Rows that do not allow copies.
  ok = !Tiles::copies_rows(12, in) && ok;
  const Kokkos::View<const Scalar***, Kokkos::LayoutRight, Mem, Kokkos::MemoryUnmanaged> shifted(
      rows.data() + 1, Tiles::width - 1, 2, DP);
  ok = !Tiles::copies_rows(DP, shifted) && ok;
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE(refused_where_it_cannot_run) {
  // The plan refuses the choice by name on every rank: double has no tensor-core operands, and
  // head dimensions above 256 do not fit the register accumulators.
  using Exec = Kokkos::DefaultExecutionSpace;
  using Mem = Exec::memory_space;
  using namespace ctxpar::swa;
  Options o;
  o.window = 8;
  o.kernels = tensor_core;
  bool ok = ctxpar::test::throws_everywhere(
      world(),
      [&] {
        StepPlan<RopeBeforeGather, SegmentChunks, Exec, double, Mem> plan(Exec(), world(),
                                                                          StepShape{2, 1, 8}, o);
      },
      "options.kernels = tensor_core needs float, bfloat16 or float16 tensors", -1);
  ok = ctxpar::test::throws_everywhere(
           world(),
           [&] {
             StepPlan<RopeBeforeGather, SegmentChunks, Exec, float, Mem> plan(
                 Exec(), world(), StepShape{2, 1, 264}, o);
           },
           "options.kernels = tensor_core takes head dimensions up to 256", -1) &&
       ok;
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_SUITE_END()
