"""`python -m evaluate.search` where Optuna's Hydra sweeper is not installed:
one line naming the fix, exit 2, before Hydra composes anything."""
import importlib.util

import pytest

from evaluate.search import __main__ as search_main


def test_a_missing_sweeper_is_one_line_naming_the_fix(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith(("optuna", "hydra_plugins.hydra_optuna")) else
                        real(name, *a))
    monkeypatch.setattr("sys.argv", ["evaluate.search", "n_trials=2"])
    with pytest.raises(SystemExit) as stop:
        search_main.main()
    assert stop.value.code == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: the recipe search needs Optuna and hydra-optuna-sweeper")
    assert "bash scripts/setup.sh" in line and "\n" not in line
    # the sweeper's own pins (optuna<3) would replace the project's Optuna: by hand it goes in without them
    assert "pip install --no-deps -r requirements/no-deps.txt" in line


@pytest.mark.skipif(importlib.util.find_spec("optuna") is None, reason="Optuna is not installed here")
def test_the_installed_sweeper_passes():
    search_main.check_sweeper_installed()  # scripts/setup.sh installs it
