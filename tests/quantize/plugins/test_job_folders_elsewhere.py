"""A sweep whose jobs have folders outside its sweep folder
(hydra.sweep.dir=out/${action}, a hydra.sweep.subdir outside it): the
failure summary looked in the sweep folder only, so a failed job there was
listed nowhere and the sweep exited 0. It now lists it, on every launcher."""
import subprocess
import sys

import pytest

from tests.conftest import quantize_env
from tests.quantize.plugins.test_local_launcher import write_app

LAUNCHERS = ["basic", "local_parallel", "local_submitit"]


def sweep(folder, launcher, *args):
    write_app(folder)
    app = (folder / "app.py").read_text()
    (folder / "app.py").write_text(app.replace('    if cfg.action == "kill":', (
        '    if cfg.action == "fail":\n        raise RuntimeError("the engine died")\n'
        '    if cfg.action == "kill":')))
    chosen = [] if launcher == "basic" else [f"hydra/launcher={launcher}"]
    return subprocess.run([sys.executable, "app.py", "-m", "action=a,fail", *chosen, *args], cwd=folder,
                          env=quantize_env(), capture_output=True, text=True, timeout=180)


def listed(out) -> list[str]:
    return [line for line in out.stderr.splitlines() if line.startswith("  ")]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_failed_job_with_a_sweep_folder_of_its_own_is_listed(launcher, tmp_path):
    out = sweep(tmp_path, launcher, "hydra.sweep.dir=out/${action}")
    assert out.returncode == 1, out.stderr[-3000:]
    assert "sweep finished: 1 of 2 job(s) failed" in out.stderr, out.stderr[-3000:]
    assert listed(out) == ["  out/fail/1_fail: action=fail: RuntimeError: the engine died (unexpected: its trace is "
                           f"in {tmp_path}/out/fail/1_fail/app.log; -v prints it)"], out.stderr[-3000:]
    assert (tmp_path / "out" / "a" / "0_a" / "done.txt").read_text() == "a"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_failed_job_whose_subdir_is_outside_the_sweep_folder_is_listed(launcher, tmp_path):
    out = sweep(tmp_path, launcher, f"hydra.sweep.dir={tmp_path}/sweep",
                "hydra.sweep.subdir=../jobs/${hydra.job.num}_${action}")
    assert out.returncode == 1, out.stderr[-3000:]
    assert "sweep finished: 1 of 2 job(s) failed" in out.stderr, out.stderr[-3000:]
    assert [line.split(": ")[0] for line in listed(out)] == ["  jobs/1_fail"], out.stderr[-3000:]


def test_a_killed_job_with_a_sweep_folder_of_its_own_is_recorded_there(tmp_path):
    """The launcher records a job that ended without a result in that job's
    own folder (it used the sweep folder of the default action)."""
    out = sweep(tmp_path, "local_submitit", "action=a,kill", "hydra.sweep.dir=out/${action}")
    assert out.returncode == 1, out.stderr[-3000:]
    assert [line.split(": ")[0] for line in listed(out)] == ["  out/kill/1_kill"], out.stderr[-3000:]
    assert (tmp_path / "out" / "kill" / "1_kill" / "FAILED.json").is_file()
