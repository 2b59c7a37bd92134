"""quantize.common.checkpoint.quantization_summary: what a manifest records
of a checkpoint's quantization, read from config.json alone."""
import json

from quantize.common.checkpoint import quantization_summary
from tests.conftest import w4_rtn_recipe

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


TWO_GROUPS = w4_rtn_recipe(64) + """\
        group_1:
          targets: ["re:.*down_proj$"]
          weights: {num_bits: 8, type: int, symmetric: true, strategy: channel}
"""


def test_the_planned_config_keeps_every_group_of_a_modifier(tmp_path):
    """Capability planning reads the planned groups: a modifier's second group
    (down_proj at int8 beside int4 elsewhere) must not replace its first."""
    from quantize.common.checkpoint import planned_quantization_config
    recipe = tmp_path / "two_groups.yaml"
    recipe.write_text(TWO_GROUPS)
    groups = planned_quantization_config(recipe)["config_groups"]
    assert [(g["targets"], g["weights"]["num_bits"]) for g in groups.values()] == [
        (["Linear"], 4), (["re:.*down_proj$"], 8)]
