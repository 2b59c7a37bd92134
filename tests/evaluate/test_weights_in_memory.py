"""limits.batch_tokens=auto counts the weights as the engine holds them, not
their size on disk: a bf16 checkpoint that engine=hf computes in float32 (a
CPU without native bf16) takes twice its files, and hf decompresses
compressed-tensors weights to dense, where vLLM keeps them packed."""
import json
import shutil

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file, save_file

from evaluate import pipeline
from evaluate.config import EvaluateConfig
from evaluate.engines.hf import HfEngine
from evaluate.engines.vllm import VllmEngine
from evaluate.formats import W4A16
from evaluate.target import from_path
import quantize.common.machine
from quantize.common.config import expand_path_shorthands, register
from quantize.common.errors import UserError
from quantize.common.machine import Machine
from quantize.common.paths import CONF_DIR

AVX2 = Machine("x86_64", frozenset({"avx2"}))                                          # hf auto: float32
EPYC = Machine("x86_64", frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}))  # hf auto: bfloat16
W4A16_CONFIG = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                    "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128}}}}


def stored_bytes(tensors: dict, dtype=None) -> int:
    return sum(t.numel() * (dtype.itemsize if dtype and t.is_floating_point() else t.element_size())
               for t in tensors.values())


def test_dense_weights_count_at_the_compute_dtype(tiny_model):
    target = from_path(tiny_model)
    tensors = load_file(tiny_model / "model.safetensors")
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    for engine in (HfEngine, VllmEngine):
        assert engine.weight_bytes(target, {"dtype": "bfloat16"}) == stored_bytes(tensors)
        assert engine.weight_bytes(target, {"dtype": "float32"}) == 2 * stored_bytes(tensors)


def test_hf_holds_compressed_weights_decompressed_and_vllm_packed(tiny_model, tmp_path):
    """A W4A16 checkpoint in compressed-tensors' pack-quantized layout: each
    Linear of the decoder as 8 int4 per int32, a bf16 scale per group of 128
    and its dense shape."""
    dense = load_file(tiny_model / "model.safetensors")
    packed = {}
    for name, weight in dense.items():
        if ".layers." in name and name.endswith("_proj.weight"):
            module, (out, inp) = name.removesuffix(".weight"), weight.shape
            packed |= {f"{module}.weight_packed": torch.zeros(out, inp // 8, dtype=torch.int32),
                       f"{module}.weight_scale": torch.ones(out, inp // 128, dtype=torch.bfloat16),
                       f"{module}.weight_shape": torch.tensor([out, inp])}
        else:
            packed[name] = weight
    model = tmp_path / "w4a16"
    model.mkdir()
    save_file(packed, model / "model.safetensors")
    config = json.loads((tiny_model / "config.json").read_text()) | {"quantization_config": W4A16_CONFIG}
    (model / "config.json").write_text(json.dumps(config))
    target = from_path(model)
    assert target.format.scheme == W4A16
    scales = stored_bytes({k: v for k, v in packed.items() if k.endswith("weight_scale")})
    assert HfEngine.weight_bytes(target, {"dtype": "bfloat16"}) == stored_bytes(dense) + scales
    assert HfEngine.weight_bytes(target, {"dtype": "float32"}) == 2 * (stored_bytes(dense) + scales)
    assert VllmEngine.weight_bytes(target, {"dtype": "bfloat16"}) == stored_bytes(packed)
    assert VllmEngine.weight_bytes(target, {"dtype": "float32"}) == stored_bytes(packed, torch.float32)


def plan(model, results_dir):
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("evaluate", overrides=expand_path_shorthands([
            f"model={model}", "engine=hf", "engine.args.device=cpu", "accuracy=none", "scenario=interactive",
            "scenario.input_len=16", "scenario.output_len=4", f"results_dir={results_dir}"]))
    return pipeline._plan(EvaluateConfig.from_cfg(cfg))


def test_auto_refuses_a_batch_beside_weights_hf_doubles_to_float32(tiny_model, tmp_path, monkeypatch):
    """Memory where 80 % holds the bf16 weights one and a half times: beside
    them the batch fits; beside the float32 weights hf computes in on a CPU
    without native bf16, nothing does."""
    on_disk = from_path(tiny_model).model_bytes
    monkeypatch.setattr("evaluate.limits.rank_memory_bytes", lambda cuda: int(1.5 * on_disk / 0.8))
    monkeypatch.setattr(quantize.common.machine, "detect", lambda *a, **k: EPYC)
    job, _, _ = plan(tiny_model, tmp_path / "res")
    assert job.base.engine_args["dtype"] == "bfloat16"
    monkeypatch.setattr(quantize.common.machine, "detect", lambda *a, **k: AVX2)
    with pytest.raises(UserError, match=r"is past limits.batch_tokens=auto \(0 tokens: the KV cache that fits"):
        plan(tiny_model, tmp_path / "res")
    assert not (tmp_path / "res").exists() or not any((tmp_path / "res").iterdir())
