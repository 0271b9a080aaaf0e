// The collectives on views against oracles every rank computes on its own from (rank, index), with
// uneven and zero-length contributions, and exact traffic counters against their formulas.
// Typed over every enabled backend and float / double / int (the data movers also bfloat16 and
// float16). Data are small integers, so every
// expected value (sums included) is exact in every scalar type and compared with ==.
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ctxpar/comm/comm.hpp"
#include "ctxpar/partition/balanced_chunks.hpp"
#include "ctxpar_test/harness.hpp"

namespace {

using ctxpar::CollectiveKind;
using ctxpar::test::Case;
using ctxpar::test::world;

template <class Tuple>
struct with_scalars;
template <class... Exec>
struct with_scalars<std::tuple<Exec...>> {
  using type = typename ctxpar::test::impl::concat<
      std::tuple<Case<Exec, float>, Case<Exec, double>, Case<Exec, int>>..., std::tuple<>>::type;
};
using comm_cases = typename with_scalars<ctxpar::test::execution_spaces>::type;

// The collectives that only move data also take the 16-bit storage types (bit patterns as
// MPI_UINT16_T); the sums refuse them at compile time (`mpi_sum_datatype_of`).
template <class Tuple>
struct with_moved_scalars;
template <class... Exec>
struct with_moved_scalars<std::tuple<Exec...>> {
  using type = typename ctxpar::test::impl::concat<
      typename with_scalars<std::tuple<Exec...>>::type,
      std::tuple<Case<Exec, ctxpar::bfloat16>, Case<Exec, ctxpar::float16>>..., std::tuple<>>::type;
};
using moved_cases = typename with_moved_scalars<ctxpar::test::execution_spaces>::type;

// A small nonzero integer from (seed, a, b), exactly representable in float, double and int (in
// the 16-bit types: the same value rounded, compared by bit pattern).
template <class T>
T value(std::uint64_t seed, std::int64_t a, std::int64_t b = 0) {
  const double u = ctxpar::test::uniform(seed, static_cast<std::uint64_t>(a * 7919 + b));
  const long v = std::lround(u * 500.0);
  if constexpr (ctxpar::is_narrow_storage_v<T>)
    return ctxpar::narrow<T>(static_cast<double>(v == 0 ? 1 : v));
  else
    return static_cast<T>(v == 0 ? 1 : v);
}

// Equality of two values: their bit patterns for the 16-bit types (which have no operators).
template <class T>
bool same(const T& a, const T& b) {
  if constexpr (ctxpar::is_narrow_storage_v<T>)
    return a.bits == b.bits;
  else
    return a == b;
}

// A sentinel distinct from every `value`.
template <class T>
T sentinel(double x) {
  if constexpr (ctxpar::is_narrow_storage_v<T>)
    return ctxpar::narrow<T>(x);
  else
    return static_cast<T>(x);
}

template <class T, class Memory, class F>
Kokkos::View<T*, Memory> make_view(const std::string& label, std::int64_t n, F&& f) {
  Kokkos::View<T*, Memory> v(label, n);
  auto h = Kokkos::create_mirror_view(v);
  for (std::int64_t i = 0; i < n; ++i) h(i) = f(i);
  Kokkos::deep_copy(v, h);
  return v;
}

template <class View>
std::vector<typename View::non_const_value_type> to_host(const View& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<typename View::non_const_value_type>(h.data(), h.data() + h.extent(0));
}

bool traffic_is(CollectiveKind kind, std::int64_t calls, std::int64_t sent, std::int64_t received) {
  const auto& t = world().traffic(kind);
  const bool ok = t.calls == calls && t.bytes_sent == sent && t.bytes_received == received;
  if (!ok) {
    std::cerr << "[rank " << world().rank() << "] " << ctxpar::to_string(kind) << " traffic: calls "
              << t.calls << " (want " << calls << "), sent " << t.bytes_sent << " (want " << sent
              << "), received " << t.bytes_received << " (want " << received << ")\n";
  }
  return ok;
}

// Per-rank counts of several shapes, all known to every rank: uneven with zeros, BalancedChunks
// of an axis shorter than P (empty shards), all zero.
std::vector<std::vector<int>> count_patterns(int p) {
  std::vector<std::vector<int>> patterns;
  std::vector<int> uneven, all_zero(p, 0);
  for (int j = 0; j < p; ++j) uneven.push_back((3 * j + 1) % 4);
  patterns.push_back(uneven);
  patterns.push_back(
      ctxpar::BalancedChunks{std::max(1, p - 1), p}.counts(3));  // L < P: trailing empties
  patterns.push_back(ctxpar::BalancedChunks{2 * p + 1, p}.counts(2));
  patterns.push_back(all_zero);
  return patterns;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(collectives)

BOOST_AUTO_TEST_CASE_TEMPLATE(allgather_equal_counts, C, moved_cases) {
  using T = typename C::scalar_type;
  using M = typename C::memory_space;
  const auto& g = world();
  const int p = g.size(), me = g.rank();
  bool ok = true;
  for (std::int64_t n : {0, 1, 5}) {
    g.reset_traffic();
    auto send = make_view<T, M>("send", n, [&](std::int64_t i) { return value<T>(1, me, i); });
    Kokkos::View<T*, M> recv("recv", n * p);
    ctxpar::allgather(typename C::execution_space(), g, send, recv);
    const auto got = to_host(recv);
    for (int j = 0; j < p; ++j) {
      for (std::int64_t i = 0; i < n; ++i) ok = ok && same(got[j * n + i], value<T>(1, j, i));
    }
    const std::int64_t bytes = n * static_cast<std::int64_t>(sizeof(T)) * (p - 1);
    ok = ok && traffic_is(CollectiveKind::allgather, 1, bytes, bytes);
  }
  CTXPAR_TEST_ALL(g, ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(allgatherv_uneven_and_empty, C, moved_cases) {
  using T = typename C::scalar_type;
  using M = typename C::memory_space;
  const auto& g = world();
  const int p = g.size(), me = g.rank();
  bool ok = true;
  for (const auto& counts : count_patterns(p)) {
    g.reset_traffic();
    std::int64_t total = 0;
    for (int c : counts) total += c;
    auto send =
        make_view<T, M>("send", counts[me], [&](std::int64_t i) { return value<T>(2, me, i); });
    // One slot more than needed, holding a sentinel: recv may be longer than the sum of counts.
    Kokkos::View<T*, M> recv("recv", total + 1);
    Kokkos::deep_copy(recv, sentinel<T>(77));
    ctxpar::allgatherv(typename C::execution_space(), g, send, recv, counts);
    const auto got = to_host(recv);
    std::int64_t at = 0;
    for (int j = 0; j < p; ++j) {
      for (int i = 0; i < counts[j]; ++i) ok = ok && same(got[at++], value<T>(2, j, i));
    }
    ok = ok && same(got[total], sentinel<T>(77));
    const std::int64_t elem = sizeof(T), own = counts[me];
    ok = ok && traffic_is(CollectiveKind::allgather, 1, own * elem * (p - 1), (total - own) * elem);
  }
  CTXPAR_TEST_ALL(g, ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(alltoall_equal_blocks, C, moved_cases) {
  using T = typename C::scalar_type;
  using M = typename C::memory_space;
  const auto& g = world();
  const int p = g.size(), me = g.rank();
  bool ok = true;
  for (std::int64_t b : {0, 1, 3}) {
    g.reset_traffic();
    // Element i of block j encodes (sender, destination, i).
    auto send = make_view<T, M>(
        "send", b * p, [&](std::int64_t k) { return value<T>(3, me * 64 + k / b, k % b); });
    Kokkos::View<T*, M> recv("recv", b * p);
    ctxpar::alltoall(typename C::execution_space(), g, send, recv);
    const auto got = to_host(recv);
    for (int i = 0; i < p; ++i) {
      for (std::int64_t k = 0; k < b; ++k)
        ok = ok && same(got[i * b + k], value<T>(3, i * 64 + me, k));
    }
    const std::int64_t bytes = b * (p - 1) * static_cast<std::int64_t>(sizeof(T));
    ok = ok && traffic_is(CollectiveKind::alltoall, 1, bytes, bytes);
  }
  CTXPAR_TEST_ALL(g, ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(alltoallv_uneven_and_empty, C, moved_cases) {
  using T = typename C::scalar_type;
  using M = typename C::memory_space;
  const auto& g = world();
  const int p = g.size(), me = g.rank();
  bool ok = true;
  // c(from, to): elements rank `from` sends to rank `to`; several patterns with zeros.
  const std::vector<std::function<int(int, int)>> patterns = {
      [](int from, int to) { return (from + 2 * to) % 3; },
      [](int from, int to) { return from == to ? 0 : from + 1; },
      [](int from, int) { return from == 0 ? 4 : 0; },  // only rank 0 sends
      [](int, int) { return 0; }};
  for (const auto& c : patterns) {
    g.reset_traffic();
    std::vector<int> send_counts, recv_counts;
    std::int64_t stotal = 0, rtotal = 0;
    for (int j = 0; j < p; ++j) {
      send_counts.push_back(c(me, j));
      recv_counts.push_back(c(j, me));
      stotal += send_counts.back();
      rtotal += recv_counts.back();
    }
    std::vector<T> packed;
    for (int j = 0; j < p; ++j) {
      for (int k = 0; k < send_counts[j]; ++k) packed.push_back(value<T>(4, me * 64 + j, k));
    }
    auto send = make_view<T, M>("send", stotal, [&](std::int64_t i) { return packed[i]; });
    Kokkos::View<T*, M> recv("recv", rtotal);
    ctxpar::alltoallv(typename C::execution_space(), g, send, send_counts, recv, recv_counts);
    const auto got = to_host(recv);
    std::int64_t at = 0;
    for (int i = 0; i < p; ++i) {
      for (int k = 0; k < recv_counts[i]; ++k)
        ok = ok && same(got[at++], value<T>(4, i * 64 + me, k));
    }
    const std::int64_t elem = sizeof(T);
    ok = ok && traffic_is(CollectiveKind::alltoall, 1, (stotal - send_counts[me]) * elem,
                          (rtotal - recv_counts[me]) * elem);
  }
  CTXPAR_TEST_ALL(g, ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(reduce_scatter_is_the_adjoint_of_allgatherv, C, comm_cases) {
  using T = typename C::scalar_type;
  using M = typename C::memory_space;
  const auto& g = world();
  const int p = g.size(), me = g.rank();
  bool ok = true;
  for (const auto& counts : count_patterns(p)) {
    std::int64_t total = 0, offset = 0;
    for (int j = 0; j < p; ++j) {
      if (j < me) offset += counts[j];
      total += counts[j];
    }
    g.reset_traffic();
    auto y = make_view<T, M>("y", total, [&](std::int64_t k) { return value<T>(5, me, k); });
    Kokkos::View<T*, M> ry("ry", counts[me]);
    ctxpar::reduce_scatter(typename C::execution_space(), g, y, ry, counts);
    const auto got = to_host(ry);
    for (int k = 0; k < counts[me]; ++k) {
      T sum = 0;
      for (int r = 0; r < p; ++r) sum += value<T>(5, r, offset + k);
      ok = ok && got[k] == sum;
    }
    const std::int64_t elem = sizeof(T), own = counts[me];
    ok = ok &&
         traffic_is(CollectiveKind::reduce_scatter, 1, (total - own) * elem, own * elem * (p - 1));
    // Adjointness: sum over ranks of <allgatherv(x), y> equals sum over ranks of <x,
    // reduce_scatter(y)>.
    auto x = make_view<T, M>("x", counts[me], [&](std::int64_t k) { return value<T>(6, me, k); });
    Kokkos::View<T*, M> gx("gx", total);
    ctxpar::allgatherv(typename C::execution_space(), g, x, gx, counts);
    const auto gxh = to_host(gx), yh = to_host(y), xh = to_host(x);
    double lhs = 0, rhs = 0;
    for (std::int64_t k = 0; k < total; ++k)
      lhs += static_cast<double>(gxh[k]) * static_cast<double>(yh[k]);
    for (int k = 0; k < counts[me]; ++k)
      rhs += static_cast<double>(xh[k]) * static_cast<double>(got[k]);
    double sums[2] = {lhs, rhs}, all[2] = {0, 0};
    MPI_Allreduce(sums, all, 2, MPI_DOUBLE, MPI_SUM, g.mpi_comm());
    ok = ok && all[0] == all[1];  // integer data: both sides exact
  }
  CTXPAR_TEST_ALL(g, ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(allreduce_sum_of_ranks, C, comm_cases) {
  using T = typename C::scalar_type;
  using M = typename C::memory_space;
  const auto& g = world();
  const int p = g.size(), me = g.rank();
  bool ok = true;
  for (std::int64_t n : {0, 1, 9}) {
    g.reset_traffic();
    auto v = make_view<T, M>("v", n, [&](std::int64_t i) { return value<T>(7, me, i); });
    ctxpar::allreduce_sum(typename C::execution_space(), g, v);
    const auto got = to_host(v);
    for (std::int64_t i = 0; i < n; ++i) {
      T sum = 0;
      for (int r = 0; r < p; ++r) sum += value<T>(7, r, i);
      ok = ok && got[i] == sum;
    }
    const std::int64_t bytes = n * static_cast<std::int64_t>(sizeof(T)) * (p - 1);
    ok = ok && traffic_is(CollectiveKind::allreduce, 1, bytes, bytes);
  }
  CTXPAR_TEST_ALL(g, ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(sendrecv_open_and_periodic_rings, C, moved_cases) {
  using T = typename C::scalar_type;
  using M = typename C::memory_space;
  using ctxpar::no_rank;
  const auto& g = world();
  const int p = g.size(), me = g.rank();
  bool ok = true;
  for (std::int64_t n : {0, 4}) {
    // Open chain to the right: the first rank receives nothing and its buffer stays untouched.
    g.reset_traffic();
    auto send = make_view<T, M>("send", n, [&](std::int64_t i) { return value<T>(8, me, i); });
    Kokkos::View<T*, M> recv("recv", n);
    Kokkos::deep_copy(recv, sentinel<T>(-99));
    const int dest = me + 1 < p ? me + 1 : no_rank, source = me > 0 ? me - 1 : no_rank;
    ctxpar::sendrecv(typename C::execution_space(), g, send, dest, recv, source, 3);
    auto got = to_host(recv);
    for (std::int64_t i = 0; i < n; ++i)
      ok = ok && same(got[i], source == no_rank ? sentinel<T>(-99) : value<T>(8, source, i));
    const std::int64_t bytes = n * static_cast<std::int64_t>(sizeof(T));
    ok = ok && traffic_is(CollectiveKind::sendrecv, 1, dest == no_rank ? 0 : bytes,
                          source == no_rank ? 0 : bytes);
    // Periodic ring to the left (at np 1 a rank exchanges with itself).
    const int left = (me + p - 1) % p, right = (me + 1) % p;
    ctxpar::sendrecv(typename C::execution_space(), g, send, left, recv, right, 4);
    got = to_host(recv);
    for (std::int64_t i = 0; i < n; ++i) ok = ok && same(got[i], value<T>(8, right, i));
    ok = ok && world().traffic(CollectiveKind::sendrecv).calls == 2;
  }
  CTXPAR_TEST_ALL(g, ok);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(multidimensional_views_move_in_row_major_blocks, C, comm_cases) {
  // Rank-2 and rank-3 LayoutRight views: the leading axis is the one split over ranks, exactly as
  // the transposes and gathers of the mechanisms use them.
  using T = typename C::scalar_type;
  using M = typename C::memory_space;
  using Exec = typename C::execution_space;
  const auto& g = world();
  const int p = g.size(), me = g.rank();
  const int n = 2, a = 3, b = 2;
  Kokkos::View<T***, Kokkos::LayoutRight, M> mine("mine", n, a, b), all("all", n * p, a, b);
  auto h = Kokkos::create_mirror_view(mine);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < a; ++j)
      for (int k = 0; k < b; ++k) h(i, j, k) = value<T>(9, me, (i * a + j) * b + k);
  Kokkos::deep_copy(mine, h);
  ctxpar::allgather(Exec(), g, mine, all);
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), all);
  bool ok = true;
  for (int r = 0; r < p; ++r)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < a; ++j)
        for (int k = 0; k < b; ++k)
          ok = ok && ha(r * n + i, j, k) == value<T>(9, r, (i * a + j) * b + k);
  // Row block j of a [P*n, a] matrix goes to rank j.
  Kokkos::View<T**, Kokkos::LayoutRight, M> send("send", p * n, a), recv("recv", p * n, a);
  auto hs = Kokkos::create_mirror_view(send);
  for (int row = 0; row < p * n; ++row)
    for (int j = 0; j < a; ++j) hs(row, j) = value<T>(10, me * 64 + row / n, (row % n) * a + j);
  Kokkos::deep_copy(send, hs);
  ctxpar::alltoall(Exec(), g, send, recv);
  auto hr = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), recv);
  for (int row = 0; row < p * n; ++row)
    for (int j = 0; j < a; ++j)
      ok = ok && hr(row, j) == value<T>(10, (row / n) * 64 + me, (row % n) * a + j);
  CTXPAR_TEST_ALL(g, ok);
}

namespace {
// `inout := earlier · inout` for row-major 2x2 matrices: associative, not commutative.
template <class ExecutionSpace, class View>
struct MatMul2 {
  View earlier, inout;
  KOKKOS_INLINE_FUNCTION void operator()(int) const {
    const auto a = earlier(0), b = earlier(1), c = earlier(2), d = earlier(3);
    const auto e = inout(0), f = inout(1), g = inout(2), h = inout(3);
    inout(0) = a * e + b * g;
    inout(1) = a * f + b * h;
    inout(2) = c * e + d * g;
    inout(3) = c * f + d * h;
  }
};

template <class ExecutionSpace>
struct MatMulCombine {
  template <class View>
  void operator()(const View& earlier, const View& inout) const {
    Kokkos::parallel_for("ctxpar::test::matmul2", Kokkos::RangePolicy<ExecutionSpace>(0, 1),
                         MatMul2<ExecutionSpace, View>{earlier, inout});
    Kokkos::fence();
  }
};

// Rank r's matrix: entries in {-1, 0, 1, 2}, unimodular-ish so products of 8 stay small and exact;
// consecutive ranks' matrices do not commute.
template <class T>
std::vector<T> matrix_of(int r) {
  const int k = r % 4;
  switch (k) {
    case 0:
      return {T(1), T(1), T(0), T(1)};
    case 1:
      return {T(1), T(0), T(1), T(1)};
    case 2:
      return {T(0), T(-1), T(1), T(2)};
    default:
      return {T(2), T(1), T(1), T(1)};
  }
}

template <class T>
std::vector<T> product(const std::vector<int>& ranks) {
  std::vector<T> m{T(1), T(0), T(0), T(1)};
  for (int r : ranks) {  // left to right: m := m · M_r
    const auto x = matrix_of<T>(r);
    m = {m[0] * x[0] + m[1] * x[2], m[0] * x[1] + m[1] * x[3], m[2] * x[0] + m[3] * x[2],
         m[2] * x[1] + m[3] * x[3]};
  }
  return m;
}

// Rounds of Hillis-Steele in which this rank (at `ordinal` in scan order) sends and receives.
void scan_rounds(int ordinal, int p, std::int64_t& sends, std::int64_t& receives) {
  sends = receives = 0;
  for (int d = 1; d < p; d <<= 1) {
    if (ordinal + d < p) ++sends;
    if (ordinal - d >= 0) ++receives;
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(scans_with_a_non_commutative_operation, C, comm_cases) {
  using T = typename C::scalar_type;
  using M = typename C::memory_space;
  using Exec = typename C::execution_space;
  const auto& g = world();
  const int p = g.size(), me = g.rank();
  bool ok = true;
  for (auto direction : {ctxpar::ScanDirection::forward, ctxpar::ScanDirection::reverse}) {
    const bool forward = direction == ctxpar::ScanDirection::forward;
    const int ordinal = forward ? me : p - 1 - me;
    std::vector<int> before;  // ranks before this one in scan order, earliest first
    for (int k = 0; k < ordinal; ++k) before.push_back(forward ? k : p - 1 - k);
    std::vector<int> through = before;
    through.push_back(me);
    const auto mine = matrix_of<T>(me);
    const std::int64_t bytes = 4 * static_cast<std::int64_t>(sizeof(T));
    std::int64_t sends = 0, receives = 0;
    scan_rounds(ordinal, p, sends, receives);

    g.reset_traffic();
    auto record = make_view<T, M>("record", 4, [&](std::int64_t i) { return mine[i]; });
    const bool has = ctxpar::exclusive_scan(Exec(), g, record, MatMulCombine<Exec>(), direction);
    auto got = to_host(record);
    ok = ok && has == (ordinal > 0) && got == (ordinal > 0 ? product<T>(before) : mine);
    ok = ok && traffic_is(CollectiveKind::scan, 1, sends * bytes, receives * bytes);

    auto inclusive = make_view<T, M>("inclusive", 4, [&](std::int64_t i) { return mine[i]; });
    ctxpar::inclusive_scan(Exec(), g, inclusive, MatMulCombine<Exec>(), direction);
    ok = ok && to_host(inclusive) == product<T>(through);
    // The oracle is order-sensitive: the commuted product differs somewhere (P >= 2), so a scan
    // that composed in the wrong order could not pass.
    std::vector<int> reversed(through.rbegin(), through.rend());
    const bool differs = product<T>(reversed) != product<T>(through);
    int any = differs ? 1 : 0, all_any = 0;
    MPI_Allreduce(&any, &all_any, 1, MPI_INT, MPI_LOR, g.mpi_comm());
    ok = ok && (p == 1 || all_any == 1);
  }
  CTXPAR_TEST_ALL(g, ok);
}

BOOST_AUTO_TEST_CASE(int_count_overflow_guard) {
  // Calls the count conversion every collective uses; nothing of 2^31 elements is allocated.
  bool ok = ctxpar::impl::mpi_count(INT_MAX, "ctxpar::test") == INT_MAX &&
            ctxpar::impl::mpi_count(0, "x") == 0;
  auto throws = [](auto f, const std::string& needle) {
    try {
      f();
    } catch (const ctxpar::Error& e) {
      const bool good = std::string(e.what()).find(needle) != std::string::npos;
      if (!good) std::cerr << "unexpected message: " << e.what() << "\n";
      return good;
    }
    return false;
  };
  const std::int64_t too_many = std::int64_t{INT_MAX} + 1;
  ok = ok && throws([&] { ctxpar::impl::mpi_count(too_many, "ctxpar::allgatherv"); },
                    "ctxpar::allgatherv: an MPI count must fit in int (expected at most 2147483647 "
                    "elements, got "
                    "2147483648)");
  ok = ok && throws([&] { ctxpar::impl::mpi_count(-1, "ctxpar::alltoallv"); }, "got -1");
  // Callers outside comm/ name the quantity that overflowed (the head transposes' blocks).
  ok = ok && throws(
                 [&] {
                   ctxpar::impl::mpi_count(too_many, "ctxpar::heads::TransposePlan",
                                           "an all-to-all block");
                 },
                 "ctxpar::heads::TransposePlan: an all-to-all block must fit in int (expected at "
                 "most 2147483647 elements, got 2147483648)");
  // Displacements: the running sum overflows although every single count fits.
  ok = ok && throws(
                 [&] {
                   ctxpar::impl::displacements({INT_MAX, 1}, "ctxpar::allgatherv");
                 },
                 "an MPI count must fit in int");
  ok = ok && throws(
                 [&] {
                   ctxpar::impl::displacements({INT_MAX, 1, 0}, "ctxpar::alltoallv");
                 },
                 "got 2147483648");
  ok = ok && ctxpar::impl::displacements({INT_MAX - 1, 1}, "x") == std::vector<int>{0, INT_MAX - 1};
  CTXPAR_TEST_ALL(world(), ok);
}

// A negative count anywhere must be refused before it reaches MPI.
BOOST_AUTO_TEST_CASE(negative_count_is_refused) {
  bool refused = false;
  try {
    ctxpar::impl::displacements({5, -1}, "ctxpar::allgatherv");
  } catch (const ctxpar::Error& e) {
    refused = std::string(e.what()).find("got -1") != std::string::npos;
  }
  CTXPAR_TEST_ALL(world(), refused);
}

// Byte counters count payload to and from other ranks only: a message to itself is a call, not
// traffic.
BOOST_AUTO_TEST_CASE(sendrecv_to_self_is_not_traffic) {
  const auto& g = world();
  const int me = g.rank();
  Kokkos::View<double*, Kokkos::HostSpace> send("send", 3), recv("recv", 3);
  g.reset_traffic();
  ctxpar::sendrecv(Kokkos::DefaultHostExecutionSpace(), g, send, me, recv, me, 5);
  CTXPAR_TEST_ALL(g, traffic_is(CollectiveKind::sendrecv, 1, 0, 0));
}

BOOST_AUTO_TEST_CASE(mismatched_buffers_give_clear_errors) {
  // Wrong sizes on every rank: each rank refuses locally before any MPI call, so none hangs.
  const auto& g = world();
  const int p = g.size();
  Kokkos::View<double*, Kokkos::HostSpace> send("send", 2), small("small", 2 * p - 1);
  auto local = [](auto f, const std::string& needle) {
    try {
      f();
    } catch (const ctxpar::Error& e) {
      return std::string(e.what()).find(needle) != std::string::npos;
    }
    return false;
  };
  const Kokkos::DefaultHostExecutionSpace host;
  bool ok = local([&] { ctxpar::allgather(host, g, send, small); },
                  "recv must hold size() * send.span() elements");
  ok = ok && local([&] { ctxpar::allgatherv(host, g, send, small, std::vector<int>(p + 1, 2)); },
                   "one count per rank");
  ok = ok && local([&] { ctxpar::reduce_scatter(host, g, small, send, std::vector<int>(p, 2)); },
                   "send must hold the sum of counts");
  Kokkos::View<double**, Kokkos::LayoutStride, Kokkos::HostSpace> strided(
      "strided", Kokkos::LayoutStride(2, 3, 2, 1));
  auto column = Kokkos::subview(strided, Kokkos::ALL, 0);
  ok = ok && local([&] { ctxpar::allreduce_sum(host, g, column); }, "must be contiguous");
  CTXPAR_TEST_ALL(g, ok);
}

// The default collectives agree on their preconditions: a violation on ONE rank (or on every rank)
// makes every rank throw the same ctxpar::Error naming the lowest bad rank and the argument,
// instead of one rank throwing while the others block in MPI. Afterwards the group still works.
BOOST_AUTO_TEST_CASE(preconditions_violated_on_one_rank_are_agreed) {
  const auto& g = world();
  const int p = g.size();
  const Kokkos::DefaultHostExecutionSpace host;
  using view = Kokkos::View<double*, Kokkos::HostSpace>;
  bool ok = true;
  for (int bad_rank : {p - 1, 0, -1}) {  // -1: every rank
    const bool bad = bad_rank < 0 || g.rank() == bad_rank;
    const int named = bad_rank < 0 ? 0 : bad_rank;
    // A value that must only be the same everywhere names the lowest rank that differs from rank 0.
    const int differs = bad_rank == 0 ? 1 : named;
    auto expect = [&](const std::string& needle, auto f, bool agreement_only = false) {
      const bool good =
          ctxpar::test::throws_everywhere(g, f, needle, agreement_only ? differs : named);
      if (!good && g.rank() == 0) std::cerr << "  (bad rank " << bad_rank << ")\n";
      ok = ok && good;
    };
    view send("send", 2), recv("recv", 2 * p), small("small", 2 * p - 1);
    expect("recv must hold size() * send.span() elements",
           [&] { ctxpar::allgather(host, g, send, bad ? small : recv); });
    // The same count everywhere: a rank sending 3 instead of 2 (with a recv that fits it).
    if (bad_rank >= 0 && p > 1) {
      view three("three", 3), recv3("recv3", 3 * p);
      expect(
          "every rank must agree on send.span()",
          [&] {
            if (bad)
              ctxpar::allgather(host, g, three, recv3);
            else
              ctxpar::allgather(host, g, send, recv);
          },
          true);
    }
    expect("one count per rank",
           [&] { ctxpar::allgatherv(host, g, send, recv, std::vector<int>(bad ? p + 1 : p, 2)); });
    expect("send.span() must equal counts[rank]", [&] {
      std::vector<int> counts(p, 2);
      if (bad) counts[g.rank()] = 1;
      ctxpar::allgatherv(host, g, send, recv, counts);
    });
    expect("an MPI count must fit in int", [&] {
      std::vector<int> counts(p, 2);
      if (bad) counts[0] = -1;
      ctxpar::allgatherv(host, g, send, recv, counts);
    });
    expect(p > 1 ? "send.span() must be divisible by the group size"
                 : "recv must hold as many elements as send",
           [&] {
             view odd("odd", 2 * p + 1), out("out", 2 * p + 1);
             if (bad && p > 1)
               ctxpar::alltoall(host, g, odd, out);
             else if (bad)
               ctxpar::alltoall(host, g, send,
                                small);  // np 1: every size divides; wrong recv instead
             else
               ctxpar::alltoall(host, g, recv, view("r", 2 * p));
           });
    expect("send must hold the sum of send_counts", [&] {
      std::vector<int> counts(p, 2);
      ctxpar::alltoallv(host, g, bad ? small : recv, counts, view("r", 2 * p), counts);
    });
    expect("send must hold the sum of counts", [&] {
      ctxpar::reduce_scatter(host, g, bad ? small : recv, send, std::vector<int>(p, 2));
    });
    expect("must be contiguous", [&] {
      Kokkos::View<double**, Kokkos::LayoutStride, Kokkos::HostSpace> strided(
          "strided", Kokkos::LayoutStride(2, 3, 2, 1));
      auto column = Kokkos::subview(strided, Kokkos::ALL, 0);
      if (bad)
        ctxpar::allreduce_sum(host, g, column);
      else
        ctxpar::allreduce_sum(host, g, view("ok", 2));
    });
    if (bad_rank >= 0 && p > 1) {
      expect(
          "every rank must agree on view.span()",
          [&] { ctxpar::allreduce_sum(host, g, view("v", bad ? 3 : 2)); }, true);
      expect(
          "every rank must agree on the record length",
          [&] {
            ctxpar::exclusive_scan(host, g, view("rec", bad ? 3 : 2),
                                   [](const view&, const view&) {});
          },
          true);
    }
    if (p == 1) break;
  }
  // Valid calls just inside the bounds still work on the same group: zero counts, an empty send.
  view empty("empty", 0), none("none", 0);
  bool good = true;
  try {
    ctxpar::allgather(host, g, empty, none);
    ctxpar::allgatherv(host, g, empty, none, std::vector<int>(p, 0));
    ctxpar::alltoallv(host, g, empty, std::vector<int>(p, 0), none, std::vector<int>(p, 0));
  } catch (const std::exception& e) {
    std::cerr << "[rank " << g.rank() << "] " << e.what() << "\n";
    good = false;
  }
  CTXPAR_TEST_ALL(g, ok && good);
}

// The unchecked variants move the same data as the checked ones and record no agreement; their
// local checks still refuse bad input on the calling rank (here on every rank, so nobody blocks).
BOOST_AUTO_TEST_CASE(unchecked_variants_skip_only_the_agreement) {
  const auto& g = world();
  const int p = g.size(), me = g.rank();
  const Kokkos::DefaultHostExecutionSpace host;
  using view = Kokkos::View<double*, Kokkos::HostSpace>;
  view send = make_view<double, Kokkos::HostSpace>(
      "send", 2, [&](std::int64_t i) { return value<double>(11, me, i); });
  view a("a", 2 * p), b("b", 2 * p);
  g.reset_traffic();
  ctxpar::allgather(host, g, send, a);
  const auto checked_agreements = g.traffic(CollectiveKind::agreement).calls;
  g.reset_traffic();
  ctxpar::allgather(host, g, send, b, ctxpar::unchecked);
  bool ok = to_host(a) == to_host(b) && checked_agreements > 0 &&
            g.traffic(CollectiveKind::agreement).calls == 0 &&
            traffic_is(CollectiveKind::allgather, 1, 16 * (p - 1), 16 * (p - 1));
  view sum("sum", 2);
  Kokkos::deep_copy(sum, 1.0);
  ctxpar::allreduce_sum(host, g, sum, ctxpar::unchecked);
  ok = ok && to_host(sum) == std::vector<double>{double(p), double(p)};
  bool refused = false;
  try {
    ctxpar::allgather(host, g, send, view("small", 2 * p - 1), ctxpar::unchecked);
  } catch (const ctxpar::Error& e) {
    refused = e.rank() == -1 && std::string(e.what()).find("recv must hold") != std::string::npos;
  }
  CTXPAR_TEST_ALL(g, ok && refused);
}

// Traffic::seconds: every kind adds the wall time of its MPI calls, which lies inside the time of
// the caller's loop around them; a scan at np 1 makes no MPI call and adds nothing; the data total
// sums the data kinds and leaves agreement out; record accumulates; reset_traffic zeroes it.
BOOST_AUTO_TEST_CASE(every_kind_times_its_mpi_calls) {
  const auto& g = world();
  const int p = g.size(), me = g.rank();
  const Kokkos::DefaultHostExecutionSpace host;
  using view = Kokkos::View<double*, Kokkos::HostSpace>;
  constexpr int calls = 5;
  const view mine = make_view<double, Kokkos::HostSpace>(
      "mine", 2 * p, [&](std::int64_t i) { return value<double>(12, me, i); });
  const view all("all", 2 * p * p), out("out", 2 * p), two("two", 2), got("got", 2);
  std::vector<int> twos(p, 2);
  const auto add = [](const view& earlier, const view& inout) {
    for (std::size_t i = 0; i < inout.extent(0); ++i) inout(i) += earlier(i);
  };
  const std::vector<std::pair<CollectiveKind, std::function<void()>>> kinds = {
      {CollectiveKind::allgather,
       [&] { ctxpar::allgather(host, g, mine, all, ctxpar::unchecked); }},
      {CollectiveKind::alltoall, [&] { ctxpar::alltoall(host, g, mine, out, ctxpar::unchecked); }},
      {CollectiveKind::reduce_scatter,
       [&] { ctxpar::reduce_scatter(host, g, mine, two, twos, ctxpar::unchecked); }},
      {CollectiveKind::scan,
       [&] {
         ctxpar::exclusive_scan(host, g, two, add, ctxpar::ScanDirection::forward,
                                ctxpar::unchecked);
       }},
      {CollectiveKind::sendrecv,
       [&] { ctxpar::sendrecv(host, g, two, (me + 1) % p, got, (me + p - 1) % p); }},
      {CollectiveKind::allreduce, [&] { ctxpar::allreduce_sum(host, g, two, ctxpar::unchecked); }}};
  bool ok = true;
  g.reset_traffic();
  for (const auto& [kind, call] : kinds) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call();
    const double loop =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const ctxpar::Traffic& t = g.traffic(kind);
    // Only a scan at np 1 skips MPI altogether (no round), so only it may report no time.
    const bool none = kind == CollectiveKind::scan && p == 1;
    const bool good =
        t.calls == calls && (none ? t.seconds == 0 : t.seconds > 0) && t.seconds <= loop;
    if (!good)
      std::cerr << "[rank " << me << "] " << ctxpar::to_string(kind) << ": " << t.calls
                << " calls, " << t.seconds << " s inside MPI, " << loop << " s around them\n";
    ok = ok && good;
  }
  double data = 0;
  for (int k = 0; k < static_cast<int>(CollectiveKind::count_); ++k)
    if (k != static_cast<int>(CollectiveKind::agreement))
      data += g.traffic(static_cast<CollectiveKind>(k)).seconds;
  ok = ok && g.traffic(CollectiveKind::agreement).calls == 0 &&
       g.total_data_traffic().seconds == data;
  // A checked agreement times its broadcast and its all-reduce, outside the data total.
  ctxpar::Preconditions chk(g, "ctxpar::test");
  chk.require_same("a constant", 7);
  chk.agree();
  const ctxpar::Traffic& agreed = g.traffic(CollectiveKind::agreement);
  ok = ok && agreed.calls == 2 && agreed.seconds > 0 && g.total_data_traffic().seconds == data;
  g.reset_traffic();
  for (int k = 0; k < static_cast<int>(CollectiveKind::count_); ++k)
    ok = ok && g.traffic(static_cast<CollectiveKind>(k)).seconds == 0;
  // Seconds add up call by call (powers of two: the sums are exact).
  g.record(CollectiveKind::allreduce, 0, 0, 0.25);
  g.record(CollectiveKind::allreduce, 0, 0, 0.5);
  ok = ok && g.traffic(CollectiveKind::allreduce).seconds == 0.75 &&
       g.total_data_traffic().seconds == 0.75;
  g.reset_traffic();
  CTXPAR_TEST_ALL(g, ok);
}

BOOST_AUTO_TEST_SUITE_END()
