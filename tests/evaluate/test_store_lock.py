"""One writer per measurement (evaluate.store_lock): a second process on a
results store waits for the measurement another holds, then measures only
what the store still lacks. Unit tests of the lock between real processes,
then two real `python -m evaluate` sweeps started together on one store."""
import errno
import fcntl
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, last_line, quantize_env, run_cli
from evaluate import results, store_lock

# Holds the lock of key argv[2:] in store argv[1] until its stdin closes; says "held" once it does.
HOLDER = """
import sys
from pathlib import Path
from evaluate import store_lock
with store_lock.measurement(Path(sys.argv[1]), tuple(sys.argv[2:]), "test"):
    print("held", flush=True)
    sys.stdin.read()
"""
KEY = ("speed", "artifact-1", "setup-1", "scenario-a")


def hold_in_child(store: Path, key: tuple = KEY) -> subprocess.Popen:
    """A process that holds `key`'s lock until its stdin is closed (or it is killed)."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(store), *key], cwd=ROOT, env=quantize_env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


class ReleaseOnWaiting(logging.Handler):
    """Lets the child go once this process logs that it waits for it: the
    release can only come after the wait has begun, however slow the host."""

    def __init__(self, child: subprocess.Popen):
        super().__init__()
        self.child, self.released_after_waiting = child, False

    def emit(self, record: logging.LogRecord) -> None:
        if "waiting for" in record.getMessage() and not self.released_after_waiting:
            self.released_after_waiting = True
            self.child.stdin.close()


def test_a_second_process_waits_for_the_holder_and_learns_who_it_was(tmp_path, caplog):
    child = hold_in_child(tmp_path)
    release = ReleaseOnWaiting(child)
    logger = logging.getLogger("quantbench.evaluate")
    logger.addHandler(release)
    try:
        with caplog.at_level(logging.INFO, logger="quantbench.evaluate"):
            with store_lock.measurement(tmp_path, KEY, "scenario a") as hold:
                pass
    finally:
        logger.removeHandler(release)
        child.kill()
    child.wait(timeout=120)
    assert release.released_after_waiting and hold.waited and hold.waited_s > 0
    assert hold.holder == f"{socket.gethostname()} pid {child.pid}"
    (line,) = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert line.startswith(f"scenario a: waiting for {hold.holder}") and str(tmp_path / "locks") in line


def test_other_measurements_and_other_stores_do_not_wait(tmp_path):
    child = hold_in_child(tmp_path / "store")
    try:
        with store_lock.measurement(tmp_path / "store", (*KEY[:-1], "scenario-b"), "scenario b") as other_key:
            pass
        with store_lock.measurement(tmp_path / "other-store", KEY, "scenario a") as other_store:
            pass
    finally:
        child.kill()
        child.wait()
    assert not other_key.waited and not other_store.waited


def test_a_killed_holder_leaves_no_lock_behind(tmp_path):
    child = hold_in_child(tmp_path)
    child.kill()  # SIGKILL: no cleanup runs; the kernel drops the lock
    child.wait()
    probe = os.open(store_lock.lock_path(tmp_path, KEY), os.O_RDWR)
    try:  # free now, or this raises instead of the measurement below waiting for ever
        fcntl.lockf(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(probe)
    with store_lock.measurement(tmp_path, KEY, "scenario a") as hold:
        pass
    assert not hold.waited and hold.locked


def test_the_lock_file_is_named_by_the_key_not_the_path_the_store_is_mounted_at(tmp_path):
    """Nodes may mount one shared store at different paths: they meet at one file."""
    here, there = store_lock.lock_path(tmp_path / "a", KEY), store_lock.lock_path(tmp_path / "b", KEY)
    assert here.parent == tmp_path / "a" / "locks" and here.name == there.name
    assert store_lock.lock_path(tmp_path, (*KEY[:-1], "scenario-b")).name != here.name


def test_a_file_system_without_locks_warns_and_measures(tmp_path, monkeypatch, caplog):
    def no_locks(fd, cmd, *args):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
    monkeypatch.setattr(fcntl, "lockf", no_locks)
    ran = False
    with caplog.at_level(logging.WARNING, logger="quantbench.evaluate"):
        with store_lock.measurement(tmp_path, KEY, "scenario a") as hold:
            ran = True
    assert ran and not hold.locked
    (line,) = [r.getMessage() for r in caplog.records if r.name == "quantbench.evaluate"]
    assert line.startswith("scenario a: cannot lock") and "another process on this store may measure it" in line
    assert "results_dir" in line


def lock_under_umask_022(store: Path):
    """Lock KEY in `store` once with the usual umask (022: new files 0644, folders 0755)."""
    old_umask = os.umask(0o022)
    try:
        with store_lock.measurement(store, KEY, "scenario a") as hold:
            pass
    finally:
        os.umask(old_umask)
    return hold


@pytest.mark.parametrize("folder_mode, shared", [(0o2775, 0o020), (0o777, 0o022), (0o755, 0)])
def test_a_lock_file_is_writable_by_whoever_may_write_its_folder(tmp_path, folder_mode, shared):
    """Under umask 022 a new file is 0644: a second user of a group-writable
    store could not open it for the lock. The lock file takes the folder's
    group and other write access instead, and no more."""
    locks = tmp_path / "locks"
    locks.mkdir()
    locks.chmod(folder_mode)
    hold = lock_under_umask_022(tmp_path)
    mode = store_lock.lock_path(tmp_path, KEY).stat().st_mode & 0o777
    assert hold.locked and mode & 0o022 == shared and mode & 0o600 == 0o600


@pytest.mark.parametrize("store_mode, shared", [(0o2775, 0o020), (0o755, 0)])
def test_the_lock_folder_a_job_makes_is_writable_by_whoever_may_write_the_store(tmp_path, store_mode, shared):
    """Under umask 022 the store's locks/ came out 0755 inside a 2775 shared
    store: its first user's lock files were shared, but nobody else could
    make one, and the second user's evaluate stopped before any engine."""
    store = tmp_path / "store"
    store.mkdir()
    store.chmod(store_mode)
    hold = lock_under_umask_022(store)
    mode = store_lock.lock_path(store, KEY).parent.stat().st_mode & 0o777
    assert hold.locked and mode & 0o022 == shared and mode & 0o700 == 0o700


# Started as root (the interpreter lives in root's home), then user nobody: lock key
# argv[2:] in store argv[1], print whether it locked; warnings go to stderr.
OTHER_USER = """
import logging, os, sys
from pathlib import Path
from evaluate import store_lock
logging.basicConfig(level=logging.WARNING, format="%(message)s")
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
with store_lock.measurement(Path(sys.argv[1]), tuple(sys.argv[2:]), "scenario a") as hold:
    print("locked" if hold.locked else "unlocked", flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to a second user needs root")
def test_a_second_user_of_a_shared_store_locks_the_first_users_lock_files(tmp_path):
    store = Path(tempfile.mkdtemp(prefix="shared-store-"))  # tmp_path's parents are root's only
    try:
        store.chmod(0o777)
        (store / "locks").mkdir()
        (store / "locks").chmod(0o777)
        old_umask = os.umask(0o022)
        try:
            with store_lock.measurement(store, KEY, "scenario a"):
                pass
        finally:
            os.umask(old_umask)
        other = run_as_nobody(store, KEY)
        assert other.returncode == 0 and other.stdout.strip() == "locked", other.stdout + other.stderr
        # a lock file made 0644 (by an older version): the other user warns and measures unlocked
        old = store_lock.lock_path(store, (*KEY[:-1], "scenario-b"))
        os.close(os.open(old, os.O_RDWR | os.O_CREAT, 0o644))
        old.chmod(0o644)
        other = run_as_nobody(store, (*KEY[:-1], "scenario-b"))
        assert other.returncode == 0 and other.stdout.strip() == "unlocked", other.stdout + other.stderr
        assert f"cannot lock {old}" in other.stderr and "chmod g+w" in other.stderr and "Traceback" not in other.stderr
    finally:
        shutil.rmtree(store)


def run_as_nobody(store: Path, key: tuple) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", OTHER_USER, str(store), *key], cwd=ROOT,
                          env=quantize_env({"HOME": str(store)}), capture_output=True, text=True, timeout=120)


def test_a_lock_folder_that_is_a_file_is_one_line_before_the_engine(tiny_model, tmp_path):
    res = tmp_path / "res"
    res.mkdir()
    (res / "locks").write_text("not a folder")
    out = run_cli("evaluate", f"model={tiny_model}", "engine=hf", "scenario=interactive", "accuracy=none",
                  f"results_dir={res}", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    line = last_line(out.stderr)
    assert line.startswith(f"error: cannot create lock files in {res / 'locks'}") and "results_dir=" in line
    assert sorted(p.name for p in res.iterdir()) == ["locks"]  # no row, no engine


# ---------------------------------------------------------------- two real sweeps on one store

def evaluate_args(model: Path, scenario: Path, res: Path, runs: int) -> list[str]:
    return [f"model={model}", "engine=hf", f"scenario={scenario}", f"runs={runs}", "accuracy=none",
            f"results_dir={res}"]


def wait_for_text(path: Path, text: str, procs: list, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in path.read_text():
        exited = [p for p in procs if p.poll() is not None]
        assert not exited, f"exited {exited[0].returncode} before '{text}':\n{path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no '{text}' in {timeout_s} s:\n{path.read_text()[-3000:]}"
        time.sleep(0.2)


@pytest.mark.slow  # three evaluate processes: ~45 s on 2 cores
def test_two_sweeps_on_one_store_measure_each_run_once(tiny_model, tmp_path):
    """A first job stores run 0 (and leaves the scenario's lock file). The test
    then holds that lock while two jobs asking runs=3 start together, so both
    plan runs 1 and 2 and both wait; released, one measures them, the other
    finds them stored and skips: one row per run key, and each says which."""
    scenario = tmp_path / "lock_s.yaml"
    scenario.write_text("name: lock_s\nbatch_size: 1\ninput_len: 16\noutput_len: 4\n")
    res = tmp_path / "res"
    # one setup for the three jobs: engine=hf's thread count is part of it
    first = run_cli("evaluate", *evaluate_args(tiny_model, scenario, res, runs=1), cwd=tmp_path,
                    env={"OMP_NUM_THREADS": "1"})
    assert first.returncode == 0, first.stderr[-2000:]
    (lock_file,) = (res / "locks").iterdir()
    held = os.open(lock_file, os.O_RDWR)
    fcntl.lockf(held, fcntl.LOCK_EX)
    logs = [tmp_path / f"sweep{i}.log" for i in (1, 2)]
    procs = [subprocess.Popen([sys.executable, "-m", "evaluate", *evaluate_args(tiny_model, scenario, res, runs=3)],
                              cwd=tmp_path, env=quantize_env({"OMP_NUM_THREADS": "1"}),
                              stdout=log.open("w"), stderr=subprocess.STDOUT)
             for log in logs]
    try:
        for log in logs:
            wait_for_text(log, "scenario lock_s: waiting for", procs)
    finally:
        os.close(held)  # lets them go
    assert [p.wait(timeout=600) for p in procs] == [0, 0], "\n".join(log.read_text()[-2000:] for log in logs)

    rows = results.read(res)
    assert all(r.ok and r.kind == "speed" for r in rows)
    assert sorted(r.run_index for r in rows) == [0, 1, 2]
    assert len({r.run_key() for r in rows}) == len(rows)
    said = sorted(log.read_text() for log in logs)
    measured = [text for text in said if "measuring what the store still lacks" in text]
    skipped = [text for text in said if "scenario lock_s: skipped, complete in the store (measured by" in text]
    assert len(measured) == 1 and len(skipped) == 1 and measured != skipped, said
    assert "run 2/3" in measured[0] and "run 2/3" not in skipped[0]
