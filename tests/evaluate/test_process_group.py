"""evaluate.process_group: stopping a child's whole process group, the one way
engine=vllm_server and lm-eval stop theirs."""
import subprocess
import threading
import time

import pytest

from evaluate import lmeval, process_group

# The leader exits at once on SIGTERM; its child (an engine core) needs a
# moment to shut down and says so when it has. Both traps are set before the
# child says it is ready (a SIGTERM before a trap would kill it at once), and
# the group's members stay the same until a signal (no loop of short sleeps).
GROUP = """
trap 'exit 0' TERM
( trap 'sleep 1; echo shut down > "$1"; exit 0' TERM; sleep 600 & : > "$1.ready"; wait ) &
wait
"""


def start_group(tmp_path) -> subprocess.Popen:
    child = tmp_path / "child"
    proc = subprocess.Popen(["bash", "-c", GROUP, "group", str(child)], start_new_session=True,
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not child.with_name("child.ready").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the group never got ready"
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize("stopper", ["process_group", "lm-eval"])
def test_the_group_gets_its_grace_when_the_leader_exits_first(tmp_path, stopper):
    """lm-eval's stop sent SIGKILL as soon as lm-eval itself had exited, so its
    vLLM engine core, still shutting down, had no grace at all."""
    proc = start_group(tmp_path)
    if stopper == "lm-eval":
        pump = threading.Thread(target=lambda: None)
        pump.start()
        lmeval._stop_group(proc, pump)
    else:
        assert process_group.stop(proc, grace_s=10) == []
    assert (tmp_path / "child").read_text().strip() == "shut down"
    assert process_group.members(proc.pid) == [] and proc.returncode == 0


def test_what_outlives_sigkill_is_returned_not_waited_for(tmp_path, monkeypatch):
    """A process stuck in a driver (played by a killpg that does nothing)."""
    proc = start_group(tmp_path)
    monkeypatch.setattr(process_group.os, "killpg", lambda pid, sig: None)
    start = time.monotonic()
    try:
        assert set(process_group.stop(proc, grace_s=0.3, kill_grace_s=0.3)) == set(process_group.members(proc.pid))
        assert time.monotonic() - start < 5
    finally:
        monkeypatch.undo()
        process_group.stop(proc, grace_s=0, kill_grace_s=5)
