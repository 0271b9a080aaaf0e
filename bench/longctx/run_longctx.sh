#!/usr/bin/env bash
# Long-context sweep: every mechanism (swa, chunkwise, heads) at P = 1 and P = 2, T per rank =
# 1 Ki … 128 Ki in powers of 2 (T outermost), one process per (mechanism, P, T) so that each
# record's peak resident memory (VmHWM, which only grows over a process's life) is that case's
# own; merged into bench/results/longctx.json.  usage: run_longctx.sh BUILD_DIR [--quick]
# Beside P = 2, the control: two single-rank jobs at once (--independent), the same two cores,
# cache and memory bandwidth shared as at P = 2, without the communication or the CP algorithm.
#   --quick: T up to 16 Ki, one timed repeat (a smoke run, not for the report's verdict).
# Then profiled calls per (mechanism, P, control) at 4 Ki and the largest T (CTXPAR_LONGCTX_PROFILE=0: none).
# The target's two ends (4 Ki and the largest T) run in CTXPAR_LONGCTX_PROCESSES processes each
# (default 3; 1 with --quick): on this machine the same case in a new process can run 1.3x faster or
# slower, more than the target allows, and the report takes the median over the processes. The
# first is the sweep's; the others come after it, the two ends in alternation.
# CTXPAR_LONGCTX_REPEATS overrides the repeats (default 3), CTXPAR_LONGCTX_MAX_T the largest T,
# CTXPAR_LONGCTX_OUT the output file.
set -euo pipefail
build="${1:?usage: run_longctx.sh BUILD_DIR [--quick]}"
shift || true
quick=0
[ "${1:-}" = "--quick" ] && quick=1
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
exe="$build/bench/longctx/ctxpar_bench_longctx"
out="${CTXPAR_LONGCTX_OUT:-$here/bench/results/longctx.json}"
repeats="${CTXPAR_LONGCTX_REPEATS:-3}"
max_t="${CTXPAR_LONGCTX_MAX_T:-131072}"
processes="${CTXPAR_LONGCTX_PROCESSES:-3}"
if [ "$quick" = 1 ]; then
  repeats=1
  max_t=16384
  processes=1
fi
# Per-case files kept under the build folder: a sweep cut short still leaves what ran
# (merge_records.py "$build/longctx" OUT merges it by hand).
tmp="$build/longctx"
rm -rf "$tmp"
mkdir -p "$tmp"
export OMP_NUM_THREADS=1 OMP_PROC_BIND=false KOKKOS_DISABLE_WARNINGS=ON
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
# A rank waiting in MPI yields its core to its peer instead of spinning (as scripts/bench does).
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
flags=(--oversubscribe --bind-to none)
status=0
started=$SECONDS
# Every mechanism, P and the control at one T, in process `k` of that T.
run_length() {
  local t="$1" k="$2" p mechanism
  for p in 1 2; do
    for mechanism in swa chunkwise heads; do
      mpirun "${flags[@]}" -np "$p" "$exe" --mechanism "$mechanism" --tokens "$t" \
        --repeats "$repeats" --out "$tmp/P${p}_${mechanism}_${t}_$k.json" || status=$?
    done
  done
  for mechanism in swa chunkwise heads; do
    mpirun "${flags[@]}" -np 2 "$exe" --mechanism "$mechanism" --tokens "$t" --independent \
      --repeats "$repeats" --out "$tmp/P1x2_${mechanism}_${t}_$k.json" || status=$?
  done
}
# T outermost, one process each: a sweep cut short by a deadline has every mechanism and P over a
# smaller T range, and both ends of the target once.
t=1024
while [ "$t" -le "$max_t" ]; do
  run_length "$t" 0
  t=$((t * 2))
done
# The ends' other processes alternate 4 Ki and the largest T, so that the load's drift over the
# sweep meets both ends alike instead of the longest T running last.
for ((k = 1; k < processes; ++k)); do
  run_length 4096 "$k"
  if [ "$max_t" != 4096 ]; then run_length "$max_t" "$k"; fi
done
# Where the time goes at the sweep's two ends (4 Ki and the largest T): the fastest of a few
# profiled calls of each pass per (mechanism, P = 1, P = 2 and the control), kernels timed through
# the Kokkos Tools callbacks (the report prints them beside a series above its target).
# CTXPAR_LONGCTX_PROFILE=0 skips it.
if [ "${CTXPAR_LONGCTX_PROFILE:-1}" != 0 ]; then
  for series in 1 2 1x2; do
    p="${series%x2}"
    control=()
    [ "$series" = 1x2 ] && p=2 && control=(--independent)
    for mechanism in swa chunkwise heads; do
      for t in 4096 "$max_t"; do
        mpirun "${flags[@]}" -np "$p" "$exe" --mechanism "$mechanism" --tokens "$t" --profile \
          "${control[@]}" --out "$tmp/P${series}_profile_${mechanism}_$t.json" || status=$?
      done
    done
  done
fi
python3 "$here/bench/common/merge_records.py" "$tmp" "$out" --keep-if-empty
echo "run_longctx: $((SECONDS - started)) s (repeats $repeats, T up to $max_t)"
exit $status
