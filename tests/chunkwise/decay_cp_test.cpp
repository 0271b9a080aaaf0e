// Chunkwise CP of the scalar-decay and diagonal-gate families against the fp64 token-by-token
// recurrence and against the single-rank path, on every rank: forward and backward (dq, dk, dv,
// dg, dh0, ht), both composition policies, packed and unpacked summaries, contiguous and zigzag,
// with and without initial states, single and packed sequences (boundaries on and next to rank
// borders), lengths that are not multiples of the chunk (63, 65, 257), empty shards, states split
// into uneven chain work items; and the chain work items tiling every state value once.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "chunkwise/chunkwise_test_support.hpp"
#include "chunkwise/decay_oracle.hpp"
#include "ctxpar/chunkwise/impl/decay_kernels.hpp"

namespace cwt = ctxpar::test::chunkwise;
namespace cw = ctxpar::chunkwise;
using ctxpar::test::world;

namespace {

// The default space: the device in a CUDA/HIP build.
using mem = Kokkos::DefaultExecutionSpace::memory_space;

std::string describe(const std::string& family, const std::string& scalar,
                     const std::string& policy, const cwt::CaseOptions& o,
                     const std::vector<std::int64_t>& cu) {
  std::string s = family + "/" + scalar + "/" + policy + "/" +
                  (o.zigzag ? "zigzag" : "contiguous") + "/" + cw::to_string(o.form) +
                  (o.initial_states ? "/states" : "") + " chunk " + std::to_string(o.chunk) +
                  " cu [";
  for (std::size_t i = 0; i < cu.size(); ++i) s += (i ? "," : "") + std::to_string(cu[i]);
  return s + "]";
}

// Runs every (policy, layout, form, states) combination of one family/scalar/problem and checks
// each against the oracle and the single-rank path. Returns the local verdict.
template <class Scalar, bool Diagonal>
bool check_problem(const std::vector<std::int64_t>& cu, int chunk, std::uint64_t seed,
                   bool full_matrix, bool strong_gates = false, std::int64_t key_dim = 8,
                   std::int64_t value_dim = 6,
                   cw::ChunkProducts products = cw::ChunkProducts::exact) {
  using adapter = cwt::DecayAdapter<Scalar, mem, Diagonal>;
  const auto& group = world();
  auto prob = cwt::make_decay_problem(2, key_dim, value_dim, Diagonal, cu, seed, chunk);
  // Log-gates in [-3.5, -1.5]: a chunk of 21 or more tokens spreads over more than 30 e-folds,
  // past the limit up to which the diagonal kernels factor a chunk's decays around one reference.
  if (strong_gates)
    for (auto& x : prob.g) x = -1.5 + (x + 0.005) / 0.03;
  const ctxpar::Group self(MPI_COMM_SELF);
  bool ok = true;
  for (int states = 0; states < 2; ++states) {
    const bool with = states == 1;
    const cwt::Result oracle = cwt::decay_oracle(prob, with, with, false).result;
    cwt::CaseOptions single;
    single.chunk = chunk;
    single.initial_states = single.final_state_grads = with;
    single.products = products;
    const double up = cw::products_unit_roundoff(products);
    const cwt::Result one_rank = cwt::run_cp<adapter, cw::GatherFold>(self, prob, single);
    const cwt::Result bound_one = cwt::decay_bounds<Scalar>(prob, with, with, 1, up);
    std::vector<cwt::Range> all{{0, prob.T}};
    ok =
        cwt::check_against("single-rank vs oracle", one_rank, oracle, bound_one, all, prob.T) && ok;
    for (int zig = 0; zig < 2; ++zig) {
      for (int form = 0; form < 2; ++form) {
        if (!full_matrix && form == 1 && zig == 1) continue;
        cwt::CaseOptions o = single;
        o.zigzag = zig == 1;
        o.form = form == 0 ? cw::SummaryForm::packed : cw::SummaryForm::unpacked;
        const int shards = group.size() * (o.zigzag ? 2 : 1);
        const cwt::Result bound = cwt::decay_bounds<Scalar>(prob, with, with, shards, up);
        const std::string family = Diagonal ? "diagonal" : "scalar";
        const std::string scalar =
            std::string(sizeof(Scalar) == 4 ? "float" : "double") + "/" + cw::to_string(products);
        std::vector<cwt::Range> rows;
        const cwt::Result gf = cwt::run_cp<adapter, cw::GatherFold>(group, prob, o, &rows);
        ok = cwt::check_against(describe(family, scalar, "gather", o, cu) + " vs oracle", gf,
                                oracle, bound, rows, prob.T) &&
             ok;
        ok = cwt::check_against(describe(family, scalar, "gather", o, cu) + " vs single-rank", gf,
                                one_rank, cwt::scaled(bound, 2.0), rows, prob.T) &&
             ok;
        const cwt::Result sc = cwt::run_cp<adapter, cw::ScanCompose>(group, prob, o, &rows);
        ok = cwt::check_against(describe(family, scalar, "scan", o, cu) + " vs oracle", sc, oracle,
                                bound, rows, prob.T) &&
             ok;
        ok = cwt::check_against(describe(family, scalar, "scan", o, cu) + " vs gather", sc, gf,
                                cwt::scaled(bound, 2.0), rows, prob.T) &&
             ok;
      }
    }
  }
  return ok;
}

template <bool Diagonal>
void run_family() {
  const auto& group = world();
  const int p = group.size();
  // One sequence, uneven split, T not a multiple of the chunk.
  CTXPAR_TEST_ALL(group, (check_problem<float, Diagonal>({0, 97}, 16, 11, true)));
  CTXPAR_TEST_ALL(group, (check_problem<double, Diagonal>({0, 97}, 16, 12, true)));
  // Packed: boundaries anywhere, one document of a single token, one spanning several ranks.
  CTXPAR_TEST_ALL(group, (check_problem<float, Diagonal>(cwt::cu_from_lengths({30, 1, 17, 45, 4}),
                                                         16, 13, true)));
  CTXPAR_TEST_ALL(group, (check_problem<double, Diagonal>(cwt::cu_from_lengths({30, 1, 17, 45, 4}),
                                                          16, 14, false)));
  // Boundaries exactly on and next to every rank border (shard length L = 8).
  std::vector<std::int64_t> lengths;
  for (int r = 0; r < p; ++r) {
    lengths.push_back(r % 2 == 0 ? 8 : 7);
    if (r % 2 == 1) lengths.push_back(1);
  }
  CTXPAR_TEST_ALL(group,
                  (check_problem<double, Diagonal>(cwt::cu_from_lengths(lengths), 4, 15, false)));
  // Local lengths 63 / 65 / 257 with the default chunk of 64.
  CTXPAR_TEST_ALL(group, (check_problem<float, Diagonal>({0, 63 * p}, 64, 16, false)));
  CTXPAR_TEST_ALL(group, (check_problem<float, Diagonal>({0, 65 * p}, 64, 17, false)));
  if (p <= 2)
    CTXPAR_TEST_ALL(group, (check_problem<double, Diagonal>({0, 257 * p}, 64, 18, false)));
  // Strong gates: the diagonal family's sub-block path (and the same data for scalar decay).
  CTXPAR_TEST_ALL(group, (check_problem<float, Diagonal>({0, 70 * p}, 64, 21, false, true)));
  CTXPAR_TEST_ALL(group, (check_problem<double, Diagonal>({0, 70 * p}, 32, 22, false, true)));
  // Fewer tokens than ranks: empty shards (and empty zigzag chunks).
  CTXPAR_TEST_ALL(group, (check_problem<double, Diagonal>({0, 3}, 16, 19, true)));
  // Empty sequences inside cu_seqlens: their final state is their initial state.
  CTXPAR_TEST_ALL(group, (check_problem<double, Diagonal>({0, 9, 9, 20}, 16, 20, false)));
  // A state the chains split into uneven work items: V = 100 puts 10 whole rows in a host item, so
  // K = 12 leaves 2 rows in the last one; the device order (the portable build) carries 16
  // columns, so 4 in the last block of each row. Two sequences: the chains start and end in them.
  CTXPAR_TEST_ALL(group, (check_problem<float, Diagonal>(cwt::cu_from_lengths({40, 25}), 16, 23,
                                                         false, false, 12, 100)));
}

// The tensor-core products reach every product kernel: on one rank, the output and every
// gradient differ from the exact products' (the inputs are not exact in any operand type).
template <bool Diagonal>
bool tensor_core_products_are_not_the_exact_ones(cw::ChunkProducts products) {
  using adapter = cwt::DecayAdapter<float, mem, Diagonal>;
  const ctxpar::Group self(MPI_COMM_SELF);
  const auto prob = cwt::make_decay_problem(2, 8, 6, Diagonal, {0, 40}, 31, 16);
  cwt::CaseOptions o;
  o.chunk = 16;
  const cwt::Result exact = cwt::run_cp<adapter, cw::GatherFold>(self, prob, o);
  o.products = products;
  const cwt::Result tensor_core = cwt::run_cp<adapter, cw::GatherFold>(self, prob, o);
  bool ok = tensor_core.output != exact.output;
  for (std::size_t i = 0; i < exact.grads.size(); ++i)
    ok = ok && tensor_core.grads[i].values != exact.grads[i].values;
  if (!ok)
    std::cerr << cw::to_string(products)
              << " chunk products gave the exact products' output or a gradient\n";
  return ok;
}

// Tensor-core chunk products (emulated on the host): every rank against the oracle under the
// bound with the products' share (`cw::decay_products_roundoff_factor`) and against the
// single-rank path, packed and not, on the tiled and the strong-gate (sub-block) paths.
template <bool Diagonal>
void run_tensor_core_products() {
  const auto& group = world();
  const int p = group.size();
  for (const cw::ChunkProducts products :
       {cw::ChunkProducts::tf32, cw::ChunkProducts::bfloat16, cw::ChunkProducts::float16}) {
    CTXPAR_TEST_ALL(group, tensor_core_products_are_not_the_exact_ones<Diagonal>(products));
    CTXPAR_TEST_ALL(group, (check_problem<float, Diagonal>(cwt::cu_from_lengths({30, 1, 17, 45, 4}),
                                                           16, 13, false, false, 8, 6, products)));
    CTXPAR_TEST_ALL(
        group, (check_problem<float, Diagonal>({0, 65 * p}, 64, 17, false, false, 8, 6, products)));
    CTXPAR_TEST_ALL(
        group, (check_problem<float, Diagonal>({0, 70 * p}, 64, 21, false, true, 8, 6, products)));
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(scalar_decay_cp_matches_oracle_and_single_rank) {
  run_family<false>();
}

BOOST_AUTO_TEST_CASE(diagonal_gate_cp_matches_oracle_and_single_rank) {
  run_family<true>();
}

BOOST_AUTO_TEST_CASE(scalar_decay_tensor_core_products_match_oracle_and_single_rank) {
  run_tensor_core_products<false>();
}

BOOST_AUTO_TEST_CASE(diagonal_gate_tensor_core_products_match_oracle_and_single_rank) {
  run_tensor_core_products<true>();
}

namespace {

// Every value of every (sequence, head) state belongs to exactly one chain work item, which holds
// at most `Capacity` values and spans several key rows only when it holds whole rows.
template <int Capacity>
bool chain_items_cover_each_state_value_once(std::int64_t K, std::int64_t V) {
  cw::impl::ChainForwardKernel<double, Kokkos::HostSpace, false, Capacity> chain{};
  const std::int64_t first = 1, seqs = 2, heads = 3;
  chain.s_lo = first;
  chain.heads = heads;
  chain.kdim = K;
  chain.vdim = V;
  chain.tiling = cw::impl::ChainTiling::of(K, V, Capacity);
  std::vector<int> seen(static_cast<std::size_t>(seqs * heads * K * V), 0);
  bool ok = true;
  for (std::int64_t i = 0; i < chain.tiling.items(seqs, heads); ++i) {
    const cw::impl::ChainItem it = chain.item(i);
    const bool shaped = it.rows >= 1 && it.w >= 1 && it.rows * it.w <= Capacity &&
                        (it.rows == 1 || it.w == V) && it.s >= first && it.s < first + seqs &&
                        it.h >= 0 && it.h < heads && it.kk0 + it.rows <= K && it.v0 + it.w <= V;
    if (!shaped) {
      std::cerr << "chain item " << i << " of K " << K << ", V " << V << ", capacity " << Capacity
                << ": " << it.rows << " rows from " << it.kk0 << ", " << it.w << " columns from "
                << it.v0 << "\n";
      return false;
    }
    for (int r = 0; r < it.rows; ++r)
      for (int j = 0; j < it.w; ++j)
        ++seen[static_cast<std::size_t>((((it.s - first) * heads + it.h) * K + it.kk0 + r) * V +
                                        it.v0 + j)];
  }
  for (std::size_t e = 0; e < seen.size(); ++e) {
    if (seen[e] != 1) {
      std::cerr << "chain state value " << e << " of K " << K << ", V " << V << ", capacity "
                << Capacity << " is carried by " << seen[e] << " items\n";
      ok = false;
    }
  }
  return ok;
}

// L = Σ o·dout + Σ h_T·dh_T of the fp64 oracle.
double oracle_loss(const cwt::DecayProblem& p) {
  const auto r = cwt::decay_oracle(p, true, true, false).result;
  double l = 0;
  for (std::size_t i = 0; i < r.output.size(); ++i) l += r.output[i] * p.dout[i];
  for (std::size_t i = 0; i < r.final_states.size(); ++i) l += r.final_states[i] * p.dht[i];
  return l;
}

// Central differences in fp64 (step h): truncation error h²/6·|L'''| and rounding error
// u·|L|/h, both far below the bound used here for O(1) inputs on these tiny shapes.
bool oracle_matches_finite_differences(bool diagonal) {
  auto p = cwt::make_decay_problem(1, 3, 2, diagonal, cwt::cu_from_lengths({4, 3}), 41, 4);
  const auto analytic = cwt::decay_oracle(p, true, true, false).result;
  const double h = 1e-5, bound = 1e-7;
  bool ok = true;
  auto check = [&](std::vector<double> cwt::DecayProblem::*field, const std::vector<double>& grad,
                   const char* name) {
    for (std::size_t i = 0; i < (p.*field).size(); ++i) {
      const double x = (p.*field)[i];
      (p.*field)[i] = x + h;
      const double up = oracle_loss(p);
      (p.*field)[i] = x - h;
      const double down = oracle_loss(p);
      (p.*field)[i] = x;
      const double fd = (up - down) / (2 * h);
      if (!(std::fabs(fd - grad[i]) <= bound * (1 + std::fabs(fd)))) {
        std::cerr << "oracle " << name << "[" << i << "]: analytic " << grad[i]
                  << ", finite difference " << fd << "\n";
        ok = false;
      }
    }
  };
  check(&cwt::DecayProblem::q, analytic.grads[0].values, "dq");
  check(&cwt::DecayProblem::k, analytic.grads[1].values, "dk");
  check(&cwt::DecayProblem::v, analytic.grads[2].values, "dv");
  check(&cwt::DecayProblem::g, analytic.grads[3].values, "dg");
  check(&cwt::DecayProblem::h0, analytic.initial_state_grads, "dh0");
  return ok;
}

}  // namespace

BOOST_AUTO_TEST_CASE(chain_work_items_tile_the_state) {
  // The device capacity and the host's, at states that fill them exactly, leave a partial row
  // block or a partial column block, and rows wider than the host capacity.
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes{
      {1, 1}, {8, 6}, {12, 100}, {128, 128}, {40, 1024}, {7, 1025}, {3, 2000}};
  for (const auto& [K, V] : shapes) {
    CTXPAR_TEST_ALL(
        world(), (chain_items_cover_each_state_value_once<cw::impl::device_chain_capacity>(K, V)));
    CTXPAR_TEST_ALL(world(),
                    (chain_items_cover_each_state_value_once<cw::impl::host_chain_capacity>(K, V)));
  }
}

BOOST_AUTO_TEST_CASE(oracle_gradients_match_finite_differences) {
  CTXPAR_TEST_ALL(world(), oracle_matches_finite_differences(false));
  CTXPAR_TEST_ALL(world(), oracle_matches_finite_differences(true));
}

#ifdef KOKKOS_ENABLE_SERIAL
// The same driver on the Serial backend (the other tests run on the default space).
BOOST_AUTO_TEST_CASE(serial_execution_space) {
  using adapter = cwt::DecayAdapter<double, Kokkos::Serial::memory_space, true>;
  const auto& group = world();
  const auto prob =
      cwt::make_decay_problem(2, 5, 3, true, cwt::cu_from_lengths({20, 7, 30}), 61, 8);
  cwt::CaseOptions o;
  o.chunk = 8;
  o.zigzag = true;
  o.initial_states = o.final_state_grads = true;
  std::vector<cwt::Range> rows;
  const auto got = cwt::run_cp<adapter, cw::ScanCompose, Kokkos::Serial>(group, prob, o, &rows);
  const auto oracle = cwt::decay_oracle(prob, true, true, false).result;
  const auto bound = cwt::decay_bounds<double>(prob, true, true, 2 * group.size());
  CTXPAR_TEST_ALL(group, cwt::check_against("serial", got, oracle, bound, rows, prob.T));
}
#endif
