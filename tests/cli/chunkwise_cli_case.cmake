# One ctest entry of the `ctxpar chunkwise` command-line tests (cmake -P). Variables:
#   TOOL, ORACLE   the ctxpar tool and tests/cli/chunkwise_cli_oracle
#   MPIEXEC        the mpiexec command line up to the program (a list), NP ranks
#   FAMILY, WORK   the model family, a scratch folder
#   MODE           `runs`: every (packed, compose, layout) combination with --backward (and two
#                  16-bit runs: bfloat16 packed, float16 plain; and two more with tensor-core
#                  chunk products, bfloat16 on bfloat16 data and tf32 on float32), each
#                  output and gradient checked against the fp64 oracle; `bad_input`: a g.npy of
#                  the wrong shape must stop every rank with the documented message.
cmake_minimum_required(VERSION 3.16)

function(run_or_fail what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${what}:\n${out}")
endfunction()

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
set(householder 1)
if(FAMILY STREQUAL "gdp")
  set(householder 2)
endif()

if(MODE STREQUAL "bad_input")
  set(in "${WORK}/in")
  file(MAKE_DIRECTORY "${in}")
  run_or_fail("inputs" "${ORACLE}" gen ${FAMILY} "${in}" float32 1)
  run_or_fail("corrupt g.npy" "${ORACLE}" corrupt "${in}")
  execute_process(COMMAND ${MPIEXEC} "${TOOL}" chunkwise --family ${FAMILY} --in "${in}"
                          --out "${WORK}/out" --householder ${householder} --chunk 8 --backward
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(all "${out}${err}")
  if(rc EQUAL 0)
    message(FATAL_ERROR "a g.npy of the wrong shape was accepted:\n${all}")
  endif()
  # Documented in docs/chunkwise.md §7: every rank prints the agreed error and exits with 2.
  math(EXPR last "${NP} - 1")
  foreach(r RANGE ${last})
    string(FIND "${all}" "ctxpar chunkwise: rank ${r} stops: ctxpar chunkwise: on rank 0: g.npy must be [T, H]" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "rank ${r} did not report the documented message (exit ${rc}):\n${all}")
    endif()
  endforeach()
  if(EXISTS "${WORK}/out/o.npy")
    message(FATAL_ERROR "the refused run wrote outputs")
  endif()
  message(STATUS "refused on every rank (exit ${rc}):\n${all}")
  return()
endif()

# One run of the tool with --backward on inputs of `dtype`, every output checked by the oracle;
# a fifth argument is the run's --products.
function(run_case packed compose layout dtype)
  set(products exact)
  if(ARGC GREATER 4)
    set(products ${ARGV4})
  endif()
  set(shards ${NP})
  if(layout STREQUAL "zigzag")
    math(EXPR shards "2 * ${NP}")
  endif()
  set(tag "${FAMILY} np${NP} packed=${packed} ${compose} ${layout} ${dtype} ${products}")
  set(in "${WORK}/in_${packed}_${dtype}")
  set(out "${WORK}/out_${packed}_${compose}_${layout}_${dtype}_${products}")
  if(NOT EXISTS "${in}")
    file(MAKE_DIRECTORY "${in}")
    run_or_fail("inputs ${tag}" "${ORACLE}" gen ${FAMILY} "${in}" ${dtype} ${packed})
  endif()
  # Packed runs repeat the call (--repeat 2): what the oracle checks is then the last of
  # three calls on the same plan and views, so state carried between calls would show.
  set(repeat)
  if(packed)
    set(repeat --repeat 2)
  endif()
  run_or_fail("ctxpar chunkwise ${tag}" ${MPIEXEC} "${TOOL}" chunkwise --family ${FAMILY}
              --in "${in}" --out "${out}" --householder ${householder} --compose ${compose}
              --layout ${layout} --chunk 8 --backward --products ${products} ${repeat})
  file(READ "${out}/chunkwise.json" summary)
  foreach(key peak_rss_bytes steady_state allocations)
    string(FIND "${summary}" "\"${key}\"" at)
    if(at EQUAL -1 AND (packed OR key STREQUAL "peak_rss_bytes"))
      message(FATAL_ERROR "${tag}: chunkwise.json has no \"${key}\":\n${summary}")
    endif()
  endforeach()
  string(FIND "${summary}" "\"dtype\": \"${dtype}\"" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${tag}: chunkwise.json does not record dtype ${dtype}:\n${summary}")
  endif()
  run_or_fail("oracle check ${tag}" "${ORACLE}" check ${FAMILY} "${in}" ${dtype} ${packed}
              ${shards} "${out}" ${products})
endfunction()

foreach(packed 0 1)
  foreach(compose gather scan)
    foreach(layout contiguous zigzag)
      # fp64 activations for the scan runs of packed input (summaries stay fp32).
      set(dtype float32)
      if(packed AND compose STREQUAL "scan")
        set(dtype float64)
      endif()
      run_case(${packed} ${compose} ${layout} ${dtype})
    endforeach()
  endforeach()
endforeach()
# 16-bit tensors (states fp32): one packed and one plain run of each type.
run_case(1 gather zigzag bfloat16)
run_case(0 scan contiguous float16)
# The chunk products on (emulated) tensor cores, every family.
run_case(1 gather zigzag bfloat16 bfloat16)
run_case(0 scan contiguous float32 tf32)
