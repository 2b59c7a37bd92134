"""scripts/check_disk.sh: setup refuses, in one line, to start an install the disk cannot hold."""
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_disk.sh"


def run(need_gib: int, *dir: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(need_gib), "installing .venv", *dir], capture_output=True, text=True)


def test_too_little_space_is_one_line_naming_the_fix():
    out = run(10**9)  # a billion GiB: more than any disk has
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "installing .venv needs about 1000000000 GiB" in lines[0] and "free some space" in lines[0]


def test_enough_space_passes_silently():
    out = run(0)
    assert out.returncode == 0 and out.stderr == "" and out.stdout == ""


def test_a_folder_not_made_yet_is_measured_on_its_nearest_existing_parent(tmp_path):
    """VENV=new/folders/venv: setup checks the disk before it makes the folders."""
    not_yet = str(tmp_path / "new" / "folders")
    assert run(0, not_yet).returncode == 0 and run(0, not_yet).stderr == ""
    out = run(10**9, not_yet)
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1 and "free some space" in out.stderr
    assert not (tmp_path / "new").exists()
