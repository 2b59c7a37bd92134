"""engine.args.tensor_parallel_size=auto (evaluate/engines/parallel.py): the
visible GPUs, down to the largest count vLLM can split the model into; 1 on a
CPU. Machines are simulated (injected facts), so these run on any host."""
import pytest
from hydra import compose, initialize_config_dir

from evaluate import pipeline
from evaluate.config import EvaluateConfig
from evaluate.engines import parallel
from evaluate.engines.vllm import VllmEngine
from evaluate.engines.vllm_server import VllmServerEngine
import quantize.common.machine
from quantize.common.config import expand_path_shorthands, register
from quantize.common.machine import Machine
from quantize.common.paths import CONF_DIR

SMOLLM2 = {"num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536}     # SmolLM2-135M
LLAMA_8B = {"num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336}  # Llama-3-8B
CPU = Machine("x86_64", frozenset({"avx2"}))
AUTO = {"tensor_parallel_size": "auto"}


def gpus(n: int) -> Machine:
    return Machine("x86_64", frozenset({"avx2"}), cuda=((9, 0),) * n, gpu_names=("NVIDIA H100",) * n)


@pytest.mark.parametrize("model, visible, expect", [
    (SMOLLM2, 1, 1), (SMOLLM2, 2, 1), (SMOLLM2, 4, 3), (SMOLLM2, 8, 3),  # 9 heads: 2, 4 and 8 do not divide them
    (LLAMA_8B, 1, 1), (LLAMA_8B, 2, 2), (LLAMA_8B, 4, 4), (LLAMA_8B, 8, 8),
])
def test_auto_is_the_most_visible_gpus_the_heads_split_across(model, visible, expect):
    assert parallel.resolve(AUTO, model, gpus(visible)) == {"tensor_parallel_size": expect}


@pytest.mark.parametrize("model", [SMOLLM2, LLAMA_8B])
def test_auto_is_one_rank_on_a_cpu(model):
    assert parallel.resolve(AUTO, model, CPU) == {"tensor_parallel_size": 1}
    assert parallel.resolve({"tensor_parallel_size": " AUTO "}, model, CPU) == {"tensor_parallel_size": 1}


def test_kv_heads_and_the_mlp_limit_auto_as_vllm_does():
    # 48 heads split 6 ways, but 8 KV heads and 6 ranks do not divide one another (QKVParallelLinear)
    assert parallel.resolve(AUTO, {"num_attention_heads": 48, "num_key_value_heads": 8}, gpus(6)) == \
        {"tensor_parallel_size": 4}
    # 16 KV heads on 32 ranks: each KV head replicated on 2 ranks
    assert parallel.resolve(AUTO, {"num_attention_heads": 64, "num_key_value_heads": 16}, gpus(32)) == \
        {"tensor_parallel_size": 32}
    # an MLP of 6 splits in 2, not 4
    assert parallel.resolve(AUTO, {"num_attention_heads": 4, "intermediate_size": 6}, gpus(4)) == \
        {"tensor_parallel_size": 2}
    # a multimodal config: the language model's heads
    assert parallel.resolve(AUTO, {"text_config": SMOLLM2}, gpus(4)) == {"tensor_parallel_size": 3}


def test_a_size_typed_out_is_left_as_it_is():
    for args in ({"tensor_parallel_size": 2}, {"tensor_parallel_size": None}, {}):
        assert parallel.resolve(args, SMOLLM2, gpus(8)) == {}


@pytest.mark.parametrize("model, tp, expect", [
    (SMOLLM2, 2, "engine.args.tensor_parallel_size=2 does not divide the model's 9 attention heads; "
                 "use one of 1, 3, or auto"),  # 9 would not divide its MLP (1536)
    ({"num_attention_heads": 48, "num_key_value_heads": 8}, 6,
     "engine.args.tensor_parallel_size=6 and the model's 8 KV heads do not divide one another; "
     "use one of 1, 2, 4, 8, 16, 24, or auto"),
    ({"num_attention_heads": 4, "intermediate_size": 6}, 4,
     "engine.args.tensor_parallel_size=4 does not divide the model's MLP size (6); use one of 1, 2, or auto"),
    (SMOLLM2, "two", "engine.args.tensor_parallel_size=two is not a count; use a whole number >= 1, or auto"),
    # int() made these 2 and 1: the error named a size not asked for, or vLLM got `true`
    (SMOLLM2, 2.5, "engine.args.tensor_parallel_size=2.5 is not a count; use a whole number >= 1, or auto"),
    (SMOLLM2, True, "engine.args.tensor_parallel_size=true is not a count; use a whole number >= 1, or auto"),
    (SMOLLM2, 0, "engine.args.tensor_parallel_size=0 is not a count; use a whole number >= 1, or auto"),
])
def test_a_size_vllm_would_refuse_is_one_line_naming_sizes_that_work(model, tp, expect):
    assert VllmEngine.config_problem(model, {"tensor_parallel_size": tp}) == expect


def test_sizes_vllm_takes_are_no_problem():
    for tp in (1, 3, "auto", None):
        assert VllmEngine.config_problem(SMOLLM2, {"tensor_parallel_size": tp}) is None
    assert VllmEngine.config_problem({}, {"tensor_parallel_size": 2}) is None  # heads unknown


@pytest.mark.parametrize("engine", [VllmEngine, VllmServerEngine])
def test_both_vllm_engines_resolve_auto_from_the_machine(engine, monkeypatch):
    monkeypatch.setattr(quantize.common.machine, "detect", lambda *a, **k: gpus(4))
    assert engine.resolve_args(AUTO, LLAMA_8B) == {"tensor_parallel_size": 4}
    monkeypatch.setattr(quantize.common.machine, "detect", lambda *a, **k: CPU)
    assert engine.resolve_args(AUTO, LLAMA_8B) == {"tensor_parallel_size": 1}


def planned(tiny_model, results_dir, tp: str):
    """The row fields `python -m evaluate engine=vllm engine.args.tensor_parallel_size=<tp>`
    would record on the tiny model (4 heads, 2 KV heads, MLP 256), as planned before the engine starts."""
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("evaluate", overrides=expand_path_shorthands([
            f"model={tiny_model}", "engine=vllm", f"engine.args.tensor_parallel_size={tp}", "accuracy=none",
            f"results_dir={results_dir}"]))
    job, _, _ = pipeline._plan(EvaluateConfig.from_cfg(cfg))
    return job.base


@pytest.mark.needs_vllm
def test_rows_record_the_size_that_runs_and_auto_shares_its_setup(tiny_model, tmp_path, monkeypatch):
    visible = {"gpus": 8}
    monkeypatch.setattr(quantize.common.machine, "detect", lambda *a, **k: gpus(visible["gpus"]))
    auto = planned(tiny_model, tmp_path, "auto")
    assert auto.engine_args["tensor_parallel_size"] == 4  # 8 GPUs, 4 heads
    typed = planned(tiny_model, tmp_path, "4")
    assert typed.engine_args["tensor_parallel_size"] == 4 and typed.setup_id == auto.setup_id
    visible["gpus"] = 2  # the same command in a job given 2 GPUs measures another setup
    fewer = planned(tiny_model, tmp_path, "auto")
    assert fewer.engine_args["tensor_parallel_size"] == 2 and fewer.setup_id != auto.setup_id
