"""A disk without room for the artifact, on a real small disk (a 4 MiB tmpfs
for the tiny model's 16 MiB artifact): quantize refuses before it loads the
model, in one line naming the sizes and the fix, exit 5; with the check off
(disk_check=false) the save meets the full disk, and that is the same kind
of line, with nothing of the artifact kept. Mounting needs root: elsewhere
these skip, saying so."""
import subprocess

import pytest

from quantize.common.errors import ExitCode
from tests.conftest import run_quantize, tail


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def one_error_line(proc) -> str:
    assert proc.returncode == ExitCode.DISK_FULL, tail(proc)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    return line


def test_an_artifact_its_disk_cannot_hold_is_refused_before_loading(tiny_model, small_disk, workdir):
    proc = run_quantize("recipe=original", f"model={tiny_model}", f"artifacts_dir={small_disk}", cwd=workdir)
    line = one_error_line(proc)
    assert line.startswith(f"error: artifact {small_disk}/tiny-llama/original needs about ")
    assert line.endswith(f" MiB free but {small_disk} has 4.0 MiB; free some space there, or pass "
                         "artifacts_dir=<a disk with room>; disk_check=false skips this check")
    assert "load model" not in proc.stdout + proc.stderr
    assert list(small_disk.iterdir()) == []


def test_a_disk_that_fills_while_saving_keeps_nothing(tiny_model, small_disk, workdir):
    proc = run_quantize("recipe=original", f"model={tiny_model}", f"artifacts_dir={small_disk}", "disk_check=false",
                        cwd=workdir)
    line = one_error_line(proc)
    assert line.startswith(f"error: no room to write artifact ") and "No space left on device" in line
    assert line.endswith(f"MiB free on {small_disk}): nothing of it was kept; free some space there, or pass "
                         "artifacts_dir=<a disk with room>")
    assert list(small_disk.iterdir()) == []   # no staging folder, no empty <model>/ folder
