# Two commands users need: `make run` (the main job) and `make test`.
# Both set up .venv/ first (idempotent: a stamp skips work already done); the
# tests also set up .venv-lmeval/, the optional lm-eval environment.
PY := .venv/bin/python

.PHONY: setup setup-lmeval run test test-fast
setup:
	bash scripts/setup.sh

setup-lmeval:
	bash scripts/setup_lmeval.sh

run: setup
	bash scripts/run_matrix.sh

test: setup setup-lmeval
	$(PY) -m pytest tests

test-fast: setup
	$(PY) -m pytest -m "not slow" tests
