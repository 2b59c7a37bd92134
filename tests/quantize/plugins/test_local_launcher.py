"""hydra/launcher=local_submitit, end to end on a tiny Hydra app: a job killed
by a signal is recorded as failed and the rest of the sweep finishes."""
import json
import subprocess
import sys

from omegaconf import OmegaConf

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


def gpu_sweep(folder, parent, *args):
    env = {k: v for k, v in quantize_env().items() if k != "CUDA_VISIBLE_DEVICES"}
    env["CUDA_VISIBLE_DEVICES"] = parent
    return subprocess.run([sys.executable, "app.py", "-m", *args, "hydra/launcher=local_submitit",
                           f"hydra.sweep.dir={folder / 'sweep'}"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)


def test_concurrent_jobs_with_gpus_per_node_each_get_their_own(tmp_path):
    """gpus_per_node=1: submitit's local executor gave every job of the sweep
    CUDA_VISIBLE_DEVICES=0, all at once. Each job now takes one of the GPUs
    the sweep sees, and a job waits for one to be free; a job marks its GPU
    busy while it runs (stand-in GPUs: only the assignment is checked)."""
    write_app(tmp_path)
    app = (tmp_path / "app.py").read_text()
    (tmp_path / "app.py").write_text(app.replace('    if cfg.action == "kill":', (
        '    busy = out.parent.parent / ("busy-" + os.environ["CUDA_VISIBLE_DEVICES"])\n'
        '    fd = os.open(busy, os.O_CREAT | os.O_EXCL)  # raises when another job holds this GPU now\n'
        '    import time\n    time.sleep(1)\n    os.close(fd)\n    os.remove(busy)\n'
        '    if cfg.action == "kill":')))
    out = gpu_sweep(tmp_path, "3,GPU-5d2c", "action=a,b,c", "hydra.launcher.gpus_per_node=1")
    assert out.returncode == 0, out.stderr[-3000:]
    seen = [p.read_text() for p in sorted((tmp_path / "sweep").glob("*/gpus.txt"))]
    assert len(seen) == 3 and sorted(seen[:2]) == ["3", "GPU-5d2c"] and seen[2] in seen[:2], seen
    assert [(tmp_path / "sweep" / f"{n}_{a}" / "done.txt").read_text() for n, a in enumerate("abc")] == list("abc")


def test_visible_gpus_as_the_docs_write_it_picks_the_jobs_gpus(tmp_path):
    """+hydra.launcher.visible_gpus=[…] (docs/sweeps.md) is the launcher's own
    key: submitit's executor, which refuses keys it does not know, never gets it."""
    write_app(tmp_path)
    out = gpu_sweep(tmp_path, "0,1,2", "action=a,b", "hydra.launcher.gpus_per_node=1",
                    "+hydra.launcher.visible_gpus=[2]")
    assert out.returncode == 0, out.stderr[-3000:]
    assert [p.read_text() for p in sorted((tmp_path / "sweep").glob("*/gpus.txt"))] == ["2", "2"]


def test_gpus_per_node_out_of_the_gpus_the_sweep_sees_in_sets(monkeypatch):
    from hydra_plugins.quantbench_launchers.local import gpu_groups
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7,1")
    assert gpu_groups(2) == ["3,5", "6,7"]
    assert gpu_groups(1, [0, 2]) == ["0", "2"]  # hydra.launcher.visible_gpus, where given


def test_gpus_per_node_more_than_the_sweep_sees_is_refused_in_one_line(tmp_path):
    write_app(tmp_path)
    out = gpu_sweep(tmp_path, "3", "action=a,b", "hydra.launcher.gpus_per_node=2")
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.splitlines() == ["error: hydra.launcher.gpus_per_node=2 asks for more GPUs than this machine "
                                       "shows (1: 3); set hydra.launcher.gpus_per_node=1 or less"], out.stderr
    assert not (tmp_path / "sweep").exists()


def test_a_job_that_never_started_has_no_typed_password_in_its_overrides(tmp_path):
    """The .hydra/overrides.yaml written for a job that never ran (a lost Ray
    node, a cancelled Slurm job) held the password FAILED.json beside it hid."""
    from hydra_plugins.quantbench_launchers.collect import record
    record(tmp_path / "3", "ray: node died", "", ["tracking=mlflow", "tracking.uri=http://u:S3cret@h1"])
    saved = OmegaConf.load(tmp_path / "3" / ".hydra" / "overrides.yaml")
    assert list(saved) == ["tracking=mlflow", "tracking.uri=http://u:***@h1"]
    assert json.loads((tmp_path / "3" / "FAILED.json").read_text())["overrides"] == list(saved)
