// The run-time choice of the host kernels' instruction set (core/host_isa.hpp,
// core/impl/isa_dispatch.hpp, comm/host_isa_agreement.hpp): names, the dispatch reaching the body
// at the width of each set this CPU runs, scopes, and the agreement a plan makes at construction
// (a forced set every rank shares, a forced set differing on one rank or one this CPU cannot run
// refused on every rank, a misspelt CTXPAR_HOST_ISA refused by name). The kernels at each width are
// tested against their oracles by the `_baseline`/`_avx2`/`_avx512` twins of the mechanism suites.
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <string>

#include "ctxpar/comm/host_isa_agreement.hpp"
#include "ctxpar/core/host_isa.hpp"
#include "ctxpar/core/impl/isa_dispatch.hpp"
#include "ctxpar/core/impl/simd.hpp"
#include "ctxpar/swa/distributed_step.hpp"
#include "ctxpar_test/harness.hpp"

using ctxpar::HostIsa;
using ctxpar::test::world;

namespace {

constexpr HostIsa every_isa[] = {HostIsa::baseline, HostIsa::avx2, HostIsa::avx512};

// Clears what a case forced, whatever it threw.
struct ForceGuard {
  ~ForceGuard() { ctxpar::force_host_isa(std::nullopt); }
};

// The environment variable for the duration of a case, restored after it.
struct EnvGuard {
  std::string saved;
  bool had;
  explicit EnvGuard(const char* value) {
    const char* old = std::getenv("CTXPAR_HOST_ISA");
    had = old != nullptr;
    if (had) saved = old;
    if (value != nullptr)
      setenv("CTXPAR_HOST_ISA", value, 1);
    else
      unsetenv("CTXPAR_HOST_ISA");
  }
  ~EnvGuard() {
    if (had)
      setenv("CTXPAR_HOST_ISA", saved.c_str(), 1);
    else
      unsetenv("CTXPAR_HOST_ISA");
  }
};

// The sum of lanes 0..n-1 of a vector of the body's width, and the width itself.
struct WidthProbe {
  int* bytes;
  float* sum;
  template <class Width>
  void operator()(Width) const {
    constexpr int b = Width::value;
    *bytes = b;
    *sum = ctxpar::impl::simd_sum<float, b>(ctxpar::impl::simd_lane_index<float, b>());
  }
};

ctxpar::swa::StepShape shape() {
  return ctxpar::swa::StepShape{2, 1, 8};
}

using Plan = ctxpar::swa::StepPlan<ctxpar::swa::RopeBeforeGather, ctxpar::swa::SegmentChunks,
                                   Kokkos::DefaultHostExecutionSpace, float>;

}  // namespace

BOOST_AUTO_TEST_SUITE(core_host_isa)

BOOST_AUTO_TEST_CASE(names_round_trip_and_nothing_else_parses) {
  bool ok = true;
  for (HostIsa isa : every_isa) {
    HostIsa back = HostIsa::baseline;
    ok = ok && ctxpar::parse_host_isa(ctxpar::host_isa_name(isa), back) && back == isa;
  }
  HostIsa unused = HostIsa::avx2;
  for (const char* bad : {"auto", "", "AVX2", "sse2", "avx"})
    ok = ok && !ctxpar::parse_host_isa(bad, unused);
  ok = ok && ctxpar::host_isa_runs_here(HostIsa::baseline) &&
       ctxpar::host_isa_runs_here(ctxpar::detected_host_isa());
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE(the_dispatch_runs_the_body_at_the_width_of_each_set_this_cpu_runs) {
  bool ok = true;
  for (HostIsa isa : every_isa) {
    if (!ctxpar::host_isa_runs_here(isa)) {
      BOOST_TEST_MESSAGE("not run here: " << ctxpar::host_isa_name(isa));
      continue;
    }
    int bytes = 0;
    float sum = -1;
    ctxpar::impl::with_host_isa(isa, WidthProbe{&bytes, &sum});
    const int lanes = bytes / static_cast<int>(sizeof(float));
    const bool here = bytes == ctxpar::impl::host_isa_bytes(isa) &&
                      sum == static_cast<float>(lanes * (lanes - 1) / 2);
    if (!here)
      BOOST_TEST_MESSAGE(ctxpar::host_isa_name(isa)
                         << ": body saw " << bytes << " bytes, sum " << sum);
    ok = ok && here;
  }
#if CTXPAR_HOST_ISA_DISPATCH
  // The wide sets really are wider than SSE2 in a dispatching build.
  ok = ok && ctxpar::impl::host_isa_bytes(HostIsa::avx2) == 32 &&
       ctxpar::impl::host_isa_bytes(HostIsa::avx512) == 64;
#endif
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE(scopes_nest_and_restore) {
  const HostIsa outside = ctxpar::impl::active_host_isa();
  bool ok = true;
  {
    const ctxpar::impl::HostIsaScope a(HostIsa::baseline);
    ok = ok && ctxpar::impl::active_host_isa() == HostIsa::baseline;
    {
      const ctxpar::impl::HostIsaScope b(HostIsa::avx2);
      ok = ok && ctxpar::impl::active_host_isa() == HostIsa::avx2;
    }
    ok = ok && ctxpar::impl::active_host_isa() == HostIsa::baseline;
  }
  ok = ok && ctxpar::impl::active_host_isa() == outside;
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE(unforced_plans_agree_on_the_detected_set) {
  const EnvGuard env(nullptr);
  const auto& group = world();
  const HostIsa agreed = ctxpar::agreed_host_isa(group);
  Plan plan(Kokkos::DefaultHostExecutionSpace(), group, shape(), ctxpar::swa::Options{});
  // Every rank of this job runs on the same kind of CPU here, so the narrowest is the detected.
  CTXPAR_TEST_ALL(group, agreed == ctxpar::detected_host_isa() && plan.host_isa() == agreed);
}

BOOST_AUTO_TEST_CASE(a_set_forced_on_every_rank_is_the_plans_and_stays_with_it) {
  const EnvGuard env(nullptr);
  const ForceGuard guard;
  const auto& group = world();
  bool ok = true;
  for (HostIsa isa : every_isa) {
    if (!ctxpar::host_isa_runs_here(isa)) continue;
    ctxpar::force_host_isa(isa);
    Plan plan(Kokkos::DefaultHostExecutionSpace(), group, shape(), ctxpar::swa::Options{});
    ctxpar::force_host_isa(std::nullopt);
    ok = ok && plan.host_isa() == isa;
  }
  // The environment forces too, and `force_host_isa` takes precedence over it.
  {
    const EnvGuard baseline("baseline");
    ok = ok && ctxpar::agreed_host_isa(group) == HostIsa::baseline;
    if (ctxpar::host_isa_runs_here(HostIsa::avx2)) {
      ctxpar::force_host_isa(HostIsa::avx2);
      ok = ok && ctxpar::agreed_host_isa(group) == HostIsa::avx2;
      ctxpar::force_host_isa(std::nullopt);
    }
  }
  CTXPAR_TEST_ALL(group, ok);
}

BOOST_AUTO_TEST_CASE(a_forced_set_differing_on_one_rank_is_refused_everywhere) {
  const auto& group = world();
  if (group.size() == 1) return;  // one rank always agrees with itself
  const EnvGuard env(nullptr);
  const ForceGuard guard;
  const int bad = group.size() - 1;
  if (group.rank() == bad) ctxpar::force_host_isa(HostIsa::baseline);
  BOOST_TEST(ctxpar::test::throws_everywhere(
      group,
      [&] {
        Plan plan(Kokkos::DefaultHostExecutionSpace(), group, shape(), ctxpar::swa::Options{});
      },
      "every rank must agree on the forced host instruction set", bad));
}

BOOST_AUTO_TEST_CASE(a_forced_set_this_cpu_cannot_run_is_refused_naming_the_option) {
  const auto& group = world();
  const EnvGuard env(nullptr);
  const ForceGuard guard;
  if (ctxpar::host_isa_runs_here(HostIsa::avx512)) {
    BOOST_TEST_MESSAGE("this CPU runs every set: nothing to refuse");
    return;
  }
  const int bad = 0;
  // Rank 0 forces a set it cannot run; the others force the same, so only the CPU check fails.
  ctxpar::force_host_isa(HostIsa::avx512);
  BOOST_TEST(ctxpar::test::throws_everywhere(
      group, [&] { (void)ctxpar::agreed_host_isa(group, "ctxpar::test"); },
      "the forced host instruction set must be compiled into this binary and run on this CPU",
      bad));
  ctxpar::force_host_isa(std::nullopt);
  const EnvGuard avx512("avx512");
  std::string seen;
  try {
    (void)ctxpar::agreed_host_isa(group, "ctxpar::test");
  } catch (const ctxpar::Error& e) {
    seen = e.what();
  }
  CTXPAR_TEST_ALL(group, seen.find("CTXPAR_HOST_ISA=avx512") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_misspelt_environment_value_is_refused_by_name) {
  const auto& group = world();
  const EnvGuard env("avx-2");
  BOOST_TEST(ctxpar::test::throws_everywhere(
      group,
      [&] {
        Plan plan(Kokkos::DefaultHostExecutionSpace(), group, shape(), ctxpar::swa::Options{});
      },
      "CTXPAR_HOST_ISA must name a host instruction set", 0));
  const EnvGuard automatic("auto");
  CTXPAR_TEST_ALL(group, ctxpar::agreed_host_isa(group) == ctxpar::detected_host_isa());
}

BOOST_AUTO_TEST_SUITE_END()
