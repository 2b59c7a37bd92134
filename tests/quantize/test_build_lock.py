"""A quantize lock: a second `python -m quantize` of one artifact waits for
the first, then finds it complete and skips it; a killed holder leaves no
lock behind (atomic.build_turn)."""
import os
import signal
import socket
import subprocess
import time

from quantize.common.atomic import build_lock_path, build_turn
from tests.conftest import QUANTIZE_TIMEOUT_S, TINY_NAME, check_ok, quantize_cmd, quantize_env, run_quantize
from tests.hosts.held_oneshot import HELD_IN_ONESHOT

RECIPE = "original"  # loaded and saved, no calibration: the cheapest build
DATA_FREE = "w4a16_rtn"  # the cheapest build that calls oneshot, where tests/hosts/held_oneshot holds it


def start(args, cwd, log_path, host: str | None = None):
    log = open(log_path, "w")
    try:
        return subprocess.Popen(quantize_cmd(*args), cwd=cwd, env=quantize_env(host=host), stdout=log,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    finally:
        log.close()  # the child keeps its own descriptor


def wait_for(condition, what: str, procs=()):
    deadline = time.monotonic() + QUANTIZE_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        assert all(p.poll() is None for p in procs), f"a process ended before {what}"
        time.sleep(0.02)


def test_a_second_quantize_of_one_artifact_waits_then_skips_it(tiny_model, tmp_path, workdir):
    """Both start while this test holds the artifact's lock, so both are
    waiting when it lets go: one builds, the other waits for it and skips."""
    arts = tmp_path / "artifacts"
    final = arts / TINY_NAME / RECIPE
    args = (f"recipe={RECIPE}", f"model={tiny_model}", f"artifacts_dir={arts}")
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    with build_turn(final, "the test"):
        procs = [start(args, workdir, log) for log in logs]
        try:
            wait_for(lambda: all("waiting for" in log.read_text() for log in logs), "both wait", procs)
        except BaseException:
            for p in procs:
                os.killpg(p.pid, signal.SIGKILL)
            raise
    assert [p.wait(timeout=QUANTIZE_TIMEOUT_S) for p in procs] == [0, 0], [log.read_text()[-2000:] for log in logs]
    outputs = {p.pid: log.read_text() for p, log in zip(procs, logs)}
    (builder,) = [pid for pid, out in outputs.items() if "written to" in out]
    (skipper,) = [pid for pid, out in outputs.items() if "skipping" in out]
    assert f"built by {socket.gethostname()} pid {builder} while this process waited" in outputs[skipper]
    assert "written to" not in outputs[skipper] and "load model" not in outputs[skipper]
    assert (final / "manifest.json").is_file()


def test_a_killed_quantize_leaves_no_lock_behind(tiny_model, tmp_path, workdir):
    """Killed while its oneshot waits (tests/hosts/held_oneshot), surely
    holding the lock: the lock file keeps naming its last holder after a
    build, so waiting on its text alone raced a build that was already over."""
    arts = tmp_path / "artifacts"
    final = arts / TINY_NAME / DATA_FREE
    args = (f"recipe={DATA_FREE}", f"model={tiny_model}", f"artifacts_dir={arts}")
    lock = build_lock_path(final)
    log = tmp_path / "killed.log"
    holder = start(args, workdir, log, host="held_oneshot")
    try:
        wait_for(lambda: HELD_IN_ONESHOT in log.read_text(), "it holds the lock inside oneshot", [holder])
        assert lock.read_text().endswith(f" pid {holder.pid}")
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # its own process group (start_new_session)
        holder.wait(timeout=60)
    assert not (final / "manifest.json").exists()
    proc = check_ok(run_quantize(*args, cwd=workdir))
    out = proc.stdout + proc.stderr
    assert "waiting for" not in out and "written to" in out
    assert (final / "manifest.json").is_file()
