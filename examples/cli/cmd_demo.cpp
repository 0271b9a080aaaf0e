// `ctxpar demo`: the foundation at work across ranks — partition plans and the collectives with
// their exact byte counts, each checked against a single-rank oracle — then every demo part the
// mechanisms registered (CTXPAR_CLI_DEMO_PART), with PASS/FAIL per part.
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "command.hpp"
#include "ctxpar/comm/comm.hpp"
#include "ctxpar/partition/balanced_chunks.hpp"
#include "json.hpp"
#include "measure.hpp"

namespace {

using execution_space = Kokkos::DefaultExecutionSpace;
using memory_space = execution_space::memory_space;
using DeviceVector = Kokkos::View<double*, memory_space>;

// Collective: the logical AND of `ok` over the group.
bool all_ranks(const ctxpar::Group& group, bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, group.mpi_comm());
  return all != 0;
}

// One foundation check's outcome on this rank.
struct Outcome {
  bool values_ok = true;
  double max_error = 0;
  std::int64_t sent = 0, expected_sent = 0, received = 0, expected_received = 0;
  double seconds = 0;
  bool ok() const { return values_ok && sent == expected_sent && received == expected_received; }
};

DeviceVector to_device(const std::vector<double>& values, const std::string& label) {
  DeviceVector v(label, values.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < values.size(); ++i) h(i) = values[i];
  Kokkos::deep_copy(v, h);
  return v;
}

std::vector<double> to_host(const DeviceVector& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<double>(h.data(), h.data() + h.extent(0));
}

void compare(Outcome& out, const std::vector<double>& actual, const std::vector<double>& expected) {
  if (actual.size() != expected.size()) {
    out.values_ok = false;
    return;
  }
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double e = std::fabs(actual[i] - expected[i]);
    out.max_error = std::max(out.max_error, e);
    // Collectives move or sum small integers here: anything but an exact match is a bug.
    if (!(e == 0)) out.values_ok = false;
  }
}

void set_traffic(Outcome& out, const ctxpar::Group& group, ctxpar::CollectiveKind kind) {
  out.sent = group.traffic(kind).bytes_sent;
  out.received = group.traffic(kind).bytes_received;
}

// The input a rank would own at global element `i`: distinct, reproducible, exactly representable.
double input_value(std::int64_t i) {
  return static_cast<double>((i * 37) % 101) - 50.0;
}

Outcome check_allgatherv(const ctxpar::Group& group, const ctxpar::BalancedChunks& plan,
                         int width) {
  Outcome out;
  const int me = group.rank();
  const std::vector<int> counts = plan.counts(width);
  std::vector<double> shard;
  for (std::int64_t i = plan.begin(me) * width; i < plan.end(me) * width; ++i)
    shard.push_back(input_value(i));
  DeviceVector send = to_device(shard, "ctxpar::demo::shard");
  DeviceVector recv("ctxpar::demo::gathered", static_cast<std::size_t>(plan.length * width));
  group.reset_traffic();
  Kokkos::Timer timer;
  ctxpar::allgatherv(execution_space(), group, send, recv, counts);
  out.seconds = timer.seconds();
  std::vector<double> oracle;  // the single-rank view: the whole sequence, built without MPI
  for (std::int64_t i = 0; i < plan.length * width; ++i) oracle.push_back(input_value(i));
  compare(out, to_host(recv), oracle);
  set_traffic(out, group, ctxpar::CollectiveKind::allgather);
  const std::int64_t own = counts[static_cast<std::size_t>(me)];
  out.expected_sent = own * 8 * (group.size() - 1);
  out.expected_received = (plan.length * width - own) * 8;
  return out;
}

double route_code(int from, int to, int k) {
  return from * 1000.0 + to * 10.0 + k;
}

Outcome check_alltoall(const ctxpar::Group& group, int block) {
  Outcome out;
  const int p = group.size(), me = group.rank();
  std::vector<double> send;
  for (int to = 0; to < p; ++to) {
    for (int k = 0; k < block; ++k) send.push_back(route_code(me, to, k));
  }
  DeviceVector s = to_device(send, "ctxpar::demo::alltoall_send");
  DeviceVector r("ctxpar::demo::alltoall_recv", send.size());
  group.reset_traffic();
  Kokkos::Timer timer;
  ctxpar::alltoall(execution_space(), group, s, r);
  out.seconds = timer.seconds();
  std::vector<double> oracle;
  for (int from = 0; from < p; ++from) {
    for (int k = 0; k < block; ++k) oracle.push_back(route_code(from, me, k));
  }
  compare(out, to_host(r), oracle);
  set_traffic(out, group, ctxpar::CollectiveKind::alltoall);
  out.expected_sent = out.expected_received = static_cast<std::int64_t>(block) * (p - 1) * 8;
  return out;
}

// Rank r's contribution to element i of the reduce-scatter: small integers, so the sum is exact.
double contribution(int r, std::int64_t i) {
  return static_cast<double>((r + 1) * ((i % 7) + 1));
}

Outcome check_reduce_scatter(const ctxpar::Group& group, const ctxpar::BalancedChunks& plan,
                             int width) {
  Outcome out;
  const int me = group.rank();
  const std::vector<int> counts = plan.counts(width);
  const std::int64_t total = plan.length * width;
  std::vector<double> send;
  for (std::int64_t i = 0; i < total; ++i) send.push_back(contribution(me, i));
  DeviceVector s = to_device(send, "ctxpar::demo::partial_sums");
  DeviceVector r("ctxpar::demo::my_sums",
                 static_cast<std::size_t>(counts[static_cast<std::size_t>(me)]));
  group.reset_traffic();
  Kokkos::Timer timer;
  ctxpar::reduce_scatter(execution_space(), group, s, r, counts);
  out.seconds = timer.seconds();
  std::vector<double> oracle;
  for (std::int64_t i = plan.begin(me) * width; i < plan.end(me) * width; ++i) {
    double sum = 0;
    for (int q = 0; q < group.size(); ++q) sum += contribution(q, i);
    oracle.push_back(sum);
  }
  compare(out, to_host(r), oracle);
  set_traffic(out, group, ctxpar::CollectiveKind::reduce_scatter);
  const std::int64_t own = counts[static_cast<std::size_t>(me)];
  out.expected_sent = (total - own) * 8;
  out.expected_received = own * 8 * (group.size() - 1);
  return out;
}

// A 2x2 matrix stored row-major in a record of 4: M_r = [[r+1, 1], [1, 0]]. These do not commute,
// so a scan that swapped operands would give a different product.
std::vector<double> transition(int r) {
  return {r + 1.0, 1.0, 1.0, 0.0};
}

std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b) {
  return {a[0] * b[0] + a[1] * b[2], a[0] * b[1] + a[1] * b[3], a[2] * b[0] + a[3] * b[2],
          a[2] * b[1] + a[3] * b[3]};
}

// combine(earlier, inout): inout := earlier · inout, run as a kernel in the record's memory space.
struct ComposeKernel {
  DeviceVector earlier, inout;
  KOKKOS_INLINE_FUNCTION void operator()(int) const {
    const double a0 = earlier(0), a1 = earlier(1), a2 = earlier(2), a3 = earlier(3);
    const double b0 = inout(0), b1 = inout(1), b2 = inout(2), b3 = inout(3);
    inout(0) = a0 * b0 + a1 * b2;
    inout(1) = a0 * b1 + a1 * b3;
    inout(2) = a2 * b0 + a3 * b2;
    inout(3) = a2 * b1 + a3 * b3;
  }
};

struct Compose {
  void operator()(const DeviceVector& earlier, const DeviceVector& inout) const {
    Kokkos::parallel_for("ctxpar::demo::compose", Kokkos::RangePolicy<execution_space>(0, 1),
                         ComposeKernel{earlier, inout});
  }
};

// Bytes a Hillis-Steele scan moves for the rank at `ordinal` in scan order.
void scan_bytes(int ordinal, int p, std::int64_t record_bytes, std::int64_t& sent,
                std::int64_t& received) {
  for (int d = 1; d < p; d *= 2) {
    if (ordinal + d < p) sent += record_bytes;
    if (ordinal - d >= 0) received += record_bytes;
  }
}

Outcome check_scans(const ctxpar::Group& group) {
  Outcome out;
  const int p = group.size(), me = group.rank();
  DeviceVector inclusive = to_device(transition(me), "ctxpar::demo::scan_record");
  DeviceVector exclusive = to_device(transition(me), "ctxpar::demo::scan_record");
  group.reset_traffic();
  Kokkos::Timer timer;
  ctxpar::inclusive_scan(execution_space(), group, inclusive, Compose{});
  const bool has_prefix = ctxpar::exclusive_scan(execution_space(), group, exclusive, Compose{},
                                                 ctxpar::ScanDirection::reverse);
  out.seconds = timer.seconds();
  std::vector<double> forward = transition(0);  // M_0 · M_1 · ... · M_me
  for (int q = 1; q <= me; ++q) forward = matmul(forward, transition(q));
  std::vector<double> actual = to_host(inclusive);
  std::vector<double> expected = forward;
  // Reverse exclusive: the ranks after this one, last rank first: M_{P-1} · ... · M_{me+1}.
  if (me + 1 < p) {
    std::vector<double> suffix = transition(p - 1);
    for (int q = p - 2; q > me; --q) suffix = matmul(suffix, transition(q));
    const std::vector<double> got = to_host(exclusive);
    actual.insert(actual.end(), got.begin(), got.end());
    expected.insert(expected.end(), suffix.begin(), suffix.end());
  }
  compare(out, actual, expected);
  out.values_ok = out.values_ok && has_prefix == (me + 1 < p);
  set_traffic(out, group, ctxpar::CollectiveKind::scan);
  scan_bytes(me, p, 32, out.expected_sent, out.expected_received);
  scan_bytes(p - 1 - me, p, 32, out.expected_sent, out.expected_received);
  return out;
}

// Collective: prints one check's verdict and its per-rank byte counts on rank 0.
bool report_check(const ctxpar::Group& group, const std::string& name, const Outcome& out,
                  ctxpar::cli::Json& json) {
  const bool ok = all_ranks(group, out.ok());
  double mine[6] = {out.max_error,
                    static_cast<double>(out.sent),
                    static_cast<double>(out.expected_sent),
                    static_cast<double>(out.received),
                    static_cast<double>(out.expected_received),
                    out.seconds};
  std::vector<double> all(static_cast<std::size_t>(group.rank() == 0 ? 6 * group.size() : 0));
  MPI_Gather(mine, 6, MPI_DOUBLE, all.data(), 6, MPI_DOUBLE, 0, group.mpi_comm());
  if (group.rank() != 0) return ok;
  std::cout << "  " << std::left << std::setw(38) << name << (ok ? "PASS" : "FAIL") << "\n";
  ctxpar::cli::Json entry = ctxpar::cli::Json::object();
  entry["check"] = name;
  entry["passed"] = ok;
  ctxpar::cli::Json ranks = ctxpar::cli::Json::array();
  for (int r = 0; r < group.size(); ++r) {
    const double* v = &all[static_cast<std::size_t>(6 * r)];
    std::cout << "      rank " << r << ": max |error| " << v[0] << ", sent "
              << static_cast<std::int64_t>(v[1]) << " B (formula "
              << static_cast<std::int64_t>(v[2]) << "), received "
              << static_cast<std::int64_t>(v[3]) << " B (formula "
              << static_cast<std::int64_t>(v[4]) << "), " << std::fixed << std::setprecision(1)
              << v[5] * 1e6 << " us\n"
              << std::defaultfloat << std::setprecision(6);
    ctxpar::cli::Json rank = ctxpar::cli::Json::object();
    rank["rank"] = r;
    rank["max_error"] = v[0];
    rank["bytes_sent"] = static_cast<std::int64_t>(v[1]);
    rank["bytes_sent_formula"] = static_cast<std::int64_t>(v[2]);
    rank["bytes_received"] = static_cast<std::int64_t>(v[3]);
    rank["bytes_received_formula"] = static_cast<std::int64_t>(v[4]);
    rank["seconds"] = v[5];
    ranks.push_back(rank);
  }
  entry["ranks"] = ranks;
  json.push_back(entry);
  return ok;
}

int run_demo(const ctxpar::cli::Args& args, const ctxpar::Group& group) {
  const auto length = args.get<std::int64_t>("length", 11);
  const int width = args.get<int>("width", 3);
  const std::string only = args.get("part", "");
  const std::string json_path = args.get("json", "");
  // The upper bounds keep a typo from asking for more memory than a demo needs.
  args.require("length", length >= 0 && length <= (std::int64_t(1) << 24),
               "the foundation's token count must be in [0, 16777216]", "0..16777216", length);
  args.require("width", width >= 1 && width <= 1024, "the doubles per token must be in [1, 1024]",
               "1..1024", width);
  // The foundation gathers length x width doubles on every rank (a few copies of them): the
  // product must fit an MPI count, and their bytes the machine.
  args.require("length", length * width <= std::numeric_limits<int>::max(),
               "--length times --width must fit an MPI count (int)",
               "at most " + std::to_string(std::numeric_limits<int>::max()),
               std::to_string(length) + " x " + std::to_string(width));
  const double need = 4.0 * 8.0 * static_cast<double>(length * width) * group.size(),
               have = ctxpar::cli::memory_limit_bytes();
  args.require(
      "length", have <= 0 || need <= have,
      "--length times --width needs more memory than this process may use (4 copies of the "
      "gathered doubles on every rank)",
      "at most " + std::to_string(static_cast<std::int64_t>(have / (1 << 20))) + " MiB",
      std::to_string(static_cast<std::int64_t>(need / (1 << 20))) + " MiB");
  bool known_part = only.empty();
  std::string part_names;
  for (const auto& part : ctxpar::cli::demo_parts()) {
    known_part = known_part || part.name == only;
    part_names += (part_names.empty() ? "" : ", ") + part.name;
  }
  args.require("part", known_part, "no such demo part", "one of " + part_names, only);
  ctxpar::cli::check_json_path(group, "ctxpar demo", json_path);
  const bool root = group.rank() == 0;
  const int p = group.size();
  const ctxpar::BalancedChunks plan{length, p};
  ctxpar::cli::Json json = ctxpar::cli::Json::object();
  json["command"] = "demo";
  json["ranks"] = p;
  json["execution_space"] = execution_space::name();
  const ctxpar::HostIsa isa = ctxpar::agreed_host_isa(group, "ctxpar demo");
  json["host_isa"] = ctxpar::host_isa_name(isa);

  if (root) {
    std::cout << "ctxpar demo on " << p << " rank" << (p == 1 ? "" : "s")
              << ", Kokkos execution space " << execution_space::name() << ", host kernels "
              << ctxpar::host_isa_name(isa) << " (CPU: widest "
              << ctxpar::host_isa_name(ctxpar::detected_host_isa()) << ")\n\n"
              << "foundation: partition plan and collectives, each checked against a single-rank "
                 "oracle\n"
              << "  plan: BalancedChunks (torch.chunk rule) of " << length << " tokens over " << p
              << " ranks, chunk " << plan.chunk() << ", " << plan.nonempty()
              << " non-empty shard(s):";
    for (int r = 0; r < p; ++r) std::cout << " [" << plan.begin(r) << "," << plan.end(r) << ")";
    std::cout << "\n  each token carries " << width
              << " doubles (8 B); bytes count traffic to/from "
              << "other ranks only\n";
  }
  ctxpar::cli::Json checks = ctxpar::cli::Json::array();
  bool all_ok = true;
  all_ok &= report_check(group, "allgatherv of uneven shards", check_allgatherv(group, plan, width),
                         checks);
  all_ok &= report_check(group, "alltoall, " + std::to_string(width) + " per pair",
                         check_alltoall(group, width), checks);
  all_ok &= report_check(group, "reduce_scatter (sum) to shards",
                         check_reduce_scatter(group, plan, width), checks);
  all_ok &= report_check(group, "scans of non-commuting 2x2 records", check_scans(group), checks);
  json["foundation"] = checks;

  std::vector<ctxpar::cli::DemoPart> parts = ctxpar::cli::demo_parts();
  std::sort(parts.begin(), parts.end(),
            [](const ctxpar::cli::DemoPart& a, const ctxpar::cli::DemoPart& b) {
              return a.name < b.name;
            });
  ctxpar::cli::Json part_results = ctxpar::cli::Json::array();
  int failed_parts = 0, ran = 0;
  for (const auto& part : parts) {
    if (!only.empty() && part.name != only) continue;
    ++ran;
    if (root) std::cout << "\npart " << part.name << "\n" << std::flush;
    std::ostringstream report;
    group.reset_traffic();
    Kokkos::Timer timer;
    ctxpar::cli::current_demo_args() = &args;
    const bool mine = part.fn(group, report);
    ctxpar::cli::current_demo_args() = nullptr;
    const double seconds = timer.seconds();
    const bool ok = all_ranks(group, mine);
    if (root) std::cout << report.str();
    // A failing rank other than 0 shows its own report, so the failure can be read where it was
    // seen.
    for (int r = 1; r < p; ++r) {
      MPI_Barrier(group.mpi_comm());
      if (group.rank() == r && !mine) {
        std::cout << "[rank " << r << " report]\n" << report.str() << std::flush;
      }
    }
    ctxpar::cli::Json entry = ctxpar::cli::Json::object();
    entry["part"] = part.name;
    entry["passed"] = ok;
    entry["seconds"] = ctxpar::cli::gather_seconds(group, seconds);
    entry["traffic"] = ctxpar::cli::gather_traffic(group);
    part_results.push_back(entry);
    if (root) std::cout << "part " << part.name << ": " << (ok ? "PASS" : "FAIL") << "\n";
    if (!ok) ++failed_parts;
  }
  json["parts"] = part_results;
  all_ok = all_ok && failed_parts == 0;
  json["passed"] = all_ok;
  if (root) {
    std::cout << "\n"
              << (all_ok ? "demo: every check passed" : "demo: SOME CHECKS FAILED")
              << " (foundation + " << ran << " part" << (ran == 1 ? "" : "s") << ")\n";
  }
  if (!json_path.empty()) ctxpar::cli::write_json(group, "ctxpar demo", json_path, json);
  return all_ok ? 0 : 1;
}

}  // namespace

CTXPAR_CLI_COMMAND(
    "demo", "checks the foundation and every mechanism across ranks, with a report",
    "[--length N] [--width W] [--part NAME] [--json FILE]\n\n"
    "options [default]:\n"
    "  --length N    tokens of the foundation's partition plan, 0..16777216 [11]\n"
    "  --width W     doubles per token in the foundation's collectives, 1..1024 [3]\n"
    "  --part NAME   run only this demo part [every part]\n"
    "  --json FILE   also write the results as JSON (rank 0) [none]\n"
    "  (the options the demo parts add are listed at the end)\n\n"
    "no input files. exit status: 0 every check passed; 1 a check failed; 2 a bad option.\n"
    "demo part options:",
    run_demo);
