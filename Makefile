# Two commands users need: `make run` (the main job) and `make test`.
# Both set up .venv/ first (idempotent: a stamp skips work already done); the
# tests also set up .venv-lmeval/, the optional lm-eval environment.
PY := .venv/bin/python

.PHONY: setup setup-lmeval setup-slurm run test test-fast
setup:
	bash scripts/setup.sh

setup-lmeval:
	bash scripts/setup_lmeval.sh

# Debian's slurm-wlm, slurmdbd and mariadb-server for tests/test_slurm.py (root
# installs them when missing; otherwise those tests are skipped, saying why).
setup-slurm:
	@if [ "$$(id -u)" = 0 ]; then bash scripts/slurm_local.sh install; \
	else bash scripts/slurm_local.sh install || echo "make: not root: tests/test_slurm.py will be skipped"; fi

run: setup
	bash scripts/run_matrix.sh

test: setup setup-lmeval setup-slurm
	$(PY) -m pytest tests

test-fast: setup
	$(PY) -m pytest -m "not slow" tests
