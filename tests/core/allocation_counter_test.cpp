// ctxpar::AllocationCounter: counts what Kokkos allocates while it lives, one at a time, and gives
// back the callbacks it replaced.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>

#include "ctxpar/core/allocation_counter.hpp"
#include "ctxpar_test/harness.hpp"

using ctxpar::test::world;

namespace {
std::int64_t foreign_calls = 0;
void foreign_allocate(const Kokkos_Profiling_SpaceHandle, const char*, const void* const,
                      const std::uint64_t) {
  ++foreign_calls;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(core_allocation_counter)

BOOST_AUTO_TEST_CASE(counts_allocations_bytes_and_deallocations) {
  bool ok = true;
  Kokkos::View<double*> outside("outside", 10);
  {
    ctxpar::AllocationCounter counter;
    ok = ok && counter.allocations() == 0 && counter.bytes() == 0;
    {
      Kokkos::View<double*> a("a", 1000);
      Kokkos::View<float**, Kokkos::HostSpace> b(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("b")), 7, 9);
      ok = ok && counter.allocations() == 2 && counter.bytes() >= 1000 * 8 + 63 * 4;
      const auto labels = counter.labels();
      ok = ok && labels.size() == 2 && labels.count("a") == 1 && labels.at("a") == 1 &&
           labels.count("b") == 1;
      // Copies, subviews and unmanaged views share memory: nothing new.
      const std::int64_t before = counter.allocations();
      auto copy = a;
      auto part = Kokkos::subview(a, Kokkos::make_pair(2, 10));
      Kokkos::View<double*, Kokkos::MemoryTraits<Kokkos::Unmanaged>> alias(a.data(), a.extent(0));
      ok = ok && counter.allocations() == before && copy.extent(0) == 1000 && part.extent(0) == 8 &&
           alias.extent(0) == 1000;
      ok = ok && counter.deallocations() == 0;
    }
    ok = ok && counter.deallocations() == 2;
    counter.reset();
    ok = ok && counter.allocations() == 0 && counter.bytes() == 0 && counter.deallocations() == 0 &&
         counter.labels().empty();
    // A view that existed before the counter is not counted when it is reused.
    Kokkos::deep_copy(outside, 1.0);
    ok = ok && counter.allocations() == 0;
  }
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_CASE(one_at_a_time_and_the_previous_callback_comes_back) {
  bool ok = true;
  Kokkos::Tools::Experimental::set_allocate_data_callback(foreign_allocate);
  foreign_calls = 0;
  {
    ctxpar::AllocationCounter counter;
    try {
      ctxpar::AllocationCounter second;
      ok = false;
    } catch (const ctxpar::Error& e) {
      ok = ok && std::string(e.what()).find("only one allocation counter") != std::string::npos;
    }
    Kokkos::View<int*> a("a", 3);
    ok = ok && counter.allocations() == 1 && foreign_calls == 0;
  }
  Kokkos::View<int*> b("b", 3);
  ok = ok && foreign_calls == 1;
  Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
  // The failed second counter did not leave the slot taken.
  {
    ctxpar::AllocationCounter again;
    Kokkos::View<int*> c("c", 3);
    ok = ok && again.allocations() == 1;
  }
  CTXPAR_TEST_ALL(world(), ok);
}

BOOST_AUTO_TEST_SUITE_END()
