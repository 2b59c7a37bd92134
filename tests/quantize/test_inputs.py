"""User inputs beyond the presets: local calibration files, a recipe given as a
path, and a recipe dropped into recipes/."""
import json
import uuid

import pytest

from tests.conftest import (MAX_SEQ_LEN, NUM_SAMPLES, RECIPES_DIR, SMALL_CALIB, TINY_NAME, check_ok,
                      file_sha256, run_quantize, w4_rtn_recipe)

RECIPE = "w8a8_smooth_ptq"  # a recipe that calibrates on data: w4a16_rtn reads no calibration text


def austen_paragraphs(min_chars: int = 600) -> list[str]:
    """Long paragraphs (> MAX_SEQ_LEN tokens each) from a held-out novel."""
    from quantize.common.assets import ensure_austen
    text = (ensure_austen() / "persuasion.txt").read_text()
    return [p for p in text.split("\n\n") if len(p) >= min_chars]


def assert_file_calibration(manifest: dict, path, reference: dict) -> None:
    cal = manifest["calibration"]
    assert cal["source"] == "file"
    assert cal["path"] == str(path)
    assert cal["name"] == path.name
    assert (cal["num_samples"], cal["max_seq_len"]) == (NUM_SAMPLES, MAX_SEQ_LEN)
    assert cal["num_tokens"] == NUM_SAMPLES * MAX_SEQ_LEN
    # Other text -> other calibration hash -> other artifact id than the
    # same recipe calibrated on the bundled corpus.
    assert cal["sha256"] != reference["calibration"]["sha256"]
    assert manifest["artifact_id"] != reference["artifact_id"]
    assert manifest["recipe"]["name"] == RECIPE
    assert manifest["quantization"]["format"] == "int-quantized"


@pytest.mark.extended
def test_calibration_from_jsonl(tmp_path, workdir, tiny_model, build_artifact):
    data = tmp_path / "calib.jsonl"
    records = [{"id": i, "text": p} for i, p in enumerate(austen_paragraphs()[:12])]
    assert len(records) == 12
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    arts = tmp_path / "artifacts"
    check_ok(run_quantize(f"recipe={RECIPE}", f"model={tiny_model}", f"calibration={data}",
                          *SMALL_CALIB, f"artifacts_dir={arts}", cwd=workdir))
    manifest = json.loads((arts / TINY_NAME / RECIPE / "manifest.json").read_text())
    assert_file_calibration(manifest, data, build_artifact(RECIPE).manifest)
    assert manifest["calibration"]["text_field"] == "text"


def test_calibration_from_txt_relative_to_cwd(tmp_path, workdir, tiny_model, build_artifact):
    """A relative path is taken from the directory the user launched from."""
    text = "\n\n".join(austen_paragraphs()[:40])
    (workdir / "calib.txt").write_text(text)
    arts = tmp_path / "artifacts"
    check_ok(run_quantize(f"recipe={RECIPE}", f"model={tiny_model}", "calibration=./calib.txt",
                          *SMALL_CALIB, f"artifacts_dir={arts}", cwd=workdir))
    manifest = json.loads((arts / TINY_NAME / RECIPE / "manifest.json").read_text())
    assert_file_calibration(manifest, workdir / "calib.txt", build_artifact(RECIPE).manifest)


USER_RECIPE = w4_rtn_recipe(32)


@pytest.mark.extended
def test_recipe_given_as_a_path(tmp_path, workdir, tiny_model):
    recipe = tmp_path / "my_w4_g32.yaml"
    recipe.write_text(USER_RECIPE)
    arts = tmp_path / "artifacts"
    check_ok(run_quantize(f"recipe={recipe}", f"model={tiny_model}", *SMALL_CALIB,
                          f"artifacts_dir={arts}", cwd=workdir))
    art = arts / TINY_NAME / "my_w4_g32"  # name = file stem
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["recipe"]["name"] == "my_w4_g32"
    assert manifest["recipe"]["source"] == str(recipe)
    assert manifest["recipe"]["sha256"] == file_sha256(recipe)
    assert (art / "recipe.yaml").read_text() == USER_RECIPE
    weights = json.loads((art / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["group_size"], weights["symmetric"]) == (4, 32, True)
    assert manifest["quantization"]["format"] == "pack-quantized"


DROP_IN_RECIPE = """\
# Plain round-to-nearest W8A8 (no SmoothQuant).
quant_stage:
  quant_modifiers:
    QuantizationModifier:
      targets: [Linear]
      scheme: W8A8
      ignore: [lm_head]
"""


def test_recipe_dropped_into_recipes_dir_is_an_option(tmp_path, workdir, tiny_model, recipes_dir_lock):
    stem = f"zz_test_dropin_{uuid.uuid4().hex[:8]}"
    path = RECIPES_DIR / f"{stem}.yaml"
    arts = tmp_path / "artifacts"
    try:
        path.write_text(DROP_IN_RECIPE)
        check_ok(run_quantize(f"recipe={stem}", f"model={tiny_model}", *SMALL_CALIB,
                              f"artifacts_dir={arts}", cwd=workdir))
    finally:
        path.unlink(missing_ok=True)
    art = arts / TINY_NAME / stem
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["recipe"]["name"] == stem
    assert manifest["recipe"]["source"] == str(path)
    assert (art / "recipe.yaml").read_text() == DROP_IN_RECIPE
    assert manifest["quantization"]["format"] == "int-quantized"
    # Gone from recipes/ -> no longer an option.
    proc = run_quantize(f"recipe={stem}", f"model={tiny_model}", f"artifacts_dir={tmp_path / 'again'}",
                        cwd=workdir)
    assert proc.returncode != 0 and f"unknown recipe '{stem}'" in proc.stderr
