"""The HTTP engines' registration and pure parts: vllm_server answers
capability questions as vllm does, its args become the server's flags, and
the openai engine's address rules."""
import subprocess
import sys
from types import SimpleNamespace

import pytest

from evaluate import engines
from evaluate.engines.http import HttpEngine, as_timing
from evaluate.engines.openai import OpenAIEngine
from evaluate.engines.http import is_loopback
from evaluate.engines.openai import check_base_url
from evaluate.engines.vllm import VllmEngine
from evaluate.engines.vllm_server import VllmServerEngine, cli_flags, last_error_line
from quantize.common.errors import UserError


def test_server_engines_are_shipped_but_not_capability_table_columns():
    assert engines.known() == ["hf", "vllm"]
    assert engines.known(servers=True) == ["hf", "openai", "vllm", "vllm_server"]
    for name in ("openai", "vllm_server"):
        cls = engines.get(name)
        assert cls.name == name and cls.serves_http


def test_both_server_engines_share_the_http_room_and_openai_needs_no_vllm_module():
    assert issubclass(VllmServerEngine, HttpEngine) and issubclass(OpenAIEngine, HttpEngine)
    loaded = subprocess.run([sys.executable, "-c", "import sys, evaluate.engines.openai; "
                             "print(sorted(m for m in sys.modules if 'vllm' in m))"],
                            capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_a_streamed_request_puts_the_servers_extra_tokens_on_its_last_chunk():
    class Streamed:
        sent, prompt_tokens, generated_tokens, chunk_times = 1.0, 8, 5, [1.1, 1.2, 1.3]
    timing = as_timing(Streamed())
    assert timing.chunks == [(1.1, 1), (1.2, 1), (1.3, 3)] and timing.start == 1.0 and timing.prompt_tokens == 8


@pytest.mark.needs_vllm
def test_vllm_server_takes_and_decides_what_vllm_does():
    assert VllmServerEngine.accepted_args() == VllmEngine.accepted_args()
    server, inproc = engines.config("vllm_server"), engines.config("vllm")
    assert server["args"] == inproc["args"] and server["env"] == inproc["env"]
    assert server["host"] == "127.0.0.1"
    assert VllmServerEngine.supports is VllmEngine.supports and VllmServerEngine.choose_dtype is VllmEngine.choose_dtype
    assert VllmServerEngine.prepare_env({"VLLM_CPU_NUM_OF_RESERVED_CPU": None}) == \
        VllmEngine.prepare_env({"VLLM_CPU_NUM_OF_RESERVED_CPU": None})


def test_engine_args_become_server_flags():
    flags = cli_flags({"max_model_len": 512, "enforce_eager": False, "enable_prefix_caching": True,
                       "dtype": "bfloat16", "seed": None, "hf_overrides": {"a": 1}})
    assert flags == ["--max-model-len", "512", "--no-enforce-eager", "--enable-prefix-caching",
                     "--dtype", "bfloat16", "--hf-overrides", '{"a": 1}']


@pytest.mark.parametrize("host,loop", [("127.0.0.1", True), ("127.8.9.10", True), ("localhost", True),
                                       ("::1", True), ("10.0.0.1", False), ("192.0.2.1", False),
                                       ("example.org", False), ("0.0.0.0", False)])
def test_loopback_addresses(host, loop):
    assert is_loopback(host) is loop


def test_base_url_rules():
    assert check_base_url("http://127.0.0.1:8000/v1/", False) == "http://127.0.0.1:8000/v1"
    assert check_base_url("http://[::1]:8000/v1", False) == "http://[::1]:8000/v1"
    assert check_base_url("http://10.0.0.1:8000/v1", True) == "http://10.0.0.1:8000/v1"
    with pytest.raises(UserError, match="engine.allow_remote=true"):
        check_base_url("http://10.0.0.1:8000/v1", False)
    with pytest.raises(UserError, match="not an http"):
        check_base_url("127.0.0.1:8000", False)
    with pytest.raises(UserError, match="engine.base_url="):
        check_base_url(None, False)


def test_the_log_line_that_says_why_the_server_stopped(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("INFO starting\nValueError: max_model_len 99999 is too long\nINFO shutting down\n")
    assert last_error_line(log) == "ValueError: max_model_len 99999 is too long"
    log.write_text("INFO a\nINFO b\n")
    assert last_error_line(log) == "INFO b"
    assert last_error_line(tmp_path / "missing.log") == "no log"


def test_the_server_ignores_the_models_generation_config_as_engine_vllm_does(tmp_path):
    """Without `--generation-config vllm` vLLM's server samples with the
    defaults of the model's generation_config.json, engine=vllm never does."""
    engine = VllmServerEngine.__new__(VllmServerEngine)
    engine.args = {"dtype": "bfloat16", "seed": 0}
    cmd = engine.command(SimpleNamespace(path=tmp_path), "127.0.0.1", 8000)
    assert cmd[cmd.index("--generation-config") + 1] == "vllm"
