"""FAILED.json, the record of a job that failed in a sweep: written whole or
not at all; one that cannot be read, or that could not be written, still
marks its job failed (an empty FAILED.json where the disk has no room for more)."""
import json
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from quantize.common import jobs
from tests.conftest import ROOT, quantize_env
from tests.sweep_app import write_sweep_app

FULL_DISK = """
import resource, signal, sys
from quantize.common import jobs
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (40, 40))   # room for 40 bytes more: a full disk or a quota
try:
    jobs.write_failure(sys.argv[1], "engine start-up failed", "Traceback ...\\n" * 20, ["recipe=fp8"], 1)
except OSError as e:
    print("refused:", e)
"""


def test_a_failed_job_on_a_full_disk_leaves_no_torn_failed_json(tmp_path):
    out = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], env=quantize_env(), capture_output=True,
                         text=True, timeout=60)
    assert "refused:" in out.stdout, out.stderr
    assert list(tmp_path.iterdir()) == []


def job_dir(sweep, name: str, failed: str | None):
    (sweep / name / ".hydra").mkdir(parents=True)
    if failed is not None:
        (sweep / name / jobs.FAILURE_FILE).write_text(failed)


@pytest.mark.parametrize("config", [{}, {"hydra": {"sweep": {}}}, {"hydra": {"sweep": {"dir": "out"}}}])
def test_a_sweep_of_a_config_without_hydras_folder_keys_starts(config):
    """The check of job folder names reads what a config has, not a key it lacks."""
    jobs.FailureSummary().on_multirun_start(OmegaConf.create(config))


def test_the_summary_lists_a_job_whose_failed_json_is_torn_by_its_dir(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    job_dir(sweep, "0", json.dumps({"error": "engine start-up failed", "traceback": "tb",
                                    "overrides": ["recipe=fp8"], "exit_code": 1}))
    job_dir(sweep, "1", '{"error": "no room to wri')
    job_dir(sweep, "2", None)
    jobs.note_jobs([SimpleNamespace(hydra_cfg=None, working_dir=str(tmp_path / "earlier"))])  # an earlier sweep's
    (tmp_path / "earlier").mkdir()
    summary, config = jobs.FailureSummary(), OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    summary.on_multirun_start(config)  # as Hydra calls it: what an earlier sweep in this process noted is not this one's
    with pytest.raises(SystemExit) as ended:
        summary.on_multirun_end(config)
    assert ended.value.code == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("sweep finished: 2 of 3 job(s) failed")
    assert lines[1] == "  0: recipe=fp8: engine start-up failed"
    assert lines[2].startswith("  1: failed; its FAILED.json is unreadable (") and lines[2].endswith(
        f"see {sweep / '1'}")


APP = '''
import errno
import shutil
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig

from quantize.common import jobs
from quantize.common.jobs import FAILURE_FILE, run_command, run_job


def no_room(*args):
    raise OSError(errno.ENOSPC, "No space left on device")


def work(cfg):
    out = Path(HydraConfig.get().runtime.output_dir)
    if cfg.action == "full":
        jobs.atomic.write_json = no_room   # a disk with no room for FAILED.json's data
        raise RuntimeError("the engine died")
    if cfg.action == "err":
        raise RuntimeError("bad recipe")
    if cfg.action == "fail":
        shutil.rmtree(out)
        out.write_text("")   # the job dir is gone: no FAILED.json can be made there at all
        raise RuntimeError("the engine died")
    (out / "done.txt").write_text(cfg.action)


@hydra.main(version_base=None, config_path=".", config_name="app")
def main(cfg):
    return run_job(work, cfg)


if __name__ == "__main__":
    run_command(main, "app", "app")
'''


def sweep_of(tmp_path, actions: str):
    write_sweep_app(tmp_path, APP)
    sweep = tmp_path / "sweep"
    out = subprocess.run([sys.executable, "app.py", "-m", f"action={actions}", f"hydra.sweep.dir={sweep}"],
                         cwd=tmp_path, env=quantize_env(), capture_output=True, text=True, timeout=120)
    return sweep, out


def test_a_failure_on_a_disk_too_full_for_its_record_still_leaves_its_job_marked_failed(tmp_path):
    """An empty FAILED.json marks it: a summary or progress in another
    process (Slurm, local_submitit, ray, joblib) counts the job failed."""
    sweep, out = sweep_of(tmp_path, "full,last")
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert (sweep / "0_full" / jobs.FAILURE_FILE).read_text() == ""
    assert "1 of 2 job(s) failed" in out.stderr, out.stderr[-3000:]
    listed = [line for line in out.stderr.splitlines() if line.startswith("  ")]
    assert len(listed) == 1 and listed[0].startswith("  0_full: failed; its FAILED.json is unreadable")
    assert (sweep / "1_last" / "done.txt").read_text() == "last"


def test_a_failure_that_cannot_be_recorded_at_all_ends_the_sweep_on_its_error(tmp_path):
    """Not even an empty FAILED.json: nothing outside the job could tell it
    failed, so the job raises; the other jobs still run."""
    sweep, out = sweep_of(tmp_path, "fail,last")
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    error = out.stderr.strip().splitlines()[-1]
    assert error.startswith("error: RuntimeError: the engine died") and "FAILED.json could not be written" in error
    assert (sweep / "1_last" / "done.txt").read_text() == "last"


def test_a_sweep_ended_by_an_unrecordable_failure_still_lists_the_jobs_that_failed(tmp_path):
    """Hydra skips the summary when a job raises: the sweep's other failed
    jobs, each with its FAILED.json, were listed nowhere."""
    sweep, out = sweep_of(tmp_path, "err,fail,last")
    assert out.returncode == 1, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith("error: RuntimeError: the engine died"), out.stderr[-3000:]
    assert "sweep stopped by the error below; 1 other job(s) failed too (details in FAILED.json):" in lines
    assert [line for line in lines if line.startswith("  ")] == [
        f"  0_err: action=err: {jobs.read_failure(sweep / '0_err' / jobs.FAILURE_FILE)['error']}"]


@pytest.fixture
def keep_signals():
    import submitit
    sig = submitit.JobEnvironment._usr_sig()
    handler = signal.getsignal(sig)
    yield sig
    signal.signal(sig, handler)


def test_a_warned_job_whose_failed_json_is_torn_is_recorded_as_time_limit(tmp_path, monkeypatch, keep_signals):
    """submitit's time-limit warning, then the job failed and its FAILED.json
    is torn: the launcher records the time limit (not a JSONDecodeError)."""
    monkeypatch.syspath_prepend(str(ROOT / "quantize" / "plugins"))   # as Hydra finds it: quantize_env
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
    from hydra_plugins.quantbench_launchers.collect import CollectingLauncher
    (tmp_path / ".hydra").mkdir()

    def job(self, *args, **kwargs):
        signal.raise_signal(keep_signals)
        (tmp_path / jobs.FAILURE_FILE).write_text('{"error": "Runt')
        return SimpleNamespace(hydra_cfg=OmegaConf.create({"hydra": {"runtime": {"output_dir": str(tmp_path)}}}),
                               overrides=["recipe=fp8"])
    signal.signal(keep_signals, lambda *_: None)
    monkeypatch.setattr(BaseSubmititLauncher, "__call__", job)
    CollectingLauncher.__call__(object.__new__(CollectingLauncher))
    info = json.loads((tmp_path / jobs.FAILURE_FILE).read_text())
    assert info["error"] == jobs.TIME_LIMIT and info["overrides"] == ["recipe=fp8"]
    assert "FAILED.json is unreadable" in info["traceback"]
