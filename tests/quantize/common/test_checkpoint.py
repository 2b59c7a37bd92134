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


def write_sharded(folder, consolidated: bool = True, index: bool = True):
    """A two-shard checkpoint (8 + 4 bf16-sized params), optionally with the
    index and a consolidated copy of both shards, as Mistral repos ship."""
    import numpy as np
    from safetensors.numpy import save_file
    folder.mkdir(parents=True, exist_ok=True)
    shards = {"model-00001-of-00002.safetensors": {"model.layers.0.mlp.up_proj.weight": np.ones((2, 4), np.float16)},
              "model-00002-of-00002.safetensors": {"model.layers.1.mlp.up_proj.weight": np.ones((2, 2), np.float16)}}
    for name, tensors in shards.items():
        save_file(tensors, str(folder / name))
    if consolidated:
        save_file({k: v for tensors in shards.values() for k, v in tensors.items()},
                  str(folder / "consolidated.safetensors"))
    if index:
        weight_map = {k: name for name, tensors in shards.items() for k in tensors}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def test_with_an_index_the_weight_files_are_those_it_names(tmp_path):
    """A consolidated copy beside the shards is read by no loader: it must
    not count in the memory check nor in the weight hash of the artifact id."""
    from quantize.common.checkpoint import weight_files
    from quantize.common.fingerprint import sha256_files
    from quantize.common.memory_check import footprint
    model = write_sharded(tmp_path / "m")
    assert [p.name for p in weight_files(model)] == ["model-00001-of-00002.safetensors",
                                                     "model-00002-of-00002.safetensors"]
    assert footprint(model, "bfloat16").params == 12
    alone = write_sharded(tmp_path / "shards_only", consolidated=False)
    assert sha256_files(weight_files(model)) == sha256_files(weight_files(alone))


def test_without_an_index_every_safetensors_file_counts(tmp_path):
    from quantize.common.checkpoint import weight_files
    model = write_sharded(tmp_path / "m", index=False)
    assert [p.name for p in weight_files(model)] == ["consolidated.safetensors", "model-00001-of-00002.safetensors",
                                                     "model-00002-of-00002.safetensors"]
    assert weight_files(tmp_path / "empty") == []


def test_an_index_naming_a_missing_shard_or_unreadable_is_refused(tmp_path):
    import pytest

    from quantize.common.checkpoint import weight_files
    from quantize.common.errors import UserError
    model = write_sharded(tmp_path / "m", consolidated=False)
    (model / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(UserError, match=r"lacks 1 weight file\(s\) its model.safetensors.index.json names "
                                        r"\(model-00002-of-00002.safetensors\); re-copy"):
        weight_files(model)
    (model / "model.safetensors.index.json").write_text('["not", "an", "index"]')
    with pytest.raises(UserError, match="is not a safetensors index"):
        weight_files(model)


def test_a_sensitivity_file_is_matched_on_the_weight_files_it_was_measured_on(tmp_path):
    """quantize.sensitivity hashes weight_files; evaluate's kept_dense must
    hash the same files to find its measurement again."""
    from evaluate.search.kept_dense import _weights_hashes
    from quantize.common import fingerprint
    from quantize.common.checkpoint import weight_files
    model = write_sharded(tmp_path / "m")
    measured = fingerprint.compute(weight_files(model)).sha256
    assert _weights_hashes(str(model))(measured) == {measured}
