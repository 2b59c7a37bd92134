"""engine=openai takes the server's address with or without /v1 (`vllm bench
serve --base-url` takes it without): both reach /v1/models and
/v1/completions of a real OpenAI-compatible HTTP server (the serving tests'
fake server, in its own process)."""
import pytest

from evaluate.engines.openai import OpenAIEngine, check_base_url
from quantize.common.errors import UserError
from tests.conftest import tail
from tests.evaluate.serving import test_run as serving
from tests.evaluate.serving.conftest import FakeServer


@pytest.fixture
def server():
    started = FakeServer("--fixed-ms", "2")
    yield started
    started.stop()


@pytest.mark.parametrize("typed,api", [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1"),
    ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1"),
    ("http://[::1]:8000", "http://[::1]:8000/v1"),
    ("http://localhost:8000/proxy/v1", "http://localhost:8000/proxy/v1"),  # a path is kept as given
])
def test_a_bare_server_address_gets_the_api_path(typed, api):
    assert check_base_url(typed, False) == api


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_each_spelling_reaches_v1_models(server, suffix):
    with OpenAIEngine(None, {}, {}, max_model_len=128,
                      settings={"base_url": f"http://127.0.0.1:{server.port}{suffix}"}) as engine:
        assert engine.base_url == f"http://127.0.0.1:{server.port}/v1"
        assert engine.model == "fake-model"  # the name only /v1/models gives


def test_evaluate_benchmarks_a_server_given_without_v1(tmp_path, tiny_model, server):
    proc = serving.evaluate(tmp_path, tiny_model, "engine=openai", f"engine.base_url=http://127.0.0.1:{server.port}",
                            "load=synchronous", "load.max_requests=3")
    assert proc.returncode == 0, tail(proc)
    (row,) = serving.rows(tmp_path)
    assert (row["engine"], row["status"], row["metrics"]["completed"]) == ("openai", "ok", 3)
    assert server.stats()["requests"] == 3  # the completions reached /v1/completions


def test_a_path_the_server_lacks_is_still_one_line_naming_it(server):
    url = f"http://127.0.0.1:{server.port}/v2"
    with pytest.raises(UserError, match=f"engine.base_url={url}: HTTP 404 at {url}/models; start the server"):
        OpenAIEngine(None, {}, {}, max_model_len=128, settings={"base_url": url})
