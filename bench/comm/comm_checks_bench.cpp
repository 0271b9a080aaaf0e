// The price of agreeing on a collective's preconditions: each collective timed with the default
// (agreed) check and with `ctxpar::unchecked`, interleaved in one run, for a small and a moderate
// message. Prints the medians per call, their difference (the agreement's cost) and their ratio.
// Usage: mpirun -np 2 ctxpar_bench_comm_checks [--calls N] [--repeats R]
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/timing.hpp"
#include "ctxpar/comm/comm.hpp"

namespace {

using host = Kokkos::DefaultHostExecutionSpace;
using view = Kokkos::View<float*, Kokkos::HostSpace>;

struct Row {
  std::string name;
  std::int64_t elements;
  ctxpar::bench::Timing checked, unchecked;
};

template <class Checked, class Unchecked>
Row measure(const ctxpar::Group& g, const std::string& name, std::int64_t n, int calls, int repeats,
            Checked&& checked, Unchecked&& unchecked) {
  Row row{name, n, {}, {}};
  // Interleaved: each repeat times both variants back to back, so drift hits both alike.
  std::vector<double> a, b;
  for (int r = 0; r < repeats + 1; ++r) {
    auto one = [&](auto&& f) {
      return ctxpar::bench::time_collective(
                 g.mpi_comm(),
                 [&] {
                   for (int i = 0; i < calls; ++i) f();
                 },
                 0, 1)
                 .median_s /
             calls;
    };
    const double ta = one(checked), tb = one(unchecked);
    if (r > 0) {  // the first round is the warm-up
      a.push_back(ta);
      b.push_back(tb);
    }
  }
  row.checked = ctxpar::bench::summarise(a);
  row.unchecked = ctxpar::bench::summarise(b);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  {
    int calls = 200, repeats = 9;
    for (int i = 1; i + 1 < argc; ++i) {
      if (!std::strcmp(argv[i], "--calls")) calls = std::atoi(argv[i + 1]);
      if (!std::strcmp(argv[i], "--repeats")) repeats = std::atoi(argv[i + 1]);
    }
    const ctxpar::Group g(MPI_COMM_WORLD);
    const int p = g.size();
    const host space;
    std::vector<Row> rows;
    for (std::int64_t n : {std::int64_t{16}, std::int64_t{1} << 16}) {
      view send("send", n), recv("recv", n * p), sum("sum", n), a2a("a2a", n * p),
          a2b("a2b", n * p);
      rows.push_back(measure(
          g, "allgather", n, calls, repeats, [&] { ctxpar::allgather(space, g, send, recv); },
          [&] { ctxpar::allgather(space, g, send, recv, ctxpar::unchecked); }));
      rows.push_back(measure(
          g, "allreduce_sum", n, calls, repeats, [&] { ctxpar::allreduce_sum(space, g, sum); },
          [&] { ctxpar::allreduce_sum(space, g, sum, ctxpar::unchecked); }));
      rows.push_back(measure(
          g, "alltoall", n * p, calls, repeats, [&] { ctxpar::alltoall(space, g, a2a, a2b); },
          [&] { ctxpar::alltoall(space, g, a2a, a2b, ctxpar::unchecked); }));
      const std::vector<int> counts(static_cast<std::size_t>(p), static_cast<int>(n));
      rows.push_back(measure(
          g, "alltoallv", n * p, calls, repeats,
          [&] { ctxpar::alltoallv(space, g, a2a, counts, a2b, counts); },
          [&] { ctxpar::alltoallv(space, g, a2a, counts, a2b, counts, ctxpar::unchecked); }));
    }
    if (g.rank() == 0) {
      std::printf("# np %d, %d calls per timing, %d interleaved repeats, medians per call\n", p,
                  calls, repeats);
      std::printf("%-14s %10s %14s %14s %14s %8s\n", "collective", "elements", "checked_us",
                  "unchecked_us", "agreement_us", "ratio");
      for (const Row& r : rows) {
        const double c = r.checked.median_s * 1e6, u = r.unchecked.median_s * 1e6;
        std::printf("%-14s %10lld %14.2f %14.2f %14.2f %8.2f\n", r.name.c_str(),
                    static_cast<long long>(r.elements), c, u, c - u, c / u);
      }
    }
  }
  Kokkos::finalize();
  MPI_Finalize();
  return 0;
}
