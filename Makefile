# Two commands users need: `make run` (the main job) and `make test`.
# Both set up .venv/ first (idempotent: a stamp skips work already done); the
# tests also set up .venv-lmeval/, the optional lm-eval environment, and
# .venv-mlflow/, the MLflow server the tracking tests start.
PY := .venv/bin/python
# The suite runs in this many pytest-xdist workers, a test file per worker at a
# time (files share module fixtures), files with slow tests first
# (tests/conftest.py orders them; --no-loadscope-reorder keeps that order).
# A test spends much of its time waiting (engine shutdowns, Slurm, servers), so
# on 2 cores a third worker fills the gaps (timings: docs/development.md,
# "Tests"). Each worker may hold a vLLM engine (1-4 GB).
TEST_WORKERS ?= 3
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# Each tier leaves pytest's JUnit XML here for scripts/suite_budget.py (check, record).
SUITE_XML := logs/suite

.PHONY: setup setup-lmeval setup-mlflow setup-slurm setup-browser setup-device-image run test test-fast test-extended family-matrix device-dry-run
setup:
	bash scripts/setup.sh

setup-lmeval:
	bash scripts/setup_lmeval.sh

# The MLflow server in its own venv, .venv-mlflow/ (the full package pins pyarrow
# below vLLM's): the tracking tests start it (docs/tracking.md).
setup-mlflow:
	bash scripts/setup_mlflow.sh

# Debian's slurm-wlm, slurmdbd and mariadb-server for tests/scripts/test_slurm_local.py (root
# installs them when missing; otherwise those tests are skipped, saying why).
setup-slurm:
	@if [ "$$(id -u)" = 0 ]; then bash scripts/slurm_local.sh install; \
	else bash scripts/slurm_local.sh install || echo "make: not root: tests/scripts/test_slurm_local.py will be skipped"; fi

# Debian's chromium and chromedriver for the report.html browser test (root
# installs them when missing; otherwise that test is skipped, saying why).
setup-browser:
	bash scripts/setup_browser.sh

# A stand-in of the GPU machines' Python image (Python 3.12, PyPI's CUDA torch
# 2.11.0, ~6 GiB) into which the device check's dry run installs and imports the
# carried vLLM (docs/hardware.md); without a Python 3.12 that step is skipped, saying why.
setup-device-image:
	bash scripts/device/image_venv.sh || echo "make: no GPU-image stand-in: the device dry run's imports step will be skipped"

run: setup
	bash scripts/run_matrix.sh

# The GPU check's bundle (vLLM for the GPU image's torch, in 60 MiB chunks) and its dry run here.
device-dry-run: setup setup-device-image
	bash scripts/device_check.sh --prepare
	bash scripts/device_check.sh --dry-run

# `make test` is CI's suite (30 min budget on 2 cores); tests marked extended
# check further formats, families and launchers along paths `make test` already
# drives for real, and run in `make test-extended` (docs/development.md, "Tests").
TEST_SETUP := setup setup-lmeval setup-mlflow setup-slurm setup-browser
test: $(TEST_SETUP)
	$(PYTEST) --junitxml=$(SUITE_XML)-all.xml -m "not extended" tests

# The GPU image's stand-in is for the device check's dry run, an extended test.
test-extended: $(TEST_SETUP) setup-device-image
	$(PYTEST) --junitxml=$(SUITE_XML)-extended.xml -m extended tests

test-fast: setup
	$(PYTEST) --junitxml=$(SUITE_XML)-fast.xml -m "not slow and not extended" tests

# The family matrix (tests/test_family_matrix.py) with vLLM started on every
# cell the capability layer lets it serve, not only `make test`'s sample; -s
# prints the observed matrix and the wall time of each sweep.
# The model-family matrix (README, "Model families"): FAMILY_MATRIX=sample starts vLLM on 3 cells only.
FAMILY_MATRIX ?= full
family-matrix: setup
	QUANTBENCH_FAMILY_MATRIX=$(FAMILY_MATRIX) $(PY) -m pytest -s -q tests/test_family_matrix.py
