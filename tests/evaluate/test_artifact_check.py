"""The artifact is checked, not trusted: before any engine starts, evaluate
recomputes the weights' fingerprint and compares it with the manifest's
(verify=fingerprint; verify=full hashes every byte), and refuses a
checkpoint that lacks a parameter its config.json implies. Each refusal is
one line, exit 2, nothing written. Artifacts come from the real quantize
stage (tests/conftest.py build_artifact); each test damages its own copy."""
import json
import logging
import shutil
import struct

import pytest

from evaluate import target
from evaluate.target import TargetConfig
from quantize.common import fingerprint
from quantize.common.errors import UserError
from tests.conftest import TINY_NAME, last_line, run_cli, sha256_files_by_hand

SMALL_SCENARIO = ("scenario=interactive", "scenario.input_len=16", "scenario.output_len=4")


@pytest.fixture
def artifacts(build_artifact, tmp_path):
    """Private copies of the tiny model's `original` and `w4a16_rtn`
    artifacts, side by side as quantize lays them out."""
    root = tmp_path / "artifacts" / TINY_NAME
    return {r: shutil.copytree(build_artifact(r).dir, root / r) for r in ("original", "w4a16_rtn")}


def manifest_of(path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def open_target(path, verify="fingerprint"):
    """What evaluate opens for model=<path>, checked as it checks it."""
    return target.load(TargetConfig(model_name=None, model_path=str(path), verify=verify))


def evaluate(model, res, *args, cwd):
    return run_cli("evaluate", f"model={model}", *SMALL_SCENARIO, f"results_dir={res}", *args, cwd=cwd)


def assert_refused(proc, res, *expect: str) -> str:
    """One line naming `expect`, exit 2, no engine started, nothing written."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "starting vLLM" not in proc.stdout + proc.stderr
    line = last_line(proc.stderr)
    for text in expect:
        assert text in line, line
    assert not res.exists() or not any(res.iterdir())
    return line


def drop_tensors(path, *names: str) -> None:
    from safetensors.torch import load_file, save_file
    weights = path / "model.safetensors"
    tensors = load_file(weights)
    for name in names:
        del tensors[name]
    save_file(tensors, weights, metadata={"format": "pt"})


def as_plain_checkpoint(path):
    """The artifact's files without its manifest: what a hub download looks like."""
    (path / "manifest.json").unlink()
    return path


# ---------------------------------------------------------------- the fingerprint

def test_a_manifest_copied_from_another_artifact_is_refused(artifacts, tmp_path):
    original, w4 = artifacts["original"], artifacts["w4a16_rtn"]
    w4_weights = manifest_of(w4)["weights_fingerprint"]["sha256"][:16]  # what the weights really are
    shutil.copy(original / "manifest.json", w4 / "manifest.json")
    res = tmp_path / "res"
    line = assert_refused(evaluate(w4, res, cwd=tmp_path), res,
                          f"names artifact {manifest_of(original)['artifact_id']} ({TINY_NAME}/original)",
                          f"fingerprint {w4_weights}", "model.safetensors lists other tensors", "force=true")
    assert line.startswith("error: ")


def test_weights_copied_from_another_artifact_name_both_artifacts(artifacts):
    original, w4 = artifacts["original"], artifacts["w4a16_rtn"]
    shutil.copy(original / "model.safetensors", w4 / "model.safetensors")
    with pytest.raises(UserError) as e:
        open_target(w4)
    assert f"names artifact {manifest_of(w4)['artifact_id']}" in str(e.value)
    assert f"those of artifact {manifest_of(original)['artifact_id']} ({original})" in str(e.value)


def test_a_tensor_removed_from_an_artifact_changes_its_header(artifacts):
    w4 = artifacts["w4a16_rtn"]
    drop_tensors(w4, "model.layers.1.mlp.up_proj.weight_packed")
    with pytest.raises(UserError, match="lists other tensors"):
        open_target(w4)


def test_verify_full_sees_a_change_between_the_samples(artifacts, tmp_path):
    w4 = artifacts["w4a16_rtn"]
    weights = w4 / "model.safetensors"
    data = bytearray(weights.read_bytes())
    start = 8 + struct.unpack("<Q", data[:8])[0]
    offsets = fingerprint.sample_offsets(start, len(data))
    between = offsets[5] + fingerprint.BLOCK_BYTES + 100
    assert between < offsets[6]
    data[between] ^= 0x01
    weights.write_bytes(bytes(data))
    assert open_target(w4).artifact_id == manifest_of(w4)["artifact_id"]  # the sample cannot see it
    res = tmp_path / "res"
    assert_refused(evaluate(w4, res, "verify=full", cwd=tmp_path), res,
                   "the SHA-256 of every byte differs", f"names artifact {manifest_of(w4)['artifact_id']}")


def test_intact_artifacts_pass_and_verify_false_trusts_the_files(artifacts):
    original, w4 = artifacts["original"], artifacts["w4a16_rtn"]
    for path in (original, w4):  # quantize recorded the fingerprint of the files it wrote
        recorded = manifest_of(path)["weights_fingerprint"]
        assert recorded["full_sha256"] == sha256_files_by_hand(path.glob("*.safetensors"))
        assert recorded["files"]["model.safetensors"]["bytes"] == (path / "model.safetensors").stat().st_size
        assert open_target(path).artifact_id == manifest_of(path)["artifact_id"]
        assert open_target(path, verify="full").artifact_id == manifest_of(path)["artifact_id"]
    shutil.copy(original / "manifest.json", w4 / "manifest.json")
    assert open_target(w4, verify=None).artifact_id == manifest_of(original)["artifact_id"]


def test_manifests_without_a_fingerprint_keep_working(artifacts, caplog):
    """Written before fingerprints: the weight bytes the manifest records
    are checked, and the tensors against the architecture."""
    original, w4 = artifacts["original"], artifacts["w4a16_rtn"]
    for path in (original, w4):
        old = manifest_of(path)
        del old["weights_fingerprint"]
        (path / "manifest.json").write_text(json.dumps(old))
    assert open_target(w4).artifact_id == manifest_of(w4)["artifact_id"]
    with caplog.at_level(logging.WARNING):
        assert open_target(w4, verify="full").artifact_id == manifest_of(w4)["artifact_id"]
    assert "predates weight fingerprints" in caplog.text
    shutil.copy(original / "manifest.json", w4 / "manifest.json")
    with pytest.raises(UserError, match=r"they hold \d+ bytes, the manifest records \d+"):
        open_target(w4)


def test_a_bad_verify_value_is_one_line(tmp_path, tiny_model):
    res = tmp_path / "res"
    assert_refused(evaluate(tiny_model, res, "verify=sometimes", cwd=tmp_path), res,
                   "verify=sometimes", "verify=fingerprint", "verify=full", "verify=false")


# ---------------------------------------------------------------- completeness

def test_a_checkpoint_missing_a_parameter_is_refused(artifacts, tmp_path):
    plain = as_plain_checkpoint(artifacts["original"])
    drop_tensors(plain, "model.layers.1.mlp.up_proj.weight", "model.norm.weight")
    res = tmp_path / "res"
    assert_refused(evaluate(plain, res, cwd=tmp_path), res,
                   "lacks 2 parameter(s) its config.json implies: model.layers.1.mlp.up_proj.weight, "
                   "model.norm.weight", "verify=false")


def test_quantized_tensors_stand_for_their_parameter(artifacts):
    """compressed-tensors stores weight_packed (+ scale, zero point, shape)
    for a quantized Linear's weight; a scale alone stands for nothing."""
    plain = as_plain_checkpoint(artifacts["w4a16_rtn"])
    open_target(plain)
    drop_tensors(plain, "model.layers.0.self_attn.q_proj.weight_packed")
    with pytest.raises(UserError, match=r"lacks 1 parameter\(s\) its config.json implies: "
                                        r"model.layers.0.self_attn.q_proj.weight;"):
        open_target(plain)


def test_lm_head_may_be_absent_only_when_tied(artifacts):
    plain = as_plain_checkpoint(artifacts["original"])
    open_target(plain)  # tie_word_embeddings: lm_head is the embedding, stored once
    config = json.loads((plain / "config.json").read_text())
    assert config["tie_word_embeddings"] is True
    (plain / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": False}))
    with pytest.raises(UserError, match=r"implies: lm_head.weight;"):
        open_target(plain)


def test_legacy_gptq_names_and_fused_moe_experts_count(tiny_model, tokenizer_dir, tmp_path):
    """GPTQ's qweight stands for weight; per-expert MoE weights load into
    transformers' fused expert parameters, so they cover them."""
    from quantize.common.tiny_model import build_tiny_qwen3_moe
    from tests.evaluate.legacy_formats import write_legacy
    write_legacy(tiny_model, "gptq", tmp_path / "gptq", tmp_path / "gptq-decoded")
    open_target(tmp_path / "gptq")
    moe = build_tiny_qwen3_moe(tmp_path / "moe", tokenizer_dir)
    open_target(moe)
    down = [f"model.layers.1.mlp.experts.{e}.down_proj.weight" for e in range(4)]
    drop_tensors(moe, *down)
    with pytest.raises(UserError, match=r"implies: model.layers.1.mlp.experts.down_proj;"):
        open_target(moe)
