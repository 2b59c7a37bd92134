"""The vLLM server engine measures its own server only: the port it chose
is held until the server is healthy, so no other job's free port is the
same; a process that bound it explicitly (and answers /health) is never
measured: the server starts again on a new port, and after PORT_TRIES such
ports the start fails in one line naming the process. And the rows record the speed variables its
engine runs with, as the server set them for its engine's processes.

The fake server (fake_server.py) stands for vLLM's; vLLM's own answers to
the engine (on a CPU or not) are given, so these run without vLLM."""
import errno
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from evaluate.engines import vllm, vllm_server
from evaluate.engines.vllm_server import PORT_TRIES, PortTaken, port_holders

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # fake_engine, as evaluate imports it from its engine config
from fake_engine import FakeServerEngine  # noqa: E402

HANG_GUARD_S = 120


@pytest.fixture(autouse=True)
def on_cpu(monkeypatch):
    monkeypatch.setattr(vllm, "on_cpu", lambda: True)


class Squatter(ThreadingHTTPServer):
    """An HTTP server of another program on 127.0.0.1: every request gets
    `status`; the paths asked for are kept."""
    daemon_threads = True

    def __init__(self, status: int):
        self.status, self.paths = status, []
        squatter = self

        class Answer(BaseHTTPRequestHandler):
            def answer(self):
                squatter.paths.append(self.path)
                self.send_response(squatter.status)
                self.send_header("Content-Length", "0")
                self.end_headers()
            do_GET = do_POST = answer

            def log_message(self, *_):
                pass
        super().__init__(("127.0.0.1", 0), Answer)
        self.port = self.server_address[1]


@contextmanager
def squatting(status: int):
    server = Squatter(status)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


class Taken:
    """A reservation of a port another process already holds (taken by an
    explicit bind: no free port of the kernel's is one that is held)."""
    def __init__(self, port: int):
        self.port = port

    def getsockname(self):
        return "127.0.0.1", self.port

    def close(self):
        pass


def choose_first(monkeypatch, *ports: int) -> None:
    """reserve_port returns `ports` first (ports another process took), then free ones."""
    chosen, real = list(ports), vllm_server.reserve_port
    monkeypatch.setattr(vllm_server, "reserve_port", lambda host: Taken(chosen.pop(0)) if chosen else real(host))


def start_engine(tmp_path, cls=FakeServerEngine, **settings):
    return cls(SimpleNamespace(path=tmp_path), {"dtype": "bfloat16"}, {}, max_model_len=256,
               settings={"log_dir": str(tmp_path), "startup_timeout_s": HANG_GUARD_S, **settings})


def stats(root_url: str) -> dict:
    with urllib.request.urlopen(f"{root_url}/stats", timeout=HANG_GUARD_S) as r:
        return json.loads(r.read())


def test_a_port_another_server_took_is_never_measured_the_server_starts_on_a_new_one(tmp_path, monkeypatch):
    with squatting(200) as squatter:
        choose_first(monkeypatch, squatter.port)
        engine = start_engine(tmp_path)
        try:
            assert not engine.root_url.endswith(f":{squatter.port}")
            assert stats(engine.root_url)["requests"] == 1  # the warm-up went to the server started
            assert engine.alive() is None
        finally:
            engine.close()
    assert set(squatter.paths) <= {"/health"}, "a request meant for the server went to another process"


def test_a_port_taken_at_every_try_fails_in_one_line_naming_the_process(tmp_path, monkeypatch):
    with squatting(404) as squatter:  # not healthy: the server's bind fails, and its log says so
        choose_first(monkeypatch, *[squatter.port] * PORT_TRIES)
        with pytest.raises(PortTaken) as e:
            start_engine(tmp_path)
    message = str(e.value)
    assert "\n" not in message
    assert f"another process (pid {os.getpid()} (" in message and f"took port {squatter.port} before" in message
    assert f"{PORT_TRIES} ports tried; a rerun picks others" in message
    assert str(tmp_path / "vllm_server.log") in message
    assert (tmp_path / "vllm_server.log").read_text().lower().count("address already in use") >= PORT_TRIES


HOLDER = """
import socket, sys
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
s.bind((sys.argv[1], 0))
s.listen()
print(s.getsockname()[1], flush=True)
sys.stdin.read()
"""


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("host", ["127.0.0.1", pytest.param("::1", marks=pytest.mark.skipif(
    not has_ipv6_loopback(), reason="no IPv6 loopback here"))])
def test_a_process_listening_beside_the_server_is_seen(host):
    """Where vLLM's socket takes SO_REUSEPORT, a process of the same user can listen
    on its port too, and the kernel would share the requests between them."""
    server = subprocess.Popen([sys.executable, "-c", HOLDER, host], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        port = int(server.stdout.readline())
        assert port_holders(port, server.pid) == ([server.pid], [])
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as beside:
            beside.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            beside.bind((host, port))
            beside.listen()
            assert port_holders(port, server.pid) == ([server.pid], [os.getpid()])
    finally:
        server.kill()
        server.wait()


class PreloadingServer(FakeServerEngine):
    """As vLLM-CPU's server with VLLM_WORKER_MULTIPROC_METHOD=spawn: it starts
    multiprocessing's resource_tracker, then sets LD_PRELOAD in its own
    os.environ, then spawns its engine core (a child that runs with it): the
    server's oldest child is not its engine core."""
    PRELOAD = "libc.so.6"  # loaded by every process anyway: preloading it changes nothing

    def command(self, target, host, port):
        fake = super().command(target, host, port)
        return [sys.executable, "-c", SPAWNING_SERVER, self.PRELOAD, *fake[1:]]


SPAWNING_SERVER = """
import multiprocessing as mp, os, runpy, sys, time
from multiprocessing import resource_tracker
if __name__ == "__main__":
    resource_tracker.ensure_running()
    os.environ["LD_PRELOAD"] = sys.argv[1]
    # the engine core titles itself as vLLM's does (setproctitle), which clobbers its environ unless told not to
    core = "import setproctitle, time; setproctitle.setproctitle('VLLM::EngineCore'); time.sleep(3600)"
    mp.get_context("spawn").Process(target=exec, args=(core,), daemon=True).start()
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_the_rows_record_the_ld_preload_the_servers_engine_runs_with(tmp_path, monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    engine = start_engine(tmp_path, PreloadingServer)
    try:
        assert engine.describe()["engine_env"]["LD_PRELOAD"] == PreloadingServer.PRELOAD
        assert "LD_PRELOAD" not in os.environ
    finally:
        engine.close()


@pytest.mark.parametrize("cmdline, core", [
    (["VLLM::EngineCore", "", ""], True),          # vLLM's process title (setproctitle)
    (["VLLM::EngineCore_DP1"], True),
    ([sys.executable, "-B", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)",
      "--multiprocessing-fork"], True),
    ([sys.executable, "-B", "-c", "from multiprocessing.resource_tracker import main;main(3)"], False),
    ([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], False),
    (["VLLM::Worker_TP0"], False),
    ([], False),
])
def test_the_engine_core_is_told_from_the_servers_other_processes(cmdline, core):
    assert vllm_server.is_engine_core(cmdline) is core


def test_an_address_in_use_of_another_port_is_the_servers_own_failure_not_a_taken_port(tmp_path):
    """vLLM binds more than its API port (its engine's, torch's): an
    'Address already in use' in its log, while no other process holds the
    API port, is reported as the server's failure, and not started again."""
    start_log = tmp_path / "start.log"
    start_log.write_text("starting\nOSError: [Errno 98] Address already in use\n")
    with pytest.raises(vllm_server.ServerStartError) as e:
        start_engine(tmp_path, fake_flags=["--exit-at-start", "--start-log", str(start_log)])
    assert not isinstance(e.value, PortTaken)
    assert "exited with code 1: OSError: [Errno 98] Address already in use" in str(e.value)
    assert (tmp_path / "vllm_server.log").read_text().count("starting") == 1, "the server was started again"


class PortChecker(FakeServerEngine):
    """Records, just before each start of the server, its port and how
    another program's bind of that port ends (None: it bound it)."""
    checks: list = []

    def command(self, target, host, port):
        with socket.socket() as other:
            try:
                other.bind((host, port))
                self.checks.append((port, None))
            except OSError as e:
                self.checks.append((port, e.errno))
        return super().command(target, host, port)


def held_here(port: int) -> list:
    """This process's sockets on local `port` (its clients' sockets have other local ports)."""
    return [c for c in psutil.Process().net_connections(kind="tcp") if c.laddr and c.laddr.port == port]


def test_the_servers_port_is_held_until_the_server_is_healthy_then_let_go(tmp_path, monkeypatch):
    """A free port is free only when chosen: held bound until the server
    listens on it, no other job's free port (a bind to port 0) is the same
    one, nor may another program bind it; the server itself binds it."""
    monkeypatch.setattr(PortChecker, "checks", [])
    engine = start_engine(tmp_path, PortChecker)
    try:
        [(port, bind_error)] = PortChecker.checks
        assert bind_error == errno.EADDRINUSE
        assert engine.root_url.endswith(f":{port}") and stats(engine.root_url)["requests"] == 1
        assert held_here(port) == []
    finally:
        engine.close()


def test_a_server_that_fails_to_start_lets_its_port_go(tmp_path, monkeypatch):
    monkeypatch.setattr(PortChecker, "checks", [])
    with pytest.raises(vllm_server.ServerStartError):
        start_engine(tmp_path, PortChecker, fake_flags=["--exit-at-start"])
    [(port, _)] = PortChecker.checks
    assert held_here(port) == []


@pytest.mark.parametrize("options", [[socket.SO_REUSEADDR], [socket.SO_REUSEADDR, socket.SO_REUSEPORT]])
def test_a_server_binds_its_held_port_as_vllm_does(options):
    """vLLM's socket takes SO_REUSEADDR (and SO_REUSEPORT with several API
    servers): it binds and listens beside the port's holder, which does not listen."""
    with vllm_server.reserve_port("127.0.0.1") as held, socket.socket() as server:
        for option in options:
            server.setsockopt(socket.SOL_SOCKET, option, 1)
        server.bind(held.getsockname())
        server.listen()


def test_an_engine_core_environ_overwritten_by_its_title_is_unknown_not_empty(monkeypatch):
    """An empty environ (setproctitle clobbered it) would record no speed
    variables over evaluate's own: it means "not readable"."""
    class Core:
        def environ(self):
            return {}
    engine = vllm_server.VllmServerEngine.__new__(vllm_server.VllmServerEngine)
    engine.proc = type("Proc", (), {"pid": os.getpid()})()
    monkeypatch.setattr(vllm_server, "engine_core", lambda pgid: Core())
    assert engine._engine_env() is None
