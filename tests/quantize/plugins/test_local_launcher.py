"""hydra/launcher=local_submitit, end to end on a tiny Hydra app: a job killed
by a signal is recorded as failed and the rest of the sweep finishes."""
import json
import subprocess
import sys

from tests.conftest import quantize_env
from tests.sweep_app import write_sweep_app

APP = '''
import os
import signal
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig

from quantize.common.jobs import run_job


def work(cfg):
    out = Path(HydraConfig.get().runtime.output_dir)
    (out / "gpus.txt").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
    with open(out / "runs.txt", "a") as runs:  # how many times the launcher ran the job
        runs.write("run\\n")
    if cfg.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer or kill -9 would
    (out / "done.txt").write_text(cfg.action)


@hydra.main(version_base=None, config_path=".", config_name="app")
def main(cfg):
    return run_job(work, cfg)


if __name__ == "__main__":
    main()
'''


def write_app(folder):
    write_sweep_app(folder, APP)


def test_a_job_killed_by_a_signal_fails_alone(tmp_path):
    write_app(tmp_path)
    sweep = tmp_path / "sweep"
    out = subprocess.run([sys.executable, "app.py", "-m", "action=first,kill,last", "hydra/launcher=local_submitit",
                          f"hydra.sweep.dir={sweep}"], cwd=tmp_path, env=quantize_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "1 of 3 job(s) failed" in out.stderr, out.stderr[-3000:]
    summary = [line for line in out.stderr.splitlines() if line.startswith("  ")]
    assert len(summary) == 1 and "action=kill" in summary[0] and "killed" in summary[0]
    (failed,) = sweep.glob("*/FAILED.json")
    assert failed.parent.name == "1_kill"
    info = json.loads(failed.read_text())
    assert info["error"].startswith("killed") and info["overrides"] == ["action=kill"]
    for name in ("0_first", "2_last"):
        assert (sweep / name / "done.txt").read_text() == name.split("_")[1]


def test_jobs_see_the_gpus_the_sweep_sees(tmp_path):
    """gpus_per_node unset (the preset): submitit alone would give each job
    CUDA_VISIBLE_DEVICES="", and a GPU sweep would silently run on the CPU."""
    write_app(tmp_path)
    for n, (parent, seen) in enumerate([("3,GPU-5d2c", "3,GPU-5d2c"), (None, "<unset>")]):
        env = {k: v for k, v in quantize_env().items() if k != "CUDA_VISIBLE_DEVICES"}
        env.update({} if parent is None else {"CUDA_VISIBLE_DEVICES": parent})
        sweep = tmp_path / f"sweep{n}"
        out = subprocess.run([sys.executable, "app.py", "-m", "action=a,b", "hydra/launcher=local_submitit",
                              f"hydra.sweep.dir={sweep}"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        assert [p.read_text() for p in sorted(sweep.glob("*/gpus.txt"))] == [seen, seen]
