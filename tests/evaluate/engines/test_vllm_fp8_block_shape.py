"""vLLM's compressed-tensors FP8 block loader fails the start where a merged
layer's part (q, k of qkv_proj; gate of gate_up_proj) is not a multiple of
the block's N outputs; the rule refuses such a model, on CPU and CUDA alike."""
import json

import pytest

from evaluate import probe
from evaluate.capabilities import KNOWN_MACHINES, decide
from evaluate.formats import FP8, FP8_BLOCK, CheckpointFormat, classify
from tests.evaluate.engines.test_vllm_fp8_cpu import compressed_tensors

SMOLLM2 = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536}
EVEN = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 32,
        "intermediate_size": 256}


def block_model(sizes: dict) -> dict:
    return compressed_tensors("FP8_BLOCK") | sizes


@pytest.mark.parametrize("machine", ["amx", "cuda_sm90"])
def test_a_model_whose_merged_parts_are_not_multiples_of_the_block_is_refused(machine):
    verdict, _ = decide("vllm", classify(block_model(SMOLLM2)), KNOWN_MACHINES[machine])
    assert not verdict and "(q 576, k/v 192)" in verdict.reason and "multiple of the block's 128" in verdict.reason
    assert "fp8_dynamic" in verdict.reason
    assert decide("vllm", classify(block_model(EVEN)), KNOWN_MACHINES[machine])[0]


def test_the_shape_is_named_before_a_dtype_whose_fix_it_would_refuse_next():
    """An fp16 block checkpoint on AMX was told to use bfloat16, which then
    met the shape refusal: the reason that no setting gets past comes first."""
    verdict, _ = decide("vllm", classify(block_model(SMOLLM2)), KNOWN_MACHINES["amx"], {"dtype": "float16"})
    assert not verdict and "(q 576, k/v 192)" in verdict.reason and "bfloat16" not in verdict.reason


def test_the_mlp_and_tensor_parallel_ranks_count():
    mlp = block_model(EVEN | {"intermediate_size": 320})
    assert "(gate/up 320)" in decide("vllm", classify(mlp), KNOWN_MACHINES["cuda_sm90"])[0].reason
    wide = block_model(EVEN | {"hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 8,
                               "intermediate_size": 384})
    assert decide("vllm", classify(wide), KNOWN_MACHINES["cuda_sm90"], {"tensor_parallel_size": 1})[0]
    verdict = decide("vllm", classify(wide), KNOWN_MACHINES["cuda_sm90"], {"tensor_parallel_size": 2})[0]
    assert not verdict and "(gate/up 192 per rank of 2)" in verdict.reason


def test_vllms_own_fp8_block_format_is_let_through():
    """linear.py, _maybe_allow_fp8_block_shape_mismatch: a config with weight_block_size skips the check."""
    config = {"dtype": "bfloat16", "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                                           "weight_block_size": [128, 128]}} | SMOLLM2
    assert decide("vllm", classify(config), KNOWN_MACHINES["amx"])[0]


@pytest.mark.parametrize("sizes", [SMOLLM2, EVEN, EVEN | {"num_key_value_heads": 2},
                                   EVEN | {"intermediate_size": 320}, {**SMOLLM2, "head_dim": 128}])
def test_the_rule_refuses_where_vllms_shape_check_fails(sizes, monkeypatch):
    """validate_fp8_block_shape, as create_weights calls it for qkv_proj and gate_up_proj (one rank)."""
    import types
    pytest.importorskip("vllm")
    monkeypatch.setattr("vllm.distributed.get_tensor_model_parallel_world_size", lambda: 1)
    from vllm.model_executor.layers.quantization.utils.fp8_utils import validate_fp8_block_shape
    parts = classify(block_model(sizes)).merged_parts
    layers = [[parts["q"], parts["k/v"], parts["k/v"]], [parts["gate/up"]] * 2]
    fails = False
    for outputs in layers:
        try:
            validate_fp8_block_shape(types.SimpleNamespace(tp_size=1), sizes["hidden_size"], sum(outputs),
                                     sizes["hidden_size"], outputs, [128, 128])
        except ValueError:
            fails = True
    assert fails is not bool(decide("vllm", classify(block_model(sizes)), KNOWN_MACHINES["amx"])[0])


def test_the_probes_block_cell_builds_a_model_vllm_loads(tmp_path, tokenizer_dir):
    fmt = CheckpointFormat(FP8, fp8=FP8_BLOCK)
    model = probe.checkpoint(fmt, tmp_path, tokenizer_dir)
    config = json.loads((model / "config.json").read_text())
    assert classify(config).fp8 == FP8_BLOCK
    assert all(size % 128 == 0 for size in classify(config).merged_parts.values())
    assert decide("vllm", classify(config), KNOWN_MACHINES["amx"])[0]
    assert decide("vllm", classify(config), KNOWN_MACHINES["cuda_sm90"])[0]
