#!/usr/bin/env bash
# A bounded check of quantbench on a CUDA machine that has Python 3.12 and a
# CUDA torch + transformers but no network (and no vLLM).
#
#   bash scripts/device_check.sh --prepare   # here, with network: fills .device-bundle/ (~20 MiB)
#   bash scripts/device_check.sh             # there, in a copy of this tree plus .device-bundle/: <= 7 min
#   bash scripts/device_check.sh --dry-run   # any CPU machine after scripts/setup.sh: the same steps, tiny models
#
# --prepare downloads the CPython 3.12 manylinux wheels of what the stages
# import beyond torch/transformers (llm-compressor, Hydra, datasets, ...) at
# the versions .venv/ runs, and copies the default model's tokenizer and
# config (no weights) and the Austen corpus from .cache/.
#
# The check installs the wheels into a folder on PYTHONPATH, prints the machine
# facts and the capability table, builds a 1B-shaped and an 8B-shaped random
# Llama on the GPU, quantizes them there (1B: W4A16 GPTQ and W8A8 SmoothQuant +
# GPTQ; 8B: W4A16 GPTQ), measures the 1B original and W4A16 with engine=hf
# (speed + accuracy), runs the model-family matrix (tests/test_family_matrix.py) on
# the GPU, runs the fast test suite alongside, and writes a summary.
# Every step runs under `timeout`, within a total budget; a failing step does
# not stop the next. Results: $OUT/summary.md (the step table: rc, wall s, peak
# GPU MiB), $OUT/check.log (the console), $OUT/logs.tar.gz (every step's log,
# manifests, result rows, report; no weights).
#
# Environment: OUT (default <work>/out), DEVICE_BUNDLE (default .device-bundle),
# DEVICE_CHECK_WORK (default a new /tmp/quantbench-device.* folder),
# DEVICE_CHECK_BUDGET_S (steps' budget: 400 on a GPU, 1500 in a dry run),
# DEVICE_CHECK_TEST_WORKERS (8 on a GPU, 2 in a dry run), DEVICE_CHECK_TESTS
# (pytest paths; the dry run runs a few files), PYTHON (python3; .venv's in a dry run),
# DEVICE_CHECK_SKIP (step names to skip, e.g. "build_8b quantize_8b_w4a16_gptq" for a short lease).
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
HERE=$ROOT/scripts/device
BUNDLE=${DEVICE_BUNDLE:-$ROOT/.device-bundle}
MAX_BUNDLE_MIB=60
DEFAULT_MODEL=SmolLM2-135M-Instruct

# What the stages import that a machine with torch + transformers lacks, as
# seen on an H200 image (2026-11-26), plus the test runner. Versions: .venv's.
WHEELS="llmcompressor compressed-tensors hydra-core omegaconf hydra-submitit-launcher submitit cloudpickle
datasets dill multiprocess fsspec xxhash httpx httpcore h11 anyio sniffio pydantic pydantic-core
annotated-types typing-inspection aiohttp aiosignal aiohappyeyeballs frozenlist multidict yarl propcache attrs
loguru nvidia-ml-py typing-extensions pytest pytest-xdist execnet pluggy iniconfig"
SDIST_ONLY="antlr4-python3-runtime"   # no wheel on PyPI: built into one here
DEVICE_PLATFORM=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
                 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

die() { echo "device_check: $*" >&2; exit 2; }

prepare() {
    local py=$ROOT/.venv/bin/python cache=${QUANTBENCH_CACHE:-$ROOT/.cache}
    [ -x "$py" ] || die "no .venv/: run 'bash scripts/setup.sh' first (the wheels take .venv's versions)"
    [ -f "$cache/models/$DEFAULT_MODEL/config.json" ] && [ -f "$cache/corpus/austen/persuasion.txt" ] \
        || die "no model or corpus under $cache: run 'bash scripts/setup.sh' first"
    local specs tmp=$BUNDLE.tmp t0=$SECONDS
    # shellcheck disable=SC2086
    specs=$("$py" -c 'import sys
from importlib.metadata import PackageNotFoundError, version
try:
    print(" ".join(f"{n}=={version(n)}" for n in sys.argv[1:]))
except PackageNotFoundError as e:
    sys.exit(f"device_check: {e.name} is not installed in .venv/: run bash scripts/setup.sh")' $WHEELS $SDIST_ONLY) || exit 2
    rm -rf "$tmp" && mkdir -p "$tmp/wheels" "$tmp/cache/models/$DEFAULT_MODEL" "$tmp/cache/corpus"
    echo "prepare: [1/3] downloading $(echo $WHEELS | wc -w) wheels for CPython 3.12 manylinux x86_64"
    # shellcheck disable=SC2046
    "$py" -m pip download --quiet --no-deps --only-binary=:all: "${DEVICE_PLATFORM[@]}" -d "$tmp/wheels" \
        $(echo "$specs" | tr ' ' '\n' | grep -v -E "^($(echo $SDIST_ONLY | tr ' ' '|'))==") \
        || die "pip download failed (see above)"
    echo "prepare: [2/3] building wheels of the sdist-only $SDIST_ONLY"
    # shellcheck disable=SC2046
    "$py" -m pip wheel --quiet --no-deps --no-binary=:all: -w "$tmp/wheels" \
        $(echo "$specs" | tr ' ' '\n' | grep -E "^($(echo $SDIST_ONLY | tr ' ' '|'))==") \
        || die "building the $SDIST_ONLY wheel failed (see above)"
    echo "prepare: [3/3] copying $DEFAULT_MODEL's tokenizer and config (no weights) and the Austen corpus"
    find "$cache/models/$DEFAULT_MODEL" -maxdepth 1 -type f ! -name '*.safetensors' ! -name '*.bin' \
        -exec cp {} "$tmp/cache/models/$DEFAULT_MODEL/" \;
    cp -r "$cache/corpus/austen" "$tmp/cache/corpus/austen"
    {
        echo "prepared $(date -u +%Y-%m-%dT%H:%M:%SZ) from commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
        echo "$specs" | tr ' ' '\n'
    } >"$tmp/PREPARED.txt"
    rm -rf "$BUNDLE" && mv "$tmp" "$BUNDLE"
    local mib
    mib=$(du -sm "$BUNDLE" | cut -f1)
    echo "prepare: $BUNDLE: $(ls "$BUNDLE/wheels" | wc -l) wheels, $(du -sh "$BUNDLE/wheels" | cut -f1) of wheels," \
        "$(du -sh "$BUNDLE/cache" | cut -f1) of tokenizer + corpus; ${mib} MiB in all, in $((SECONDS - t0)) s"
    ((mib < MAX_BUNDLE_MIB)) || die "the bundle is ${mib} MiB, over the ${MAX_BUNDLE_MIB} MiB a device run may carry"
    echo "prepare: on the CUDA machine, in a copy of this tree with .device-bundle/: bash scripts/device_check.sh"
}

# ---------------------------------------------------------------- the check

# step NAME CAP_S MIN_S CMD...: run CMD with a limit of min(CAP_S, time left in
# the budget), skipped when that is under MIN_S. Its output goes to
# steps/NAME.log (the tail is echoed); with GPU_HOOK=1 (the default) each
# Python process records its peak GPU memory (scripts/device/gpu_peak), and
# nvidia-smi samples the whole GPU's memory meanwhile.
step() {
    local name=$1 cap=$2 min=$3
    shift 3
    local now left limit s e wall rc mon="" torch_mib="-" gpu_mib="-" note=""
    cap=$((cap * CAP_SCALE))
    now=$(date +%s)
    left=$((END - now))
    limit=$((cap < left ? cap : left))
    echo
    echo "== $name   [$(date -u +%H:%M:%S) UTC, $((now - T0)) s into the check, limit ${limit} s, budget ends in ${left} s]"
    if [[ " ${DEVICE_CHECK_SKIP:-} " == *" $name "* ]]; then
        echo "-- $name: SKIPPED (named in DEVICE_CHECK_SKIP)"
        printf '%s\tskipped\t-\t-\t-\tDEVICE_CHECK_SKIP\n' "$name" >>"$W/steps.tsv"
        return 0
    fi
    if ((limit < min)); then
        echo "-- $name: SKIPPED (${left} s left in the budget, it needs ${min} s)"
        printf '%s\tskipped\t-\t-\t-\tno time left\n' "$name" >>"$W/steps.tsv"
        return 0
    fi
    if [ "$GPU" = 1 ]; then
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 >"$W/gpu/$name.csv" 2>/dev/null &
        mon=$!
        echo "$mon" >>"$W/step.pids"
    fi
    local hook_path=$PYTHONPATH
    [ "${GPU_HOOK:-1}" = 1 ] && hook_path=$HERE/gpu_peak:$PYTHONPATH
    s=$(date +%s.%N)
    # `timeout` puts the step in a process group of its own: its pid is kept
    # so that an interrupted check stops it too (the trap in check).
    PYTHONPATH=$hook_path DEVICE_CHECK_GPU_PEAK_FILE=$W/gpu/$name.peak \
        timeout -k 10 "$limit" "$@" >"$W/steps/$name.log" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >>"$W/step.pids"
    wait "$pid"
    rc=$?
    e=$(date +%s.%N)
    if [ -n "$mon" ]; then kill "$mon" 2>/dev/null; wait "$mon" 2>/dev/null; fi
    wall=$(awk -v a="$s" -v b="$e" 'BEGIN { printf "%.1f", b - a }')
    [ -s "$W/gpu/$name.peak" ] && torch_mib=$(awk '$2 > m { m = $2 } END { print m + 0 }' "$W/gpu/$name.peak")
    [ -s "$W/gpu/$name.csv" ] && gpu_mib=$(awk '$1 + 0 > m { m = $1 + 0 } END { print m }' "$W/gpu/$name.csv")
    grep -v -E '^\s*$|it/s\]|s/it\]|\| METRIC \|' "$W/steps/$name.log" | tail -n "${TAIL:-12}" | cut -c1-300
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then note="timed out at ${limit} s"; echo "   (TIMED OUT at ${limit} s)"; fi
    if [ "$name" = tests ]; then   # pytest's last line; if it was stopped, how far it got and how many failed
        note=$("$PY" "$HERE/summarize.py" --tests-note "$W/steps/$name.log" 2>&1 | tail -1)
        grep -E '^(\[gw[0-9]+\] \[ *[0-9]+%\] (FAILED|ERROR) |(FAILED|ERROR) )' "$W/steps/$name.log" | sort -u | head -40 | cut -c1-300
    fi
    echo "-- $name: rc=$rc, ${wall} s, peak GPU ${torch_mib} MiB (torch), ${gpu_mib} MiB (whole GPU)"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$wall" "$torch_mib" "$gpu_mib" "$note" >>"$W/steps.tsv"
    return 0
}

check() {
    T0=$(date +%s)
    budget=0
    local dry=0
    [ "$MODE" = dry ] && dry=1
    GPU=0
    if ((dry)); then
        export CUDA_VISIBLE_DEVICES=""   # the same steps on the CPU, whatever this machine has
        PY=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
        budget=${DEVICE_CHECK_BUDGET_S:-2400}
        CAP_SCALE=${DEVICE_CHECK_CAP_SCALE:-4}   # a shared 2-core machine is slow; the budget still bounds it
    else
        nvidia-smi -L >/dev/null 2>&1 || die "no NVIDIA GPU here (nvidia-smi -L failed): use --dry-run on a CPU machine"
        [ -d "$BUNDLE/wheels" ] || die "no $BUNDLE/wheels: run 'bash scripts/device_check.sh --prepare' where there is network, and carry .device-bundle"
        GPU=1
        PY=${PYTHON:-python3}
        budget=${DEVICE_CHECK_BUDGET_S:-400}
        CAP_SCALE=1
    fi
    END=$((T0 + budget))
    mkdir -p "$W/steps" "$W/gpu" "$W/models" || die "cannot create $W"
    trap 'echo "device_check: interrupted; stopping the running steps" >&2
          xargs -r kill -TERM <"$W/step.pids" 2>/dev/null; exit 130' INT TERM
    : >"$W/step.pids"
    printf 'step\trc\twall_s\tpeak_torch_mib\tpeak_gpu_mib\tnote\n' >"$W/steps.tsv"

    echo "quantbench device check ($([ $dry = 1 ] && echo 'dry run on the CPU' || echo 'CUDA')), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "tree $ROOT (commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "unknown; bundle: $(head -1 "$BUNDLE/PREPARED.txt" 2>/dev/null)")),"
    echo "work $W, results $OUT, budget ${budget} s for the steps, python $PY"

    # The cache the stages read (QUANTBENCH_CACHE): the bundle's tokenizer,
    # config and corpus (no weights), or in a dry run without a bundle .cache/.
    export QUANTBENCH_CACHE=$W/cache
    if [ -d "$BUNDLE/cache" ]; then
        cp -r "$BUNDLE/cache" "$QUANTBENCH_CACHE"
    else
        QUANTBENCH_CACHE=${QUANTBENCH_CACHE_DRY:-$ROOT/.cache}
        echo "no $BUNDLE: the dry run uses $QUANTBENCH_CACHE and this Python's packages"
    fi
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HOME=$W/hf
    export TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
    local site=$W/site
    PYTHONPATH=$ROOT:$ROOT/quantize/plugins${PYTHONPATH:+:$PYTHONPATH}
    # A dry run hides vLLM as the CUDA machine lacks it (tests/hosts/no_vllm_host).
    ((dry)) && PYTHONPATH=$ROOT/tests/hosts/no_vllm_host:$PYTHONPATH
    ((dry)) || PYTHONPATH=$site:$PYTHONPATH
    export PYTHONPATH
    local base=$QUANTBENCH_CACHE/models/$DEFAULT_MODEL
    local shape_small=1b shape_big=8b calib=() evals workers tests
    if ((dry)); then
        shape_small=tiny shape_big=small
        calib=(calibration.num_samples=8 calibration.max_seq_len=64)
        evals=(scenario="$HERE/scenarios_dry.yaml" runs=1 warmup_runs=1 accuracy.num_windows=2
               accuracy.window_len=128 accuracy.lastword.num_items=8)
        workers=${DEVICE_CHECK_TEST_WORKERS:-2}
        tests=${DEVICE_CHECK_TESTS:-tests/evaluate/engines/test_vllm_startup.py tests/quantize/common/test_config.py}
    else
        evals=(scenario="$HERE/scenarios_gpu.yaml" runs=2 warmup_runs=1)
        workers=${DEVICE_CHECK_TEST_WORKERS:-8}
        tests=${DEVICE_CHECK_TESTS:-tests}
    fi
    # Explicit, so hardware-dependent defaults cannot change what is measured.
    evals+=(engine=hf load=none slo=none lm_eval=none accuracy=austen accuracy.reference_device=auto
            results_dir="$W/results")
    local small=$W/models/llama-$shape_small-random big=$W/models/llama-$shape_big-random
    cd "$W" || exit 1   # Hydra writes its logs/ into the cwd

    if [ ! -d "$BUNDLE/wheels" ]; then
        echo; echo "== install: SKIPPED (no $BUNDLE/wheels)"
        printf 'install\tskipped\t-\t-\t-\tno bundle\n' >>"$W/steps.tsv"
    elif ((dry)); then   # installable for the device's Python (3.12); not used here
        GPU_HOOK=0 step install 240 10 "$PY" -m pip install --quiet --no-index --no-deps --no-compile \
            "${DEVICE_PLATFORM[@]}" --target "$W/site-py312" "$BUNDLE"/wheels/*.whl
    else
        GPU_HOOK=0 step install 90 10 "$PY" -m pip install --quiet --no-index --no-deps --no-compile \
            --no-warn-conflicts --target "$site" "$BUNDLE"/wheels/*.whl
    fi
    TAIL=60 step facts 60 5 bash -c "{ nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv; } 2>/dev/null;
        echo \"\$(nproc) CPU cores, \$(free -g | awk '/Mem:/ {print \$2}') GiB RAM, /tmp: \$(df -h /tmp | awk 'NR == 2 {print \$4}') free\";
        '$PY' '$HERE/facts.py'"
    TAIL=80 step capabilities 90 5 bash -c "'$PY' -m evaluate.capabilities; echo;
        echo '--- python -m evaluate.capabilities machine=cuda_sm90 (the rules for an H100/H200):';
        '$PY' -m evaluate.capabilities machine=cuda_sm90"

    # On the GPU, the fast suite runs beside the GPU steps (it is mostly CPU
    # work on 16 cores); their whole-GPU column includes its processes. In a
    # dry run (2 cores) it runs after them.
    local tests_pid="" tests_cmd
    # Plugins: only xdist (the device's own pytest plugins may not load with the carried pytest).
    # -v: a line per test as it ends ("[gw3] [ 93%] FAILED <id>"), so a run the budget stops still names its failures.
    tests_cmd="cd '$ROOT' && OMP_NUM_THREADS=2 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 '$PY' -m pytest -v -p xdist.plugin \
        -p no:cacheprovider -m 'not slow' -n $workers --dist loadfile --basetemp '$W/pytest' -o addopts='-ra --durations=10' --junitxml '$W/steps/tests.xml' $tests"
    if ((!dry)); then
        GPU_HOOK=0 TAIL=25 step tests "$budget" 30 bash -c "$tests_cmd" >"$W/tests.console" 2>&1 &
        tests_pid=$!
        echo; echo "== tests: started beside the next steps (pid $tests_pid, $workers workers, limit: the budget)"
    fi

    step "build_$shape_small" 120 10 "$PY" "$HERE/build_model.py" "$small" "$base" --shape "$shape_small"
    step "quantize_${shape_small}_w4a16_gptq" 150 20 "$PY" -m quantize model="$small" recipe=w4a16_gptq \
        artifacts_dir="$W/artifacts" ${calib[@]+"${calib[@]}"}
    step "quantize_${shape_small}_w8a8_smooth_gptq" 150 20 "$PY" -m quantize model="$small" \
        recipe=w8a8_smooth_gptq artifacts_dir="$W/artifacts" ${calib[@]+"${calib[@]}"}
    step "build_$shape_big" 150 20 "$PY" "$HERE/build_model.py" "$big" "$base" --shape "$shape_big"
    step "quantize_${shape_big}_w4a16_gptq" 200 $((dry ? 20 : 100)) "$PY" -m quantize model="$big" \
        recipe=w4a16_gptq artifacts_dir="$W/artifacts" ${calib[@]+"${calib[@]}"}
    step "evaluate_${shape_small}_original" 120 20 "$PY" -m evaluate model="$small" "${evals[@]}"
    step "evaluate_${shape_small}_w4a16_gptq" 120 20 "$PY" -m evaluate \
        model="$W/artifacts/llama-$shape_small-random/w4a16_gptq" "${evals[@]}"
    # The family matrix (tests/test_family_matrix.py: 16 tiny families x 3 recipes, quantized and served
    # with engine=hf) on the GPU; not in a dry run (on a CPU: make family-matrix).
    ((dry)) || GPU_HOOK=0 TAIL=40 step families 300 60 bash -c "cd '$ROOT' && OMP_NUM_THREADS=4 QUANTBENCH_FAMILY_MATRIX=sample \
        PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 '$PY' -m pytest -v -p no:cacheprovider --basetemp '$W/pytest-families' \
        -o addopts='-ra --durations=5' --junitxml '$W/steps/families.xml' tests/test_family_matrix.py"

    if [ -n "$tests_pid" ]; then
        echo; echo "== waiting for the tests   [$(($(date +%s) - T0)) s into the check]"
        wait "$tests_pid"
        cat "$W/tests.console"
    else
        GPU_HOOK=0 TAIL=25 step tests "$budget" 30 bash -c "$tests_cmd"
    fi
    step report 60 5 "$PY" -m evaluate.report results_dir="$W/results" out_dir="$W/reports"
    collect
}

collect() {
    local wall=$(($(date +%s) - T0)) ok total
    total=$(($(wc -l <"$W/steps.tsv") - 1))
    ok=$(awk -F'\t' 'NR > 1 && $2 == "0"' "$W/steps.tsv" | wc -l)
    {
        echo "# quantbench device check, $(date -u +%Y-%m-%d) ($([ "$MODE" = dry ] && echo 'dry run on a CPU' || echo 'CUDA'))"
        echo
        local gpu_name=""
        [ "$GPU" = 1 ] && gpu_name="$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1), "
        echo "${gpu_name}$(nproc) CPU cores; $ok of $total steps exited 0; ${wall} s in all (budget ${budget} s for the steps)."
        [ "$MODE" = dry ] || echo "The tests ran beside the GPU steps: the whole-GPU column of those steps includes them."
        echo
        timeout 30 "$PY" "$HERE/summarize.py" "$W" 2>&1
    } >"$OUT/summary.md"
    (cd "$W" && timeout 60 tar -czf "$OUT/logs.tar.gz" --exclude='*.safetensors' --exclude=tokenizer.json \
        steps steps.tsv gpu models artifacts results reports logs 2>/dev/null)
    echo
    cat "$OUT/summary.md"
    echo
    echo "device_check: $ok of $total steps exited 0 in ${wall} s; $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
    [ "$ok" = "$total" ]
}

MODE=device
case "${1:-}" in
    --prepare) MODE=prepare ;;
    --dry-run) MODE=dry ;;
    "") ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (--prepare, --dry-run, --help)" ;;
esac
if [ "$MODE" = prepare ]; then
    prepare
    exit
fi
W=${DEVICE_CHECK_WORK:-$(mktemp -d /tmp/quantbench-device.XXXXXX)}
OUT=${OUT:-$W/out}
mkdir -p "$W" "$OUT" || die "cannot create $W or $OUT"
check 2>&1 | tee "$OUT/check.log"
exit "${PIPESTATUS[0]}"
