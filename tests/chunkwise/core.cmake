# Summaries, composition, driver and the scalar-decay / diagonal-gate backends (included by
# tests/chunkwise/CMakeLists.txt).
ctxpar_add_mpi_test(NAME chunkwise_decay_cp SOURCES decay_cp_test.cpp LABELS chunkwise TIMEOUT 300)
ctxpar_add_mpi_test(NAME chunkwise_summary SOURCES summary_test.cpp LABELS chunkwise TIMEOUT 300)
ctxpar_add_mpi_test(NAME chunkwise_errors SOURCES errors_test.cpp LABELS chunkwise TIMEOUT 300)
ctxpar_add_mpi_test(NAME chunkwise_short_conv SOURCES short_conv_test.cpp LABELS chunkwise TIMEOUT 120)
ctxpar_add_mpi_test(NAME chunkwise_decay_numerics SOURCES decay_numerics_test.cpp LABELS chunkwise TIMEOUT 300)
ctxpar_add_mpi_test(NAME chunkwise_cp_plan SOURCES cp_plan_test.cpp LABELS chunkwise TIMEOUT 120)
ctxpar_add_mpi_test(NAME chunkwise_gates SOURCES gates_test.cpp LABELS chunkwise TIMEOUT 120)
# The conv plan's results and steady state on the paths device memory takes.
ctxpar_add_staged_twin(NAME chunkwise_short_conv_staged SOURCES short_conv_test.cpp LABELS chunkwise
  ARGS --run_test=conv_halo_zigzag_matches_whole_sequence_oracle,conv_plan_repeats_its_results_and_allocates_nothing_in_calls)
ctxpar_add_isa_twins(TARGET chunkwise_decay_cp LABELS chunkwise)
# The tensor-core products in AMD's MFMA layouts, as a HIP device runs them.
ctxpar_add_mfma_twin(NAME chunkwise_decay_mfma SOURCES decay_cp_test.cpp LABELS chunkwise
  RUN_TEST scalar_decay_tensor_core_products_match_oracle_and_single_rank,diagonal_gate_tensor_core_products_match_oracle_and_single_rank)
# What runs on the device in a CUDA/HIP build (label `device`).
ctxpar_add_device_entries(TARGET chunkwise_decay_cp LABELS chunkwise)
ctxpar_add_device_entries(TARGET chunkwise_cp_plan LABELS chunkwise)
ctxpar_add_device_entries(TARGET chunkwise_gates LABELS chunkwise)
# Every family on bfloat16 and float16 tensors: the rounded fp32 plan, bit for bit (16-bit plan).
ctxpar_add_mpi_test(NAME chunkwise_sixteen_bit_cp SOURCES sixteen_bit_cp_test.cpp LABELS chunkwise TIMEOUT 300)
ctxpar_add_device_entries(TARGET chunkwise_sixteen_bit_cp LABELS chunkwise)
