"""Sweeps on a real single-node Slurm cluster (scripts/slurm_local.sh: slurmctld,
slurmd, slurmdbd, MariaDB) through hydra-submitit-launcher, started once per
session in a temp dir on free ports and stopped at the end.

Covered: a request no node can meet stops before submitting with one line; the
GPU preset's request is scheduled on the node's (stand-in) GPU and runs; a
quantize sweep and evaluate sweeps (transformers and dummy-engine jobs, each
writing its own shard, merged by the report); `scancel` mid-job, a job over
its time limit and a requeued job: each sweep ends, the failures are recorded
and listed, and the rerun completes with no row lost or duplicated. Where the
MLflow server is installed (make setup-mlflow) the evaluate sweeps also log
to one (tracking=mlflow): one run per job, and after the cancel, the time
limit and the requeue each timed run is a step of its run exactly once.

Slurm, not the engine, is under test: the jobs run transformers or the dummy
engine (the local node binds no CPUs, TaskPlugin=task/none, so a vLLM job
would meet nothing here that a local run does not), and the jobs that Slurm
stops wait on a file the test creates (tests/scripts/gated_engine.py), so
they are mid-scenario when it acts whatever the machine's speed."""
import importlib.util
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, SMALL_CALIB, TINY_NAME, last_line, quantize_env, tail
from tests.evaluate.engines.test_base import DUMMY_YAML
from tests.servers import MLFLOW_SERVER, mlflow_server
from evaluate import results

SCRIPT = ROOT / "scripts" / "slurm_local.sh"
HANG_GUARD_S = 600  # a sweep that does not end by then is a hang, not a slow machine
# A scenario small enough for the transformers engine on 2 cores.
TINY = ["scenario=interactive", "scenario.name=slurm_tiny", "scenario.input_len=16", "scenario.output_len=8"]
SACCT_POLL_S = 0.5
# engine=gated: a warm-up and one timed run, then each run waits for the gate file.
GATED_FREE_RUNS = 2
# The GPU preset on the local partition, sized for its node (2 cores; 1 GPU, see the cluster fixture).
SLURM_GPU = ["hydra/launcher=slurm_gpu", "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=1",
             "hydra.launcher.mem_gb=4"]


@dataclass
class Cluster:
    env: dict      # for slurm_local.sh (QB_SLURM_DIR, ports)
    conf: str      # SLURM_CONF

    def cli_env(self) -> dict:
        return quantize_env({"SLURM_CONF": self.conf, "VLLM_CPU_KVCACHE_SPACE": "1"})

    def states(self, ids: list[str]) -> list[str]:
        """Final sacct states (a job's result file can come a moment before Slurm marks it ended)."""
        deadline = time.time() + 60
        while True:
            out = self.slurm("sacct", "-X", "-n", "-P", "-o", "State", "-j", ",".join(ids)).split()
            if time.time() > deadline or not {"RUNNING", "COMPLETING", "PENDING"} & set(out):
                return out
            time.sleep(SACCT_POLL_S)

    def slurm(self, *cmd: str) -> str:
        out = subprocess.run(cmd, env=self.cli_env(), capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"{' '.join(cmd)}: {out.stderr}"
        return out.stdout


def _slurm_installed() -> bool:
    return all(shutil.which(b) or Path("/usr/sbin", b).exists() for b in ("slurmctld", "slurmdbd", "mariadbd"))


def _free_ports() -> int:
    """A base port with base..base+2 (slurmctld, slurmd, slurmdbd) and base+5 (MariaDB) free."""
    for base in range(17817, 30000, 10):
        try:
            for port in (base, base + 1, base + 2, base + 5):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free ports for a local Slurm")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    if not _slurm_installed():
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            pytest.skip("Slurm is not installed and cannot be installed here (needs root and apt-get): "
                        "apt-get install slurm-wlm slurmdbd mariadb-server")
        out = subprocess.run(["bash", str(SCRIPT), "install"], capture_output=True, text=True, timeout=900)
        if out.returncode != 0 and "apt-get install" in out.stderr:  # no network or package source (a CUDA image)
            pytest.skip(f"Slurm is not installed and apt-get could not install it here: {last_line(out.stderr)}")
        assert out.returncode == 0, f"slurm_local.sh install failed:\n{out.stderr}"
    base = _free_ports()
    # One GPU whatever the host has: a stand-in on a CPU machine (slurm_local.sh's gres_conf).
    env = {**os.environ, "QB_SLURM_DIR": str(tmp_path_factory.mktemp("slurm")),
           "QB_SLURM_PORT": str(base), "QB_SLURM_DB_PORT": str(base + 5), "QB_SLURM_GPUS": "1"}
    out = subprocess.run(["bash", str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"slurm_local.sh start failed:\n{out.stderr}"
    export = out.stdout.strip().splitlines()[-1]
    assert export.startswith("export SLURM_CONF="), out.stdout
    c = Cluster(env, shlex.split(export)[1].removeprefix("SLURM_CONF="))  # as eval reads it (printf %q)
    again = subprocess.run(["bash", str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "already running" in again.stderr  # idempotent
    yield c
    stop = subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=120)
    assert stop.returncode == 0, stop.stderr
    status = subprocess.run(["bash", str(SCRIPT), "status"], env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode != 0 and "slurmctld: stopped" in status.stderr


def run(cluster, module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=cluster.cli_env(),
                          capture_output=True, text=True, timeout=HANG_GUARD_S)


def start(cluster, module: str, *args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=cwd, env=cluster.cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=HANG_GUARD_S)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def job_ids(sweep: Path) -> list[str]:
    """Slurm job ids of a sweep's started jobs (`<id>` or `<array>_<task>`), from
    submitit's folders under the sweep dir, which hold each job's logs."""
    return sorted(p.parent.name for p in (sweep / ".submitit").glob("*/*_log.out"))


def ok_runs(res: Path, recipe: str) -> list[results.Row]:
    return [r for r in results.read(res) if r.recipe == recipe and r.status == "ok" and r.kind == "speed"]


def wait_for_rows(res: Path, recipe: str, more_than: int, proc: subprocess.Popen, or_exit=False) -> int:
    """Until the sweep's job wrote a new ok row (its count), or with `or_exit`
    the sweep ended first (0)."""
    deadline = time.time() + HANG_GUARD_S
    while time.time() < deadline and proc.poll() is None:
        n = len(ok_runs(res, recipe)) if res.is_dir() else 0
        if n > more_than:
            return n
        time.sleep(0.2)
    if or_exit and proc.poll() is not None:
        return 0
    raise AssertionError(f"no new {recipe} row (sweep exited {proc.poll()}): {tail(finish(proc))}")


def failures(sweep: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sweep.glob("*/FAILED.json")]


@pytest.fixture(scope="module")
def tracker(tmp_path_factory):
    """The URI of an MLflow server the evaluate sweeps also log to; None where
    none is installed (the sweeps then run untracked)."""
    if not MLFLOW_SERVER.exists() or importlib.util.find_spec("mlflow") is None:
        yield None
        return
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


def tracking(uri: str | None, experiment: str) -> list[str]:
    return ["tracking=mlflow", f"tracking.uri={uri}", f"tracking.experiment={experiment}"] if uri else []


def measurement_steps(uri: str, experiment: str) -> dict[str, tuple[str, list[int]]]:
    """Each measurement run's name -> (its parent run's name, the steps of its output_throughput, sorted)."""
    from mlflow import MlflowClient
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    names = {r.info.run_id: r.info.run_name for r in runs}
    assert len(set(names.values())) == len(runs), sorted(names.values())   # no run twice
    return {r.info.run_name: (names.get(r.data.tags.get("mlflow.parentRunId")),
                              sorted(m.step for m in client.get_metric_history(r.info.run_id, "output_throughput")))
            for r in runs if r.data.tags.get("kind") == "speed"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("slurm-sweeps")


@pytest.fixture(scope="module")
def extra_engines(workdir) -> tuple[str, Path]:
    """The hydra.searchpath override that offers engine=dummy and engine=gated
    (their YAML outside the checkout's conf/, their modules found from the
    checkout on the jobs' PYTHONPATH), and the gated engine's gate file."""
    folder, gate = workdir / "searchpath", workdir / "gate"
    (folder / "engine").mkdir(parents=True)
    dummy = {**yaml.safe_load(DUMMY_YAML.read_text()), "_target_": "tests.evaluate.engines.dummy_engine.DummyEngine"}
    gated = {**dummy, "name": "gated", "_target_": "tests.scripts.gated_engine.GatedEngine",
             "args": {**dummy["args"], "gate": str(gate), "free_runs": GATED_FREE_RUNS}}
    for config in (dummy, gated):
        (folder / "engine" / f"{config['name']}.yaml").write_text(yaml.safe_dump(config))
    return f"hydra.searchpath=[file://{folder}]", gate


@pytest.fixture(scope="module")
def quantized(cluster, tiny_model, workdir):
    """The tiny model quantized by a two-job sweep on Slurm."""
    sweep = workdir / "sweep-quantize"
    out = run(cluster, "quantize", "-m", "recipe=original,w4a16_rtn", f"model={tiny_model}", "artifacts_dir=art",
              *SMALL_CALIB, "hydra/launcher=slurm_local", f"hydra.sweep.dir={sweep}", cwd=workdir)
    return out, sweep, workdir / "art" / TINY_NAME


def test_impossible_request_stops_before_submitting(cluster, tmp_path):
    before = cluster.slurm("sacct", "-a", "-X", "-n", "-o", "JobID")
    cases = [
        (["hydra/launcher=slurm_cpu"], "hydra.launcher.partition=cpu", "set hydra.launcher.partition=debug"),
        (["hydra/launcher=slurm_local", "hydra.launcher.cpus_per_task=64"], "hydra.launcher.cpus_per_task=64",
         f"set hydra.launcher.cpus_per_task={os.cpu_count()} or less"),
        (["hydra/launcher=slurm_local", "hydra.launcher.mem_gb=100000"], "hydra.launcher.mem_gb=100000",
         "set hydra.launcher.mem_gb="),
        ([*SLURM_GPU, "hydra.launcher.gpus_per_node=2"], "hydra.launcher.gpus_per_node=2",
         "than any node of partition debug has (1); set hydra.launcher.gpus_per_node=1 or less"),
    ]
    for overrides, names, fix in cases:
        out = run(cluster, "quantize", "-m", "recipe=original,w4a16_rtn", *overrides,
                  f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, tail(out)
        assert lines[0].startswith("error: ") and names in lines[0] and fix in lines[0], lines[0]
    assert cluster.slurm("sacct", "-a", "-X", "-n", "-o", "JobID") == before  # nothing was submitted
    assert not list((tmp_path / "sweep").glob("*/.hydra"))


def test_a_running_cluster_restarts_into_a_changed_config(cluster):
    """A cluster started by an earlier version of slurm_local.sh (other GPUs,
    or none) gets the current node config from `start`, not "already running"."""
    def start(gpus: str) -> str:
        out = subprocess.run(["bash", str(SCRIPT), "start"], env={**cluster.env, "QB_SLURM_GPUS": gpus},
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stderr

    try:
        assert "configuration changed" in start("2")
        assert cluster.slurm("sinfo", "-h", "-N", "-o", "%G %T").split() == ["gpu:2", "idle"]
    finally:
        assert "configuration changed" in start(cluster.env["QB_SLURM_GPUS"])
    assert cluster.slurm("sinfo", "-h", "-N", "-o", "%G %T").split() == ["gpu:1", "idle"]
    assert "already running" in start(cluster.env["QB_SLURM_GPUS"])


def test_the_gpu_preset_asks_for_a_gpu_and_the_job_gets_it(cluster, tiny_model, tmp_path):
    """slurm_gpu's request (gpus_per_node: 1, submitit's --gpus-per-node) is
    scheduled on the node's GPU: the job runs with Slurm's GPU variables set
    and is accounted one gres/gpu."""
    sweep = tmp_path / "sweep"
    # The setup lines run in the job before Python: they report what Slurm gave it.
    report = 'hydra.launcher.setup=["echo qb-gpus=$SLURM_GPUS_ON_NODE job-gpus=$SLURM_JOB_GPUS"]'
    out = run(cluster, "quantize", "-m", "recipe=original", f"model={tiny_model}", "artifacts_dir=art", *SMALL_CALIB,
              *SLURM_GPU, report, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert out.returncode == 0, tail(out)
    assert "1 job(s) ok" in out.stdout + out.stderr
    (script,) = (sweep / ".submitit").glob("*/*_submission.sh")
    assert "#SBATCH --gpus-per-node=1\n" in script.read_text()
    (job,) = job_ids(sweep)
    assert cluster.states([job]) == ["COMPLETED"]
    assert "gres/gpu=1" in cluster.slurm("sacct", "-X", "-n", "-P", "-o", "AllocTRES", "-j", job).strip().split(",")
    (log,) = (sweep / ".submitit").glob("*/*_log.out")
    assert "qb-gpus=1 job-gpus=0" in log.read_text()
    assert (tmp_path / "art" / TINY_NAME / "original" / "manifest.json").is_file()


@pytest.mark.slow
def test_quantize_then_evaluate_on_slurm_with_merged_shards(cluster, quantized, tiny_model, workdir, extra_engines,
                                                            tracker):
    out, sweep, art = quantized
    assert out.returncode == 0, tail(out)
    assert "2 job(s) ok" in out.stdout + out.stderr
    assert {p.parent.name for p in art.glob("*/manifest.json")} == {"original", "w4a16_rtn"}
    ids = job_ids(sweep)
    assert len(ids) == 2  # each job's log is under the sweep dir
    assert cluster.states(ids) == ["COMPLETED", "COMPLETED"]

    res = workdir / "res-merged"
    hf = run(cluster, "evaluate", "-m", "recipe=original,w4a16_rtn", f"model={tiny_model}", "artifacts_dir=art",
             "engine=hf", "accuracy=none", *TINY, "runs=1", f"results_dir={res}", "hydra/launcher=slurm_local",
             f"hydra.sweep.dir={workdir / 'sweep-eval-hf'}", *tracking(tracker, "slurm"), cwd=workdir)
    assert hf.returncode == 0, tail(hf)
    if tracker:  # one run per job, each under its artifact's
        assert measurement_steps(tracker, "slurm") == {
            f"{recipe} · slurm_tiny · hf": (f"{TINY_NAME}/{recipe}", [0]) for recipe in ("original", "w4a16_rtn")}
    # a second sweep into the same results: its shard joins the first's
    dummy = run(cluster, "evaluate", "-m", "recipe=original", f"model={tiny_model}", "artifacts_dir=art",
                "engine=dummy", extra_engines[0], "accuracy=none", *TINY, "runs=1", f"results_dir={res}",
                "hydra/launcher=slurm_local", f"hydra.sweep.dir={workdir / 'sweep-eval-dummy'}", cwd=workdir)
    assert dummy.returncode == 0, tail(dummy)

    # Under Slurm every evaluate job writes its own shard; nothing went to the shared file.
    shards = sorted(res.glob("results-*.jsonl"))
    assert len(shards) == 3 and not (res / "results.jsonl").exists(), [s.name for s in shards]
    per_shard = [{(r["recipe"], r["engine"]) for r in map(json.loads, s.read_text().splitlines())} for s in shards]
    assert sorted(map(sorted, per_shard)) == sorted([[("original", "hf")], [("w4a16_rtn", "hf")],
                                                      [("original", "dummy")]])
    ok = [r for r in results.read(res) if r.status == "ok"]
    assert sorted((r.recipe, r.engine) for r in ok) == [("original", "dummy"), ("original", "hf"),
                                                              ("w4a16_rtn", "hf")]
    report = subprocess.run([sys.executable, "-m", "evaluate.report", f"results_dir={res}",
                             f"out_dir={workdir / 'report'}"], cwd=workdir, env=cluster.cli_env(),
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, tail(report)
    text = (workdir / "report" / "report.md").read_text()
    assert "w4a16_rtn" in text and "dummy" in text and "hf" in text


@pytest.mark.extended
@pytest.mark.slow
def test_scancel_time_limit_and_requeue_lose_nothing(cluster, quantized, tiny_model, workdir, extra_engines,
                                                      tracker):
    """Two sweeps at once, each held after its first row (engine=gated, its
    gate closed): one job is cancelled, the other (1-minute limit) gets
    Slurm's time-limit warning signal, as Slurm sends it `signal_delay_s`
    before the limit (here sent at once with `scancel --signal`, or by Slurm
    itself 30 s before the limit, within its 30 s check period). Both sweeps
    end with exit 1 and the failure listed; the reruns, one of them requeued
    while held after its next row, complete every run exactly once once the
    gate opens."""
    assert quantized[0].returncode == 0, tail(quantized[0])
    searchpath, gate = extra_engines
    res = workdir / "res-failures"
    base = [f"model={tiny_model}", "artifacts_dir=art", "engine=gated", searchpath, "accuracy=none", *TINY,
            "runs=8", f"results_dir={res}", "hydra/launcher=slurm_local", *tracking(tracker, "slurm-requeue")]
    cancel_cmd, limit_cmd = ["-m", "recipe=original", *base], ["-m", "recipe=w4a16_rtn", *base]
    cancel = start(cluster, "evaluate", *cancel_cmd, f"hydra.sweep.dir={workdir / 'sweep-cancel'}", cwd=workdir)
    limit = start(cluster, "evaluate", *limit_cmd, "hydra.launcher.timeout_min=1",
                  f"hydra.sweep.dir={workdir / 'sweep-limit'}", cwd=workdir)
    wait_for_rows(res, "original", 0, cancel)
    cluster.slurm("scancel", *job_ids(workdir / "sweep-cancel"))
    # Slurm's own warning (30 s in) can come before the job's first row on a busy
    # machine: the job ends by the warning either way, which is what is tested.
    if wait_for_rows(res, "w4a16_rtn", 0, limit, or_exit=True):
        cluster.slurm("scancel", "--signal=USR2", *job_ids(workdir / "sweep-limit"))
    cancelled, limited = finish(cancel), finish(limit)

    assert cancelled.returncode == 1, tail(cancelled)
    assert "1 of 1 job(s) failed" in cancelled.stderr and "recipe=original" in cancelled.stderr
    (info,) = failures(workdir / "sweep-cancel")
    assert info["error"].startswith("cancelled") and "rerun" in info["error"]
    assert limited.returncode == 1, tail(limited)
    assert "1 of 1 job(s) failed" in limited.stderr and "time limit" in limited.stderr
    (info,) = failures(workdir / "sweep-limit")
    assert info["error"].startswith("time limit") and "hydra.launcher.timeout_min" in info["error"]
    # The preset's 120 s warning is longer than the 1-minute limit: Slurm is told to warn at 30 s.
    (script,) = (workdir / "sweep-limit" / ".submitit").glob("*/*_submission.sh")
    assert "#SBATCH --signal=USR2@30\n" in script.read_text()
    kept = {recipe: ok_runs(res, recipe) for recipe in ("original", "w4a16_rtn")}
    # each held after its first row until stopped (the time-limited one, if it got there)
    assert len(kept["original"]) == 1 and len(kept["w4a16_rtn"]) <= 1

    # Rerun both (the time limit back to the preset's), each held after its
    # next row; requeue the cancelled one there, as preemption would, then
    # open the gate: it restarts and resumes, and the other one finishes.
    cancel = start(cluster, "evaluate", *cancel_cmd, f"hydra.sweep.dir={workdir / 'sweep-cancel-rerun'}",
                   cwd=workdir)
    limit = start(cluster, "evaluate", *limit_cmd, f"hydra.sweep.dir={workdir / 'sweep-limit-rerun'}", cwd=workdir)
    wait_for_rows(res, "original", len(kept["original"]), cancel)
    (job,) = job_ids(workdir / "sweep-cancel-rerun")
    cluster.slurm("scontrol", "requeue", job)
    # Slurm holds a requeued job back for a while (BeginTime); let it start now.
    deadline = time.time() + 60
    while "PENDING" not in cluster.slurm("squeue", "-h", "-j", job, "-o", "%T") and time.time() < deadline:
        time.sleep(0.2)
    gate.touch()  # the held job is gone: nothing runs past its row before the requeue
    cluster.slurm("scontrol", "update", f"JobId={job}", "StartTime=now")
    rerun_cancel, rerun_limit = finish(cancel), finish(limit)

    assert rerun_cancel.returncode == 0, tail(rerun_cancel)
    assert rerun_limit.returncode == 0, tail(rerun_limit)
    for recipe in ("original", "w4a16_rtn"):
        rows = ok_runs(res, recipe)
        counts = Counter(r.run_index for r in rows)
        assert sorted(counts) == list(range(8)) and set(counts.values()) == {1}, (recipe, counts)
        before = {(r.run_index, r.timestamp) for r in kept[recipe]}
        assert before <= {(r.run_index, r.timestamp) for r in rows}  # completed rows kept as they were
    cluster.states([job])
    log = cluster.slurm("sacct", "-X", "-n", "-P", "-D", "-o", "State", "-j", job).split()
    assert log == ["REQUEUED", "COMPLETED"], log  # it was requeued, then finished
    if tracker:  # each timed run a step of its measurement's one run, once
        assert measurement_steps(tracker, "slurm-requeue") == {
            f"{recipe} · slurm_tiny · gated": (f"{TINY_NAME}/{recipe}", list(range(8)))
            for recipe in ("original", "w4a16_rtn")}
