"""Servers the tests start themselves (the MLflow tracking server,
optuna-dashboard): on 127.0.0.1 only, on a free port, waited for over HTTP,
stopped (their whole process group) when the test is done."""
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

HOST = "127.0.0.1"
START_GUARD_S = 600   # MLflow's server takes 1-3 min to start on 2 loaded cores; longer is a hang


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 30) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


@contextmanager
def serving(command: list[str], ready_url: str, log: Path, env: dict | None = None):
    """Run `command` until the `with` block ends, once `ready_url` answers 200;
    its output goes to `log`, whose tail a failed start shows."""
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _wait(proc, ready_url, log)
        yield proc
    finally:
        _stop(proc)


def _wait(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + START_GUARD_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            get(url, timeout=5)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {START_GUARD_S} s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """The server and the workers it started (its own process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


MLFLOW_SERVER = Path(__file__).resolve().parents[1] / ".venv-mlflow" / "bin" / "mlflow"   # make setup-mlflow


@contextmanager
def mlflow_server(folder: Path):
    """`mlflow server` (.venv-mlflow) with a SQLite backend and a local
    artifact root in `folder`; yields its URI."""
    port = free_port()
    command = [str(MLFLOW_SERVER), "server", "--host", HOST, "--port", str(port), "--workers", "1",
               "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
               "--artifacts-destination", str(folder / "artifacts")]
    # no GenAI job runner: nothing here uses it, and its scheduler slows the start
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with serving(command, f"http://{HOST}:{port}/health", folder / "server.log", env=env):
        yield f"http://{HOST}:{port}"
