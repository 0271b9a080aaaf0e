// Profile of the head-transpose pack kernel against references that move exactly the same runs:
// a plain host loop over rows, std::memcpy per run, and the same team kernel with a plain inner
// loop instead of ThreadVectorRange — each timed right after a same-run triad, in rounds. One
// process, the run table of rank 0 of a simulated P-way partition (built like TransposePlan's).
// Host backends only (the references dereference memory on the host).
//   ctxpar_bench_heads_pack_profile [--rounds R]
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/json.hpp"
#include "common/timing.hpp"
#include "common/triad.hpp"
#include "ctxpar/heads/channel_layout.hpp"
#include "ctxpar/heads/impl/transpose_kernels.hpp"

namespace {
namespace ch = ctxpar::heads;
namespace cb = ctxpar::bench;
using exec = Kokkos::DefaultHostExecutionSpace;
using mem = exec::memory_space;
using matrix = Kokkos::View<float**, Kokkos::LayoutRight, mem>;
using flat = Kokkos::View<float*, mem>;
using team = Kokkos::TeamPolicy<exec>;
using run_t = ch::impl::ChannelRun;

// The runs of the concatenated channel map of all P destinations, as TransposePlan builds them
// (no repeats are marked: the pack copies repeats like first appearances).
std::vector<run_t> make_runs(const ch::ChannelLayout& layout, int p, std::int64_t rows,
                             std::int64_t& total) {
  ctxpar::KeyGroupPartition blocks{ctxpar::HeadPartition{layout.nheads(), p}, layout.ngroups()};
  std::vector<std::int64_t> map, offset(p + 1, 0);
  std::vector<int> owner;
  for (int j = 0; j < p; ++j) {
    const auto mj = layout.channel_map(blocks, j);
    map.insert(map.end(), mj.begin(), mj.end());
    owner.insert(owner.end(), mj.size(), j);
    offset[j + 1] = static_cast<std::int64_t>(map.size());
  }
  std::vector<run_t> runs;
  for (std::size_t k = 0; k < map.size(); ++k) {
    if (!runs.empty()) {
      run_t& last = runs.back();
      if (last.owner == owner[k] && last.source + last.length == map[k] &&
          last.target + last.length == static_cast<std::int64_t>(k)) {
        ++last.length;
        continue;
      }
    }
    run_t r;
    r.source = map[k], r.target = static_cast<std::int64_t>(k), r.length = 1, r.owner = owner[k];
    runs.push_back(r);
  }
  for (run_t& r : runs) {
    const std::int64_t o = offset[r.owner];
    r.block_stride = offset[r.owner + 1] - o;
    r.block_base = rows * o + (r.target - o);
  }
  total = offset[p];
  return runs;
}

double gbps(double bytes, const cb::Timing& t) {
  return bytes / t.median_s * 1e-9;
}

}  // namespace

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int rounds = 3;
    for (int i = 1; i < argc; ++i)
      if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = std::atoi(argv[++i]);
    const std::int64_t rows = 8192;
    for (int m : {2, 1}) {
      const ch::GdpShape shape{8, 64, 2, 64, m, 4};
      const ch::ChannelLayout layout = shape.input_layout();
      for (int p : {2, 4, 8}) {
        std::int64_t total = 0;
        const std::vector<run_t> host_runs = make_runs(layout, p, rows, total);
        Kokkos::View<run_t*, mem> runs("runs", host_runs.size());
        for (std::size_t r = 0; r < host_runs.size(); ++r) runs(r) = host_runs[r];
        matrix x("x", rows, layout.channels());
        for (std::int64_t t = 0; t < rows; ++t)
          for (std::int64_t c = 0; c < layout.channels(); ++c) x(t, c) = float(t * 7 + c);
        flat a("a", rows * total), b("b", rows * total);
        const double bytes = 2.0 * sizeof(float) * double(rows) * double(total);
        const run_t* rp = runs.data();
        const std::int64_t nr = static_cast<std::int64_t>(runs.extent(0));
        for (int round = 0; round < rounds; ++round) {
          const double triad = cb::triad_gbps(exec(), std::size_t{1} << 24);
          const auto kernel = cb::time_it([&] {
            Kokkos::parallel_for("ctxpar::bench::heads::pack_kernel",
                                 team(exec(), rows, Kokkos::AUTO),
                                 ch::impl::PackSequence<matrix, flat, mem, exec>{x, a, runs});
            exec().fence();
          });
          const auto team_plain = cb::time_it([&] {
            float* out = b.data();
            Kokkos::parallel_for(
                "ctxpar::bench::heads::team_plain", team(exec(), rows, Kokkos::AUTO),
                [=](const team::member_type& mm) {
                  const std::int64_t t = mm.league_rank();
                  const float* row = x.data() + t * x.stride(0);
                  Kokkos::parallel_for(Kokkos::TeamThreadRange(mm, nr), [&](std::int64_t r) {
                    const run_t run = rp[r];
                    const float* src = row + run.source;
                    float* dst = out + run.block_base + t * run.block_stride;
                    for (std::int64_t i = 0; i < run.length; ++i) dst[i] = src[i];
                  });
                });
            exec().fence();
          });
          const auto plain = cb::time_it([&] {
            float* out = b.data();
            Kokkos::parallel_for("ctxpar::bench::heads::plain_loop",
                                 Kokkos::RangePolicy<exec>(exec(), 0, rows), [=](std::int64_t t) {
                                   const float* row = x.data() + t * x.stride(0);
                                   for (std::int64_t r = 0; r < nr; ++r) {
                                     const run_t run = rp[r];
                                     const float* src = row + run.source;
                                     float* dst = out + run.block_base + t * run.block_stride;
                                     for (std::int64_t i = 0; i < run.length; ++i) dst[i] = src[i];
                                   }
                                 });
            exec().fence();
          });
          const auto copy = cb::time_it([&] {
            float* out = b.data();
            Kokkos::parallel_for("ctxpar::bench::heads::memcpy_runs",
                                 Kokkos::RangePolicy<exec>(exec(), 0, rows), [=](std::int64_t t) {
                                   const float* row = x.data() + t * x.stride(0);
                                   for (std::int64_t r = 0; r < nr; ++r)
                                     std::memcpy(out + rp[r].block_base + t * rp[r].block_stride,
                                                 row + rp[r].source, sizeof(float) * rp[r].length);
                                 });
            exec().fence();
          });
          bool same = true;
          for (std::int64_t i = 0; i < rows * total; ++i) same = same && a(i) == b(i);
          std::printf(
              "M=%d P=%d runs=%lld round %d: triad %.2f GB/s | ratio to triad: pack kernel %.2f, "
              "team + plain inner %.2f, plain loop %.2f, memcpy %.2f | load %.1f%s\n",
              m, p, static_cast<long long>(nr), round, triad, gbps(bytes, kernel) / triad,
              gbps(bytes, team_plain) / triad, gbps(bytes, plain) / triad,
              gbps(bytes, copy) / triad, cb::load_average(), same ? "" : " | MISMATCH");
        }
      }
    }
  }
  MPI_Finalize();
  return 0;
}
