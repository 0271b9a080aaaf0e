// Checks shared by the numerics tests of every family (decay_numerics_test.cpp,
// gated_delta_numerics_test.cpp): dg's accuracy next to dq's and dk's in the same run, and the
// isolation of a non-finite input inside its document.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "chunkwise/chunkwise_test_support.hpp"

namespace ctxpar::test::chunkwise {

/// Global relative L2 error of `got` against `want` over the rows each rank owns (collective).
inline double relative_l2(const std::vector<double>& got, const std::vector<double>& want,
                          const std::vector<Range>& rows, std::int64_t T) {
  double sums[2] = {0, 0}, all[2] = {0, 0};
  const std::int64_t per = T > 0 ? static_cast<std::int64_t>(want.size()) / T : 0;
  for (auto r : rows) {
    for (std::int64_t i = r.first * per; i < r.second * per; ++i) {
      const double d = got[static_cast<std::size_t>(i)] - want[static_cast<std::size_t>(i)];
      sums[0] += d * d;
      sums[1] += want[static_cast<std::size_t>(i)] * want[static_cast<std::size_t>(i)];
    }
  }
  MPI_Allreduce(sums, all, 2, MPI_DOUBLE, MPI_SUM, world().mpi_comm());
  return std::isnan(all[0]) ? all[0] : std::sqrt(all[0] / (all[1] > 0 ? all[1] : 1.0));
}

/// dg's relative L2 error against the oracle within 4·max(dq's, dk's) of the same run (gradients
/// in the order dq, dk, dv, dg, …). Every term of dg (a straddling pair's contribution, the state
/// reaching a query, a key reaching the end state) is one product of the factors dq and dk are
/// built from, and each dg entry accumulates two sums of at most C (C·n_h) such terms where dq and
/// dk accumulate one: so dg's error is at most about twice theirs; 4× allows for the data. Across
/// shards the state reaching a query and the gradient reaching a key travel as fp32 summaries (by
/// design, whatever the activation type): those terms of dg carry u_fp32 relative error and are at
/// most all of dg, while dq and dk barely show it (their undecayed local terms dominate), so u_fp32
/// is added when there is more than one rank. Collective; prints the three errors on rank 0.
inline bool dg_as_accurate_as_dq_dk(const Result& got, const Result& want,
                                    const std::vector<Range>& rows, std::int64_t T,
                                    const std::string& what) {
  const double eq = relative_l2(got.grads[0].values, want.grads[0].values, rows, T);
  const double ek = relative_l2(got.grads[1].values, want.grads[1].values, rows, T);
  const double eg = relative_l2(got.grads[3].values, want.grads[3].values, rows, T);
  const double summaries = world().size() > 1 ? unit_roundoff<float>() : 0.0;
  const bool ok = eg <= 4.0 * std::max(eq, ek) + summaries;
  if (world().rank() == 0) {
    std::cerr << what << " np " << world().size() << ": dq " << eq << " dk " << ek << " dg " << eg
              << (ok ? "" : "  <-- dg above the bound") << "\n";
  }
  return ok;
}

/// True iff `a` and `b` (two runs differing only inside document `doc`) are bitwise equal on every
/// owned token row outside the document and on every other document's state rows. Local verdict.
inline bool same_outside_document(const Result& a, const Result& b,
                                  const std::vector<std::int64_t>& cu, int doc,
                                  const std::vector<Range>& rows, const std::string& what) {
  const std::int64_t T = cu.back(), db = cu[static_cast<std::size_t>(doc)],
                     de = cu[static_cast<std::size_t>(doc) + 1];
  const std::size_t docs = cu.size() - 1;
  bool ok = true;
  auto tokens = [&](const std::string& name, const std::vector<double>& x,
                    const std::vector<double>& y) {
    const std::int64_t per = static_cast<std::int64_t>(x.size()) / T;
    for (auto r : rows) {
      for (std::int64_t tok = r.first; tok < r.second; ++tok) {
        if (tok >= db && tok < de) continue;
        for (std::int64_t j = 0; j < per; ++j) {
          const std::size_t i = static_cast<std::size_t>(tok * per + j);
          if (!(x[i] == y[i])) {
            std::cerr << "[rank " << world().rank() << "] " << what << " changed " << name
                      << " at token " << tok << " element " << j << ": " << x[i] << " -> " << y[i]
                      << "\n";
            ok = false;
            return;
          }
        }
      }
    }
  };
  auto states = [&](const std::string& name, const std::vector<double>& x,
                    const std::vector<double>& y) {
    const std::size_t per = x.size() / docs;
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (i / per == static_cast<std::size_t>(doc)) continue;
      if (!(x[i] == y[i])) {
        std::cerr << "[rank " << world().rank() << "] " << what << " changed " << name
                  << " of document " << i / per << ": " << x[i] << " -> " << y[i] << "\n";
        ok = false;
        return;
      }
    }
  };
  tokens("output", a.output, b.output);
  for (std::size_t g = 0; g < a.grads.size(); ++g)
    tokens(a.grads[g].name, a.grads[g].values, b.grads[g].values);
  states("final state", a.final_states, b.final_states);
  states("initial-state gradient", a.initial_state_grads, b.initial_state_grads);
  return ok;
}

/// Runs `clean` and `dirty` (which differ by a non-finite value of input `field` inside document
/// 1) through adapter `A` with policy `Policy` (chunk 4, initial states and final-state gradients)
/// and checks `same_outside_document`. Local verdict.
template <class A, class Policy, class Problem>
bool non_finite_stays_in_document_1(const Problem& clean, const Problem& dirty, bool zigzag,
                                    int field) {
  CaseOptions o;
  o.chunk = 4;
  o.zigzag = zigzag;
  o.initial_states = o.final_state_grads = true;
  std::vector<Range> rows;
  const Result a = run_cp<A, Policy>(world(), clean, o, &rows);
  const Result b = run_cp<A, Policy>(world(), dirty, o, &rows);
  return same_outside_document(a, b, clean.cu, 1, rows,
                               "non-finite in document 1 (field " + std::to_string(field) + ")");
}

}  // namespace ctxpar::test::chunkwise
