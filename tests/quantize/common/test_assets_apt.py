"""The corpus from Debian's package on a host apt-get cannot serve: one line
naming the other way, not a traceback (FileNotFoundError, CalledProcessError)."""
import subprocess
import sys

import pytest

from quantize.common import assets
from quantize.common.errors import UserError
from tests.conftest import quantize_env


@pytest.fixture
def no_corpus(tmp_path, monkeypatch):
    monkeypatch.setattr(assets, "AUSTEN_DIR", tmp_path / "corpus" / "austen")
    monkeypatch.setattr(assets, "CACHE_DIR", tmp_path)
    return tmp_path


def test_a_host_without_apt_get_is_told_where_else_the_corpus_comes_from(no_corpus, monkeypatch):
    monkeypatch.setenv("PATH", str(no_corpus / "empty-bin"))
    with pytest.raises(UserError, match=r"r-cran-janeaustenr, and this host has no apt-get; or copy .*austen from a "
                                        r"Debian or Ubuntu host"):
        assets.ensure_austen()
    assert not (no_corpus / "corpus").exists()


def test_an_apt_get_that_cannot_fetch_is_one_line_with_its_reason(no_corpus, monkeypatch):
    bin_dir = no_corpus / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apt-get"
    fake.write_text("#!/bin/sh\necho 'E: List directory /var/lib/apt/lists/partial is missing.' >&2\nexit 100\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}")
    with pytest.raises(UserError, match=r"apt-get could not fetch r-cran-janeaustenr \(E: List directory .* is "
                                        r"missing\.\); run it as root"):
        assets.ensure_austen()


RACE = """
import sys, time
from pathlib import Path
from quantize.common import assets
corpus, log = Path(sys.argv[1]), Path(sys.argv[2])
assets.AUSTEN_DIR = corpus
def slow_fetch(package, dest):  # stands in for apt-get download and dpkg-deb: slow, and counted
    with open(log, "a") as f:
        f.write("fetch\\n")
    time.sleep(1.0)
    return dest / "x.deb"
assets._apt_download = slow_fetch
assets.subprocess.run = lambda *a, **k: None
assets.read_r_lazyload = lambda path: {name: [name] for name in assets.AUSTEN_BOOKS}
assets.ensure_austen()
"""


def test_jobs_that_start_together_on_a_fresh_cache_build_the_corpus_once(tmp_path):
    """Three jobs on a fresh cache: one fetches and builds the corpus, the
    others wait for it and find it built (no rebuild replacing it under them)."""
    corpus, log = tmp_path / "corpus" / "austen", tmp_path / "fetches"
    (tmp_path / "cache").mkdir()
    env = quantize_env({"QUANTBENCH_CACHE": str(tmp_path / "cache")})
    jobs = [subprocess.Popen([sys.executable, "-c", RACE, str(corpus), str(log)], env=env, cwd=tmp_path,
                             stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for job in jobs:
        assert job.wait(timeout=120) == 0, job.stderr.read()
    assert log.read_text() == "fetch\n"
    assert (corpus / "persuasion.txt").read_text() == "persuasion\n"
