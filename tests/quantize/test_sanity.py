"""Quantize's accuracy sanity gate (quantize/sanity.py, rules in quantize/common/sanity_rules.py): the rules, and the
Phi case end to end: SmoothQuant mappings that exist in Phi but do not fit
its parallel block (input_layernorm also feeds mlp.fc1, which is not
compensated for the smoothing) give a model far from its base, which the
manifest marks suspect; the same W8A8 without SmoothQuant is not."""
import dataclasses
import json

import pytest

from quantize import pipeline, sanity
from quantize.common import sanity_rules
from quantize.common.errors import UserError
from quantize.common.manifest import Manifest, ModelInfo, Quantization, RecipeInfo
from quantize.common.tiny_model import build_tiny
from tests.conftest import SMALL_CALIB, run_quantize

CONFIG = sanity_rules.SanityConfig.from_config(None)
W8A8 = {"schemes": [{"weights": {"num_bits": 8, "type": "int"}, "activations": {"num_bits": 8, "type": "int"}}]}
FP8 = {"schemes": [{"weights": {"num_bits": 8, "type": "float"}, "activations": {"num_bits": 8, "type": "float"}}]}
W8A16 = {"schemes": [{"weights": {"num_bits": 8, "type": "int"}, "activations": None}]}
W4A16 = {"schemes": [{"weights": {"num_bits": 4, "type": "int", "group_size": 64}}]}
GPTQ_W8A8 = """    GPTQModifier:
      targets: [Linear]
      scheme: W8A8
      ignore: [lm_head]
      dampening_frac: 0.01
"""
WRONG_FOR_PHI = """quant_stage:
  quant_modifiers:
    SmoothQuantModifier:
      smoothing_strength: 0.8
      mappings:
        - [["re:.*q_proj", "re:.*k_proj", "re:.*v_proj"], "re:.*input_layernorm"]
""" + GPTQ_W8A8


@pytest.mark.parametrize("quantization, sparse, family", [
    (W8A8, False, "w8a8"), (FP8, False, "w8a8"), (W8A16, False, "w8a16"), (W4A16, False, "w4"),
    (W8A8, True, "sparse_2of4"), ({"schemes": []}, False, "other"), (None, False, "other")])
def test_the_format_family_comes_from_the_narrowest_weight_scheme_and_2of4(quantization, sparse, family):
    assert sanity_rules.family(quantization, sparse) == family


def test_the_shipped_floors_order_the_families_by_what_they_keep():
    floors = CONFIG.floors
    assert floors["w8a8"] >= floors["w4"] > floors["sparse_2of4"]
    assert CONFIG.floor("no such family") == floors["other"]


@pytest.mark.parametrize("top1, family, suspect", [
    (0.79, "w8a8", True), (0.80, "w8a8", False), (0.017, "w8a8", True), (0.65, "w4", False),
    (0.50, "w4", True), (0.50, "sparse_2of4", False), (None, "w8a8", False)])
def test_top1_below_the_family_floor_is_suspect(top1, family, suspect):
    reason = sanity_rules.top1_reason(top1, family, CONFIG)
    assert bool(reason) == suspect
    if suspect:
        assert f"{top1:.3f}" in reason and family in reason


@pytest.mark.parametrize("recovery, half, suspect", [
    (101.5, None, False),   # one run: within the 2 % allowance
    (102.5, None, True),
    (111.0, 12.0, False),   # several runs, but an interval this wide holds 100 %
    (103.0, 1.0, True),     # above 100 % by more than its interval
    (99.0, 0.5, False), (None, None, False)])
def test_recovery_above_100_beyond_its_interval_is_suspect(recovery, half, suspect):
    assert bool(sanity_rules.recovery_reason(recovery, half, CONFIG)) == suspect


@pytest.mark.parametrize("values, fix", [
    ({"floors": {"w3a3": 0.5}}, "unknown format families"),
    ({"floors": {"w4": 60}}, "between 0 and 1"),
    ({"floors": {}, "num_windos": 4}, "unknown sanity setting"),
    ({"floors": {}, "num_windows": 0}, "at least 1 window"),
    # each was a ValueError or TypeError mid-job, or (enabled, strict) bool("zzz"): on
    ({"floors": {"w4": "zzz"}}, r"^sanity.floors.w4=zzz: each floor is a top-1 agreement between 0 and 1, e.g. "),
    ({"floors": {}, "enabled": "zzz"}, r"^sanity: enabled=zzz is not true or false; pass true or false for enabled$"),
    ({"floors": {}, "strict": "no"}, r"^sanity: strict=no is not true or false"),
    ({"floors": {}, "num_windows": "zzz"}, r"^sanity: num_windows=zzz is not an integer"),
    ({"floors": {}, "recovery_tolerance_pct": -1}, r"^sanity.recovery_tolerance_pct=-1: pass a number of % >= 0")])
def test_bad_sanity_settings_are_one_line(values, fix):
    with pytest.raises(UserError, match=fix):
        sanity_rules.SanityConfig.from_config(values)


def test_sanity_enabled_takes_0_and_1_as_force_does():
    assert sanity_rules.SanityConfig.from_config({"floors": {}, "enabled": 0}).enabled is False
    assert sanity_rules.SanityConfig.from_config({"floors": {}, "strict": 1}).strict is True


def _manifest(quantization: dict) -> Manifest:
    return Manifest("id", ModelInfo("m"), RecipeInfo("r"), Quantization.from_dict(quantization))


def test_strict_fails_a_suspect_artifact_instead_of_keeping_it():
    measured = {"top1_agreement": 0.3, "kl_divergence": 1.0, "scored_tokens": 508}
    kept = pipeline._judged(_manifest(W8A8), dict(measured), CONFIG, sparse_24=False)
    assert kept.extra["suspect"]["family"] == "w8a8" and kept.checks["sanity"]["floor"] == 0.80
    with pytest.raises(UserError, match="fails the sanity check.*sanity.strict=false"):
        pipeline._judged(_manifest(W8A8), dict(measured), dataclasses.replace(CONFIG, strict=True), sparse_24=False)
    sound = pipeline._judged(_manifest(W8A8), dict(measured, top1_agreement=0.95), CONFIG, sparse_24=False)
    assert "suspect" not in sound.to_dict() and sound.checks["sanity"]["top1_agreement"] == 0.95


@pytest.mark.extended
def test_smoothquant_mappings_wrong_for_phi_make_a_suspect_artifact(tmp_path, tokenizer_dir):
    model = build_tiny("phi", tmp_path / "phi", tokenizer_dir)
    (tmp_path / "wrong_for_phi.yaml").write_text(WRONG_FOR_PHI)
    (tmp_path / "gptq_w8a8.yaml").write_text("quant_stage:\n  quant_modifiers:\n" + GPTQ_W8A8)
    recipes = f"{tmp_path / 'wrong_for_phi.yaml'},{tmp_path / 'gptq_w8a8.yaml'}"
    proc = run_quantize("-m", f"model={model}", f"recipe={recipes}", *SMALL_CALIB,
                        f"artifacts_dir={tmp_path / 'art'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wrong = json.loads((tmp_path / "art" / "phi" / "wrong_for_phi" / "manifest.json").read_text())
    right = json.loads((tmp_path / "art" / "phi" / "gptq_w8a8" / "manifest.json").read_text())
    assert wrong["checks"]["sanity"]["top1_agreement"] < 0.5, wrong["checks"]["sanity"]
    assert wrong["suspect"]["family"] == "w8a8" and "top-1 agreement" in wrong["suspect"]["reason"]
    assert right["checks"]["sanity"]["top1_agreement"] > 0.9 and "suspect" not in right
    assert wrong["checks"]["sanity"]["scored_tokens"] == CONFIG.num_windows * (CONFIG.window_len - 1)
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "SUSPECT" in line]
    assert len(warnings) == 1 and "wrong_for_phi" in warnings[0], warnings


def test_a_forward_pass_the_check_cannot_make_skips_it_with_the_reason():
    skipped = pipeline._sanity_after(sanity.Measure.failed(RuntimeError("no\nforward")), model=None)
    assert skipped == {"skipped": "the model's forward pass failed (RuntimeError: no forward)"}
    judged = pipeline._judged(_manifest(W8A8), skipped, CONFIG, sparse_24=False)
    assert judged.checks["sanity"] == skipped and "suspect" not in judged.to_dict()
