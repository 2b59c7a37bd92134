#!/usr/bin/env bash
# Runs a command as on an AVX2-only x86 host, to estimate what such a host does
# where none is at hand (bash scripts/as_avx2_host.sh make run):
# - every Python process sees AVX2 only through torch's ISA queries
#   (tests/hosts/avx2_host), so vLLM loads its real _C_AVX2 (no int4 kernel) and
#   quantbench's capability layer, calibration and `dtype: auto` decide as there;
# - ATen and inductor's generated C++ (ATEN_CPU_CAPABILITY), MKL and oneDNN run
#   AVX2 instructions only; result rows record these caps in engine_env, and
#   `hardware.cpu_isa` still lists this CPU's own flags.
# Clock, cores and memory stay this host's: timings are an estimate, not a
# measurement of an AVX2 machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$root/tests/hosts/avx2_host${PYTHONPATH:+:$PYTHONPATH}"
export ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
exec "$@"
