"""scripts/check_disk.sh: setup refuses, in one line, to start an install the disk cannot hold."""
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_disk.sh"


def run(*pairs, env: dict | None = None) -> subprocess.CompletedProcess:
    """pairs: GiB, folder, GiB, folder, ..."""
    return subprocess.run(["bash", str(SCRIPT), "installing .venv", *map(str, pairs)], capture_output=True, text=True,
                          env=env)


def test_too_little_space_is_one_line_naming_the_folder_the_need_and_the_fix():
    out = run(10**9, ".")  # a billion GiB: more than any disk has
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "installing .venv needs about 1000000000 GiB free on " in lines[0]
    assert "(. 1000000000 GiB) but it has " in lines[0] and "free some space" in lines[0]


def test_enough_space_passes_silently():
    out = run(0, ".", 0.5, "/tmp")
    assert out.returncode == 0 and out.stderr == "" and out.stdout == ""


def test_folders_on_one_disk_add_up(tmp_path):
    df = tmp_path / "bin" / "df"
    df.parent.mkdir()
    df.write_text("#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
                  "echo 'fake 2097152 1048576 1048576 50% /fake'\n")   # 1 GiB free
    df.chmod(0o755)
    env = {"PATH": f"{df.parent}:/usr/bin:/bin"}
    assert run(0.6, tmp_path, env=env).returncode == 0 and run(0.6, "/tmp", env=env).returncode == 0
    out = run(0.6, tmp_path, 0.6, "/tmp", env=env)
    assert out.returncode == 1
    assert f"needs about 1.2 GiB free on /fake ({tmp_path} 0.6 GiB, /tmp 0.6 GiB) but it has 1.0 GiB" in out.stderr


def test_a_folder_not_made_yet_is_measured_on_its_nearest_existing_parent(tmp_path):
    """VENV=new/folders/venv: setup checks the disk before it makes the folders."""
    not_yet = str(tmp_path / "new" / "folders")
    assert run(0, not_yet).returncode == 0 and run(0, not_yet).stderr == ""
    out = run(10**9, not_yet)
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1 and "free some space" in out.stderr
    assert f"({not_yet} 1000000000 GiB)" in out.stderr
    assert not (tmp_path / "new").exists()


def test_a_missing_folder_argument_is_a_usage_line():
    out = run(3)
    assert out.returncode == 2 and out.stderr.startswith("check_disk: usage:")


def folders_checked(tmp_path, env: dict) -> list[str]:
    """The folders target.sh's check_install_disk hands to check_disk.sh (a
    stand-in that prints them), under exactly the environment `env`."""
    root = tmp_path / "project"
    (root / "scripts").mkdir(parents=True, exist_ok=True)
    (root / "scripts" / "check_disk.sh").write_text('shift; while [ $# -gt 0 ]; do echo "$2"; shift 2; done\n')
    target = SCRIPT.parent / "target.sh"
    out = subprocess.run(["bash", "-c", f'set -euo pipefail; source "{target}"; '
                          'check_install_disk "installing .venv" venv 4 1'],
                         cwd=root, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_pip_cache_is_checked_where_pip_keeps_it_even_without_home(tmp_path):
    """Without HOME (a bare job), set -u stopped setup; pip finds the home
    folder from the passwd entry, and so does the check."""
    import pwd, os
    home = pwd.getpwuid(os.getuid()).pw_dir
    assert folders_checked(tmp_path, {}) == ["venv", f"{home}/.cache/pip", "/tmp"]
    assert folders_checked(tmp_path, {"XDG_CACHE_HOME": "/x", "TMPDIR": "/t"}) == ["venv", "/x/pip", "/t"]


def test_any_pip_no_cache_dir_turns_the_cache_check_off(tmp_path):
    """pip disables its cache for PIP_NO_CACHE_DIR=0 or false too."""
    for value in ("1", "0", "false", "off"):
        assert folders_checked(tmp_path, {"HOME": "/h", "PIP_NO_CACHE_DIR": value}) == ["venv", "/tmp"]
