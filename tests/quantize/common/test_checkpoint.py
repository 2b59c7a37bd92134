"""quantize.common.checkpoint.quantization_summary: what a manifest records
of a checkpoint's quantization, read from config.json alone."""
import json

from quantize.common.checkpoint import quantization_summary

W8A8 = {"weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                              "dynamic": True}}
FP8_KV = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False,
          "observer": "minmax"}


def write_config(path, quantization_config):
    config = {"model_type": "llama"} | ({"quantization_config": quantization_config} if quantization_config else {})
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_a_dense_checkpoint(tmp_path):
    summary = quantization_summary(write_config(tmp_path, None))
    assert summary.method is None and summary.format == "dense" and summary.schemes == ()
    # the manifest's JSON as quantbench has always written it for a dense checkpoint
    assert summary.to_dict() == {"method": None, "format": "dense", "schemes": []}


def test_the_kv_cache_scheme_is_recorded_when_present(tmp_path):
    q = {"quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
         "config_groups": {"group_0": W8A8}, "kv_cache_scheme": FP8_KV}
    summary = quantization_summary(write_config(tmp_path, q))
    assert summary.kv_cache == {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor",
                                "dynamic": False}
    assert summary.schemes[0].activations["strategy"] == "token"
    assert list(summary.to_dict()) == ["method", "format", "schemes", "ignore", "kv_cache"]


def test_no_kv_cache_key_without_a_kv_scheme(tmp_path):
    q = {"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"group_0": W8A8},
         "kv_cache_scheme": None}
    summary = quantization_summary(write_config(tmp_path, q))
    assert summary.kv_cache is None and "kv_cache" not in summary.to_dict()
