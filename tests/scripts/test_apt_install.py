"""scripts/apt_install.sh, the one way setup steps install Debian packages,
driven with a stand-in apt-get on PATH that behaves like dpkg's lock: a second
apt-get while one runs fails with rc 100 (what a CI clone's setup met while
another checkout's setup installed Slurm)."""
import os
import stat
import subprocess
from pathlib import Path

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "apt_install.sh"

FAKE_APT = """#!/usr/bin/env bash
# dpkg's lock: one apt-get at a time, a second one fails as the real one does
mkdir "{state}/dpkg.lock" 2>/dev/null || {{ echo "E: Could not get lock" >&2; exit 100; }}
trap 'rmdir "{state}/dpkg.lock"' EXIT
echo "$*" >> "{state}/calls"
case " $* " in
  *" update "*) touch "{state}/lists" ;;
  *" install "*) [ -e "{state}/lists" ] || {{ echo "E: Unable to locate package" >&2; exit 100; }}
                 sleep 1 ;;
esac
"""


def fake_apt(tmp_path: Path, lists: bool) -> dict:
    state = tmp_path / "state"
    state.mkdir()
    if lists:
        (state / "lists").touch()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    apt = bin_dir / "apt-get"
    apt.write_text(FAKE_APT.format(state=state))
    apt.chmod(apt.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "QB_APT_LOCK": str(tmp_path / "apt.lock"),
            "TMPDIR": str(tmp_path)}


def start(env: dict, name: str) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(SCRIPT), name, "pkg-a", "pkg-b"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_setups_at_once_both_install(tmp_path):
    env = fake_apt(tmp_path, lists=True)
    first, second = start(env, "one"), start(env, "two")
    outs = [p.communicate(timeout=60) for p in (first, second)]
    assert (first.returncode, second.returncode) == (0, 0), outs
    calls = (tmp_path / "state" / "calls").read_text().splitlines()
    assert len(calls) == 2 and all("install -y -qq --no-install-recommends pkg-a pkg-b" in c for c in calls)
    assert all("DPkg::Lock::Timeout=600" in c for c in calls)   # waits for dpkg's lock held by others too
    assert not list(tmp_path.glob("*-apt.*.log"))               # a successful install leaves no log


def test_the_lists_are_refreshed_only_when_an_install_fails_without_them(tmp_path):
    env = fake_apt(tmp_path, lists=False)
    done = subprocess.run(["bash", str(SCRIPT), "setup-x", "pkg-a"], env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    assert done.returncode == 0, done.stderr
    verbs = [c.split()[2] for c in (tmp_path / "state" / "calls").read_text().splitlines()]
    assert verbs == ["install", "update", "install"]


def test_a_failed_install_names_its_log_and_keeps_apts_status(tmp_path):
    env = fake_apt(tmp_path, lists=False)
    (tmp_path / "bin" / "apt-get").write_text("#!/bin/sh\necho 'E: Unable to locate package pkg-a' >&2\nexit 100\n")
    done = subprocess.run(["bash", str(SCRIPT), "setup-x", "pkg-a"], env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    assert done.returncode == 100
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("setup-x: error: apt-get install pkg-a failed (rc 100); see ")
    log = Path(line.rsplit("see ", 1)[1])
    assert "Unable to locate package pkg-a" in log.read_text()


def test_a_daemon_a_package_starts_does_not_hold_the_lock(tmp_path):
    """A package's script may start a daemon (invoke-rc.d on a host without
    systemd); inheriting the lock, it made the next setup wait 30 min."""
    env = fake_apt(tmp_path, lists=True)
    apt = tmp_path / "bin" / "apt-get"
    apt.write_text(apt.read_text() + "(setsid sleep 30 >/dev/null 2>&1 &)\n")
    assert subprocess.run(["bash", str(SCRIPT), "one", "pkg-a"], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=60).returncode == 0
    second = subprocess.run(["bash", str(SCRIPT), "two", "pkg-b"], env=env, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and "waiting for another install" not in second.stderr, second.stderr


def test_the_lock_folder_is_made_when_missing(tmp_path):
    env = fake_apt(tmp_path, lists=True) | {"QB_APT_LOCK": str(tmp_path / "run" / "lock" / "apt.lock")}
    done = subprocess.run(["bash", str(SCRIPT), "setup-x", "pkg-a"], env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    assert done.returncode == 0, done.stderr
