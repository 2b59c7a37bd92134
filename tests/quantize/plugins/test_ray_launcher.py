"""hydra/launcher=ray_local and ray_gpu: a job whose Ray worker is killed is
recorded as failed, once, and the rest of the sweep finishes; a GPU request
the cluster cannot meet is refused in one line."""
import importlib.util
import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from quantize.common.paths import CONF_DIR
from tests.conftest import quantize_env
from tests.quantize.plugins.test_local_launcher import write_app

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("ray", "hydra_plugins.hydra_ray_launcher")),
    reason="Ray or Hydra's Ray launcher is not installed here (bash scripts/setup.sh installs them)")


def sweep(folder, *args):
    return subprocess.run([sys.executable, "app.py", "-m", *args, f"hydra.sweep.dir={folder / 'sweep'}"],
                          cwd=folder, env=quantize_env({"RAY_DEDUP_LOGS": "0"}), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("preset", ["ray_local", "ray_gpu"])
def test_the_presets_never_rerun_a_killed_job(preset):
    """Ray's default reruns a task whose worker died 3 times: an OOM-killed
    quantize job would run 4 times. What the presets pass to ray.remote."""
    cfg = OmegaConf.load(CONF_DIR / "hydra" / "launcher" / f"{preset}.yaml")
    assert cfg.ray.remote.max_retries == 0
    assert cfg._target_.endswith("ray_jobs.CollectingRayLauncher")
    if preset == "ray_gpu":
        assert cfg.ray.remote.num_gpus == 1


@pytest.mark.extended
def test_a_job_whose_worker_is_killed_fails_alone_and_once(tmp_path):
    write_app(tmp_path)
    out = sweep(tmp_path, "action=first,kill,last", "hydra/launcher=ray_local")
    assert out.returncode == 1, out.stderr[-3000:]
    assert "1 of 3 job(s) failed" in out.stderr, out.stderr[-3000:]
    summary = [line for line in out.stderr.splitlines() if line.startswith("  ")]
    assert len(summary) == 1 and "action=kill" in summary[0] and "killed" in summary[0], summary
    (failed,) = (tmp_path / "sweep").glob("*/FAILED.json")
    assert failed.parent.name == "1_kill" and (failed.parent / "runs.txt").read_text() == "run\n"
    info = json.loads(failed.read_text())
    assert info["error"].startswith("killed") and info["overrides"] == ["action=kill"]
    for name in ("0_first", "2_last"):
        assert (tmp_path / "sweep" / name / "done.txt").read_text() == name.split("_")[1]


@pytest.mark.extended
def test_a_gpu_request_no_node_meets_is_refused_in_one_line(tmp_path):
    write_app(tmp_path)
    out = sweep(tmp_path, "action=a,b", "hydra/launcher=ray_gpu", "hydra.launcher.ray.remote.num_gpus=64",
                "+hydra.launcher.ray.init.num_cpus=1", "+hydra.launcher.ray.init.include_dashboard=false")
    assert out.returncode == 2, out.stderr[-3000:]
    assert "hydra.launcher.ray.remote.num_gpus=64 asks for more GPUs than any node" in out.stderr
    assert not list((tmp_path / "sweep").glob("*/done.txt"))


@pytest.mark.extended
def test_each_gpu_job_sees_the_gpu_ray_gave_it(tmp_path):
    """ray_local's tasks ask for no GPU, and Ray leaves such a job every GPU
    of the machine; ray_gpu's get one each (two stand-in GPUs here)."""
    write_app(tmp_path)
    out = sweep(tmp_path, "action=a,b", "hydra/launcher=ray_gpu", "+hydra.launcher.ray.init.num_gpus=2",
                "+hydra.launcher.ray.init.num_cpus=2", "+hydra.launcher.ray.init.include_dashboard=false")
    assert out.returncode == 0, out.stderr[-3000:]
    seen = [p.read_text() for p in sorted((tmp_path / "sweep").glob("*/gpus.txt"))]
    assert len(seen) == 2 and set(seen) <= {"0", "1"}, seen


@pytest.mark.extended
def test_jobs_whose_output_went_to_the_workers_directory_are_not_ok(tmp_path):
    """Ray workers started in another directory (here: a runtime_env
    working_dir) resolve a relative sweep dir against their own: the sweep
    found no job and said "0 job(s) ok", exit 0."""
    write_app(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    out = subprocess.run([sys.executable, "app.py", "-m", "action=a,b", "hydra/launcher=ray_local",
                          "hydra.sweep.dir=sweep", f"+hydra.launcher.ray.init.runtime_env.working_dir={tmp_path}/elsewhere"],
                         cwd=tmp_path, env=quantize_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "2 of 2 job(s) failed" in out.stderr, out.stderr[-3000:]
    assert "start the Ray workers (`ray start`) in this directory" in out.stderr
    assert len(list((tmp_path / "sweep").glob("*/FAILED.json"))) == 2


@pytest.mark.extended
def test_jobs_whose_folder_needs_the_running_job_are_found_in_the_sweep(tmp_path):
    """A subdir only the running job resolves (${hydra:...}) left the
    launcher looking in sweep/<n>: both good jobs were recorded "elsewhere"
    failures, with stray sweep/0 and sweep/1 folders."""
    write_app(tmp_path)
    out = sweep(tmp_path, "action=a,b", "hydra/launcher=ray_local",
                "hydra.sweep.subdir=${hydra:runtime.choices.hydra/launcher}_${hydra.job.num}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["multirun.yaml", "ray_local_0", "ray_local_1"]
    assert [(tmp_path / "sweep" / f"ray_local_{n}" / "done.txt").read_text() for n in (0, 1)] == ["a", "b"]


@pytest.mark.extended
def test_jobs_with_a_sweep_folder_of_their_own_are_ok(tmp_path):
    """hydra.sweep.dir=sweep/${action}: each job's folder was checked against
    the default action's (sweep/ok) and both good jobs recorded as failed."""
    write_app(tmp_path)
    out = subprocess.run([sys.executable, "app.py", "-m", "action=a,b", "hydra/launcher=ray_local",
                          f"hydra.sweep.dir={tmp_path}/sweep/${{action}}"],
                         cwd=tmp_path, env=quantize_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert not list((tmp_path / "sweep").rglob("FAILED.json"))
    assert [(tmp_path / "sweep" / a / f"{n}_{a}" / "done.txt").read_text() for n, a in enumerate("ab")] == ["a", "b"]


@pytest.mark.extended
def test_a_job_whose_folder_this_machine_lacks_is_not_ok(tmp_path):
    """A Ray node without a shared folder, its project at the same path,
    reports the folder this machine expects: the sweep said ok, exit 0,
    though the output is on that node. Here the job removes its .hydra
    as seen from this machine."""
    write_app(tmp_path)
    app = (tmp_path / "app.py").read_text()
    (tmp_path / "app.py").write_text(app.replace('    if cfg.action == "kill":', (
        '    if cfg.action == "vanish":\n        import shutil\n        shutil.rmtree(out / ".hydra")\n'
        '    if cfg.action == "kill":')))
    out = sweep(tmp_path, "action=a,vanish", "hydra/launcher=ray_local")
    assert out.returncode == 1, out.stderr[-3000:]
    summary = [line for line in out.stderr.splitlines() if line.startswith("  ")]
    assert len(summary) == 1 and summary[0].startswith("  1_vanish: action=vanish: elsewhere:"), out.stderr[-3000:]
    assert "this machine has no such job folder" in summary[0]
    assert sorted(p.parent.name for p in (tmp_path / "sweep").glob("*/FAILED.json")) == ["1_vanish"]
    assert (tmp_path / "sweep" / "0_a" / "done.txt").read_text() == "a"


@pytest.mark.parametrize("joined", [False, True])
def test_a_gpu_request_no_live_node_meets_waits_on_a_joined_cluster(joined, monkeypatch, caplog, capsys):
    """An autoscaling cluster starts its GPU nodes only once work is pending:
    refusing there stopped every GPU sweep. The instance started here gets
    no more nodes: refused."""
    import ray
    from hydra_plugins.quantbench_launchers.ray_jobs import check_gpus
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": 8.0}}])
    if not joined:
        with pytest.raises(SystemExit) as exit:
            check_gpus(1, joined)
        assert exit.value.code == 2
        assert "num_gpus=1 asks for more GPUs than any node" in capsys.readouterr().err
        return
    check_gpus(1, joined)
    assert "num_gpus=1 asks for more GPUs than any live node" in caplog.text
    assert "autoscaling" in caplog.text


@pytest.mark.parametrize("address, env, started, joined", [
    (None, None, False, False),
    (None, None, True, True),  # `ray up`, then the sweep on the head: ray.init() joins what `ray start` started
    ("local", None, True, False),  # "local" starts an instance here even then
    (None, "local", True, False),
    (None, "10.0.0.5:6379", False, True),
    ("10.0.0.5:6379", None, False, True),
    ("local", "10.0.0.5:6379", False, False),  # the address given wins over $RAY_ADDRESS
    ("ray://10.0.0.5:10001", None, False, True),
])
def test_a_cluster_is_joined_as_ray_init_joins_it(address, env, started, joined, tmp_path, monkeypatch):
    """A GPU sweep on the head of a `ray up` cluster was refused as if the
    launcher had started Ray itself; RAY_ADDRESS=local counted as a joined
    cluster, so an unmeetable GPU request only warned and the jobs waited forever."""
    from hydra_plugins.quantbench_launchers.ray_jobs import joins_cluster
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # where `ray start` records its cluster
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    if started:
        (tmp_path / "ray").mkdir()
        (tmp_path / "ray" / "ray_current_cluster").write_text("10.0.0.7:6379\n")
    assert joins_cluster(address) is joined


@pytest.mark.parametrize("output_subdir, made, ok", [
    (".hydra", ".hydra", True),
    (None, "", True),  # hydra.output_subdir=null: Hydra writes no config folder
    ("cfg", "cfg", True),
    (".hydra", "", False),  # the folder Hydra wrote is not here: the job's node has its own
    (None, None, False),
])
def test_a_job_is_found_by_the_config_folder_hydra_wrote(output_subdir, made, ok, tmp_path, monkeypatch):
    """A good job run with hydra.output_subdir=null or renamed was recorded
    as failed ("elsewhere"): only a .hydra folder counted as its output."""
    import ray
    from hydra.core.utils import JobReturn, JobStatus
    from hydra_plugins.quantbench_launchers.ray_jobs import CollectingRayLauncher
    sweep_dir = tmp_path / "sweep"
    job_dir = sweep_dir / "0_a"
    sweep_dir.mkdir()
    if made is not None:  # what this machine sees of the job's folder
        (job_dir / made).mkdir(parents=True)
    ret = JobReturn(overrides=["action=a"], status=JobStatus.COMPLETED, hydra_cfg=OmegaConf.create(
        {"hydra": {"output_subdir": output_subdir, "runtime": {"output_dir": str(job_dir)}}}))
    ret.return_value = "ok"
    monkeypatch.setattr(ray, "get", lambda ref: ret)
    got = CollectingRayLauncher._collect(None, ["action=a"], 0, job_dir, sweep_dir, object())
    assert (got.return_value == "ok") is ok
    assert (job_dir / "FAILED.json").exists() is not ok


@pytest.mark.extended
def test_a_killed_job_with_a_sweep_folder_of_its_own_is_listed(tmp_path):
    """hydra.sweep.dir=out/${action}: the failure summary looked in the
    default action's sweep folder only, so the killed job was listed nowhere
    and the sweep exited 0."""
    write_app(tmp_path)
    out = subprocess.run([sys.executable, "app.py", "-m", "action=a,kill", "hydra/launcher=ray_local",
                          "hydra.sweep.dir=out/${action}"], cwd=tmp_path, env=quantize_env({"RAY_DEDUP_LOGS": "0"}),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr[-3000:]
    summary = [line for line in out.stderr.splitlines() if line.startswith("  ")]
    assert len(summary) == 1 and summary[0].startswith("  out/kill/1_kill: action=kill: killed"), out.stderr[-3000:]
    assert (tmp_path / "out" / "kill" / "1_kill" / "FAILED.json").is_file()
