"""No orphaned engines: what an engine starts dies with evaluate, however
evaluate dies (evaluate/lifeline.py). On plain processes first (a fork, as
vLLM starts its engine core, and an exec'd subprocess with a child of its own,
as `vllm serve` is), then the real thing: kill -9 of `python -m evaluate`
while vLLM serves, with vLLM's engine core forked (the CPU default) or
spawned (as on CUDA)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from evaluate import lifeline
from tests.conftest import quantize_env

ROOT = Path(__file__).resolve().parents[3]
GONE_WITHIN_S = 10   # the engine's processes after evaluate's death
HANG_GUARD_S = 600   # a vLLM start on 2 busy cores: past this the test has hung

HOLDER = """
import json, multiprocessing, subprocess, sys, time
sys.path.insert(0, {root!r})
from evaluate import lifeline

def sleep():
    time.sleep(600)

with lifeline.hold() as held:
    forked = multiprocessing.get_context("fork").Process(target=sleep)
    forked.start()
    # an exec'd process with a child of its own, as `vllm serve` and its engine core
    server = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
                               "print('started', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    server.stdout.readline()   # its child exists: no sleep that a busy machine outlasts
    print(json.dumps({{"forked": forked.pid, "server": server.pid, "watchdog": held.watchdog_pid}}), flush=True)
    sys.stdin.read()
"""


def alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids, within_s: float) -> list[int]:
    end = time.monotonic() + within_s
    while time.monotonic() < end and alive(pids):
        time.sleep(0.1)
    return alive(pids)


def tree(pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def test_a_forked_and_an_execd_process_tree_die_with_their_parent():
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.format(root=str(ROOT))], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=quantize_env())
    try:
        info = json.loads(holder.stdout.readline())
        pids = tree(holder.pid)
        assert {info["forked"], info["server"], info["watchdog"]} < set(pids) and len(pids) == 4
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert wait_gone(pids, GONE_WITHIN_S) == [], "processes left after kill -9 of their parent"
    finally:
        holder.kill()


def test_a_normal_close_stops_the_watchdog_and_leaves_other_processes_alone():
    outside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with lifeline.hold() as held:
            assert os.environ[lifeline.MARKER] == held.token
            inside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        assert lifeline.MARKER not in os.environ
        assert wait_gone([held.watchdog_pid], GONE_WITHIN_S) == []
        assert alive([outside.pid, inside.pid]) == [outside.pid, inside.pid]  # a normal close ends nothing
    finally:
        for p in (outside, inside):
            p.kill()
            p.wait()



CUT_SHORT = """
import subprocess, sys, time
from types import SimpleNamespace
sys.path.insert(0, {root!r})
from evaluate.engines.base import Engine

class Stubborn(Engine):
    name = "stubborn"
    starts_processes = True

    def start(self, target, args, max_model_len):
        self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self):
        raise KeyboardInterrupt  # a second Ctrl-C while it stops its processes

engine = Stubborn(SimpleNamespace(path="."), {{}}, {{}}, max_model_len=16)
print(engine.proc.pid, flush=True)
try:
    engine.close()
except KeyboardInterrupt:
    pass
"""


def test_a_close_cut_short_leaves_the_watchdog_to_end_the_engines_processes():
    """A second Ctrl-C during Engine.stop() stopped the watchdog as a normal
    close does: the engine's processes outlived evaluate."""
    holder = subprocess.run([sys.executable, "-c", CUT_SHORT.format(root=str(ROOT))], capture_output=True,
                            text=True, env=quantize_env(), timeout=120)
    assert holder.returncode == 0, holder.stderr
    engine_process = int(holder.stdout.split()[0])
    try:
        assert wait_gone([engine_process], GONE_WITHIN_S) == [], "the engine's process outlived evaluate"
    finally:
        if alive([engine_process]):
            os.kill(engine_process, signal.SIGKILL)


def engine_tree_once_ready(proc: subprocess.Popen) -> list[int]:
    """Evaluate's processes (bar itself) once vLLM says it is ready."""
    end = time.monotonic() + HANG_GUARD_S
    for line in proc.stdout:
        if "vLLM ready" in line:
            return tree(proc.pid)
        assert time.monotonic() < end, "vLLM was not ready in time"
    raise AssertionError(f"evaluate exited with {proc.wait()} before vLLM was ready")


@pytest.mark.slow
@pytest.mark.needs_vllm
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_kill_9_of_evaluate_leaves_no_engine_process(tmp_path, tiny_model, start_method):
    sockets = tempfile.mkdtemp(prefix="qb-k9-")  # a killed evaluate cannot remove its socket folder
    env = quantize_env({"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_WORKER_MULTIPROC_METHOD": start_method,
                        "TMPDIR": sockets})
    cmd = [sys.executable, "-m", "evaluate", f"model={tiny_model}", "scenario=interactive", "scenario.input_len=16",
           "scenario.output_len=4", "runs=100", "accuracy=none", "engine.args.enforce_eager=true",
           f"results_dir={tmp_path / 'results'}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        pids = engine_tree_once_ready(proc)
        names = [psutil.Process(p).name() for p in pids]
        assert any("EngineCore" in n for n in names), names
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert wait_gone(pids, GONE_WITHIN_S) == [], f"left after kill -9 of evaluate: {names}"
    finally:
        proc.kill()
        shutil.rmtree(sockets, ignore_errors=True)
