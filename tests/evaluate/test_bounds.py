"""Bounded by default: runs, batch size and a batch's tokens past
conf/evaluate.yaml `limits:` are one line naming the `limits.*` key that
allows them on purpose, and a context past the model's positions is refused
unless config.json declares rope scaling that covers it; all before any
engine starts, exit 2, nothing written."""
import json
import shutil
from types import SimpleNamespace

import pytest

from evaluate import results
from evaluate.limits import Limits
from evaluate.scenarios import Scenario
from evaluate.target import context_length
from quantize.common.errors import UserError
from tests.conftest import run_cli
from tests.evaluate.test_bad_inputs import assert_one_line_error

TINY_SCENARIO = ("scenario=interactive", "scenario.input_len=16", "scenario.output_len=4")


def evaluate(model, res, *args, cwd):
    return run_cli("evaluate", f"model={model}", "engine=hf", f"results_dir={res}", *args, cwd=cwd)


def assert_nothing_ran(proc, res):
    assert "starting" not in proc.stdout + proc.stderr  # no engine
    assert not res.exists() or not any(res.iterdir())


@pytest.mark.parametrize("args, expect", [
    (["runs=100000"], "runs=100000 is past limits.runs=100 runs per scenario; lower it, or pass limits.runs=100000"),
    (["runs=auto", "max_runs=5000"], "max_runs=5000 is past limits.runs=100"),
    (["scenario.batch_size=100000"], "batch_size=100000 is past limits.batch_size=1024; lower its batch_size, "
                                     "or pass limits.batch_size=100000 to run it on purpose"),
    (["scenario.batch_size=500", "limits.batch_tokens=5000"],
     "batch_size x (input_len + output_len) = 10000 tokens is past limits.batch_tokens=5000; lower "
     "its batch_size or lengths, or pass limits.batch_tokens=10000 to run it on purpose"),
], ids=["runs", "max_runs", "batch_size", "batch_tokens"])
def test_work_past_a_bound_is_one_line_naming_the_override(tiny_model, tmp_path, args, expect):
    res = tmp_path / "res"
    out = evaluate(tiny_model, res, *TINY_SCENARIO, *args, cwd=tmp_path)
    assert_one_line_error(out, expect)
    assert_nothing_ran(out, res)


def test_an_explicit_limit_allows_the_work_on_purpose(tiny_model, tmp_path):
    res = tmp_path / "res"
    out = evaluate(tiny_model, res, *TINY_SCENARIO, "scenario.batch_size=2", "limits.batch_size=2",
                   "limits.batch_tokens=40", "accuracy=none", "runs=1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [r.status for r in results.read(res)] == ["ok"]


def held(kv_itemsize: int, weight_bytes: int, remote: bool = False):
    """An engine that holds KV elements of `kv_itemsize` bytes and weights of `weight_bytes`."""
    return SimpleNamespace(remote=remote, kv_itemsize=lambda fmt, args: kv_itemsize,
                           weight_bytes=lambda target, args: weight_bytes)


def test_batch_tokens_auto_follow_memory_and_the_models_kv_layout():
    """A 7B-shaped model (128 KiB of KV per token, 14 GB of weights) on a
    machine of 32 GiB: the KV cache beside the weights in 80 % of it holds
    102,903 tokens, so a batch of 128 x 1,024 is refused and 8 x 1,024 is not."""
    target = SimpleNamespace(config={"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                                     "head_dim": 128}, format=None)
    machine, args = SimpleNamespace(cuda=()), {"dtype": "bfloat16"}
    engine, remote = held(2, 14 * 10**9), held(2, 14 * 10**9, remote=True)
    limits = Limits(runs=None, batch_size=None, batch_tokens="auto")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("evaluate.limits.rank_memory_bytes", lambda cuda: 32 * 2**30)
        limits.check_batch_tokens([Scenario("fits", 8, 1000, 24)], target, args, machine, engine)
        with pytest.raises(UserError, match=r"= 131072 tokens is past limits.batch_tokens=auto \(102903 tokens: the "
                                            r"KV cache that fits beside the weights in 80% of this machine's memory"):
            limits.check_batch_tokens([Scenario("big", 128, 1000, 24)], target, args, machine, engine)
        # a server quantbench cannot see: this machine's memory bounds nothing
        limits.check_batch_tokens([Scenario("big", 128, 1000, 24)], target, args, machine, remote)


def test_batch_tokens_auto_count_the_engines_kv_bytes_and_on_a_cpu_every_rank():
    """The same 7B shape: an fp8 KV cache (1 byte, as vLLM sizes it) holds twice
    the tokens, which the bound read at 2 bytes refused; on a CPU, tensor
    parallel ranks share one memory, so two hold as many tokens as one (the
    bound grew with the size: 156,309 tokens at 1, 366,024 at 2)."""
    from evaluate.engines.vllm import VllmEngine
    from evaluate.formats import W8A8_INT8, CheckpointFormat
    from evaluate.limits import tokens_in_memory
    target = SimpleNamespace(config={"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                                     "head_dim": 128}, format=None)
    cpu, gpu = SimpleNamespace(cuda=()), SimpleNamespace(cuda=("H100",))
    kv8 = CheckpointFormat(W8A8_INT8, method="compressed-tensors", kv_cache="fp8")
    assert VllmEngine.kv_itemsize(kv8, {"dtype": "bfloat16"}) == 1
    assert VllmEngine.kv_itemsize(CheckpointFormat(W8A8_INT8), {"dtype": "bfloat16"}) == 2
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("evaluate.limits.rank_memory_bytes", lambda cuda: 32 * 2**30)
        one, fp8 = (tokens_in_memory(target, {"dtype": "bfloat16"}, cpu, held(size, 7 * 10**9)) for size in (2, 1))
        assert fp8 == pytest.approx(2 * one, abs=2)
        two_ranks = tokens_in_memory(target, {"dtype": "bfloat16", "tensor_parallel_size": 2}, cpu, held(2, 7 * 10**9))
        assert two_ranks == one                    # the ranks split the KV heads within one memory
        on_gpus = tokens_in_memory(target, {"dtype": "bfloat16", "tensor_parallel_size": 2}, gpu, held(2, 7 * 10**9))
        assert on_gpus > 2 * one                  # each GPU holds half the weights and half the KV heads


def test_a_bad_limit_is_one_line(tiny_model, tmp_path):
    out = evaluate(tiny_model, tmp_path / "res", *TINY_SCENARIO, "limits.runs=0", cwd=tmp_path)
    assert_one_line_error(out, "limits.runs=0: pass an integer >= 1, or null for no bound")


@pytest.mark.parametrize("values", [{"runs": "many"}, {"batch_size": True}, {"batch_tokens": -1}])
def test_every_limit_takes_a_positive_integer_or_null(values):
    with pytest.raises(UserError, match=r"limits\.\w+=\S+: pass an integer >= 1"):
        Limits.from_group(values)
    assert Limits.from_group({"runs": None, "batch_tokens": "auto"}) == Limits(None, None, "auto")


# ---------------------------------------------------------------- the model's positions

def test_max_model_len_past_the_models_positions_is_refused_before_any_engine(tiny_model, tmp_path):
    """The tiny model has 1024 positions: a longer max_model_len once made hf
    measure tokens on positions the model never learned and record them ok."""
    res = tmp_path / "res"
    out = evaluate(tiny_model, res, "scenario=interactive", "scenario.input_len=1500", "scenario.output_len=4",
                   "engine.args.max_model_len=2000", "accuracy=none", cwd=tmp_path)
    assert_one_line_error(out, "engine.args.max_model_len=2000 is past the 1024 positions of tiny-llama",
                          "declares rope_scaling")
    assert_nothing_ran(out, res)


@pytest.mark.parametrize("args, expect", [
    (["scenario.input_len=1500"], "1504 tokens but max_model_len is 1024; choose a shorter scenario: the model has "
                                  "1024 positions"),
    (["scenario.input_len=600", "engine.args.max_model_len=512"],
     "604 tokens but max_model_len is 512; choose a shorter scenario, or raise engine.args.max_model_len to 604 "
     "(at most 1024)"),
], ids=["past_the_positions", "past_max_model_len"])
def test_a_scenario_too_long_names_a_fix_within_the_models_positions(tiny_model, tmp_path, args, expect):
    res = tmp_path / "res"
    out = evaluate(tiny_model, res, "scenario=interactive", "scenario.output_len=4", "accuracy=none", *args,
                   cwd=tmp_path)
    assert_one_line_error(out, expect)
    assert_nothing_ran(out, res)


def test_rope_scaling_that_covers_the_context_is_measured(tiny_model, tmp_path):
    model = shutil.copytree(tiny_model, tmp_path / "tiny-llama-rope")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}))
    res = tmp_path / "res"
    out = evaluate(model, res, "scenario=interactive", "scenario.input_len=1500", "scenario.output_len=4",
                   "engine.args.max_model_len=2048", "accuracy=none", "runs=1", "warmup_runs=0", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [(r.status, r.input_len) for r in results.read(res)] == [("ok", 1500)]


@pytest.mark.parametrize("config, positions", [
    ({"max_position_embeddings": 8192}, 8192),
    ({"max_position_embeddings": 8192, "rope_scaling": None}, 8192),
    ({"max_position_embeddings": 8192, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, 8192),
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}}, 8192),
    # Llama 3.1: max_position_embeddings already counts the scaled context
    ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                          "original_max_position_embeddings": 8192}}, 131072),
    # Qwen2.5 with YaRN added: 4 x the original 32768
    ({"max_position_embeddings": 32768, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                         "original_max_position_embeddings": 32768}}, 131072),
    ({"text_config": {"max_position_embeddings": 2048}}, 2048),
    ({}, None),
], ids=["plain", "null", "default", "linear", "llama3", "yarn", "text_config", "unsaid"])
def test_the_models_context_counts_declared_rope_scaling(config, positions):
    assert context_length(config) == positions
