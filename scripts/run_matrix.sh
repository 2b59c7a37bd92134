#!/usr/bin/env bash
# The whole matrix for one model, in three Hydra steps that meet through files:
#   quantize every recipe -> evaluate every artifact on a scenario set -> report.
# Completed artifacts and result rows are skipped, so a rerun resumes; a failing
# job is recorded and the others finish (exit status 1 at the end if any failed).
#
#   RECIPES=original,w8a8_smooth_ptq SCENARIO=cpu bash scripts/run_matrix.sh [extra overrides]
#   (on Slurm: add hydra/launcher=submitit_slurm as an extra override)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RECIPES=${RECIPES:-original,w8a8_smooth_ptq,w4a16_rtn,w4a16_gptq}
SCENARIO=${SCENARIO:-cpu}
RUNS=${RUNS:-3}
RESULTS=${RESULTS:-results}
REPORT=${REPORT:-reports}

status=0
"$PY" -m quantize -m "recipe=$RECIPES" "$@" || status=1
"$PY" -m evaluate -m "recipe=$RECIPES" "scenario=$SCENARIO" "runs=$RUNS" "results_dir=$RESULTS" "$@" || status=1
"$PY" -m evaluate.report --results-dir "$RESULTS" --out-dir "$REPORT" || status=1
echo "report: $REPORT/report.md (exit status $status)"
exit $status
