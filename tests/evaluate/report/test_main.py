"""evaluate/report/__main__.py: `python -m evaluate.report key=value ...` (Hydra overrides)."""
import subprocess
import sys
from pathlib import Path

import pytest

from evaluate.report.__main__ import main

from .rows import PLOTS, main_rows, store

ROOT = Path(__file__).resolve().parents[3]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ACCEPTED = ("python -m evaluate.report takes results_dir= out_dir= title= pareto_scenario= accuracy_floor_pct= "
            "busy_host_pct= layout= output= sanity= tracking= cost= (Hydra overrides; --help lists them)")


def test_cli_subprocess_takes_key_value_arguments(tmp_path):
    store(tmp_path / "results", main_rows())
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "evaluate.report", f"results_dir={tmp_path / 'results'}",
                           f"out_dir={out}", "title=My title", "pareto_scenario=medium_batch"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (out / "report.md").read_text().startswith("# My title\n")
    if PLOTS:
        assert (out / "pareto_medium_batch.png").read_bytes()[:8] == PNG_SIGNATURE
        assert not (out / "pareto_interactive.png").exists()    # pareto_scenario keeps that one
    else:  # the tables without plots, and one line saying why
        assert not list(out.glob("*.png")) and "matplotlib is not installed" in proc.stderr
    assert str(out / "report.md") in proc.stdout.splitlines()


def test_relative_dirs_are_taken_from_the_cwd(tmp_path, monkeypatch, capsys):
    store(tmp_path / "results", main_rows())
    monkeypatch.chdir(tmp_path)
    assert main([]) == 0  # the defaults: results/ -> reports/
    assert (tmp_path / "reports" / "report.md").read_text().startswith("# quantbench: quantized LLM benchmark")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reports", "results"]  # no .hydra/, no log


@pytest.mark.parametrize("arg", ["resuls_dir=x", "--results-dir", "results", "--out-dir=x"])
def test_an_unknown_key_or_a_flag_is_one_line_naming_the_keys(tmp_path, capsys, arg):
    assert main([f"out_dir={tmp_path / 'out'}", arg]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: unknown argument {arg!r}; {ACCEPTED}"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("make_dir", [True, False])
def test_no_results_exits_2_with_one_line(tmp_path, capsys, make_dir):
    empty = tmp_path / "results"
    if make_dir:
        empty.mkdir()
    assert main([f"results_dir={empty}", f"out_dir={tmp_path / 'out'}"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: no results in {empty}; run python -m evaluate first"]
    assert not (tmp_path / "out").exists()


def test_a_results_file_is_one_line_saying_pass_the_folder(tmp_path, capsys):
    """A rows file given as results_dir= said "no results in <file>; run python -m evaluate first"."""
    rows = tmp_path / "results.jsonl"
    rows.write_text("")
    assert main([f"results_dir={rows}", f"out_dir={tmp_path / 'out'}"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: results_dir={rows} is a file, not a folder; pass results_dir=<the folder python -m evaluate "
        "wrote its rows to>"]
    assert not (tmp_path / "out").exists()
