"""Engine processes die with evaluate, however evaluate dies (kill -9, the
OOM killer): vLLM's engine core and workers, a vLLM server's process tree,
lm-eval's. An engine that starts processes holds a lifeline while it runs:

- a process this one forks from its main thread (vLLM's engine core with
  multiprocessing's `fork`) gets SIGKILL from the kernel when this process
  dies (PR_SET_PDEATHSIG), and so, in turn, do the workers it forks;
- every process started meanwhile inherits the marker variable MARKER in its
  environment (a spawned or exec'd one, e.g. `vllm serve` and its children,
  shows it in /proc/<pid>/environ); a watchdog process in its own session
  polls for this process's death and then ends every process that carries
  the marker: SIGTERM, then SIGKILL after a grace period.

A normal close stops the watchdog; the engine has stopped its processes by then.
A close an exception cuts short leaves it running, to end them when this process exits."""
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Iterator

MARKER = "QUANTBENCH_ENGINE_OF"
PR_SET_PDEATHSIG = 1
POLL_S = 0.2    # how often the watchdog looks whether its parent is gone
GRACE_S = 3.0   # SIGTERM -> SIGKILL

# Runs as `python -I -c WATCHDOG <parent pid> <MARKER=token> <poll s> <grace s>`, stdlib only.
WATCHDOG = r"""
import os, signal, sys, time
parent, entry, poll, grace = int(sys.argv[1]), sys.argv[2].encode(), float(sys.argv[3]), float(sys.argv[4])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the engine closed normally: nothing to end
signal.signal(signal.SIGINT, signal.SIG_IGN)           # Ctrl-C is for evaluate, which then closes the engine
while os.getppid() == parent:
    time.sleep(poll)
signal.signal(signal.SIGTERM, signal.SIG_IGN)          # from here on, finish the job

def marked():
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if entry in f.read().split(b"\0"):
                        found.append(int(name))
            except OSError:  # gone, or not ours
                pass
    return found

for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
    for pid in marked():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    end = time.monotonic() + wait
    while time.monotonic() < end and marked():
        time.sleep(0.1)
"""

# Resolved here, in the parent: a forked child must not look symbols up. None off Linux.
_prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
_held = 0                       # lifelines held in this process
_fork_dies_with_parent = False  # set in the parent just before a fork, read by the child
_fork_parent = 0


@dataclass(frozen=True)
class Lifeline:
    token: str           # MARKER's value in the engine's processes
    watchdog_pid: int


@contextlib.contextmanager
def hold() -> Iterator[Lifeline]:
    """While held, processes started here die with this process (see the module doc)."""
    global _held
    token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    watchdog = _start_watchdog(token)
    outer = os.environ.get(MARKER)  # a lifeline held around this one
    os.environ[MARKER] = token
    _held += 1
    try:
        yield Lifeline(token, watchdog.pid)
        # reached only when the block ends normally: one an exception cuts short (a
        # second Ctrl-C in a stop) leaves the watchdog to end the engine's processes
        _stop(watchdog)
    finally:
        _held -= 1
        if outer is None:
            os.environ.pop(MARKER, None)
        else:
            os.environ[MARKER] = outer


def _start_watchdog(token: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != MARKER}  # never its own target
    return subprocess.Popen([sys.executable, "-I", "-c", WATCHDOG, str(os.getpid()), f"{MARKER}={token}",
                             str(POLL_S), str(GRACE_S)], env=env, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def _stop(watchdog: subprocess.Popen) -> None:
    watchdog.terminate()
    try:
        watchdog.wait(timeout=5)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait()


def die_with_parent() -> None:
    """In a new child (a fork's, a subprocess's preexec_fn): the kernel sends
    it SIGKILL when the thread that started it ends, however this process
    ended. Only the main thread lives as long as the process: start from it."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _before_fork() -> None:
    # PR_SET_PDEATHSIG follows the thread that forks: only the main thread lives as long as this process
    global _fork_dies_with_parent, _fork_parent
    _fork_dies_with_parent = _held > 0 and threading.current_thread() is threading.main_thread()
    _fork_parent = os.getpid()


def _after_fork_in_child() -> None:
    if not _fork_dies_with_parent:
        return
    die_with_parent()
    if os.getppid() != _fork_parent:  # the parent died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
