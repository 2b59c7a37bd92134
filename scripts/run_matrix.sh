#!/usr/bin/env bash
# The whole matrix for one model, in three Hydra steps that meet through files:
#   quantize every recipe -> evaluate every artifact on a scenario set -> report.
# Completed artifacts and result rows are skipped, so a rerun resumes; a failing
# job is recorded and the others finish (exit status 1 at the end if any failed).
# First the plan (jobs, engines to start, ETA from this host's past job times);
# after each job, "progress: k/N done, elapsed …, ETA …" (docs/sweeps.md).
#
#   bash scripts/run_matrix.sh [matrix preset] [extra overrides for both stages]
#   bash scripts/run_matrix.sh reference hydra/launcher=slurm_gpu
#   RECIPES=original,w8a8_smooth_ptq SCENARIO=interactive bash scripts/run_matrix.sh cpu
#   TRACKING=mlflow MLFLOW_TRACKING_URI=http://127.0.0.1:5000 bash scripts/run_matrix.sh
#     (each stage also logs to that MLflow server: docs/tracking.md)
# A preset is conf/matrix/<name>.env (RECIPES, SCENARIO, RUNS, SERVABLE_ONLY);
# variables set in the environment win over the preset. Without one: `gpu` on a
# CUDA machine, `cpu` elsewhere (`python -m evaluate.hardware`, the machine facts
# evaluate picks its own defaults from, conf/hardware/).
# SERVABLE_ONLY=1 (the default): quantize only the recipes evaluate's engine can
# serve on this machine (python -m evaluate.capabilities servable=[...]); evaluate
# records the others as `unsupported` with the reason. Off when a launcher
# override sends the jobs to other machines (slurm_cpu, slurm_gpu, a Ray
# cluster's address); SERVABLE_ONLY=0 quantizes all.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
presets() { local f list=""; for f in conf/matrix/*.env; do f=${f##*/}; list="$list${list:+, }${f%.env}"; done; echo "$list"; }
if [ $# -gt 0 ] && [ -f "conf/matrix/$1.env" ]; then
  MATRIX=$1; shift
elif [ $# -gt 0 ] && [[ $1 != *=* && $1 != [-~]* ]]; then  # not an override (key=value, ~key) nor a flag
  echo "error: no matrix preset $1 (have: $(presets))" >&2
  exit 2
else
  hardware=$("$PY" -m evaluate.hardware) || exit 2
  MATRIX=$([ "$hardware" = cuda ] && echo gpu || echo cpu)
fi
env_recipes=${RECIPES:-}; env_scenario=${SCENARIO:-}; env_runs=${RUNS:-}; env_servable=${SERVABLE_ONLY:-}
SERVABLE_ONLY=1
# shellcheck disable=SC1090
source "conf/matrix/$MATRIX.env"
RECIPES=${env_recipes:-$RECIPES}; SCENARIO=${env_scenario:-$SCENARIO}; RUNS=${env_runs:-$RUNS}
SERVABLE_ONLY=${env_servable:-$SERVABLE_ONLY}
case $SERVABLE_ONLY in
  0|1) ;;
  *) echo "error: SERVABLE_ONLY=$SERVABLE_ONLY: use 1 (quantize only what this machine can serve, the default)" \
       "or 0 (quantize every recipe)" >&2
     exit 2 ;;
esac
echo "matrix $MATRIX: recipes $RECIPES; scenario $SCENARIO; $RUNS runs"
RESULTS=${RESULTS:-results}
REPORT=${REPORT:-reports}
# TRACKING=<conf/tracking/ choice>: the three stages log to it too (the capability
# check and the plan take no tracking= override, so it is not among "$@").
tracking=()
[ -n "${TRACKING:-}" ] && tracking=("tracking=$TRACKING")

status=0
# Wall time per stage and in total (bash's SECONDS, reset here), printed at the end.
SECONDS=0; start=0; times=""
stage_done() { times="$times$1 $((SECONDS - start)) s, "; start=$SECONDS; }
# Exit status 2 is a usage error (bad override, a Slurm request no node can
# meet): it was said in one line, and the later stages would only repeat it.
# 130 is Ctrl-C (the stages exit with it rather than die of SIGINT, so bash
# would go on): the matrix stops there too.
stage() {
  "$@"
  local rc=$?
  case $rc in 0) ;; 2|130) exit $rc ;; *) status=1 ;; esac
}
# The capability check asks this machine's engine: it speaks for the jobs only
# where the launcher runs them here (slurm_local's node is this machine too).
runs_here() {
  local launcher=basic arg
  for arg in "$@"; do
    case $arg in
      hydra/launcher=*) launcher=${arg#hydra/launcher=} ;;
      *hydra.launcher.ray.init.address=*) case ${arg#*=} in ""|null) ;; *) return 1 ;; esac ;;
    esac
  done
  case $launcher in
    basic|joblib|local_parallel|submitit_local|local_submitit|ray|ray_local|ray_gpu|slurm_local) return 0 ;;
    *) return 1 ;;
  esac
}
QUANTIZE=$RECIPES
plan_args=()
if [ "$SERVABLE_ONLY" = 1 ] && ! runs_here "$@"; then
  echo "quantizing every recipe: the jobs run on other machines, which may serve what this one cannot"
elif [ "$SERVABLE_ONLY" = 1 ]; then
  # The plan's check first, so that an override of one stage only (force=true)
  # is named as such, as without SERVABLE_ONLY, not as a key the capability
  # check lacks.
  "$PY" -m evaluate.matrix_plan --check --quantize "$RECIPES" --evaluate "$RECIPES" --scenario "$SCENARIO" \
    --runs "$RUNS" --results-dir "$RESULTS" "$@"
  check_rc=$?
  case $check_rc in 2|130) exit $check_rc ;; esac
  QUANTIZE=$("$PY" -m evaluate.capabilities "servable=[$RECIPES]" "$@")
  caps_rc=$?
  case $caps_rc in 0) ;; 130) exit 130 ;; *) exit 2 ;; esac  # no list of what to quantize: nothing starts
  [ "$QUANTIZE" = "$RECIPES" ] || echo "quantizing only what can be served here: ${QUANTIZE:-none} (SERVABLE_ONLY=0 quantizes all)"
  plan_args=(--servable "$QUANTIZE")
fi
# The plan (jobs, engines to start, ETA from this host's past job times), and
# its run file: each job of both stages reads it from $QUANTBENCH_RUN, records
# its time beside it and prints "k/N done, elapsed, ETA" (quantize.common.progress).
case $RESULTS in /*) results_abs=$RESULTS ;; *) results_abs=$PWD/$RESULTS ;; esac
run_file="$results_abs/progress/run-$(date -u +%Y%m%dT%H%M%SZ)-$$.json"
"$PY" -m evaluate.matrix_plan --quantize "$QUANTIZE" --evaluate "$RECIPES" --scenario "$SCENARIO" \
  --runs "$RUNS" --results-dir "$RESULTS" --run-file "$run_file" ${plan_args[@]+"${plan_args[@]}"} "$@"
plan_rc=$?
case $plan_rc in
  0) export QUANTBENCH_RUN=$run_file ;;
  2|130) exit $plan_rc ;;
  *) echo "no plan: the stages run without progress lines" ;;
esac
if [ -n "$QUANTIZE" ]; then
  stage "$PY" -m quantize -m "recipe=$QUANTIZE" "$@" ${tracking[@]+"${tracking[@]}"}
fi
stage_done quantize
stage "$PY" -m evaluate -m "recipe=$RECIPES" "scenario=$SCENARIO" "runs=$RUNS" "results_dir=$RESULTS" "$@" \
  ${tracking[@]+"${tracking[@]}"}
stage_done evaluate
stage "$PY" -m evaluate.report "results_dir=$RESULTS" "out_dir=$REPORT" ${tracking[@]+"${tracking[@]}"}
stage_done report
total=$SECONDS
echo "matrix $MATRIX wall time: ${times}total $total s ($((total / 60)) min $((total % 60)) s)"
echo "report: $REPORT/report.md (exit status $status)"
exit $status
