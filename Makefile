# Two commands users need: `make run` (the main job) and `make test`.
# Both set up .venv/ first (idempotent: a stamp skips work already done).
PY := .venv/bin/python

.PHONY: setup run test test-fast
setup:
	bash scripts/setup.sh

run: setup
	bash scripts/run_matrix.sh

test: setup
	$(PY) -m pytest tests

test-fast: setup
	$(PY) -m pytest -m "not slow" tests
