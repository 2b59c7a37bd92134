"""The vLLM start-up deadline (evaluate/engines/vllm.py _stop_children_after)
on plain processes: what it stops, whenever they start, and what it leaves
alone. Events, not clocks, decide each outcome; the deadlines are short
because nothing here waits for real work."""
import subprocess
import threading

from evaluate.engines.vllm import _stop_children_after

HANG_GUARD_S = 120  # a process the deadline should have stopped is still running after this: fail


def sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "600"])


def test_a_process_started_before_the_deadline_is_stopped_at_it():
    fired = threading.Event()
    with _stop_children_after(0.2, fired):
        child = sleeper()
        child.wait(timeout=HANG_GUARD_S)
    assert fired.is_set() and child.returncode == -9


def test_a_process_started_after_the_deadline_passed_is_stopped_too():
    """On a loaded host the deadline can pass before vLLM has spawned its
    engine core: that core must not then run unwatched."""
    fired = threading.Event()
    with _stop_children_after(0.1, fired):
        assert fired.wait(timeout=HANG_GUARD_S)
        child = sleeper()
        child.wait(timeout=HANG_GUARD_S)
    assert child.returncode == -9


def test_a_start_within_its_deadline_leaves_everything_running():
    fired = threading.Event()
    older = sleeper()  # started before: never the deadline's to stop
    try:
        with _stop_children_after(HANG_GUARD_S, fired):
            child = sleeper()
        assert not fired.is_set() and child.poll() is None and older.poll() is None
    finally:
        for p in (older, child):
            p.kill()
            p.wait()


def test_processes_older_than_the_start_survive_its_deadline():
    fired = threading.Event()
    older = sleeper()
    try:
        with _stop_children_after(0.1, fired):
            child = sleeper()
            child.wait(timeout=HANG_GUARD_S)
        assert fired.is_set() and older.poll() is None
    finally:
        older.kill()
        older.wait()
