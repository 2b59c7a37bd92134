"""Hydra multiruns with real launchers, failure isolation, resume, and the
results store under concurrent writers."""
import importlib.util
import json
import multiprocessing
import os
import signal
import subprocess
import time

import pytest

from evaluate import results
from tests.conftest import quantize_cmd, quantize_env
from tests.hosts.held_oneshot import HELD_IN_ONESHOT

SMALL = ["calibration.num_samples=8", "calibration.max_seq_len=64"]


def quantize(*args, cwd):
    return subprocess.run(quantize_cmd(*args), cwd=cwd, capture_output=True, text=True, timeout=900,
                          env=quantize_env())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from quantize.common.assets import ensure_default_model
    from quantize.common.tiny_model import build_tiny_llama
    return build_tiny_llama(tmp_path_factory.mktemp("sweep") / "tiny-llama", ensure_default_model())


def manifests(art):
    return {p.parent.name: json.loads(p.read_text()) for p in (art / "tiny-llama").glob("*/manifest.json")}


def test_one_failing_job_does_not_stop_the_sweep(tiny, tmp_path):
    """w8a8_smooth_ptq needs more calibration windows than exist; original needs none."""
    art, sweep = tmp_path / "art", tmp_path / "sweep"
    out = quantize("-m", "recipe=w8a8_smooth_ptq,original", f"model={tiny}", f"artifacts_dir={art}",
                   "calibration.num_samples=1000000", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert out.returncode == 1
    assert "1 of 2 job(s) failed" in out.stderr and "recipe=w8a8_smooth_ptq" in out.stderr
    assert set(manifests(art)) == {"original"}
    (failed,) = list(sweep.glob("*/FAILED.json"))
    info = json.loads(failed.read_text())
    assert "num_samples" in info["error"] and "recipe=w8a8_smooth_ptq" in info["overrides"]
    assert (failed.parent / ".hydra" / "overrides.yaml").is_file()  # each job's config is kept


def plugin_missing(*modules: str) -> bool:
    return any(importlib.util.find_spec(m) is None for m in modules)


# The joblib and Ray launchers are plugins setup.sh installs; a bare CUDA image (the device check) has neither.
@pytest.mark.parametrize("launcher", [
    "local_submitit",
    pytest.param("local_parallel", marks=pytest.mark.skipif(
        plugin_missing("joblib", "hydra_plugins.hydra_joblib_launcher"),
        reason="Hydra's joblib launcher is not installed here (bash scripts/setup.sh installs it)")),
    pytest.param("ray_local", marks=[pytest.mark.extended, pytest.mark.skipif(
        plugin_missing("ray", "hydra_plugins.hydra_ray_launcher"),
        reason="Ray or Hydra's Ray launcher is not installed here (bash scripts/setup.sh installs them)")]),
])
def test_plugin_launchers_run_the_sweep(tiny, tmp_path, launcher):
    art, sweep = tmp_path / "art", tmp_path / "sweep"
    out = quantize("-m", "recipe=original,w4a16_rtn", f"model={tiny}", f"artifacts_dir={art}", *SMALL,
                   f"hydra/launcher={launcher}", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert set(manifests(art)) == {"original", "w4a16_rtn"}
    assert "2 job(s) ok" in out.stdout + out.stderr
    if launcher == "local_submitit":
        assert list((sweep / ".submitit").glob("*/*_log.out"))


def test_killed_sweep_resumes_without_redoing_finished_work(tiny, tmp_path):
    """kill -9 while the second job's oneshot waits (tests/hosts/held_oneshot;
    `original` calls none): on a clock, a busy machine could finish more first."""
    art, log = tmp_path / "art", tmp_path / "sweep.log"
    args = ["-m", "recipe=original,w4a16_rtn,w8a8_smooth_ptq", f"model={tiny}",
            f"artifacts_dir={art}", *SMALL]
    with open(log, "w") as out:
        proc = subprocess.Popen(quantize_cmd(*args), cwd=tmp_path, env=quantize_env(host="held_oneshot"),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and HELD_IN_ONESHOT not in log.read_text() and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # kill -9 the whole sweep mid-way through its second job
    proc.wait()
    done_before = manifests(art)
    assert set(done_before) == {"original"}, log.read_text()[-3000:]
    for name in ("w4a16_rtn", "w8a8_smooth_ptq"):
        assert not (art / "tiny-llama" / name).exists()  # nothing half-done looks complete

    out = quantize(*args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    after = manifests(art)
    assert set(after) == {"original", "w4a16_rtn", "w8a8_smooth_ptq"}
    for name, manifest in done_before.items():
        assert after[name]["created_at"] == manifest["created_at"]  # not rebuilt
    log = out.stdout + out.stderr
    assert log.count("skipping") == len(done_before)
    assert not list((art / "tiny-llama").glob(".*tmp-*"))


def _writer(path, worker, n):
    for i in range(n):
        results.append(path, results.Row(kind="speed", extra={"worker": worker, "i": i, "padding": "x" * 3000}))


def test_concurrent_writers_never_lose_or_tear_lines(tmp_path):
    path = results.shard_path(tmp_path)
    procs = [multiprocessing.Process(target=_writer, args=(path, w, 200)) for w in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    lines = path.read_text().splitlines()
    rows = [json.loads(line) for line in lines]  # every line parses
    assert len(rows) == 6 * 200
    assert {(r["worker"], r["i"]) for r in rows} == {(w, i) for w in range(6) for i in range(200)}


def test_reader_merges_shards_and_skips_a_torn_line(tmp_path):
    def row(n):
        return results.Row(kind="speed", status="ok", artifact_id="a", metrics={"latency_s": 1.0}, extra={"n": n})
    results.append(tmp_path / "results.jsonl", row(1))
    other = results.shard_path(tmp_path, shard=True)
    results.append(other, row(2))
    with open(other, "a") as f:
        f.write('{"kind": "speed", "status": "ok", "n": ')  # a writer killed mid-line
    assert sorted(r.extra["n"] for r in results.read(tmp_path)) == [1, 2]
