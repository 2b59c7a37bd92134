"""The real thing, on the tiny model: evaluate starts vLLM's OpenAI server,
runs two load levels of a few requests through it and stops it; and kill -9
of the process that started a server takes vLLM's engine core and worker
with it."""
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import quantize_env, run_cli, tail

ROOT = Path(__file__).resolve().parents[3]
FAST = ("engine.args.enforce_eager=true", "engine.env.VLLM_CPU_KVCACHE_SPACE=1")
# vLLM's processes go within seconds of their stop; past this bound they are left behind, however loaded the host
HANG_GUARD_S = 120


def alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids) -> list[int]:
    """The pids still alive when all had gone, or when HANG_GUARD_S ran out."""
    end = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < end and alive(pids):
        time.sleep(0.5)
    return alive(pids)


def server_pids(log: Path) -> set[int]:
    """The server, its engine core and worker, as its log names them."""
    text = log.read_text(errors="replace")
    pids = {int(p) for p in re.findall(r"\((?:EngineCore|Worker|APIServer)[^ ]* pid=(\d+)\)", text)}
    pids |= {int(p) for p in re.findall(r"Started server process \[(\d+)\]", text)}
    return pids


@pytest.mark.slow
def test_evaluate_serves_the_tiny_model_and_leaves_no_process(tmp_path, tiny_model):
    proc = run_cli("evaluate", f"model={tiny_model}", "engine=vllm_server", "load=concurrency", "load.levels=[1,2]",
                   "load.max_requests=3", "scenario=interactive", "accuracy=none", *FAST,
                   f"results_dir={tmp_path / 'results'}", cwd=tmp_path)
    assert proc.returncode == 0, tail(proc)
    rows = [json.loads(line) for line in (tmp_path / "results" / "results.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["status"], r["load"]["level"]) for r in rows] == [("serving", "ok", 1), ("serving", "ok", 2)]
    assert all(r["metrics"]["completed"] == 3 and r["metrics"]["server_peak_memory_bytes"] > 0 for r in rows)
    assert rows[0]["engine_version"] and rows[0]["engine_startup"]["server_ready_s"] > 0
    (log,) = tmp_path.glob("logs/evaluate/*/vllm_server.log")
    pids = server_pids(log)
    assert len(pids) >= 2, log.read_text()[-2000:]
    assert wait_gone(pids) == []


CLIENT = """
import json, sys
sys.path.insert(0, {root!r})
from types import SimpleNamespace
from evaluate.engines.vllm_server import VllmServerEngine
engine = VllmServerEngine(SimpleNamespace(path={model!r}), {{"dtype": "bfloat16", "enforce_eager": True}},
                          {{"VLLM_CPU_KVCACHE_SPACE": 1, "VLLM_CPU_NUM_OF_RESERVED_CPU": None}},
                          max_model_len=256, settings={{"log_dir": {tmp!r}}})
import psutil
tree = [engine.server_pid] + [p.pid for p in psutil.Process(engine.server_pid).children(recursive=True)]
print(json.dumps({{"tree": tree, "watchdog": engine.lifeline.watchdog_pid}}), flush=True)
sys.stdin.read()
"""


@pytest.mark.extended
@pytest.mark.slow
def test_kill_9_of_the_client_takes_vllms_engine_core_with_it(tmp_path, tiny_model):
    sockets = tempfile.mkdtemp(prefix="qb-k9-")  # short: tmp_path is too long for a socket's path
    code = CLIENT.format(root=str(ROOT), model=str(tiny_model), tmp=str(tmp_path))
    client = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              # a killed client cannot remove its socket folder: give it a temp dir of its own
                              text=True, env=quantize_env({"TMPDIR": sockets}))
    try:
        line = client.stdout.readline()
        assert line, (tmp_path / "vllm_server.log").read_text()[-2000:]
        info = json.loads(line)
        tree = info["tree"]
        names = [psutil.Process(p).name() for p in tree]
        assert len(tree) >= 2 and any("EngineCore" in n for n in names), names
        client.send_signal(signal.SIGKILL)
        client.wait()
        assert wait_gone(tree + [info["watchdog"]]) == [], "vLLM processes left after kill -9 of the client"
    finally:
        client.kill()
        shutil.rmtree(sockets, ignore_errors=True)
