// Gathers a sequence sharded across MPI ranks (the torch.chunk split) back onto every rank.
// Run: mpirun -np 3 ./allgather_example
#include <Kokkos_Core.hpp>
#include <boost/mpi/environment.hpp>
#include <cstdio>
#include <ctxpar/ctxpar.hpp>

int main(int argc, char* argv[]) {
  boost::mpi::environment env(argc, argv);  // MPI first, then Kokkos
  Kokkos::ScopeGuard kokkos(argc, argv);
  using exec = Kokkos::DefaultExecutionSpace;

  const ctxpar::Group group(MPI_COMM_WORLD);  // duplicates the communicator, counts traffic
  const ctxpar::BalancedChunks plan{10, group.size()};  // 10 tokens, possibly uneven shards
  const int me = group.rank();

  Kokkos::View<float*, exec::memory_space> shard("shard", plan.size(me));
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<exec>(0, plan.size(me)),
      KOKKOS_LAMBDA(int i) { shard(i) = static_cast<float>(plan.begin(me) + i); });

  Kokkos::View<float*, exec::memory_space> whole("whole", plan.length);
  ctxpar::allgatherv(exec(), group, shard, whole, plan.counts());

  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), whole);
  int wrong = 0;
  for (int i = 0; i < plan.length; ++i) wrong += host(i) != static_cast<float>(i);
  const auto& t = group.traffic(ctxpar::CollectiveKind::allgather);
  std::printf("rank %d: %s, sent %lld B, received %lld B\n", me, wrong ? "WRONG" : "ok",
              static_cast<long long>(t.bytes_sent), static_cast<long long>(t.bytes_received));
  return wrong ? 1 : 0;
}
