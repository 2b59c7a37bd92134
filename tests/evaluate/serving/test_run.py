"""`python -m evaluate ... load=...` end to end against the fake server:
serving rows per level, resume, a failed level, a server that dies, the
openai engine and its bad input (one line, nothing written)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quantize.common.errors import ExitCode
from tests.conftest import last_line, quantize_env, tail

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fake_engine import write_conf  # noqa: E402

METRIC_KEYS = {"completed", "failed", "duration", "request_throughput", "request_goodput", "output_throughput",
               "total_token_throughput", "max_concurrent_requests", "mean_ttft_ms", "median_tpot_ms", "p99_itl_ms",
               "std_e2el_ms", "slo_attainment", "achieved_rate_ratio", "client_cpu_pct", "server_peak_memory_bytes",
               "valid"}


def evaluate(tmp_path, model, *args, fake_flags=(), timeout=300) -> subprocess.CompletedProcess:
    conf = write_conf(tmp_path / "conf", list(fake_flags))
    (conf / "load").mkdir(exist_ok=True)  # load=staircase: a profile from outside conf/ (dummy_profile.py)
    (conf / "load" / "staircase.yaml").write_text((HERE / "dummy_profile.yaml").read_text())
    env = quantize_env()
    env["PYTHONPATH"] = os.pathsep.join((str(HERE), env["PYTHONPATH"]))
    cmd = [sys.executable, "-m", "evaluate", f"model={model}", f"hydra.searchpath=[file://{conf}]",
           "scenario=interactive", "accuracy=none", f"results_dir={tmp_path / 'results'}", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def rows(tmp_path) -> list[dict]:
    path = tmp_path / "results" / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.needs_vllm
def test_a_rerun_under_another_slo_measures_its_levels_anew(tmp_path, tiny_model):
    """A level's goodput, attainment and pNN are computed against the SLO as
    it runs: a rerun under another SLO took the levels judged by the old one
    as complete (and slo_search searched on them)."""
    base = ("engine=fake_server", "load=concurrency", "load.levels=[1]", "load.max_requests=4",
            "slo=interactive_cpu")
    for ttft_ms, expect in ((2000, "appended"), (1, "appended")):   # the same SLO: test_results.py
        proc = evaluate(tmp_path, tiny_model, *base, f"slo.ttft_ms={ttft_ms}", fake_flags=["--fixed-ms", "5"])
        assert proc.returncode == 0 and expect in proc.stdout + proc.stderr, tail(proc)
    got = rows(tmp_path)
    assert [r["slo"]["ttft_ms"] for r in got] == [2000, 1]
    assert [r["metrics"]["slo_attainment"] for r in got] == [1.0, 0.0]   # 5 ms per token is over a 1 ms TTFT


@pytest.mark.needs_vllm
def test_a_level_per_row_and_a_rerun_measures_nothing_again(tmp_path, tiny_model):
    args = ("engine=fake_server", "load=concurrency", "load.levels=[1,2]", "load.max_requests=4")
    proc = evaluate(tmp_path, tiny_model, *args, fake_flags=["--fixed-ms", "5"])
    assert proc.returncode == 0, tail(proc)
    got = rows(tmp_path)
    assert [(r["kind"], r["status"], r["load"]["mode"], r["load"]["level"]) for r in got] == [
        ("serving", "ok", "concurrency", 1), ("serving", "ok", "concurrency", 2)]
    r = got[0]
    assert r["batch_size"] is None and (r["input_len"], r["output_len"]) == (128, 64)
    assert r["load"] == {"profile": "concurrency", "mode": "concurrency", "level": 1, "burstiness": None,
                         "max_requests": 4, "max_seconds": 30, "drain_seconds": 30}
    assert METRIC_KEYS <= set(r["metrics"]) and r["metrics"]["completed"] == 4
    assert r["engine_version"] == "fake-1" and r["engine_startup"]["server_ready_s"] >= 0
    again = evaluate(tmp_path, tiny_model, *args, fake_flags=["--fixed-ms", "5"])
    assert again.returncode == 0 and "nothing to do" in again.stdout + again.stderr
    assert len(rows(tmp_path)) == 2


@pytest.mark.needs_vllm
def test_sweep_runs_synchronous_saturation_then_rates_between(tmp_path, tiny_model):
    proc = evaluate(tmp_path, tiny_model, "engine=fake_server", "load=sweep", "load.max_requests=6",
                    "load.saturation_concurrency=4", "load.rate_levels=2", fake_flags=["--fixed-ms", "2"])
    assert proc.returncode == 0, tail(proc)
    got = [r["load"] for r in rows(tmp_path) if r["status"] == "ok"]
    assert [(g["mode"], g["profile"]) for g in got] == [("synchronous", "sweep"), ("concurrency", "sweep"),
                                                        ("rate", "sweep"), ("rate", "sweep")]
    low, high = sorted(r["metrics"]["request_throughput"] for r in rows(tmp_path)[:2])
    assert low < got[2]["level"] < got[3]["level"] < high


@pytest.mark.extended
@pytest.mark.needs_vllm
def test_a_failed_level_is_recorded_and_the_next_one_runs(tmp_path, tiny_model):
    # request 0 is the warm-up; the level of concurrency 2 gets requests 4-6, all refused
    proc = evaluate(tmp_path, tiny_model, "engine=fake_server", "load=concurrency", "load.levels=[1,2,3]",
                    "load.max_requests=3", fake_flags=["--fixed-ms", "2", "--fail-from", "4", "--fail-to", "6"])
    assert proc.returncode == ExitCode.RUNS_FAILED, tail(proc)
    assert last_line(proc.stderr).startswith("error: 1 run(s) failed while the others were measured (the first: ")
    got = [(r["load"]["level"], r["status"]) for r in rows(tmp_path)]
    assert got == [(1, "ok"), (2, "failed"), (3, "ok")]
    assert "HTTP 500" in rows(tmp_path)[1]["reason"]


@pytest.mark.extended
@pytest.mark.needs_vllm
def test_a_server_that_dies_records_what_it_owed_and_fails_in_one_line(tmp_path, tiny_model):
    proc = evaluate(tmp_path, tiny_model, "engine=fake_server", "load=concurrency", "load.levels=[1,2,4]",
                    "load.max_requests=4", fake_flags=["--fixed-ms", "2", "--die-after", "5"])
    assert proc.returncode == ExitCode.ENGINE_DIED, tail(proc)
    assert last_line(proc.stderr).startswith("error: server died: ") and "exited with code 3" in last_line(proc.stderr)
    got = [(r["load"]["level"], r["status"]) for r in rows(tmp_path)]
    assert got == [(1, "ok"), (2, "failed"), (4, "failed")]
    assert all("server died" in r["reason"] for r in rows(tmp_path)[1:])


@pytest.mark.extended
@pytest.mark.needs_vllm
def test_batch_scenarios_run_through_the_server_engine_too(tmp_path, tiny_model):
    proc = evaluate(tmp_path, tiny_model, "engine=fake_server", "runs=1", fake_flags=["--fixed-ms", "2"])
    assert proc.returncode == 0, tail(proc)
    (r,) = rows(tmp_path)
    assert (r["kind"], r["status"], r["batch_size"]) == ("speed", "ok", 1)
    assert r["metrics"]["output_throughput"] > 0


def test_openai_engine_benchmarks_a_running_server(tmp_path, tiny_model, fake_server):
    server = fake_server("--fixed-ms", "2")
    proc = evaluate(tmp_path, tiny_model, "engine=openai", f"engine.base_url={server.base_url}",
                    "load=synchronous", "load.max_requests=3")
    assert proc.returncode == 0, tail(proc)
    (r,) = rows(tmp_path)
    assert (r["engine"], r["status"], r["metrics"]["completed"]) == ("openai", "ok", 3)
    assert r["engine_version"] == "fake-1" and r["metrics"]["server_peak_memory_bytes"] is None
    assert server.stats()["requests"] == 3


def test_a_level_records_its_drain_and_another_drain_measures_it_anew(tmp_path, tiny_model, fake_server):
    """The drain decides which late requests complete and which fail: a rerun
    with another drain took the level as complete. A row from before the
    drain was recorded ran with a drain unknown now: it is measured anew."""
    server = fake_server("--fixed-ms", "2")
    args = ("engine=openai", f"engine.base_url={server.base_url}", "load=synchronous", "load.max_requests=2")
    first = evaluate(tmp_path, tiny_model, *args, "load.drain_seconds=5")
    assert first.returncode == 0, tail(first)
    (old,) = rows(tmp_path)
    assert old["load"]["drain_seconds"] == 5
    del old["load"]["drain_seconds"]   # as rows were written before
    (tmp_path / "results" / "results.jsonl").write_text(json.dumps(old) + "\n")
    for drain in (5, 0):
        proc = evaluate(tmp_path, tiny_model, *args, f"load.drain_seconds={drain}")
        assert proc.returncode == 0 and "nothing to do" not in proc.stdout + proc.stderr, tail(proc)
    assert [r["load"].get("drain_seconds") for r in rows(tmp_path)] == [None, 5, 0]
    assert server.stats()["requests"] == 3 * 2


@pytest.mark.extended
def test_a_profile_from_outside_conf_runs_its_levels_and_resumes(tmp_path, tiny_model, fake_server):
    """One module and one YAML on the search path add a profile: no list in evaluate names it."""
    server = fake_server("--fixed-ms", "2")
    args = ("engine=openai", f"engine.base_url={server.base_url}", "load=staircase", "load.count=3")
    proc = evaluate(tmp_path, tiny_model, *args)
    assert proc.returncode == 0, tail(proc)
    assert [(r["status"], r["load"]) for r in rows(tmp_path)] == [
        ("ok", {"profile": "staircase", "mode": "concurrency", "level": level, "burstiness": None,
                "max_requests": 3, "max_seconds": 30, "drain_seconds": 10}) for level in (1, 3, 5)]
    again = evaluate(tmp_path, tiny_model, *args)
    assert again.returncode == 0 and "nothing to do" in again.stdout + again.stderr
    assert len(rows(tmp_path)) == 3
    bad = evaluate(tmp_path, tiny_model, *args[:3], "load.count=0")
    assert bad.returncode == 2
    assert last_line(bad.stderr) == "error: load=staircase: load.count must be at least 1, not 0"


@pytest.mark.parametrize("args,message", [
    (("engine=openai", "engine.base_url=http://127.0.0.1:9/v1"), "nothing answers at http://127.0.0.1:9/v1"),
    (("engine=openai", "engine.base_url=http://192.0.2.1:8000/v1"), "pass engine.allow_remote=true"),
    (("engine=openai",), "pass engine.base_url="),
    pytest.param(("engine=vllm",), "load=synchronous needs a server engine: pass engine=vllm_server",
                 marks=pytest.mark.needs_vllm),
    # slo=none named: a CUDA machine's default states one (slo=interactive_gpu, conf/hardware/cuda.yaml)
    (("engine=openai", "engine.base_url=http://127.0.0.1:9/v1", "load=slo_search", "slo=none"), "needs an SLO"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, tiny_model, args, message):
    proc = evaluate(tmp_path, tiny_model, "load=synchronous", *args)
    assert proc.returncode == 2, tail(proc)
    assert message in last_line(proc.stderr) and last_line(proc.stderr).startswith("error: ")
    assert rows(tmp_path) == []
