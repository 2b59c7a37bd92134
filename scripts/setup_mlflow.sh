#!/usr/bin/env bash
# The MLflow tracking server's environment, .venv-mlflow/ (idempotent, stamped
# like scripts/setup.sh), for `tracking=mlflow` against a server of your own
# (docs/tracking.md) and for the tests that start one (tests/test_tracking_server.py).
# Kept apart from .venv: the full mlflow package pins pyarrow below vLLM's.
# quantbench's jobs log through mlflow-skinny, which scripts/setup.sh installs.
#   bash scripts/setup_mlflow.sh    then  .venv-mlflow/bin/mlflow server --host 127.0.0.1 ...
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/target.sh   # the stamp and the disk check

# its own variable: VENV names the main venv (scripts/setup.sh), which must not get the full mlflow
VENV=${MLFLOW_VENV:-.venv-mlflow}
STAMP=$VENV/.quantbench-installed
want=$( (cat requirements/mlflow-server.txt scripts/setup_mlflow.sh) | sha256sum | cut -c1-16)
if ! venv_installed "$VENV" "$STAMP" "$want"; then
    check_install_disk "installing $VENV (the MLflow server)" "$VENV" 1 0.5
    # an interrupted `python -m venv` leaves no pip; a removed base Python, a dangling bin/python
    if [ -f "$VENV/pyvenv.cfg" ] && ! venv_runs_pip "$VENV"; then
        echo "setup-mlflow: $VENV is a venv whose python cannot run pip; recreating it"
        rm -rf "$VENV"
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        echo "setup-mlflow: creating $VENV"
        "${PYTHON:-python3}" -m venv "$VENV"
    fi
    rm -f "$STAMP"
    echo "setup-mlflow: installing the MLflow server into $VENV (a minute the first time)"
    "$VENV/bin/pip" install --quiet -r requirements/mlflow-server.txt
    echo "setup-mlflow: $("$VENV/bin/mlflow" --version)"
    echo "$want" > "$STAMP"
fi
