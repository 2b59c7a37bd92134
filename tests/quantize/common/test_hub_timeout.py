"""A hub (HF_ENDPOINT) that accepts connections but never answers: the
download's wait is bounded by HF_HUB_ETAG_TIMEOUT, then the cache decides or
one line names the fix; snapshot_download alone waited forever."""
import socket
import threading
import time

import pytest

from tests.conftest import last_line, quantize_cmd, quantize_env
from tests.quantize.common.test_big_models import one_line_error
from quantize.common import hub

ETAG_TIMEOUT_S = 1   # the test's own HF_HUB_ETAG_TIMEOUT, which the bound must follow
HUNG_S = 60          # far beyond it: the call hung


@pytest.fixture
def silent_hub():
    """The URL of a server that takes every connection and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held = []

    def accept():
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:   # closed at the end of the test
                return
    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for conn in held:
        conn.close()


def bounded(fn):
    """fn() run where a hang fails the test instead of holding it: (what it
    returned or raised, seconds taken)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = fn()
        except BaseException as e:   # noqa: BLE001 - handed to the test as is
            outcome["value"] = e
    started = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(HUNG_S)
    assert not worker.is_alive(), f"still waiting on the silent hub after {HUNG_S} s"
    return outcome["value"], time.monotonic() - started


@pytest.fixture
def hub_at(silent_hub, tmp_path, monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "ENDPOINT", silent_hub)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)   # whatever an earlier job of this process left
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", ETAG_TIMEOUT_S)
    return tmp_path / "hub"


@pytest.mark.parametrize("revision", [None, "v1", "a" * 40])
def test_a_silent_hub_ends_the_download_with_the_unreachable_line(hub_at, revision):
    """A branch, a tag, and a full commit (a search's pinned trial: no look-up
    of the commit, the hub's file listing first) each waited forever."""
    def download():
        return one_line_error(lambda: hub.download("some-org/tiny", revision))
    message, took = bounded(download)
    assert isinstance(message, str), message
    assert "the Hugging Face hub cannot be reached" in message and "pass model=DIR" in message
    assert took < ETAG_TIMEOUT_S + 8, took   # about the timeout set, not the hub's 10 s default


def test_a_silent_hub_reads_a_cached_model(hub_at, tmp_path):
    commit = "a" * 40
    snapshot = hub_at / "models--some-org--tiny" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (snapshot / name).write_text("{}")
    (hub_at / "models--some-org--tiny" / "refs").mkdir()
    (hub_at / "models--some-org--tiny" / "refs" / "main").write_text(commit)
    for revision in (None, commit):
        found, _ = bounded(lambda: hub.download("some-org/tiny", revision))
        assert found == snapshot, found


def test_quantize_of_a_hub_id_at_a_silent_hub_is_one_line_and_exit_2(silent_hub, tmp_path):
    """The user's own HF_HUB_ETAG_TIMEOUT is the bound; HF_HUB_OFFLINE unset."""
    import subprocess
    env = quantize_env({"HF_HOME": str(tmp_path / "empty-hf"), "HF_ENDPOINT": silent_hub,
                        "HF_HUB_ETAG_TIMEOUT": str(ETAG_TIMEOUT_S)})
    del env["HF_HUB_OFFLINE"]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    try:
        proc = subprocess.run(quantize_cmd("recipe=original", "model=some-org/some-model",
                                           f"artifacts_dir={tmp_path / 'artifacts'}"),
                              cwd=cwd, env=env, capture_output=True, text=True, timeout=HUNG_S + 60)
    except subprocess.TimeoutExpired:
        pytest.fail("quantize still waiting on the silent hub")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    line = last_line(proc.stderr)
    assert [l for l in proc.stderr.splitlines() if l.startswith("error:")] == [line]
    for words in ("some-org/some-model", "cannot be reached", "hf download some-org/some-model", "model=DIR"):
        assert words in line, line
    assert not (tmp_path / "artifacts").exists()
