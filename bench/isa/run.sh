#!/usr/bin/env bash
# scripts/bench's entry for the default-versus-native comparison (scripts/bench-isa builds its three
# trees itself, so the benchmark build directory passed as $1 is not used).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
exec bash "$here/scripts/bench-isa" --json "$here/bench/results/isa.json"
