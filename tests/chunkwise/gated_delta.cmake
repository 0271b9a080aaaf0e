# Gated delta rule / gated delta product backends (included by tests/chunkwise/CMakeLists.txt).
ctxpar_add_mpi_test(NAME chunkwise_gated_delta_oracle SOURCES gated_delta_oracle_test.cpp
  LABELS chunkwise RANKS 1 NO_EXTENDED TIMEOUT 300)
ctxpar_add_mpi_test(NAME chunkwise_gated_delta_local SOURCES gated_delta_local_test.cpp
  LABELS chunkwise RANKS 1 2 NO_EXTENDED TIMEOUT 300)
ctxpar_add_mpi_test(NAME chunkwise_gated_delta_cp SOURCES gated_delta_cp_test.cpp LABELS chunkwise TIMEOUT 300)
ctxpar_add_mpi_test(NAME chunkwise_gated_delta_errors SOURCES gated_delta_errors_test.cpp LABELS chunkwise TIMEOUT 120)
ctxpar_add_mpi_test(NAME chunkwise_gated_delta_numerics SOURCES gated_delta_numerics_test.cpp
  LABELS chunkwise TIMEOUT 300)
# The driver on a reused context allocates nothing in steady state (Kokkos Tools allocation callbacks).
ctxpar_add_mpi_test(NAME chunkwise_steady_state SOURCES steady_state_test.cpp LABELS chunkwise TIMEOUT 120)
# The same on the paths device memory takes (staged collectives, host copies as allocations).
ctxpar_add_staged_twin(NAME chunkwise_steady_state_staged SOURCES steady_state_test.cpp LABELS chunkwise)
ctxpar_add_isa_twins(TARGET chunkwise_gated_delta_cp LABELS chunkwise)
# The tensor-core products in AMD's MFMA layouts, as a HIP device runs them.
ctxpar_add_mfma_twin(NAME chunkwise_gated_delta_mfma SOURCES gated_delta_cp_test.cpp LABELS chunkwise
  RUN_TEST tensor_core_chunk_products_match_oracle_and_single_rank)
# What runs on the device in a CUDA/HIP build (label `device`).
ctxpar_add_device_entries(TARGET chunkwise_gated_delta_local LABELS chunkwise TYPED)
ctxpar_add_device_entries(TARGET chunkwise_gated_delta_cp LABELS chunkwise)
ctxpar_add_device_entries(TARGET chunkwise_steady_state LABELS chunkwise)
