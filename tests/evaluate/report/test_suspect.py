"""Suspect artifacts (evaluate/analysis/suspect.py, rules in quantize/common/sanity_rules.py):
named in their own section with the reason, and never ranked, summarised,
on a front or recommended. On rows as evaluate writes them, and end to end:
a tiny model quantized for real, a copy of its W8A8 artifact with one
layer's weights shuffled, each measured by engine=hf with accuracy, then
`python -m evaluate.report`."""
import dataclasses
import json
import shutil

from evaluate import results
from evaluate.analysis import analyse
from evaluate.report import build_report
from evaluate.report.markdown import SUSPECT_TITLE
from quantize.common import fingerprint, manifest
from quantize.common.checkpoint import weight_files
from quantize.common.tiny_model import build_tiny_llama
from tests.conftest import SMALL_CALIB, run_cli, run_quantize

from .rows import ARTIFACTS, base_row, main_rows, store

W4 = {"method": "compressed-tensors", "format": "pack-quantized",
      "schemes": [{"weights": {"num_bits": 4, "type": "int", "group_size": 64}, "activations": None}]}


def accuracy_row(recipe: str, top1: float, recovery: float, run_index: int = 0, **changes):
    return base_row(recipe, kind="accuracy", scenario="pride_and_prejudice", run_index=run_index,
                    manifest={"quantization": W4}, metrics={"perplexity": 30.0, "kl_divergence": 0.1,
                                                            "top1_agreement": top1, "recovery_pct": recovery},
                    **changes)


def sections(md: str) -> dict[str, str]:
    """report.md's `## ` sections by title."""
    return {part.split("\n", 1)[0]: part for part in md.split("\n## ")[1:]}


def report(tmp_path, rows) -> str:
    store(tmp_path / "res", rows)
    build_report(tmp_path / "res", tmp_path / "out", "t")
    return (tmp_path / "out" / "report.md").read_text()


def assert_only_in_suspects(md: str, name: str) -> str:
    """`name` is in the suspect section and in no other; returns that section."""
    parts = sections(md)
    assert name in parts[SUSPECT_TITLE]
    elsewhere = [title for title, text in parts.items() if title != SUSPECT_TITLE and name in text]
    assert not elsewhere, f"{name} also in {elsewhere}"
    return parts[SUSPECT_TITLE]


def test_top1_below_the_floor_keeps_an_artifact_out_of_every_ranking(tmp_path):
    rows = main_rows() + [accuracy_row("w4a16_gptq", 0.31, 96.0)]
    md = report(tmp_path, rows)
    section = assert_only_in_suspects(md, "w4a16_gptq")
    assert "top-1 agreement with the base 0.310 < 0.55, the floor of w4" in section
    assert "w8a8_smooth_ptq" in sections(md)["Ranking"]       # the others are still ranked
    analysis = analyse([tmp_path / "res"], results.read(tmp_path / "res"))
    assert [s.recipe for s in analysis.suspects] == ["w4a16_gptq"]
    assert all(g.recipe != "w4a16_gptq" for g in analysis.speed + analysis.accuracy)


def test_recovery_above_100_is_suspect_only_beyond_its_interval(tmp_path):
    spread = [accuracy_row("w4a16_gptq", 0.8, rec, run_index=i) for i, rec in enumerate((96.0, 104.0, 112.0))]
    md = report(tmp_path / "wide", main_rows() + spread)   # mean 104 %, its interval holds 100 %
    assert SUSPECT_TITLE not in sections(md) and "w4a16_gptq" in sections(md)["Ranking"]
    tight = [accuracy_row("w4a16_gptq", 0.8, rec, run_index=i) for i, rec in enumerate((110.5, 111.0, 111.5))]
    section = assert_only_in_suspects(report(tmp_path / "tight", main_rows() + tight), "w4a16_gptq")
    assert "accuracy recovery 111.0 % exceeds 100 % by more than 2.0 % (the larger of its 95 % interval" in section


def test_repeating_an_accuracy_run_does_not_make_an_artifact_suspect(tmp_path):
    """Repeated rows score the same windows: their spread is near 0, and an
    allowance of ±0.0 made the second run of a 101 % artifact suspect (one run
    is allowed the 2 %), dropping it from every table."""
    once = [accuracy_row("w4a16_gptq", 0.8, 101.0)]
    twice = once + [accuracy_row("w4a16_gptq", 0.8, 101.0, run_index=1)]
    for name, rows in (("once", once), ("twice", twice)):
        md = report(tmp_path / name, main_rows() + rows)
        assert SUSPECT_TITLE not in sections(md) and "w4a16_gptq" in sections(md)["Ranking"], name


def test_the_suspect_line_shows_the_figures_of_the_measurement_that_failed(tmp_path):
    """Measured on two engines, one below the floor: the line's figures are that
    engine's, not those of whichever group came last (the sound one)."""
    rows = main_rows() + [accuracy_row("w4a16_gptq", 0.31, 80.0),
                          accuracy_row("w4a16_gptq", 0.90, 98.0, engine="hf", setup_id="hf-1")]
    section = assert_only_in_suspects(report(tmp_path, rows), "w4a16_gptq")
    (line,) = [line for line in section.splitlines() if line.startswith("- **w4a16_gptq**")]
    assert "; top-1 agreement 0.310, recovery 80.0 %): top-1 agreement with the base 0.310 < 0.55" in line
    assert line.endswith("(vllm, pride_and_prejudice)") and "0.900" not in line


def test_a_manifest_marked_suspect_is_not_ranked_without_accuracy_rows(tmp_path):
    folder = tmp_path / "w4a16_gptq"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"artifact_id": ARTIFACTS["w4a16_gptq"][0],
                                                       "suspect": {"reason": "top-1 agreement 0.2 < 0.55"}}))
    rows = [r.but(artifact_path=str(folder)) if r.recipe == "w4a16_gptq" else r for r in main_rows()]
    section = assert_only_in_suspects(report(tmp_path, rows), "w4a16_gptq")
    assert "quantize's sanity check: top-1 agreement 0.2 < 0.55" in section


def test_the_original_and_sound_artifacts_are_never_suspect(tmp_path):
    rows = main_rows() + [accuracy_row("original", 0.2, 130.0, artifact_id=ARTIFACTS["original"][0])]
    assert SUSPECT_TITLE not in sections(report(tmp_path, rows))


def shuffled_copy(src, dst, tensor: str, recipe: str):
    """A copy of artifact `src` whose `tensor` has its rows permuted, under
    another recipe name and id, its fingerprint updated (evaluate checks the
    files against it): corrupt weights in an otherwise valid artifact."""
    import torch
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, dst)
    (file,) = weight_files(dst)
    tensors = load_file(file)
    weights = tensors[tensor]
    tensors[tensor] = weights[torch.randperm(weights.shape[0], generator=torch.Generator().manual_seed(0))]
    save_file(tensors, file, metadata={"format": "pt"})
    found = manifest.read(dst)
    manifest.write(dst, dataclasses.replace(
        found, artifact_id="c0" + found.artifact_id[2:], recipe=dataclasses.replace(found.recipe, name=recipe),
        weights_fingerprint=fingerprint.compute(weight_files(dst), full=True)))
    return dst


def test_a_planted_corrupt_artifact_is_suspect_and_unranked_in_the_report(tmp_path, tokenizer_dir):
    model = build_tiny_llama(tmp_path / "peaked", tokenizer_dir, initializer_range=0.1)  # peaked: top-1 means something
    proc = run_quantize("-m", f"model={model}", "recipe=original,w8a8_smooth_ptq", *SMALL_CALIB,
                        f"artifacts_dir={tmp_path / 'art'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    arts = tmp_path / "art" / "peaked"
    corrupt = shuffled_copy(arts / "w8a8_smooth_ptq", arts / "w8a8_shuffled",
                            "model.layers.0.mlp.down_proj.weight", "w8a8_shuffled")
    (tmp_path / "tiny.yaml").write_text("name: tiny\nbatch_size: 1\ninput_len: 32\noutput_len: 8\n")
    out = run_cli("evaluate", "-m", f"model={arts / 'original'},{arts / 'w8a8_smooth_ptq'},{corrupt}", "engine=hf",
                  f"scenario={tmp_path / 'tiny.yaml'}", "runs=2", "accuracy.num_windows=2",
                  "accuracy.window_len=128", "accuracy.lastword.num_items=8", f"results_dir={tmp_path / 'res'}",
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    top1 = {r.recipe: r.metrics["top1_agreement"] for r in results.read(tmp_path / "res") if r.kind == "accuracy"}
    assert top1["w8a8_shuffled"] < 0.80 <= top1["w8a8_smooth_ptq"], top1
    done = run_cli("evaluate.report", f"results_dir={tmp_path / 'res'}", f"out_dir={tmp_path / 'rep'}",
                   "output=[markdown]", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    md = (tmp_path / "rep" / "report.md").read_text()
    section = assert_only_in_suspects(md, "w8a8_shuffled")
    assert f"top-1 agreement with the base {top1['w8a8_shuffled']:.3f} < 0.80, the floor of w8a8" in section
    assert "w8a8_smooth_ptq" in sections(md)["Ranking"]
