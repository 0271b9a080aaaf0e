// Shared machinery of the chunkwise CP tests, generic over the backend through an *adapter*:
// - a problem (global fp64 inputs built from (seed, index), packed boundaries, optional initial
//   states, output and final-state gradients),
// - `run_cp<Policy>`: uploads the rank's rows (contiguous or zigzag), runs a `CpPlan`'s forward and
//   backward and returns host copies of everything the rank computed,
// - `check_against`: compares a run on every owned token (and every state row) with a reference
//   (the fp64 oracle or the single-rank path) under a per-element bound.
//
// An adapter `A` provides:
//   using backend = …; using problem = …;       (problem has members T, H, K, V, cu, h0, dout, dht)
//   static backend make_backend(const problem&, chunkwise::BackendOptions);
//   static typename backend::inputs_type inputs(const problem&, const std::vector<Range>& rows);
//   static typename backend::gradients_type gradients(const problem&, std::int64_t local_tokens);
//   static std::vector<Array> gradient_arrays(const typename backend::gradients_type&);  //
//   token-major static Result oracle(const problem&);            // fp64 recurrence, every field
//   filled static Result bounds(const problem&, const Tolerance&);  // per-element absolute error
//   bounds
#pragma once

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ctxpar/chunkwise/driver.hpp"
#include "ctxpar/chunkwise/sequence_layout.hpp"
#include "ctxpar/core/storage.hpp"
#include "ctxpar_test/harness.hpp"

namespace ctxpar::test::chunkwise {

namespace cw = ::ctxpar::chunkwise;

/// A token range `[first, second)`.
using Range = std::pair<std::int64_t, std::int64_t>;

/// A named host array, token-major (`[T, rest…]`) for per-token quantities.
struct Array {
  std::string name;
  std::vector<double> values;
};

/// Everything one run produced (or an oracle computed), in global token order where it applies.
struct Result {
  std::vector<double> output;               ///< `[T, H, V]`
  std::vector<double> final_states;         ///< `[N, H, K, V]` (empty when not asked)
  std::vector<double> initial_state_grads;  ///< `[N, H, K, V]` (empty when not asked)
  std::vector<Array> grads;                 ///< token-major gradients, backend order
};

/// What a case exercises.
struct CaseOptions {
  bool zigzag = false;
  cw::SummaryForm form = cw::SummaryForm::packed;
  bool initial_states = false;     ///< pass h0 and ask for dh0
  bool final_state_grads = false;  ///< pass dht and ask for ht
  int chunk = 16;
  cw::ChunkProducts products = cw::ChunkProducts::exact;  ///< the backend's chunk products
};

/// Host copy of any view, flattened (16-bit values widened exactly).
template <class View>
std::vector<double> to_host(const View& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<double> out(v.span());
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<double>(ctxpar::widen(h.data()[i]));
  return out;
}

/// A view `[rows of ranges…, rest…]` holding the rows `ranges` of a token-major host array with
/// `per_token` values per token (stored through `ctxpar::narrow`: a plain conversion for float and
/// double, exact for values already of a 16-bit type).
template <class View>
View upload_rows(const std::vector<double>& global, std::int64_t per_token,
                 const std::vector<Range>& ranges, const std::string& label, std::size_t e1,
                 std::size_t e2 = KOKKOS_INVALID_INDEX, std::size_t e3 = KOKKOS_INVALID_INDEX) {
  std::int64_t rows = 0;
  for (auto r : ranges) rows += r.second - r.first;
  typename View::non_const_type v(label, static_cast<std::size_t>(rows), e1, e2, e3);
  auto h = Kokkos::create_mirror_view(v);
  std::int64_t at = 0;
  for (auto r : ranges) {
    for (std::int64_t t = r.first; t < r.second; ++t, ++at) {
      for (std::int64_t j = 0; j < per_token; ++j) {
        h.data()[at * per_token + j] = ctxpar::narrow<typename View::non_const_value_type>(
            global[static_cast<std::size_t>(t * per_token + j)]);
      }
    }
  }
  Kokkos::deep_copy(v, h);
  return v;
}

/// The rows (global token ranges, in local order) rank `r` holds under `plan`.
inline std::vector<Range> owned_rows(const cw::SequenceLayout& plan, int r) {
  std::vector<Range> out;
  for (int slot = 0; slot < plan.slots(); ++slot) {
    const int v = plan.virtual_shard(r, slot);
    out.emplace_back(plan.shard_begin(v), plan.shard_begin(v) + plan.shard_length(v));
  }
  return out;
}

/// Runs the CP forward and backward of adapter `A` on `group` for `prob`, returning the rank's
/// outputs and gradients scattered into global-size arrays (rows the rank does not own are 0) and
/// the state arrays every rank receives. Runs on the execution space of the adapter's memory space
/// unless `Exec` names another. States are in the backend's compute type (fp32 for 16-bit
/// backends, whose plan is `narrow_plan.hpp`'s).
template <class A, class Policy, class Exec = typename A::backend::memory_space::execution_space>
Result run_cp(const Group& group, const typename A::problem& prob, const CaseOptions& opt,
              std::vector<Range>* rows_out = nullptr) {
  using backend_t = typename A::backend;
  using scalar = typename backend_t::scalar_type;
  using state_scalar = ctxpar::compute_t<scalar>;
  using mem = typename backend_t::memory_space;
  const Exec space;
  const auto plan = opt.zigzag ? cw::SequenceLayout::create(group, Zigzag{}, prob.cu)
                               : cw::SequenceLayout::create(group, Contiguous{}, prob.cu);
  const std::vector<Range> rows = owned_rows(plan, group.rank());
  if (rows_out) *rows_out = rows;
  const backend_t backend = A::make_backend(prob, cw::BackendOptions{opt.chunk, 0.0, opt.products});
  const auto in = A::inputs(prob, rows);
  const std::int64_t local = plan.local_length(), N = plan.sequence_count();
  const std::size_t H = prob.H, K = prob.K, V = prob.V;
  cw::token_view<scalar, mem> out("o", local, H, V);
  cw::ForwardStates<state_scalar, mem> fs;
  cw::BackwardStates<state_scalar, mem> bs;
  if (opt.initial_states) {
    fs.initial_states = upload_rows<cw::const_sequence_states_view<state_scalar, mem>>(
        prob.h0, H * K * V, {{0, N}}, "h0", H, K, V);
    bs.initial_state_grads = cw::sequence_states_view<state_scalar, mem>("dh0", N, H, K, V);
  }
  if (opt.final_state_grads) {
    fs.final_states = cw::sequence_states_view<state_scalar, mem>("ht", N, H, K, V);
    bs.final_state_grads = upload_rows<cw::const_sequence_states_view<state_scalar, mem>>(
        prob.dht, H * K * V, {{0, N}}, "dht", H, K, V);
  }
  cw::DriverOptions dopt;
  dopt.form = opt.form;
  auto cp = cw::make_cp_plan<Policy>(space, group, backend, plan, backend.shape(in), dopt);
  typename decltype(cp)::context_type ctx;
  cp.forward(in, out, ctx, fs);
  const auto dout =
      upload_rows<cw::const_token_view<scalar, mem>>(prob.dout, H * V, rows, "dout", H, V);
  const auto grads = A::gradients(prob, local);
  cp.backward(ctx, dout, grads, bs);

  Result res;
  const std::int64_t T = prob.T;
  auto scatter = [&](const std::vector<double>& local_vals, std::int64_t per_token) {
    std::vector<double> global(static_cast<std::size_t>(T * per_token), 0.0);
    std::int64_t at = 0;
    for (auto r : rows) {
      for (std::int64_t t = r.first; t < r.second; ++t, ++at) {
        for (std::int64_t j = 0; j < per_token; ++j) {
          global[static_cast<std::size_t>(t * per_token + j)] =
              local_vals[static_cast<std::size_t>(at * per_token + j)];
        }
      }
    }
    return global;
  };
  res.output = scatter(to_host(out), H * V);
  for (auto& a : A::gradient_arrays(grads)) {
    const std::int64_t per = local > 0 ? static_cast<std::int64_t>(a.values.size()) / local : 0;
    res.grads.push_back({a.name, local > 0 ? scatter(a.values, per)
                                           : std::vector<double>(static_cast<std::size_t>(T) * 0)});
  }
  if (opt.final_state_grads) res.final_states = to_host(fs.final_states);
  if (opt.initial_states) res.initial_state_grads = to_host(bs.initial_state_grads);
  return res;
}

/// Compares `got` with `want` under `bound` on the rows listed (token-major arrays) and on every
/// state row. Local verdict; report through CTXPAR_TEST_ALL.
inline bool check_against(const std::string& what, const Result& got, const Result& want,
                          const Result& bound, const std::vector<Range>& rows, std::int64_t T) {
  bool ok = true;
  auto check_rows = [&](const std::string& name, const std::vector<double>& a,
                        const std::vector<double>& e, const std::vector<double>& b) {
    if (e.empty() || T == 0) return;
    const std::int64_t per = static_cast<std::int64_t>(e.size()) / T;
    for (auto r : rows) {
      const std::int64_t n = (r.second - r.first) * per, base = r.first * per;
      ok = all_close(
               what + " " + name, n,
               [&](std::int64_t i) { return a[static_cast<std::size_t>(base + i)]; },
               [&](std::int64_t i) { return e[static_cast<std::size_t>(base + i)]; },
               [&](std::int64_t i) { return b[static_cast<std::size_t>(base + i)]; },
               [&](std::int64_t i) {
                 std::ostringstream s;
                 s << "token " << r.first + i / per << " element " << i % per;
                 return s.str();
               }) &&
           ok;
    }
  };
  auto check_all = [&](const std::string& name, const std::vector<double>& a,
                       const std::vector<double>& e, const std::vector<double>& b) {
    if (e.empty()) return;
    ok = all_close(
             what + " " + name, static_cast<std::int64_t>(e.size()),
             [&](std::int64_t i) { return a[static_cast<std::size_t>(i)]; },
             [&](std::int64_t i) { return e[static_cast<std::size_t>(i)]; },
             [&](std::int64_t i) { return b[static_cast<std::size_t>(i)]; },
             [&](std::int64_t i) { return "flat index " + std::to_string(i); }) &&
         ok;
  };
  check_rows("output", got.output, want.output, bound.output);
  for (std::size_t g = 0; g < want.grads.size() && g < got.grads.size(); ++g) {
    check_rows(want.grads[g].name, got.grads[g].values, want.grads[g].values,
               bound.grads[g].values);
  }
  if (!got.final_states.empty())
    check_all("final states", got.final_states, want.final_states, bound.final_states);
  if (!got.initial_state_grads.empty()) {
    check_all("initial-state gradients", got.initial_state_grads, want.initial_state_grads,
              bound.initial_state_grads);
  }
  return ok;
}

/// `bound` scaled by `factor` (the single-rank path may err in either direction, so CP vs
/// single-rank allows the sum of both paths' bounds).
inline Result scaled(const Result& bound, double factor) {
  Result r = bound;
  auto s = [factor](std::vector<double>& v) {
    for (auto& x : v) x *= factor;
  };
  s(r.output);
  s(r.final_states);
  s(r.initial_state_grads);
  for (auto& g : r.grads) s(g.values);
  return r;
}

/// A packed layout of `T` tokens from sequence lengths (`{T}` for one sequence).
inline std::vector<std::int64_t> cu_from_lengths(const std::vector<std::int64_t>& lengths) {
  std::vector<std::int64_t> cu{0};
  for (auto l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

}  // namespace ctxpar::test::chunkwise
