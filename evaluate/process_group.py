"""Stopping a child and every process it started (a vLLM server and its
engine core, lm-eval and its vLLM): one way, bounded in time. The child was
started with start_new_session=True, so it leads a process group of its own."""
import os
import signal
import subprocess
import time

import psutil

POLL_S = 0.1


def processes(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of a process group."""
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):   # gone meanwhile
            pass
    return out


def members(pgid: int) -> list[int]:
    return [p.pid for p in processes(pgid)]


def cpu_seconds(pgid: int) -> float:
    """CPU seconds used so far by a process group's processes, with the
    children they waited for: a group that uses none is idle (or deadlocked)."""
    total = 0.0
    for p in processes(pgid):
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:   # gone meanwhile
            pass
    return total


def stop(leader: subprocess.Popen, grace_s: float, kill_grace_s: float = 5.0) -> list[int]:
    """SIGTERM to the leader's whole group, so that each member shuts down in
    its own order (vLLM stops its engine core); SIGKILL to what is left after
    grace_s, the group counted, not the leader alone, which may exit first.
    Returns the members still alive kill_grace_s after the SIGKILL (stuck in a
    driver): the caller names them; nothing here waits longer."""
    for sig, grace in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_grace_s)):
        if not members(leader.pid):
            break
        try:
            os.killpg(leader.pid, sig)
        except ProcessLookupError:
            break
        end = time.monotonic() + grace
        while time.monotonic() < end and members(leader.pid):
            leader.poll()  # reap the leader, or it stays a zombie member
            time.sleep(POLL_S)
    leader.poll()
    return members(leader.pid)
