"""The artifact is what its name says: `python -m quantize` refuses a base
checkpoint lacking parameters of its architecture (before calibration), and a
recipe that quantized or pruned no module (after oneshot); both are one line,
exit 2, nothing written. A recipe that does change the model records how many
modules it changed (manifest `modules_changed`), and summary.csv shows it."""
import csv
import json
import shutil
from pathlib import Path

import pytest

from quantize.common import manifest
from quantize.common.checkpoint import read_header
from tests.conftest import SMALL_CALIB, check_ok, last_line, run_quantize, w4_rtn_recipe

LAYER_1 = "model.layers.1."


def checkpoint_variant(tiny: Path, out: Path, drop=(), config: dict | None = None, lm_head: bool = False) -> Path:
    """A copy of the tiny model without the tensors whose names start with
    one of `drop`, with `config` merged into its config.json and, with
    `lm_head`, an lm_head.weight of its own (a copy of the embeddings)."""
    from safetensors.torch import load_file, save_file
    shutil.copytree(tiny, out)
    tensors = load_file(out / "model.safetensors")
    if lm_head:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors = {name: t for name, t in tensors.items() if not name.startswith(tuple(drop))}
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(json.loads((out / "config.json").read_text()) | (config or {})))
    return out


def recipe_file(path: Path, targets: list[str], ignore: list[str]) -> Path:
    """An int4 RTN recipe with the given targets and ignore lists."""
    path.write_text(f"""\
quant_stage:
  quant_modifiers:
    QuantizationModifier:
      ignore: {json.dumps(ignore)}
      config_groups:
        group_0:
          targets: {json.dumps(targets)}
          weights: {{num_bits: 4, type: int, symmetric: true, strategy: group, group_size: 64}}
""")
    return path


# A user recipe that prunes (Wanda 2:4) and quantizes (int4 RTN) every decoder
# Linear. Pruning's ignore is a regex: llm-compressor 0.14 names a pruned
# Linear "lm_head." when targets are [Linear], which a plain `lm_head` misses.
PRUNE_AND_QUANTIZE = """\
sparsity_stage:
  sparsity_modifiers:
    WandaPruningModifier:
      sparsity: 0.5
      mask_structure: "2:4"
      targets: [Linear]
      ignore: ["re:.*lm_head"]
""" + w4_rtn_recipe(64)
DECODER_LINEARS = 14  # 2 layers x (q, k, v, o, gate, up, down)

# name -> (overrides(tmp, tiny model), words the one error line holds)
CASES = {
    "base_checkpoint_lacks_a_decoder_layer": (
        lambda tmp, tiny: ["recipe=w4a16_rtn", *SMALL_CALIB,
                           f"model={checkpoint_variant(tiny, tmp / 'no-layer-1', drop=[LAYER_1])}"],
        ["no-layer-1", "lacks 9 parameter tensor(s) of the LlamaForCausalLM architecture",
         "model.layers.1.input_layernorm.weight", "and 4 more", "re-copy or re-download the checkpoint"]),
    "untied_base_checkpoint_lacks_lm_head": (
        lambda tmp, tiny: ["recipe=original",
                           f"model={checkpoint_variant(tiny, tmp / 'untied', config={'tie_word_embeddings': False})}"],
        ["untied", "lacks 1 parameter tensor(s)", "lm_head.weight", "tie_word_embeddings is false"]),
    "ignore_covers_every_linear": (
        lambda tmp, tiny: [f"recipe={recipe_file(tmp / 'ignore_all.yaml', ['Linear'], ['lm_head', 're:.*_proj$'])}",
                           f"model={tiny}", *SMALL_CALIB],
        ["recipe ignore_all matched no module of tiny-llama", "check targets/ignore", "ignore_all.yaml",
         "model.layers.0.self_attn.q_proj"]),
    "targets_match_no_module": (
        lambda tmp, tiny: [f"recipe={recipe_file(tmp / 'no_match.yaml', ['re:.*query_key_value$'], ['lm_head'])}",
                           f"model={tiny}", *SMALL_CALIB],
        ["recipe no_match matched no module of tiny-llama", "check targets/ignore"]),
}
REFUSED_BEFORE_CALIBRATION = {"base_checkpoint_lacks_a_decoder_layer", "untied_base_checkpoint_lacks_lm_head"}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line_with_nothing_written(case, tmp_path, workdir, tiny_model):
    make_args, words = CASES[case]
    arts = tmp_path / "artifacts"
    proc = run_quantize(*make_args(tmp_path, tiny_model), f"artifacts_dir={arts}", cwd=workdir)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    line = last_line(proc.stderr)
    assert [l for l in proc.stderr.splitlines() if l.startswith("error:")] == [line], output[-3000:]
    assert len(line) < 600
    for word in words:
        assert word in line, f"{word!r} not in: {line}"
    written = [p for p in arts.rglob("*") if not p.is_dir()] if arts.exists() else []
    assert written == [], f"wrote into the artifacts dir: {written}"
    ran_oneshot = "oneshot (calibrate" in output
    assert ran_oneshot == (case not in REFUSED_BEFORE_CALIBRATION), output[-3000:]


def test_complete_checkpoints_load_tied_without_lm_head_and_untied_with_it(tiny_model, tmp_path):
    """The refusal is no false alarm: tied embeddings need no lm_head tensor
    (the tiny model stores none), untied ones load with theirs."""
    from quantize.pipeline import _load_model
    header, _ = read_header(tiny_model / "model.safetensors")
    assert "lm_head.weight" not in header and json.loads((tiny_model / "config.json").read_text())[
        "tie_word_embeddings"]
    untied = checkpoint_variant(tiny_model, tmp_path / "untied", config={"tie_word_embeddings": False}, lm_head=True)
    for model_dir in (tiny_model, untied):
        model = _load_model(model_dir)
        assert model.lm_head.weight.shape == model.model.embed_tokens.weight.shape


@pytest.fixture(scope="module")
def pruned_and_quantized(tiny_model, tmp_path_factory) -> Path:
    """An artifact of PRUNE_AND_QUANTIZE on the tiny model (one CLI run)."""
    tmp = tmp_path_factory.mktemp("prune-and-quantize")
    (tmp / "cwd").mkdir()
    recipe = tmp / "prune_and_quantize.yaml"
    recipe.write_text(PRUNE_AND_QUANTIZE)
    out = tmp / "artifact"
    check_ok(run_quantize(f"recipe={recipe}", f"model={tiny_model}", *SMALL_CALIB, f"artifact_dir={out}",
                          cwd=tmp / "cwd"))
    return out


def test_manifest_counts_the_modules_the_recipe_changed(pruned_and_quantized):
    m = manifest.read(pruned_and_quantized)
    assert m.modules_changed == {"total": DECODER_LINEARS, "quantized": DECODER_LINEARS, "pruned": DECODER_LINEARS}
    assert m.row_fields()["modules_changed"] == m.modules_changed


def test_the_sanity_family_is_2_4_where_the_saved_weights_hold_it_not_where_the_recipe_prunes(
        pruned_and_quantized, tiny_model, tmp_path):
    """The family (and floor) quantize judged by came from "the recipe prunes",
    the report's from the saved weights: an unstructured prune got the lenient
    2:4 floor at quantize and the int4 one in the report."""
    two_four = manifest.read(pruned_and_quantized)
    assert two_four.holds_2_4 and two_four.checks["sanity"]["family"] == "sparse_2of4"
    recipe = tmp_path / "unstructured.yaml"
    recipe.write_text(PRUNE_AND_QUANTIZE.replace('mask_structure: "2:4"', 'mask_structure: "0:0"'))
    (tmp_path / "cwd").mkdir()
    check_ok(run_quantize(f"recipe={recipe}", f"model={tiny_model}", *SMALL_CALIB,
                          f"artifact_dir={tmp_path / 'art'}", cwd=tmp_path / "cwd"))
    unstructured = manifest.read(tmp_path / "art")
    assert not unstructured.holds_2_4 and unstructured.modules_changed["pruned"] == DECODER_LINEARS
    assert unstructured.checks["sanity"]["family"] == "w4"


def test_summary_csv_shows_the_count(pruned_and_quantized, tmp_path):
    """Rows repeat the real manifest's fields (Manifest.row_fields), and
    summary.csv's modules_changed column shows the count; the baseline's
    cell is empty."""
    from evaluate.report import build_report
    from tests.evaluate.report.rows import main_rows, store

    fields = manifest.read(pruned_and_quantized).row_fields()
    rows = [r.but(manifest=fields) if r.recipe == "w4a16_gptq" else r for r in main_rows()]
    store(tmp_path / "results", rows)
    build_report(tmp_path / "results", tmp_path / "out", "t", outputs=("csv",))
    with open(tmp_path / "out" / "summary.csv", newline="") as f:
        lines = list(csv.DictReader(f))
    cells = {(r["recipe"], r["modules_changed"]) for r in lines}
    assert ("w4a16_gptq", str(DECODER_LINEARS)) in cells and ("original", "") in cells
    assert {recipe for recipe, count in cells if count} == {"w4a16_gptq"}
