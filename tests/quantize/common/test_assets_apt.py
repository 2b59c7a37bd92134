"""The corpus from Debian's package on a host apt-get cannot serve: one line
naming the other way, not a traceback (FileNotFoundError, CalledProcessError)."""
import pytest

from quantize.common import assets
from quantize.common.errors import UserError


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
