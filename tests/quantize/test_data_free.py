"""A recipe that calibrates on no data (dynamic activations, round-to-nearest
weights) is one artifact whatever calibration and seed a sweep passes: its id
leaves them out and quantize reads no calibration text for it."""
import json
import shutil
from dataclasses import replace

import pytest

from tests.conftest import SMALL_CALIB, TINY_NAME, check_ok, file_sha256, recipe_source, run_quantize, tail

DATA_FREE = {"fp8_dynamic", "w4a16_rtn"}   # shipped recipes whose modifiers all run without data
STATIC_ACTIVATIONS = """\
quant_stage:
  quant_modifiers:
    QuantizationModifier:
      targets: [Linear]
      scheme: FP8
      ignore: [lm_head]
"""


def loaded(name: str, text: str | None = None, tmp_path=None):
    from quantize import recipe as recipes
    from quantize.common.recipe_choices import RecipeChoice
    path = recipe_source(name) if text is None else tmp_path / f"{name}.yaml"
    if text is not None:
        path.write_text(text)
    return recipes.load(RecipeChoice(name=name, path=str(path)))


def test_which_recipes_need_calibration_data_is_llm_compressors_answer(tmp_path):
    """Dynamic or weight-only quantization needs none; SmoothQuant, GPTQ, AWQ,
    SparseGPT, static activation scales and a KV-cache scheme do."""
    from quantize import recipe as recipes
    for name in ("fp8_dynamic", "w4a16_rtn", "w4a16_gptq", "w4a16_awq", "w8a8_smooth_ptq", "w8a8_kv8",
                 "w8a16_sparse_awq"):
        assert recipes.check_with_llmcompressor(loaded(name)) == (name not in DATA_FREE), name
    assert recipes.check_with_llmcompressor(loaded("fp8_static", STATIC_ACTIVATIONS, tmp_path))


@pytest.fixture(scope="module")
def built(tiny_model, tmp_path_factory):
    """w4a16_rtn of the tiny model, built once with the small calibration settings."""
    root = tmp_path_factory.mktemp("data-free")
    (root / "cwd").mkdir()
    arts = root / "artifacts"
    check_ok(run_quantize("recipe=w4a16_rtn", f"model={tiny_model}", *SMALL_CALIB, f"artifacts_dir={arts}",
                          cwd=root / "cwd"))
    return root, arts / TINY_NAME / "w4a16_rtn"


def rerun(tiny_model, art, *extra, cwd):
    return run_quantize("recipe=w4a16_rtn", f"model={tiny_model}", f"artifact_dir={art}", *extra, cwd=cwd)


def files(art):
    return {p.name: (p.stat().st_mtime_ns, file_sha256(p)) for p in art.iterdir() if p.is_file()}


def test_another_seed_and_calibration_find_the_data_free_artifact_complete(built, tiny_model):
    """A sweep over seed= and calibration.* builds a data-free recipe once: the
    other points skip it, without reading calibration text (a million windows
    exist nowhere)."""
    root, art = built
    first, before = json.loads((art / "manifest.json").read_text()), files(art)
    assert first["calibration"] is None and first["seed"] is None, first["calibration"]
    assert [k for k in first["timings_s"] if k.startswith("oneshot")] == ["oneshot (quantize, no calibration data in "
                                                                          f"{first['calibration_dtype']})"]
    proc = rerun(tiny_model, art, "seed=7", "calibration.num_samples=1000000", "calibration.max_seq_len=32",
                 cwd=root / "cwd")
    assert proc.returncode == 0, tail(proc)
    assert f"artifact {first['artifact_id']} is complete at {art}" in proc.stdout + proc.stderr, tail(proc)
    assert "needs no calibration data" in proc.stdout + proc.stderr
    assert files(art) == before


def test_a_data_free_artifact_built_when_ids_counted_calibration_keeps_its_id(built, tiny_model, tmp_path):
    """An artifact whose manifest recorded the calibration and seed it was
    given (and hashed them into its id) is complete under the id it records:
    evaluate's rows keyed by that id stay its rows."""
    from quantize.common import manifest
    root, art = built
    old = tmp_path / "old"
    shutil.copytree(art, old)
    m = manifest.read(old)
    calibration = {"source": "austen", "num_samples": 8, "max_seq_len": 64, "sha256": "ab" * 32}
    identity = {"model_weights_sha256": m.model.weights_sha256, "recipe_sha256": m.recipe.sha256,
                "calibration_sha256": calibration["sha256"], "calibration_dtype": m.calibration_dtype, "seed": 0,
                "versions": m.versions, "model_config_sha256": m.model.config_sha256,
                "model_files_sha256": m.model.files_sha256}
    old_id = manifest.artifact_id(**identity)
    manifest.write(old, replace(m, artifact_id=old_id, calibration=calibration, seed=0))
    proc = rerun(tiny_model, old, "seed=3", cwd=root / "cwd")
    assert f"artifact {old_id} is complete at {old}" in proc.stdout + proc.stderr, tail(proc)
    assert manifest.read(old).artifact_id == old_id
    # the recorded calibration stands in for none: other inputs are still refused
    other_id = manifest.artifact_id(**identity | {"recipe_sha256": "cd" * 32})
    manifest.write(old, replace(m, artifact_id=other_id, calibration=calibration, seed=0))
    refused = rerun(tiny_model, old, cwd=root / "cwd")
    assert refused.returncode == 2, tail(refused)
    assert f"{old} holds artifact {other_id} built from other inputs" in refused.stderr, tail(refused)
