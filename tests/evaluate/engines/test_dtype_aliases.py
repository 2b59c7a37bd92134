"""torch's dtype aliases (half, float, double), which engine.args.dtype
takes, count at their dtype's width in the memory bounds."""
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import save_file

from evaluate.engines.base import weights_in_memory
from evaluate.engines.vllm import VllmEngine
from evaluate.formats import W8A8_INT8, CheckpointFormat
from quantize.common.dtypes import dtype_name
from quantize.common.memory_check import dtype_width, wider

PARAMS = 1000


@pytest.fixture
def checkpoint(tmp_path):
    save_file({"model.layers.0.mlp.weight": np.zeros((10, 100), np.float16)}, str(tmp_path / "model.safetensors"))
    return tmp_path


@pytest.mark.parametrize("alias, width", [("half", 2), ("float16", 2), ("bfloat16", 2), ("float", 4),
                                          ("float32", 4), ("double", 8), ("float64", 8)])
def test_weights_count_at_the_aliased_dtypes_width(checkpoint, alias, width):
    assert weights_in_memory(checkpoint, alias) == PARAMS * width
    assert VllmEngine.weight_bytes(SimpleNamespace(path=checkpoint), {"dtype": alias}) == PARAMS * width
    assert dtype_width(alias) == width


def test_an_alias_is_named_as_torch_names_its_dtype():
    assert [dtype_name(a) for a in ("half", "float", "double", "bfloat16", "auto", None)] == \
           ["float16", "float32", "float64", "bfloat16", None, None]
    assert wider("half", "double") == "double"


@pytest.mark.parametrize("alias, itemsize", [("float", 4), ("float32", 4), ("half", 2), ("bfloat16", 2)])
def test_the_kv_cache_counts_the_model_dtypes_width(alias, itemsize):
    assert VllmEngine.kv_itemsize(CheckpointFormat(W8A8_INT8), {"dtype": alias}) == itemsize


def test_the_fp8_rule_reads_an_alias_as_its_dtype():
    """vLLM's AMX FP8 block kernel writes bf16 or float32: float is float32, half is float16."""
    from evaluate.capabilities import KNOWN_MACHINES, decide
    from evaluate.formats import classify
    from tests.evaluate.engines.test_vllm_fp8_cpu import compressed_tensors
    fmt = classify(compressed_tensors("FP8_BLOCK"))
    assert decide("vllm", fmt, KNOWN_MACHINES["amx"], {"dtype": "float"})[0]
    assert not decide("vllm", fmt, KNOWN_MACHINES["amx"], {"dtype": "half"})[0]


def test_hfs_kv_cache_counts_the_model_dtypes_width():
    from evaluate.engines.hf import HfEngine
    assert HfEngine.kv_itemsize(CheckpointFormat(W8A8_INT8), {"dtype": "float"}) == 4
