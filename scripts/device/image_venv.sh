#!/usr/bin/env bash
# A stand-in for the GPU machines' Python image on this CPU machine, for the
# device check's dry run (scripts/device_check.sh --dry-run): Python 3.12 with
# exactly scripts/device/image.txt (PyPI's CUDA torch 2.11.0 and NVIDIA's
# libraries included: about 6 GiB, 2-4 min the first time). The dry run
# installs the carried bundle into a folder with this Python and imports the
# carried vLLM from it, as the GPU machine will.
#
#   bash scripts/device/image_venv.sh          # makes .venv-device-image/ (idempotent: a stamp skips it)
#   bash scripts/device/image_venv.sh --path   # prints its python, or exits 1 when there is none
#                                              # (or only an unfinished one: the dry run skips its imports)
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/target.sh   # the stamp and the disk check, as the other venvs'
VENV=${DEVICE_IMAGE_VENV:-.venv-device-image}
STAMP=$VENV/.image-installed
# Pulled in by packages of image.txt (typer) but absent from the image
# (KINDS.md): removed, so the dry run misses what the GPU machine misses.
NOT_IN_IMAGE="pydantic pydantic-core annotated-types typing-inspection"

# The stamp: what is installed (the list and what is removed), not how this script reads.
want=$( (cat scripts/device/image.txt; echo "$NOT_IN_IMAGE") | sha256sum | cut -c1-16)
if [ "${1:-}" = --path ]; then
    venv_installed "$VENV" "$STAMP" "$want" && echo "$(cd "$VENV" && pwd)/bin/python" && exit 0
    exit 1
fi
venv_installed "$VENV" "$STAMP" "$want" && { echo "image_venv: $VENV is up to date"; exit 0; }

# A Python 3.12 that runs: PYTHON312, python3.12 on PATH (a pyenv shim may
# not), pyenv's own builds, the system's.
python312=""
for candidate in ${PYTHON312:-} python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 \
                 /usr/bin/python3.12 /usr/local/bin/python3.12; do
    if "$candidate" -c 'import sys, venv; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
        python312=$candidate
        break
    fi
done
if [ -z "$python312" ]; then
    echo "image_venv: no Python 3.12 here (the GPU image's); set PYTHON312=/path/to/python3.12" >&2
    exit 2
fi
echo "image_venv: $python312 ($("$python312" -V 2>&1))"
check_install_disk "installing $VENV (the GPU image's stand-in)" "$VENV" 6 2
rm -rf "$VENV"
"$python312" -m venv "$VENV"
echo "image_venv: installing scripts/device/image.txt into $VENV (torch 2.11.0 with CUDA libraries: a few minutes)"
"$VENV/bin/pip" install --quiet --disable-pip-version-check -r scripts/device/image.txt
# shellcheck disable=SC2086
"$VENV/bin/pip" uninstall --quiet -y $NOT_IN_IMAGE
"$VENV/bin/python" -c "import torch, transformers; print('image_venv: torch', torch.__version__, 'transformers', transformers.__version__)"
echo "$want" >"$STAMP"
