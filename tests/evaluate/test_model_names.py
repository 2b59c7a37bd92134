"""A model choice names the rows of its plain checkpoint: a preset whose name
differs from its folder (smollm2_135m: smollm2-135m-instruct in
.cache/models/SmolLM2-135M-Instruct) gets the name quantize gives the
artifacts built from it, so `python -m evaluate` of the original and of
`recipe=<name>` are one model in the report, with speed-ups against it; the
report also finds an original named otherwise by its id."""
import csv
import shutil

import pytest

from evaluate import results, target
from evaluate.target import TargetConfig
from tests.conftest import TINY_NAME, run_cli

SMALL = ("scenario=interactive", "scenario.input_len=16", "scenario.output_len=4", "engine=hf", "accuracy=none",
         "runs=2", "warmup_runs=1")


def test_a_plain_checkpoint_takes_its_model_choices_name_and_an_artifact_its_manifests(tiny_model, build_artifact,
                                                                                          tmp_path):
    folder = shutil.copytree(tiny_model, tmp_path / "Tiny-Llama-Folder")
    assert target.load(TargetConfig(model_name=TINY_NAME, model_path=str(folder))).model_name == TINY_NAME
    assert target.load(TargetConfig(model_name=None, model_path=str(folder))).model_name == "Tiny-Llama-Folder"
    artifact = build_artifact("w4a16_rtn").dir
    assert target.load(TargetConfig(model_name="other", model_path=str(artifact))).model_name == TINY_NAME


@pytest.mark.parametrize("name_it", [True, False], ids=["preset-name", "folder-name"])
def test_the_original_is_its_artifacts_baseline_however_it_was_named(tiny_model, build_artifact, tmp_path, name_it):
    """Named as a preset names it (model.name), the original's rows carry its
    artifacts' model name. Named after a folder of another name (`model=<dir>`,
    or a store from before), the report still finds it by identity: the
    artifact's manifest records its base model's hashes, which are its id."""
    folder = shutil.copytree(tiny_model, tmp_path / "Tiny-Llama-Folder")   # as SmolLM2-135M-Instruct
    res = tmp_path / "res"
    original = [f"model={folder}"] + ([f"model.name={TINY_NAME}"] if name_it else [])
    for model in (original, [f"model={build_artifact('w4a16_rtn').dir}"]):
        proc = run_cli("evaluate", *model, *SMALL, f"results_dir={res}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    stored = {r.recipe: r.model_name for r in results.read(res)}
    assert stored == {"original": TINY_NAME if name_it else "Tiny-Llama-Folder", "w4a16_rtn": TINY_NAME}
    proc = run_cli("evaluate.report", f"results_dir={res}", f"out_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = {r["recipe"]: r for r in csv.DictReader((tmp_path / "out" / "summary.csv").open())}
    assert summary["original"]["model_name"] == summary["w4a16_rtn"]["model_name"] == TINY_NAME
    assert float(summary["w4a16_rtn"]["speedup_vs_original"]) > 0
