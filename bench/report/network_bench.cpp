// Network sweep for the latency–bandwidth (α–β) model of docs/performance.md: ping-pong between
// ranks 0 and 1 over message sizes, and MPI_Allgather / MPI_Alltoall over per-rank sizes, at the
// rank count it is started with. Plain MPI (no Kokkos): the model is about the transport.
//
//   mpirun -np P network_bench OUT.json [--quick]
//
// Each timed call is preceded by a barrier; a collective's time is the slowest rank's; the median
// of the repeats is reported with min and max. Buffers are filled with non-zero data.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

struct Stats {
  double median = 0, min = 0, max = 0;
};

Stats summarise(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  Stats s;
  s.min = t.front();
  s.max = t.back();
  s.median = t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
  return s;
}

std::string record(const std::string& kind, int ranks, long long bytes, const Stats& s,
                   int repeats) {
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "{\"benchmark\": \"network\", \"case\": \"%s_%lldB_P%d\", \"kind\": \"%s\", \"ranks\": %d, "
      "\"bytes\": %lld, \"time_median_s\": %.9g, \"time_min_s\": %.9g, \"time_max_s\": %.9g, "
      "\"repeats\": %d}",
      kind.c_str(), bytes, ranks, kind.c_str(), ranks, bytes, s.median, s.min, s.max, repeats);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string out = argc > 1 ? argv[1] : "network.json";
  const bool quick = argc > 2 && std::strcmp(argv[2], "--quick") == 0;
  const int repeats = quick ? 7 : 21;
  std::vector<std::string> records;

  // Ping-pong 0 <-> 1: one-way time = round trip / 2.
  if (size >= 2) {
    for (long long n = 8; n <= (4ll << 20); n *= 8) {
      std::vector<char> buf(static_cast<std::size_t>(n), 1);
      std::vector<double> t;
      for (int k = 0; k < repeats + 3; ++k) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        if (rank == 0) {
          MPI_Send(buf.data(), static_cast<int>(n), MPI_CHAR, 1, 0, MPI_COMM_WORLD);
          MPI_Recv(buf.data(), static_cast<int>(n), MPI_CHAR, 1, 0, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
        } else if (rank == 1) {
          MPI_Recv(buf.data(), static_cast<int>(n), MPI_CHAR, 0, 0, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
          MPI_Send(buf.data(), static_cast<int>(n), MPI_CHAR, 0, 0, MPI_COMM_WORLD);
        }
        const double dt = (MPI_Wtime() - t0) / 2;
        if (k >= 3) t.push_back(dt);
      }
      if (rank == 0) records.push_back(record("pingpong", size, n, summarise(t), repeats));
    }
  }
  // Collectives: `bytes` is the per-rank contribution (all-gather) or per-destination block
  // (all-to-all).
  for (long long n : {1024ll, 65536ll, 1ll << 20}) {
    for (int which = 0; which < 2; ++which) {
      std::vector<char> send(static_cast<std::size_t>(which == 0 ? n : n * size), 2),
          recv(static_cast<std::size_t>(n * size), 0);
      std::vector<double> t;
      for (int k = 0; k < repeats + 2; ++k) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        if (which == 0) {
          MPI_Allgather(send.data(), static_cast<int>(n), MPI_CHAR, recv.data(),
                        static_cast<int>(n), MPI_CHAR, MPI_COMM_WORLD);
        } else {
          MPI_Alltoall(send.data(), static_cast<int>(n), MPI_CHAR, recv.data(), static_cast<int>(n),
                       MPI_CHAR, MPI_COMM_WORLD);
        }
        double dt = MPI_Wtime() - t0, slowest = 0;
        MPI_Reduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (k >= 2) t.push_back(slowest);
      }
      if (rank == 0)
        records.push_back(
            record(which == 0 ? "allgather" : "alltoall", size, n, summarise(t), repeats));
    }
  }
  if (rank == 0) {
    std::ofstream f(out);
    f << "[\n";
    for (std::size_t i = 0; i < records.size(); ++i)
      f << "  " << records[i] << (i + 1 < records.size() ? ",\n" : "\n");
    f << "]\n";
  }
  MPI_Finalize();
  return 0;
}
