// Parameter slicing per rank against an index oracle written from the layout's definition (conv
// rows per householder copy: V by head block, K and Q by key group with the repeat; dt_bias and
// A_log by head block; D per head or per channel), and the gradient fold: each rank's slice
// gradient lands on the full parameter's rows and the ranks' contributions are summed.
#include "ctxpar/heads/gdp_context_parallel.hpp"
#include "ctxpar_test/harness.hpp"
#include "oracle.hpp"

namespace {
using ctxpar::test::world;
namespace ch = ctxpar::heads;

// Conv rows of rank j at P = 1: the V, K and Q channels of the input layout, shifted by d_inner.
std::vector<std::int64_t> conv_rows(const ch::GdpShape& s, int p, int j, bool uneven) {
  const auto in = heads_test::gdp_channels(s.nheads, s.headdim, s.ngroups, s.d_state, s.householder,
                                           p, j, uneven);
  std::vector<std::int64_t> rows;
  for (std::int64_t c : in)
    if (c >= s.d_inner() && c < s.d_inner() + s.conv_channels()) rows.push_back(c - s.d_inner());
  return rows;
}

template <class HeadPolicy>
bool check(const ch::GdpShape& s) {
  using exec = Kokkos::DefaultExecutionSpace;
  using mem = exec::memory_space;
  const int p = world().size(), me = world().rank();
  constexpr bool uneven = std::is_same_v<HeadPolicy, ch::UnevenHeads>;
  ch::GdpContextParallel<HeadPolicy, ch::Contiguous, exec, double> cp(exec(), world(), s, 4 * p);
  const auto rows = conv_rows(s, p, me, uneven);
  const auto [hb, he] = heads_test::head_range(s.nheads, p, me, uneven);
  bool ok = cp.conv1d_channels() == static_cast<std::int64_t>(rows.size());

  auto full = ch::GdpParameters<double, mem>::allocate(s), local = full;
  auto value = [](int which, std::int64_t i) { return ctxpar::test::uniform(40 + which, i); };
  auto fw = Kokkos::create_mirror_view(full.conv_weight);
  for (std::int64_t c = 0; c < s.conv_channels(); ++c)
    for (int k = 0; k < s.conv_width; ++k) fw(c, k) = value(0, c * s.conv_width + k);
  Kokkos::deep_copy(full.conv_weight, fw);
  auto fill1 = [&](auto v, int which) {
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t i = 0; i < h.extent(0); ++i) h(i) = value(which, i);
    Kokkos::deep_copy(v, h);
  };
  fill1(full.conv_bias, 1);
  fill1(full.dt_bias, 2);
  fill1(full.a_log, 3);
  local.conv_weight = decltype(local.conv_weight)("lw", rows.size(), s.conv_width);
  local.conv_bias = decltype(local.conv_bias)("lb", rows.size());
  local.dt_bias = decltype(local.dt_bias)("ldt", he - hb);
  local.a_log = decltype(local.a_log)("la", he - hb);
  cp.slice_parameters(full, local);
  auto lw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), local.conv_weight);
  auto lb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), local.conv_bias);
  auto ldt = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), local.dt_bias);
  auto la = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), local.a_log);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    ok = ok && lb(i) == value(1, rows[i]);
    for (int k = 0; k < s.conv_width; ++k)
      ok = ok && lw(i, k) == value(0, rows[i] * s.conv_width + k);
  }
  for (int h = hb; h < he; ++h) ok = ok && ldt(h - hb) == value(2, h) && la(h - hb) == value(3, h);

  // D per head and per channel.
  Kokkos::View<double*, mem> d_head("dh", s.nheads), d_chan("dc", s.d_inner()), lh("lh", he - hb),
      lc("lc", (he - hb) * s.headdim);
  fill1(d_head, 4);
  fill1(d_chan, 5);
  cp.slice_vector(d_head, lh, false);
  cp.slice_vector(d_chan, lc, true);
  auto lhh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), lh);
  auto lch = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), lc);
  for (int h = hb; h < he; ++h) {
    ok = ok && lhh(h - hb) == value(4, h);
    for (int j = 0; j < s.headdim; ++j)
      ok = ok && lch((h - hb) * s.headdim + j) == value(5, std::int64_t(h) * s.headdim + j);
  }

  // Gradient fold: rank r's local gradient of local row i is g(r, i); the full gradient of a row
  // is the sum over the ranks holding it.
  auto g = [](int r, std::int64_t i) { return double(r + 1) + 0.001 * double(i); };
  auto lwh = Kokkos::create_mirror_view(local.conv_weight);
  auto lbh = Kokkos::create_mirror_view(local.conv_bias);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    lbh(i) = g(me, i);
    for (int k = 0; k < s.conv_width; ++k) lwh(i, k) = g(me, i * s.conv_width + k);
  }
  Kokkos::deep_copy(local.conv_weight, lwh);
  Kokkos::deep_copy(local.conv_bias, lbh);
  auto dth = Kokkos::create_mirror_view(local.dt_bias);
  for (int h = 0; h < he - hb; ++h) dth(h) = g(me, h);
  Kokkos::deep_copy(local.dt_bias, dth);
  Kokkos::deep_copy(local.a_log, dth);
  auto grads = ch::GdpParameters<double, mem>::allocate(s, "grads");
  cp.accumulate_gradients(local, grads);
  std::vector<double> want_b(s.conv_channels(), 0.0), want_w(s.conv_channels() * s.conv_width, 0.0),
      want_h(s.nheads, 0.0);
  for (int r = 0; r < p; ++r) {
    const auto rr = conv_rows(s, p, r, uneven);
    for (std::size_t i = 0; i < rr.size(); ++i) {
      want_b[rr[i]] += g(r, i);
      for (int k = 0; k < s.conv_width; ++k)
        want_w[rr[i] * s.conv_width + k] += g(r, i * s.conv_width + k);
    }
    const auto [b, e] = heads_test::head_range(s.nheads, p, r, uneven);
    for (int h = b; h < e; ++h) want_h[h] += g(r, h - b);
  }
  auto gw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grads.conv_weight);
  auto gb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grads.conv_bias);
  auto gdt = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grads.dt_bias);
  auto ga = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grads.a_log);
  const double bound =
      p * 4 * ctxpar::test::unit_roundoff<double>() * (p + 2);  // sums of <= P terms of size <= P+1
  for (std::int64_t c = 0; c < s.conv_channels(); ++c) {
    ok = ok && std::fabs(gb(c) - want_b[c]) <= bound;
    for (int k = 0; k < s.conv_width; ++k)
      ok = ok && std::fabs(gw(c, k) - want_w[c * s.conv_width + k]) <= bound;
  }
  for (int h = 0; h < s.nheads; ++h)
    ok = ok && std::fabs(gdt(h) - want_h[h]) <= bound && std::fabs(ga(h) - want_h[h]) <= bound;
  if (!ok) std::cerr << "[rank " << me << "] parameter slice/fold mismatch\n";
  return ok;
}
}  // namespace

BOOST_AUTO_TEST_CASE(slices_and_folds) {
  const int p = world().size();
  for (int m : {1, 2, 3})
    for (int g : {1, p, 2 * p}) {
      BOOST_TEST_CONTEXT("M=" << m << " G=" << g) {
        CTXPAR_TEST_ALL(world(), check<ch::EvenHeads>(ch::GdpShape{4 * p, 2, g, 3, m, 4}));
      }
    }
  CTXPAR_TEST_ALL(world(), check<ch::UnevenHeads>(ch::GdpShape{2 * p + 1, 2, 1, 3, 2, 4}));
  CTXPAR_TEST_ALL(world(), check<ch::UnevenHeads>(ch::GdpShape{2 * p + 1, 2, 2 * p + 1, 3, 2, 4}));
}
