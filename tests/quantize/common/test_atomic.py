"""A quantize run killed mid-way leaves nothing that looks like an artifact, and
the next run completes and cleans up after it. What the atomic writers write
has the modes a plain open() and mkdir() give under the umask, through the
real stages too."""
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from quantize.common import atomic
from tests.conftest import (SMALL_CALIB, TINY_NAME, QUANTIZE_TIMEOUT_S, check_ok, file_sha256,
                      quantize_cmd, quantize_env, run_quantize, tail)

# Calibrated (GPTQ), yet one of the cheaper recipes to rerun; killed while
# its oneshot waits, between "staging dir created" and "renamed into place".
RECIPE = "w4a16_gptq"


def staging_dirs(model_dir):
    return sorted(model_dir.glob(f".{RECIPE}.tmp-*")) if model_dir.is_dir() else []


def kill_once_staging(args, cwd, model_dir):
    """Start quantize, SIGKILL it as soon as its staging dir exists; return the
    staging dirs seen. Its oneshot waits for the signal (tests/hosts/held_oneshot),
    so a busy machine cannot see the build over before the kill."""
    proc = subprocess.Popen(quantize_cmd(*args), cwd=cwd, env=quantize_env(host="held_oneshot"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + QUANTIZE_TIMEOUT_S
    try:
        while not staging_dirs(model_dir):
            if proc.poll() is not None:
                pytest.fail(f"quantize exited ({proc.returncode}) before it could be killed mid-run:\n"
                            f"{proc.stderr.read()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("no staging dir appeared")
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)  # our own process group (start_new_session)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    return staging_dirs(model_dir)


def test_killed_run_leaves_no_artifact_and_rerun_recovers(tmp_path, tiny_model):
    cwd, arts = tmp_path / "cwd", tmp_path / "artifacts"
    cwd.mkdir()
    model_dir = arts / TINY_NAME
    final = model_dir / RECIPE
    args = (f"recipe={RECIPE}", f"model={tiny_model}", *SMALL_CALIB, f"artifacts_dir={arts}")

    # 1. Killed before the artifact existed: no artifact, only a staging leftover.
    leftovers = kill_once_staging(args, cwd, model_dir)
    assert leftovers, "the killed run should have left its staging dir behind"
    assert not final.exists()
    assert not (final / "manifest.json").exists()

    # 2. The rerun builds the artifact and removes the leftover.
    proc = check_ok(run_quantize(*args, cwd=cwd))
    assert "skipping" not in proc.stdout + proc.stderr
    assert (final / "manifest.json").is_file() and list(final.glob("*.safetensors"))
    assert sorted(p.name for p in model_dir.iterdir()) == [RECIPE], "leftover staging/old dirs"

    # 3. A forced rebuild killed mid-run leaves the complete artifact untouched.
    before = {p.name: (p.stat().st_mtime_ns, file_sha256(p)) for p in final.iterdir()}
    leftovers = kill_once_staging((*args, "force=true"), cwd, model_dir)
    assert leftovers
    after = {p.name: (p.stat().st_mtime_ns, file_sha256(p)) for p in final.iterdir()}
    assert after == before

    # ...and the forced rerun completes and cleans up.
    proc = check_ok(run_quantize(*args, "force=true", cwd=cwd))
    assert sorted(p.name for p in model_dir.iterdir()) == [RECIPE], tail(proc)
    assert (final / "manifest.json").stat().st_mtime_ns != before["manifest.json"][0]


# A build that, inside its staging dir, touches `marker` and then waits
# until the file `go` exists (none given: goes on at once).
BUILD = """
import sys, time
from pathlib import Path
from quantize.common.atomic import staging_dir
final, who, marker, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4]
with staging_dir(final) as tmp:
    (tmp / "who").write_text(who)
    marker.touch()
    while go and not Path(go).exists():
        time.sleep(0.05)
    (tmp / "done").write_text(who)
"""


def wait_for_file(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, f"no {path.name} in time"
        time.sleep(0.05)


def test_concurrent_builds_of_one_artifact_take_turns(tmp_path):
    """A second build of the same artifact waits for the first instead of
    deleting its staging dir as a leftover; both complete, the later one wins."""
    final, env = tmp_path / "models" / "art", quantize_env()

    def start(who, marker, go=""):
        return subprocess.Popen([sys.executable, "-c", BUILD, str(final), who, str(marker), str(go)],
                                env=env, stderr=subprocess.PIPE, text=True)

    go = tmp_path / "go"
    first = start("first", tmp_path / "first-staging", go)
    wait_for_file(tmp_path / "first-staging", first)
    second = start("second", tmp_path / "second-staging")
    time.sleep(3)   # the second, started, waits for the first's lock (if not yet, it still builds after it)
    go.touch()
    assert first.wait(timeout=120) == 0, first.stderr.read()
    assert second.wait(timeout=120) == 0, second.stderr.read()
    assert (final / "done").read_text() == "second" == (final / "who").read_text()
    assert [p.name for p in final.parent.iterdir()] == ["art"]


def test_a_build_under_another_lock_keeps_its_staging_dir(tmp_path):
    """The same artifact folder through a symlink and under another
    QUANTBENCH_CACHE (another lock file): the second build no longer removes
    the first's staging dir as a killed run's leftover; both complete."""
    real = tmp_path / "models"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)

    def start(final, who, marker, cache, go=""):
        env = quantize_env({"QUANTBENCH_CACHE": str(tmp_path / cache)})
        return subprocess.Popen([sys.executable, "-c", BUILD, str(final), who, str(marker), str(go)],
                                env=env, stderr=subprocess.PIPE, text=True)

    go = tmp_path / "go"
    first = start(real / "art", "first", tmp_path / "first-staging", "cache-1", go)
    wait_for_file(tmp_path / "first-staging", first)
    second = start(tmp_path / "link" / "art", "second", tmp_path / "second-staging", "cache-2")
    assert second.wait(timeout=120) == 0, second.stderr.read()
    go.touch()   # the first finishes only after the second is done, however slow its start
    assert first.wait(timeout=120) == 0, first.stderr.read()
    assert (real / "art" / "done").read_text() == "first" == (real / "art" / "who").read_text()
    assert [p.name for p in real.iterdir()] == ["art"]


def test_one_artifact_reached_through_a_symlink_has_one_build_lock(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    assert atomic.build_lock_path(tmp_path / "link" / "art") == atomic.build_lock_path(tmp_path / "real" / "art")


def test_a_killed_builds_leftovers_are_removed_by_the_next(tmp_path):
    """A staging dir whose mark no process holds (a killed build), a mark
    without its dir, and a dir of an older version without a mark: gone."""
    final = tmp_path / "art"
    for leftover in (".art.tmp-dead1", ".art.tmp-nomark"):
        (tmp_path / leftover).mkdir()
    (tmp_path / ".art.tmp-dead1.live").touch()
    (tmp_path / ".art.tmp-nodir.live").touch()
    with atomic.staging_dir(final) as tmp:
        (tmp / "f").write_text("x")
    assert [p.name for p in tmp_path.iterdir()] == ["art"]


def build(final: Path, content: str, fail: bool = False) -> None:
    with atomic.staging_dir(final) as tmp:
        (tmp / "who").write_text(content)
        if fail:
            raise RuntimeError("the build failed")


def test_a_rebuild_stopped_between_its_renames_keeps_the_old_artifact(tmp_path, monkeypatch):
    """SIGTERM (jobs raises SystemExit) right after the old artifact is moved
    aside: it is put back, and nothing else is left beside it."""
    final = tmp_path / "art"
    build(final, "old")
    real = os.replace

    def replace(src, dst):
        real(src, dst)
        if atomic.OLD in str(dst):
            raise SystemExit(143)
    monkeypatch.setattr(atomic.os, "replace", replace)
    with pytest.raises(SystemExit):
        build(final, "new")
    assert (final / "who").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["art"]


def test_a_rebuild_killed_between_its_renames_gets_the_old_artifact_back(tmp_path):
    """kill -9 left the artifact aside (`.art.old-<pid>`) and none in place:
    the next build puts it back before it starts, so a failed one keeps it."""
    final = tmp_path / "art"
    build(final, "old")
    os.replace(final, tmp_path / ".art.old-4242")
    with pytest.raises(RuntimeError):
        build(final, "new", fail=True)
    assert (final / "who").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["art"]


def test_a_killed_rebuilds_old_copy_is_removed_and_a_reused_pid_rebuilds(tmp_path):
    """A leftover old copy beside the artifact, named by this very pid (pids
    repeat in containers): the next forced rebuild removes it and succeeds."""
    final = tmp_path / "art"
    build(final, "old")
    leftover = tmp_path / f".art.old-{os.getpid()}"
    leftover.mkdir()
    (leftover / "who").write_text("older")
    build(final, "new")
    assert (final / "who").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["art"]


CLEAN_UP = """
import sys
from pathlib import Path
from quantize.common import atomic
atomic._remove_dead_builds(Path(sys.argv[1]))
"""


def test_a_cleanup_between_a_rebuilds_renames_leaves_its_old_copy_to_it(tmp_path, monkeypatch):
    """Another build of the same folder under another lock (another
    QUANTBENCH_CACHE) cleans up just after this rebuild moved the old copy
    aside: the copy is live, so it is not put back in the way of the new one."""
    final = tmp_path / "art"
    build(final, "old")
    real = os.replace

    def replace(src, dst):
        real(src, dst)
        if atomic.OLD in Path(dst).name:
            subprocess.run([sys.executable, "-c", CLEAN_UP, str(final)], env=quantize_env(), check=True,
                           timeout=60)
    monkeypatch.setattr(atomic.os, "replace", replace)
    build(final, "new")
    assert (final / "who").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["art"]


# ---------------------------------------------------------------- modes

@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(folder: Path) -> dict[str, int]:
    """Each path under `folder` (itself included) -> its permission bits."""
    return {str(p.relative_to(folder.parent)): p.stat().st_mode & 0o777 for p in [folder, *folder.rglob("*")]}


def wrong_modes(folder: Path, file_mode: int, dir_mode: int) -> dict[str, str]:
    return {name: oct(mode) for name, mode in modes(folder).items()
            if mode != (dir_mode if (folder.parent / name).is_dir() else file_mode)}


def test_the_umask_is_read_without_changing_it():
    with umask(0o027):
        assert atomic.umask() == 0o027 and atomic.file_mode() == 0o640 and atomic.dir_mode() == 0o750
        assert os.umask(0o027) == 0o027


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077], ids=lambda m: f"umask{m:03o}")
def test_every_writer_gives_the_modes_open_and_mkdir_give(mask, tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "CACHE_DIR", tmp_path / "cache")   # the staging lock's folder
    out = tmp_path / "out"
    with umask(mask):
        (tmp_path / "plain_dir").mkdir()
        (tmp_path / "plain_file").write_text("")
        atomic.write_text(out / "report.md", "# report\n")
        atomic.write_json(out / "deeper" / "manifest.json", {})
        atomic.append_line(out / "results.jsonl", "{}")
        with atomic.replacing(out / "plot.png") as tmp:
            tmp.write_bytes(b"png")
        with atomic.staging_dir(out / "artifact") as staging:
            (staging / "model.safetensors").write_bytes(b"")
            os.chmod(staging / "model.safetensors", 0o600)   # as a library saving through its own temp file
    file_mode, dir_mode = [(tmp_path / name).stat().st_mode & 0o777 for name in ("plain_file", "plain_dir")]
    assert (file_mode, dir_mode) == (0o666 & ~mask, 0o777 & ~mask)   # what open() and mkdir() gave
    assert not wrong_modes(out, file_mode, dir_mode)
    assert not wrong_modes(tmp_path / "cache", file_mode, dir_mode)
    assert sorted(p.name for p in out.iterdir()) == ["artifact", "deeper", "plot.png", "report.md", "results.jsonl"]


def test_a_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), atomic.replacing(tmp_path / "report.md") as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.extended
@pytest.mark.slow  # a quantize, an evaluate and a report, twice: about a minute on 2 cores
@pytest.mark.parametrize("mask", [0o022, 0o077], ids=lambda m: f"umask{m:03o}")
def test_what_the_stages_write_has_the_modes_the_umask_gives(mask, tiny_model, tmp_path):
    """An artifact, a results store and a report: under umask 022 anyone may
    read them (0644, 0755), under 077 their owner alone (0600, 0700)."""
    arts, res, reports = tmp_path / "artifacts", tmp_path / "results", tmp_path / "reports"
    scenario = ("scenario=interactive", "scenario.input_len=16", "scenario.output_len=4")
    commands = [
        ("quantize", "recipe=original", f"model={tiny_model}", f"artifacts_dir={arts}"),
        ("evaluate", "recipe=original", f"model={tiny_model}", f"artifacts_dir={arts}", "engine=hf", *scenario,
         "runs=1", "accuracy=none", f"results_dir={res}"),
        ("evaluate.report", f"results_dir={res}", f"out_dir={reports}"),
    ]
    env = quantize_env({"PYTHONDONTWRITEBYTECODE": "1"})   # no byte code of the checkout under this umask
    for module, *args in commands:
        proc = subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, env=env, umask=mask,
                              capture_output=True, text=True, timeout=QUANTIZE_TIMEOUT_S)
        assert proc.returncode == 0, f"{module}: {tail(proc)}"
    assert {p.name for p in reports.iterdir()} >= {"report.md", "report.html", "summary.csv", "throughput.png"}
    assert (res / "results.jsonl").is_file() and (arts / TINY_NAME / "original" / "manifest.json").is_file()
    for folder in (arts, res, reports):
        assert not wrong_modes(folder, 0o666 & ~mask, 0o777 & ~mask), folder
