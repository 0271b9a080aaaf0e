// Chunkwise CP of the gated delta rule (GDN) and the gated delta product (GDP, n_h = 2, 3)
// through the shared driver, against the fp64 token-by-token oracle and the single-rank path, on
// every rank: outputs, final states and every gradient (dq, dk, dv, dg, dβ, dh0); both composition
// policies, packed and unpacked summaries, contiguous and zigzag ownership, with and without
// initial states; single and packed sequences with boundaries on and next to rank borders,
// lengths around the chunk, empty shards. Also: the work the driver asks of the backend per rank
// (kernel launches per label) and the unchanged summary bytes.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "chunkwise/chunkwise_test_support.hpp"
#include "chunkwise/decay_oracle.hpp"
#include "chunkwise/gated_delta_cp_support.hpp"
#include "ctxpar/core/impl/warp_lanes.hpp"

namespace cwt = ctxpar::test::chunkwise;
namespace cw = ctxpar::chunkwise;
namespace gd = ctxpar::test::gated_delta;
using ctxpar::test::world;

namespace {

using cwt::bounds;
using cwt::epsilons;
using cwt::normwise_within;
// On the default space: the device in a CUDA/HIP build (the launch-count test stays on the host,
// whose kernels it counts).
template <class Scalar, bool Product>
using GdAdapter = cwt::GdAdapter<Scalar, Product, Kokkos::DefaultExecutionSpace::memory_space>;
using HostGdAdapter = cwt::GdAdapter<double, false>;
using cwt::GdCpProblem;
using cwt::make_cp_problem;
using cwt::oracle;

std::string describe(const std::string& family, const std::string& policy,
                     const cwt::CaseOptions& o, const std::vector<std::int64_t>& cu) {
  std::string s = family + "/" + policy + "/" + (o.zigzag ? "zigzag" : "contiguous") + "/" +
                  cw::to_string(o.form) + (o.initial_states ? "/states" : "") + " chunk " +
                  std::to_string(o.chunk) + " cu [";
  for (std::size_t i = 0; i < cu.size(); ++i) s += (i ? "," : "") + std::to_string(cu[i]);
  return s + "]";
}

template <class Scalar, bool Product>
bool check_problem(const std::vector<std::int64_t>& cu, int n_h, int chunk, std::uint64_t seed,
                   bool full_matrix, cw::ChunkProducts products = cw::ChunkProducts::exact) {
  using adapter = GdAdapter<Scalar, Product>;
  const auto& group = world();
  const GdCpProblem prob = make_cp_problem(seed, cu, n_h, 2, 8, 6, chunk);
  const ctxpar::Group self(MPI_COMM_SELF);
  const std::string family = std::string(Product ? "gdp n_h=" + std::to_string(n_h) : "gdn") + "/" +
                             (sizeof(Scalar) == 4 ? "float" : "double") + "/" +
                             cw::to_string(products);
  bool ok = true;
  for (int states = 0; states < 2; ++states) {
    const bool with = states == 1;
    const cwt::Result want = oracle(prob, with, with);
    cwt::CaseOptions single;
    single.chunk = chunk;
    single.initial_states = single.final_state_grads = with;
    single.products = products;
    const cwt::Result one_rank = cwt::run_cp<adapter, cw::GatherFold>(self, prob, single);
    const std::vector<cwt::Range> all{{0, prob.T}};
    ok = cwt::check_against(family + " single-rank vs oracle", one_rank, want,
                            bounds<Scalar>(prob, want, 1, products), all, prob.T) &&
         ok;
    ok = normwise_within(family + " single-rank vs oracle", one_rank, want,
                         epsilons<Scalar>(prob, 1, products)) &&
         ok;
    for (int zig = 0; zig < 2; ++zig) {
      for (int form = 0; form < 2; ++form) {
        if (!full_matrix && form == 1) continue;
        cwt::CaseOptions o = single;
        o.zigzag = zig == 1;
        o.form = form == 0 ? cw::SummaryForm::packed : cw::SummaryForm::unpacked;
        const int shards = group.size() * (o.zigzag ? 2 : 1);
        const cwt::Result bound = bounds<Scalar>(prob, want, shards, products);
        std::vector<cwt::Range> rows;
        const cwt::Result gf = cwt::run_cp<adapter, cw::GatherFold>(group, prob, o, &rows);
        ok = cwt::check_against(describe(family, "gather", o, cu) + " vs oracle", gf, want, bound,
                                rows, prob.T) &&
             ok;
        ok = cwt::check_against(describe(family, "gather", o, cu) + " vs single-rank", gf, one_rank,
                                cwt::scaled(bound, 2.0), rows, prob.T) &&
             ok;
        const cwt::Result sc = cwt::run_cp<adapter, cw::ScanCompose>(group, prob, o, &rows);
        ok = cwt::check_against(describe(family, "scan", o, cu) + " vs oracle", sc, want, bound,
                                rows, prob.T) &&
             ok;
        ok = cwt::check_against(describe(family, "scan", o, cu) + " vs gather", sc, gf,
                                cwt::scaled(bound, 2.0), rows, prob.T) &&
             ok;
      }
    }
  }
  return ok;
}

}  // namespace

BOOST_AUTO_TEST_CASE(gated_delta_rule_cp_matches_oracle_and_single_rank) {
  const auto& group = world();
  const int p = group.size();
  // One sequence, uneven split, T not a multiple of the chunk.
  CTXPAR_TEST_ALL(group, (check_problem<float, false>({0, 97}, 1, 16, 11, true)));
  CTXPAR_TEST_ALL(group, (check_problem<double, false>({0, 97}, 1, 16, 12, false)));
  // Packed: a single-token document, one spanning several ranks.
  CTXPAR_TEST_ALL(group, (check_problem<float, false>(cwt::cu_from_lengths({30, 1, 17, 45, 4}), 1,
                                                      16, 13, true)));
  // Boundaries exactly on and next to every rank border (shard length 8).
  std::vector<std::int64_t> lengths;
  for (int r = 0; r < p; ++r) {
    lengths.push_back(r % 2 == 0 ? 8 : 7);
    if (r % 2 == 1) lengths.push_back(1);
  }
  CTXPAR_TEST_ALL(group,
                  (check_problem<double, false>(cwt::cu_from_lengths(lengths), 1, 4, 15, false)));
  // Local lengths 63 / 65 with the default chunk of 64 (257 in the local test).
  CTXPAR_TEST_ALL(group, (check_problem<float, false>({0, 63 * p}, 1, 64, 16, false)));
  CTXPAR_TEST_ALL(group, (check_problem<float, false>({0, 65 * p}, 1, 64, 17, false)));
  // Fewer tokens than ranks (empty shards) and an empty document.
  CTXPAR_TEST_ALL(group, (check_problem<double, false>({0, 3}, 1, 16, 19, false)));
  CTXPAR_TEST_ALL(group, (check_problem<double, false>({0, 9, 9, 20}, 1, 16, 20, false)));
}

BOOST_AUTO_TEST_CASE(gated_delta_product_cp_matches_oracle_and_single_rank) {
  const auto& group = world();
  for (int n_h = 2; n_h <= 3; ++n_h) {
    CTXPAR_TEST_ALL(group, (check_problem<float, true>({0, 41}, n_h, 8, 30 + n_h, n_h == 2)));
    CTXPAR_TEST_ALL(group, (check_problem<double, true>(cwt::cu_from_lengths({13, 1, 9, 20}), n_h,
                                                        4, 40 + n_h, false)));
  }
}

namespace {

// The tensor-core products reach the kernels: on one rank, their output is not the exact
// products' (the inputs are not exact in any of the operand types) though within the bound.
bool tensor_core_products_are_not_the_exact_ones(cw::ChunkProducts products) {
  using adapter = GdAdapter<float, false>;
  const ctxpar::Group self(MPI_COMM_SELF);
  const GdCpProblem prob = make_cp_problem(64, {0, 40}, 1, 2, 8, 6, 16);
  cwt::CaseOptions o;
  const cwt::Result exact = cwt::run_cp<adapter, cw::GatherFold>(self, prob, o);
  o.products = products;
  const cwt::Result tensor_core = cwt::run_cp<adapter, cw::GatherFold>(self, prob, o);
  if (tensor_core.output != exact.output) return true;
  std::cerr << cw::to_string(products) << " chunk products gave the exact products' output\n";
  return false;
}

}  // namespace

// Tensor-core chunk products (the warp products emulated on the host, the instructions on a GPU
// built for sm_80 or later) for every operand type, GDN and GDP: against the oracle within the
// bound with the products' unit roundoff and against the single-rank path, on every rank; and
// refused where they cannot run (fp64 data, the decay families, ranks that disagree).
BOOST_AUTO_TEST_CASE(tensor_core_chunk_products_match_oracle_and_single_rank) {
  const auto& group = world();
  const int p = group.size();
  const cw::ChunkProducts all_products[] = {cw::ChunkProducts::tf32, cw::ChunkProducts::bfloat16,
                                            cw::ChunkProducts::float16};
  if constexpr (ctxpar::impl::has_warp_mma_v<Kokkos::DefaultExecutionSpace>) {
    for (const cw::ChunkProducts products : all_products) {
      CTXPAR_TEST_ALL(group, tensor_core_products_are_not_the_exact_ones(products));
      CTXPAR_TEST_ALL(group, (check_problem<float, false>(cwt::cu_from_lengths({30, 1, 17, 45, 4}),
                                                          1, 16, 61, false, products)));
      CTXPAR_TEST_ALL(group,
                      (check_problem<float, false>({0, 65 * p}, 1, 64, 62, false, products)));
      CTXPAR_TEST_ALL(group, (check_problem<float, true>({0, 41}, 2, 8, 63, false, products)));
    }
  }
  const GdCpProblem prob = make_cp_problem(65, {0, 20}, 1, 2, 8, 6, 16);
  cwt::CaseOptions o;
  o.products = cw::ChunkProducts::tf32;
  CTXPAR_TEST_ALL(
      group,
      ctxpar::test::throws_everywhere(
          group, [&] { cwt::run_cp<GdAdapter<double, false>, cw::GatherFold>(group, prob, o); },
          "need float or 16-bit data", -1));
  const auto decay = cwt::make_decay_problem(2, 8, 6, false, {0, 20}, 66, 16);
  CTXPAR_TEST_ALL(
      group,
      ctxpar::test::throws_everywhere(
          group,
          [&] {
            cwt::run_cp<
                cwt::DecayAdapter<double, Kokkos::DefaultExecutionSpace::memory_space, false>,
                cw::GatherFold>(group, decay, o);
          },
          "need float or 16-bit data", -1));
  if (p > 1) {
    o.products = group.rank() == p - 1 ? cw::ChunkProducts::bfloat16 : cw::ChunkProducts::exact;
    CTXPAR_TEST_ALL(
        group,
        ctxpar::test::throws_everywhere(
            group, [&] { cwt::run_cp<GdAdapter<float, false>, cw::GatherFold>(group, prob, o); },
            "the chunk products", -1));
  }
}

// Packed isolation: perturbing document 1 leaves every other document's outputs bit-identical on
// every rank, and with the output gradient zero outside document 1 every gradient outside it is
// exactly zero.
BOOST_AUTO_TEST_CASE(gated_delta_packed_documents_are_isolated) {
  using adapter = GdAdapter<float, false>;
  const auto& group = world();
  const std::vector<std::int64_t> cu = cwt::cu_from_lengths({11, 23, 1, 17});
  GdCpProblem prob = make_cp_problem(77, cu, 1, 2, 8, 6, 8);
  cwt::CaseOptions o;
  o.chunk = 8;
  std::vector<cwt::Range> rows;
  const cwt::Result base = cwt::run_cp<adapter, cw::ScanCompose>(group, prob, o, &rows);
  GdCpProblem changed = prob;
  const std::int64_t b = cu[1], e = cu[2], H = prob.H, K = prob.K, V = prob.V;
  for (std::int64_t i = b * H * K; i < e * H * K; ++i)
    changed.p.q[i] *= 0.5, changed.p.k[i] = -changed.p.k[i];
  for (std::int64_t i = b * H * V; i < e * H * V; ++i) changed.p.v[i] += 0.25;
  for (std::int64_t i = b * H; i < e * H; ++i) changed.p.beta[i] *= 0.5;
  const cwt::Result moved = cwt::run_cp<adapter, cw::ScanCompose>(group, changed, o, &rows);
  bool ok = true, differs = false;
  for (const auto& r : rows) {
    for (std::int64_t t = r.first; t < r.second; ++t) {
      for (std::int64_t i = t * H * V; i < (t + 1) * H * V; ++i) {
        if (t >= b && t < e)
          differs = differs || base.output[i] != moved.output[i];
        else
          ok = ok && base.output[i] == moved.output[i];
      }
    }
  }
  // Gradients with the output gradient confined to document 1.
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(prob.dout.size()); ++i)
    if (i < b * H * V || i >= e * H * V) prob.dout[i] = 0.0;
  const cwt::Result confined = cwt::run_cp<adapter, cw::GatherFold>(group, prob, o, &rows);
  bool nonzero_inside = false;
  for (const auto& g : confined.grads) {
    const std::int64_t per = static_cast<std::int64_t>(g.values.size()) / prob.T;
    for (const auto& r : rows)
      for (std::int64_t t = r.first; t < r.second; ++t)
        for (std::int64_t j = t * per; j < (t + 1) * per; ++j) {
          if (t >= b && t < e)
            nonzero_inside = nonzero_inside || g.values[j] != 0.0;
          else
            ok = ok && g.values[j] == 0.0;
        }
  }
  CTXPAR_TEST_ALL(group, ok);
  // Somebody owns document 1, so the perturbation and its gradients are visible somewhere.
  BOOST_TEST(!ctxpar::test::all_ranks(group, !differs));
  BOOST_TEST(!ctxpar::test::all_ranks(group, !nonzero_inside));
}

namespace {

// Launches per kernel label while installed (one test at a time per process).
std::map<std::string, int>* launch_counts = nullptr;
void count_launch(const char* name, std::uint32_t, std::uint64_t* id) {
  if (launch_counts) ++(*launch_counts)[name];
  *id = 0;
}
void ignore_end(std::uint64_t) {}

}  // namespace

// The driver asks the backend only for what the composition reads (SummaryNeeds): one sequence
// over every rank, counted per rank through Kokkos Tools. Without states, the first rank forms
// its dS with the apply's own pass (one forward pass), the last rank reads γ off the apply's own
// reverse pass, and no M is stored except on middle ranks, whose fragment continues on both
// sides. With states, every rank whose summary is read forms M (the driver bakes h0 / dh_T in
// through it). The summary bytes on the wire do not change, and the results are the ones
// gated_delta_rule_cp_matches_oracle_and_single_rank checks.
BOOST_AUTO_TEST_CASE(gated_delta_driver_does_only_the_work_the_composition_reads) {
  using adapter = HostGdAdapter;
  const auto& group = world();
  const int p = group.size(), r = group.rank();
  const bool first = r == 0, last = r == p - 1, single = p == 1;
  const std::int64_t H = 2, K = 8, V = 6;
  for (int states = 0; states < 2; ++states) {
    const GdCpProblem prob = make_cp_problem(70 + states, {0, 16 * p}, 1, H, K, V, 8);
    cwt::CaseOptions o;
    o.chunk = 8;
    o.initial_states = o.final_state_grads = states == 1;
    std::map<std::string, int> counts;
    group.reset_traffic();
    launch_counts = &counts;
    Kokkos::Tools::Experimental::set_begin_parallel_for_callback(count_launch);
    Kokkos::Tools::Experimental::set_end_parallel_for_callback(ignore_end);
    (void)cwt::run_cp<adapter, cw::GatherFold>(group, prob, o);
    Kokkos::fence();
    Kokkos::Tools::Experimental::set_begin_parallel_for_callback(nullptr);
    Kokkos::Tools::Experimental::set_end_parallel_for_callback(nullptr);
    launch_counts = nullptr;
    const int fwd = counts["ctxpar::chunkwise::gated_delta::forward_pass"];
    const int bwd = counts["ctxpar::chunkwise::gated_delta::reverse_pass"];
    const int stored_m = counts["ctxpar::chunkwise::gated_delta::store_transition"];
    // Expected by role (one sequence, one shard per rank).
    int want_fwd = 1, want_bwd = 1, want_m = 0;
    if (!single && !first && !last) {
      want_fwd = 2, want_bwd = 2, want_m = 2;  // a middle fragment: M and Mᵀ are read
    } else if (!single && states == 1) {
      // The first rank's (M, dS) carries h0 forward; the last rank's (Mᵀ, γ) carries dh_T back.
      if (first) want_fwd = 2, want_m = 1;
      if (last) want_bwd = 2, want_m = 1;
    }
    const bool ok = fwd == want_fwd && bwd == want_bwd && stored_m == want_m;
    if (!ok)
      std::cout << "[rank " << r << "] P = " << p << (states ? " with states" : " without states")
                << ": forward passes " << fwd << " (want " << want_fwd << "), reverse passes "
                << bwd << " (want " << want_bwd << "), stored transitions " << stored_m << " (want "
                << want_m << ")\n";
    CTXPAR_TEST_ALL(group, ok);
    // The wire format is unchanged: forward and backward each gather one packed dense record
    // (H·(K·V + K²) floats) from every other rank.
    const std::int64_t record = H * (K * V + K * K) * 4;
    const auto& gathered = group.traffic(ctxpar::CollectiveKind::allgather);
    CTXPAR_TEST_ALL(group, gathered.bytes_received == 2 * record * (p - 1));
  }
}
