"""A report stopped by SIGTERM (a Slurm time limit, `timeout`) removes its
staging folder, leaves the last report as it was and says so in one line,
with the exit status 128 + 15 of the other commands."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import evaluate.report
from evaluate.report import Stopped, build_report
from evaluate.report.__main__ import _on_sigterm, stopped_line

from .rows import main_rows, store
from .test_main_cli import HERE, ROOT
from .test_report_files import contents

HANG_GUARD_S = 120
# draws slow.png into the staging folder, then waits (dummy_report.SlowPlot)
SLOW_PLOT = "_target_: dummy_report.SlowPlot\nseconds: 600\n"


def staging_folders(out: Path) -> list[Path]:
    return sorted(out.glob(".report-*"))


def wait_for(condition, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the report never reached its slow plot"
        time.sleep(0.1)


def test_a_report_stopped_by_sigterm_leaves_the_last_report_and_no_staging_folder(tmp_path):
    store(tmp_path / "results", main_rows())
    out = tmp_path / "out"
    build_report(tmp_path / "results", out, "first", outputs=("markdown",))
    before = contents(out)
    searchpath = tmp_path / "conf"
    (searchpath / "report" / "output").mkdir(parents=True)
    (searchpath / "report" / "output" / "slow_plot.yaml").write_text(SLOW_PLOT)
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "evaluate.report", f"results_dir={tmp_path / 'results'}",
                             f"out_dir={out}", "title=second", "output=[markdown,slow_plot]",
                             f"hydra.searchpath=[file://{searchpath}]"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any((folder / "slow.png").exists() for folder in staging_folders(out)), proc)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert stderr.splitlines() == ["error: stopped (SIGTERM): nothing was replaced, the last report is as it was; "
                                   "rerun the same command to write it"]
    assert stdout == ""
    assert staging_folders(out) == []
    assert contents(out) == before   # the first report, whole, and nothing beside it


def test_a_sigterm_while_the_files_are_renamed_into_place_waits_until_the_report_is_whole(tmp_path, monkeypatch):
    store(tmp_path / "results", main_rows())
    out = tmp_path / "out"
    build_report(tmp_path / "results", out, "first", outputs=("markdown", "csv"))
    renamed, real_replace = [], os.replace

    def replace_then_sigterm(src, dst):
        real_replace(src, dst)
        if Path(dst).parent != out:   # a file written into the staging folder
            return
        renamed.append(dst)
        if len(renamed) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(evaluate.report.os, "replace", replace_then_sigterm)
    before = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        with pytest.raises(Stopped) as e:
            build_report(tmp_path / "results", out, "second", outputs=("markdown", "csv"))
    finally:
        signal.signal(signal.SIGTERM, before)
    assert len(renamed) > 1 and sorted(renamed) == sorted(out.iterdir())   # every file, then the signal
    assert e.value.written_to == out
    assert "# second" in (out / "report.md").read_text()


def test_a_ctrl_c_while_the_files_are_renamed_into_place_says_where_the_whole_report_is(tmp_path, monkeypatch):
    """Ctrl-C is held as SIGTERM is; once the report is whole it says so, not
    "rerun to do the rest"."""
    store(tmp_path / "results", main_rows())
    out = tmp_path / "out"
    build_report(tmp_path / "results", out, "first", outputs=("markdown", "csv"))
    renamed, real_replace = [], os.replace

    def replace_then_ctrl_c(src, dst):
        real_replace(src, dst)
        if Path(dst).parent == out:
            renamed.append(dst)
            if len(renamed) == 1:
                os.kill(os.getpid(), signal.SIGINT)
    monkeypatch.setattr(evaluate.report.os, "replace", replace_then_ctrl_c)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(Stopped) as e:
            build_report(tmp_path / "results", out, "second", outputs=("markdown", "csv"))
    finally:
        signal.signal(signal.SIGINT, before)
    assert sorted(renamed) == sorted(out.iterdir()) and "# second" in (out / "report.md").read_text()
    assert e.value.written_to == out
    assert stopped_line(e.value).startswith(f"stopped (SIGINT) after the report was written to {out}")
