# ctxpar_add_mpi_test(NAME <name> SOURCES <files...> [LABELS <labels...>] [TIMEOUT <s>]
#                     [RANKS <np...>] [EXTENDED_RANKS <np...> | NO_EXTENDED] [WILL_FAIL])
#
# Builds one Boost.Test executable (with the shared MPI+Kokkos test main) and registers it with
# ctest once per rank count: np 1, 2, 3, 4 in the default suite (odd counts find uneven-split
# bugs) and np 5..8 oversubscribed under the `extended` label. Every entry has a timeout, so a
# hang fails instead of stalling CI, and runs CTXPAR_TEST_THREADS host threads per rank (one by
# default; the `portable` and `tsan` presets ask for more so team kernels run on concurrent threads).
set(CTXPAR_TEST_DEFAULT_RANKS 1 2 3 4 CACHE STRING "Rank counts of the default test suite")
set(CTXPAR_TEST_EXTENDED_RANKS 5 6 7 8 CACHE STRING "Rank counts of the extended test label")

# Open MPI creates its session directory (<tmpdir>/ompi.<host>.<uid>) on the first launch and
# removes it when the last one ends; two launches that ctest -j runs side by side can race on it
# and fail MPI_Init ("File exists"). Every launch command therefore gets a session directory of
# its own (Open MPI creates the path), numbered in configure order under this root: call it once
# per test, never share its command between two tests.
set(CTXPAR_MPI_SESSION_ROOT "/tmp/ctxpar-mpi-sessions" CACHE PATH
  "Parent of the per-launch Open MPI session directories of the tests")

function(ctxpar_mpi_command out nprocs)
  get_property(launches GLOBAL PROPERTY CTXPAR_MPI_LAUNCHES)
  if(NOT launches)
    set(launches 0)
  endif()
  math(EXPR launches "${launches} + 1")
  set_property(GLOBAL PROPERTY CTXPAR_MPI_LAUNCHES ${launches})
  # The build tree's hash keeps two build trees (CI's presets) apart in one root.
  string(MD5 tree "${CMAKE_BINARY_DIR}")
  string(SUBSTRING "${tree}" 0 8 tree)
  set(${out} ${CMAKE_COMMAND} -E env
      OMPI_MCA_orte_tmpdir_base=${CTXPAR_MPI_SESSION_ROOT}/${tree}-${launches}
      ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${nprocs} ${CTXPAR_MPIEXEC_FLAGS}
      ${MPIEXEC_PREFLAGS} PARENT_SCOPE)
endfunction()

# OpenMPI needs these to run as root and to oversubscribe a 2-core machine.
set(CTXPAR_MPIEXEC_FLAGS --oversubscribe --bind-to none CACHE STRING "Extra flags for mpiexec in tests")
# Host threads per rank: OMP_NUM_THREADS for the OpenMP backend, KOKKOS_NUM_THREADS for every
# host backend (the Threads backend reads only that). Extra variables (e.g. OMP_WAIT_POLICY,
# TSAN_OPTIONS) come from CTXPAR_TEST_EXTRA_ENVIRONMENT.
set(CTXPAR_TEST_THREADS 1 CACHE STRING "Host threads per rank in the tests (OMP_NUM_THREADS)")
set(CTXPAR_TEST_EXTRA_ENVIRONMENT "" CACHE STRING "Extra VAR=value entries for every test")
set(CTXPAR_TEST_TIMEOUT_FACTOR 1 CACHE STRING
  "Multiplies every test timeout (sanitizer builds run several times slower)")
# HWLOC_COMPONENTS=-pci: MPI_Init has Open MPI's hwloc read the whole PCI-ID database, which the
# tests never use; under AddressSanitizer that read (one realloc per line, each a copy) costs about
# 6 s of CPU per process, enough to push the CLI fuzz suites past their timeouts on 2 cores.
set(CTXPAR_TEST_ENVIRONMENT
  HWLOC_COMPONENTS=-pci
  OMP_NUM_THREADS=${CTXPAR_TEST_THREADS} KOKKOS_NUM_THREADS=${CTXPAR_TEST_THREADS}
  OMP_PROC_BIND=false OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
  ${CTXPAR_TEST_EXTRA_ENVIRONMENT})

function(ctxpar_register_mpi_test name target)
  cmake_parse_arguments(ARG "WILL_FAIL;NO_EXTENDED" "TIMEOUT;SKIP_RETURN_CODE"
    "LABELS;RANKS;EXTENDED_RANKS;ARGS;ENVIRONMENT" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(NOT ARG_RANKS)
    set(ARG_RANKS ${CTXPAR_TEST_DEFAULT_RANKS})
  endif()
  if(ARG_NO_EXTENDED)
    set(ARG_EXTENDED_RANKS)
  elseif(NOT ARG_EXTENDED_RANKS)
    set(ARG_EXTENDED_RANKS ${CTXPAR_TEST_EXTENDED_RANKS})
  endif()
  foreach(np IN LISTS ARG_RANKS ARG_EXTENDED_RANKS)
    ctxpar_mpi_command(cmd ${np})
    set(test_name ${name}_np${np})
    add_test(NAME ${test_name} COMMAND ${cmd} $<TARGET_FILE:${target}> ${ARG_ARGS})
    set(labels ${ARG_LABELS} mpi)
    if(np IN_LIST ARG_EXTENDED_RANKS)
      list(APPEND labels extended)
    endif()
    math(EXPR processors "${np} * ${CTXPAR_TEST_THREADS}")
    math(EXPR timeout "${ARG_TIMEOUT} * ${CTXPAR_TEST_TIMEOUT_FACTOR}")
    set_tests_properties(${test_name} PROPERTIES TIMEOUT ${timeout} PROCESSORS ${processors}
      LABELS "${labels}" ENVIRONMENT "${CTXPAR_TEST_ENVIRONMENT};${ARG_ENVIRONMENT}")
    if(ARG_SKIP_RETURN_CODE)
      set_tests_properties(${test_name} PROPERTIES SKIP_RETURN_CODE ${ARG_SKIP_RETURN_CODE})
    endif()
    if(ARG_WILL_FAIL)
      set_tests_properties(${test_name} PROPERTIES WILL_FAIL TRUE)
    endif()
  endforeach()
endfunction()

function(ctxpar_add_mpi_test)
  cmake_parse_arguments(ARG "WILL_FAIL;NO_EXTENDED" "NAME;TIMEOUT" "SOURCES;LABELS;RANKS;EXTENDED_RANKS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ctxpar_test_main)
  set(forward)
  if(ARG_WILL_FAIL)
    list(APPEND forward WILL_FAIL)
  endif()
  if(ARG_TIMEOUT)
    list(APPEND forward TIMEOUT ${ARG_TIMEOUT})
  endif()
  if(ARG_RANKS)
    list(APPEND forward RANKS ${ARG_RANKS})
  endif()
  if(ARG_NO_EXTENDED)
    list(APPEND forward NO_EXTENDED)
  elseif(ARG_EXTENDED_RANKS)
    list(APPEND forward EXTENDED_RANKS ${ARG_EXTENDED_RANKS})
  endif()
  ctxpar_register_mpi_test(${ARG_NAME} ${ARG_NAME} LABELS ${ARG_LABELS} ${forward})
endfunction()

# ctxpar_low_ranks(<out>): the rank counts 1, 2 and 3 this build tests (CTXPAR_TEST_DEFAULT_RANKS),
# where the twins below run: one rank, two, and an odd number.
function(ctxpar_low_ranks out)
  set(ranks)
  foreach(np 1 2 3)
    if(np IN_LIST CTXPAR_TEST_DEFAULT_RANKS)
      list(APPEND ranks ${np})
    endif()
  endforeach()
  set(${out} ${ranks} PARENT_SCOPE)
endfunction()

# ctxpar_add_defined_twin(NAME <twin> DEFINITION <macro> LABEL <label> TIMEOUT s SOURCES ...
# LABELS ... [ARGS ...]): the test built a second time with <macro>=1, at np 1..3, labelled <label>.
function(ctxpar_add_defined_twin)
  cmake_parse_arguments(ARG "" "NAME;DEFINITION;LABEL;TIMEOUT" "SOURCES;LABELS;ARGS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ctxpar_test_main)
  target_compile_definitions(${ARG_NAME} PRIVATE ${ARG_DEFINITION}=1)
  ctxpar_low_ranks(ranks)
  ctxpar_register_mpi_test(${ARG_NAME} ${ARG_NAME} LABELS ${ARG_LABELS} ${ARG_LABEL}
    TIMEOUT ${ARG_TIMEOUT} RANKS ${ranks} NO_EXTENDED ARGS ${ARG_ARGS})
endfunction()

# ctxpar_add_staged_twin(NAME <twin> SOURCES ... LABELS ... [TIMEOUT s] [ARGS ...]): the test built
# a second time with CTXPAR_EMULATE_DEVICE_STAGING, so its host memory takes the paths device
# memory takes (collectives staged through the group's arena, every library host copy a separate
# allocation) and its allocation counts include them. At np 1..3: a staged collective on 1, 2 and
# an odd number of ranks.
function(ctxpar_add_staged_twin)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SOURCES;LABELS;ARGS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  ctxpar_add_defined_twin(NAME ${ARG_NAME} DEFINITION CTXPAR_EMULATE_DEVICE_STAGING LABEL staged
    TIMEOUT ${ARG_TIMEOUT} SOURCES ${ARG_SOURCES} LABELS ${ARG_LABELS} ARGS ${ARG_ARGS})
endfunction()

# ctxpar_add_mfma_twin(NAME <twin> SOURCES ... LABELS ... RUN_TEST <cases> [TIMEOUT s]): the test
# built a second time with CTXPAR_EMULATE_MFMA, so its host spaces' tensor-core team products
# emulate AMD's MFMA layouts (wavefronts of 64, 16×16 tiles) rather than NVIDIA's: the data
# movement a HIP device runs, against the same oracles, at np 1..3. RUN_TEST names the test cases
# (Boost.Test's --run_test) that use those products; host builds only.
function(ctxpar_add_mfma_twin)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT;RUN_TEST" "SOURCES;LABELS" ${ARGN})
  if(Kokkos_ENABLE_CUDA OR Kokkos_ENABLE_HIP)
    return()
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  ctxpar_add_defined_twin(NAME ${ARG_NAME} DEFINITION CTXPAR_EMULATE_MFMA LABEL mfma
    TIMEOUT ${ARG_TIMEOUT} SOURCES ${ARG_SOURCES} LABELS ${ARG_LABELS}
    ARGS --run_test=${ARG_RUN_TEST})
endfunction()

# ctxpar_add_isa_twins(TARGET <test executable> LABELS ... [TIMEOUT s]): the executable run again
# at np 1..3 with each host instruction set forced (CTXPAR_HOST_ISA=baseline, avx2, avx512;
# core/host_isa.hpp), against the same oracles, so every width the binary carries is tested where
# the CPU runs it. No extra build. The test main reports a twin as skipped (exit 77) when the CPU
# cannot run its set, or when its set is the one this CPU detects (the plain entries already ran
# it). Only for builds whose host spaces run the host SIMD kernels.
function(ctxpar_add_isa_twins)
  cmake_parse_arguments(ARG "" "TARGET;TIMEOUT" "LABELS" ${ARGN})
  if(CTXPAR_PORTABLE_KERNELS OR Kokkos_ENABLE_CUDA OR Kokkos_ENABLE_HIP)
    return()
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  ctxpar_low_ranks(ranks)
  foreach(isa baseline avx2 avx512)
    ctxpar_register_mpi_test(${ARG_TARGET}_${isa} ${ARG_TARGET} LABELS ${ARG_LABELS} isa
      TIMEOUT ${ARG_TIMEOUT} RANKS ${ranks} NO_EXTENDED SKIP_RETURN_CODE 77
      ENVIRONMENT CTXPAR_HOST_ISA=${isa} CTXPAR_TEST_ISA_TWIN=1)
  endforeach()
endfunction()

# ctxpar_add_device_entries(TARGET <test executable> LABELS ... [TYPED] [TIMEOUT s] [RANKS np...]):
# in a CUDA or HIP build, what of the executable runs on the device, under the `device` label at
# np 1 and 2 unless RANKS says otherwise (ranks share the GPU), so `ctest -N -L device` lists
# every mechanism's device cases and `ctest -L device` runs them on a GPU. TYPED: the executable's typed cases list the device space
# (ctxpar::test::cases / execution_spaces); new entries <TARGET>_device_np1/2 run only those, by
# Boost.Test's name filter on the space's name at the three suite depths the tests use (a filter
# that matches nothing fails the entry, so a device case lost from the list cannot pass
# unnoticed). Otherwise the executable runs on Kokkos::DefaultExecutionSpace, which is the device:
# its plain entries <TARGET>_np1/2 (TARGET may name entries of another executable, e.g. the CLI's)
# take the label. No-op in a host build.
function(ctxpar_add_device_entries)
  cmake_parse_arguments(ARG "TYPED" "TARGET;TIMEOUT" "LABELS;RANKS" ${ARGN})
  if(Kokkos_ENABLE_CUDA)
    set(device Cuda)
  elseif(Kokkos_ENABLE_HIP)
    set(device HIP)
  else()
    return()
  endif()
  if(NOT ARG_RANKS)
    set(ARG_RANKS 1 2)
  endif()
  set(ranks)
  foreach(np IN LISTS ARG_RANKS)
    if(np IN_LIST CTXPAR_TEST_DEFAULT_RANKS)
      list(APPEND ranks ${np})
    endif()
  endforeach()
  if(NOT ARG_TYPED)
    foreach(np IN LISTS ranks)
      if(TEST ${ARG_TARGET}_np${np})
        set_property(TEST ${ARG_TARGET}_np${np} APPEND PROPERTY LABELS device)
      endif()
    endforeach()
    return()
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  # Boost.Test spells Kokkos::Cuda as Kokkos__Cuda (Kokkos::Experimental::HIP in Kokkos 3).
  set(name "*__${device}*")
  ctxpar_register_mpi_test(${ARG_TARGET}_device ${ARG_TARGET} LABELS ${ARG_LABELS} device
    TIMEOUT ${ARG_TIMEOUT} RANKS ${ranks} NO_EXTENDED ARGS "--run_test=${name}:*/${name}:*/*/${name}")
endfunction()
