"""The vLLM server engine measures its own server only, after it started
too: a server that died unseen (between scenarios, say) frees its port, and
another process that binds it then answers on it. Every batch run, accuracy
pass and load level ends in ServerDied (the job's exit 3, its runs recorded
failed), never with another server's answers as the model's.

The fake server (fake_server.py) stands for vLLM's, and a second one for
the other process."""
import os
import signal
import time
from urllib.parse import urlsplit

import psutil
import pytest

from evaluate.serving.load import Level, ServerDied, run_level

from .test_vllm_server_port import HANG_GUARD_S, on_cpu, start_engine  # noqa: F401 (on_cpu: a fixture)

PROMPTS = [[1] * 16] * 4


@pytest.fixture
def server_replaced(tmp_path, fake_server):
    """A started engine whose server was killed (unseen by the engine), and
    another server on its port: (engine, the other server)."""
    engine = start_engine(tmp_path)
    try:
        port = urlsplit(engine.root_url).port
        os.killpg(engine.server_pid, signal.SIGKILL)   # no wait(): the engine has not seen it die
        wait_port_free(port)
        yield engine, fake_server("--port", str(port))
    finally:
        engine.close()


def wait_port_free(port: int) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
              for c in psutil.net_connections(kind="tcp")):
        assert time.monotonic() < deadline, f"port {port} still held after the server was killed"
        time.sleep(0.05)


def test_a_batch_run_after_the_server_died_never_measures_the_process_now_on_its_port(server_replaced):
    engine, other = server_replaced
    with pytest.raises(ServerDied, match="was killed by signal 9"):
        engine.run(PROMPTS, 4)
    assert other.stats()["requests"] == 0


def test_an_accuracy_pass_after_the_server_died_never_reads_the_process_now_on_its_port(server_replaced):
    engine, other = server_replaced
    with pytest.raises(ServerDied, match="was killed by signal 9"):
        engine.prompt_logprobs(PROMPTS, 1)
    assert other.stats()["requests"] == 0


def test_a_load_level_served_by_another_process_after_the_server_died_is_not_a_measurement(server_replaced):
    """Every request answered, each within the level's first poll of the server."""
    engine, _ = server_replaced
    with pytest.raises(ServerDied, match="was killed by signal 9"):
        run_level(engine.base_url, engine.model, Level("concurrency", 2), PROMPTS, 4, max_seconds=HANG_GUARD_S,
                  drain_seconds=HANG_GUARD_S, alive=engine.alive, server_pid=None)
