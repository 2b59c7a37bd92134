"""Identity covers what changes the model's output: two checkpoints with one
set of weights and another rope_theta are two artifacts (quantize) and two
checkpoints (evaluate); a config.json field that changes no output
(`_name_or_path`) keeps the id; what an older store recorded keeps its id."""
import json
import shutil
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from evaluate import results, target
from evaluate.results import Row
from quantize.common import manifest
from tests.conftest import TINY_NAME, run_cli, run_quantize, tail
from tests.evaluate.pipeline_fixtures import scen  # noqa: F401  (fixture)


def variant(tiny_model, root, edit) -> str:
    """A copy of the tiny model (same folder name, same weights) with `edit` applied to its config.json."""
    out = root / TINY_NAME
    shutil.copytree(tiny_model, out)
    config = json.loads((out / "config.json").read_text())
    edit(config)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return str(out)


def other_rope_theta(config):  # transformers 5 writes rope_theta under rope_parameters
    config["rope_parameters"]["rope_theta"] = 500000.0


def renamed(config):
    config["_name_or_path"] = "someone/else"


def models(tiny_model, tmp_path) -> tuple[str, str, str]:
    """(a: the tiny model, b: a with another rope_theta, c: a under another _name_or_path)."""
    return (variant(tiny_model, tmp_path / "a", lambda config: None),
            variant(tiny_model, tmp_path / "b", other_rope_theta), variant(tiny_model, tmp_path / "c", renamed))


def test_another_rope_theta_is_another_artifact_and_a_renamed_config_the_same(tiny_model, tmp_path, workdir):
    a, b, c = models(tiny_model, tmp_path)
    arts = tmp_path / "artifacts"
    final = arts / TINY_NAME / "original"
    sweep = run_quantize("-m", f"model={a},{c},{b}", "recipe=original", f"artifacts_dir={arts}", cwd=workdir)
    out = sweep.stdout + sweep.stderr
    first = json.loads((final / "manifest.json").read_text())
    built = first["artifact_id"]
    assert first["id_scheme"] == manifest.ID_SCHEME and first["model"]["path"] == a, tail(sweep)
    assert out.count("written to") == 1 and f"artifact {built} is complete at {final}" in out, tail(sweep)
    # b's weights are a's, its config is not: never skipped as a's artifact
    assert f"{final} holds artifact {built} built from other inputs" in out, tail(sweep)
    other = run_quantize(f"model={b}", "recipe=original", f"artifact_dir={arts / 'b'}", cwd=workdir)
    assert other.returncode == 0, tail(other)
    assert json.loads((arts / "b" / "manifest.json").read_text())["artifact_id"] != built


@pytest.mark.extended
def test_evaluate_measures_a_checkpoint_with_another_rope_theta(tiny_model, tmp_path, scen):
    a, b, c = models(tiny_model, tmp_path)
    res = tmp_path / "res"
    proc = run_cli("evaluate", "-m", f"model={a},{b},{c}", "engine=hf", scen["test_tiny_a"], "runs=1",
                   "accuracy=none", f"results_dir={res}", cwd=tmp_path)
    assert proc.returncode == 0, tail(proc)
    ids = {r.artifact_path: r.artifact_id for r in results.read(res)}
    assert set(ids) == {a, b}, ids  # c is a under another name: nothing to do
    assert ids[a] != ids[b]
    assert (proc.stdout + proc.stderr).count("nothing to do") == 1


def test_a_manifest_of_id_scheme_1_keeps_its_id(tiny_model, tmp_path, workdir):
    """An artifact built before ids covered config.json is still complete for
    its model, under the id it records, and still not for b."""
    a, b, _ = models(tiny_model, tmp_path)
    arts = tmp_path / "artifacts"
    final = arts / TINY_NAME / "original"
    assert run_quantize(f"model={a}", "recipe=original", f"artifacts_dir={arts}", cwd=workdir).returncode == 0
    m = manifest.read(final)
    identity = {"model_weights_sha256": m.model.weights_sha256, "recipe_sha256": m.recipe.sha256,
                "calibration_sha256": None, "calibration_dtype": None, "seed": None, "versions": None}
    old_id = manifest.artifact_id(**identity)
    assert old_id != m.artifact_id
    manifest.write(final, replace(m, artifact_id=old_id, id_scheme=None, model=replace(m.model, config_sha256=None)))
    proc = run_quantize("-m", f"model={a},{b}", "recipe=original", f"artifacts_dir={arts}", cwd=workdir)
    out = proc.stdout + proc.stderr
    assert f"artifact {old_id} is complete at {final}" in out, tail(proc)
    assert f"{final} holds artifact {old_id} built from a config.json with other rope_parameters" in out, tail(proc)
    assert manifest.read(final).artifact_id == old_id


def test_another_chat_template_is_another_artifact_and_an_id_of_scheme_2_stays_complete(tiny_model, tmp_path,
                                                                                            workdir):
    """The tokenizer and generation config ship with the artifact and change
    what evaluate serves: a fixed chat template was skipped as complete, and the
    stale one kept. An artifact of id scheme 2 (before they counted) keeps its id."""
    a = variant(tiny_model, tmp_path / "a", lambda config: None)
    arts = tmp_path / "artifacts"
    final = arts / TINY_NAME / "original"
    assert run_quantize(f"model={a}", "recipe=original", f"artifacts_dir={arts}", cwd=workdir).returncode == 0
    built = manifest.read(final)
    assert built.id_scheme == 3 and built.model.files_sha256
    tokenizer_config = tmp_path / "a" / TINY_NAME / "tokenizer_config.json"
    edited = json.loads(tokenizer_config.read_text()) | {"chat_template": "{{ messages[0]['content'] }}"}
    tokenizer_config.write_text(json.dumps(edited))
    again = run_quantize(f"model={a}", "recipe=original", f"artifacts_dir={arts}", cwd=workdir)
    assert f"{final} holds artifact {built.artifact_id} built from other inputs" in again.stderr, tail(again)
    identity = {"model_weights_sha256": built.model.weights_sha256, "recipe_sha256": built.recipe.sha256,
                "calibration_sha256": None, "calibration_dtype": None, "seed": None, "versions": None,
                "model_config_sha256": built.model.config_sha256}
    scheme_2 = manifest.artifact_id(**identity)
    manifest.write(final, replace(built, artifact_id=scheme_2, id_scheme=2,
                                  model=replace(built.model, files_sha256=None)))
    kept = run_quantize(f"model={a}", "recipe=original", f"artifacts_dir={arts}", cwd=workdir)
    assert f"artifact {scheme_2} is complete at {final}" in kept.stdout + kept.stderr, tail(kept)


def test_a_plain_checkpoint_keeps_the_id_an_older_store_records(tiny_model):
    """Rows of this folder under its weights' hash, measured after its
    config.json last changed: the checkpoint keeps that id; an edit since, a
    row of another folder or none: the id that covers config.json."""
    opened = target.from_path(tiny_model)
    before = opened.id_before_config
    assert before and opened.artifact_id != before
    edited = datetime.fromtimestamp((tiny_model / "config.json").stat().st_mtime, timezone.utc)
    row = Row(kind="speed", status="ok", artifact_id=before, artifact_path=str(tiny_model),
              timestamp=(edited + timedelta(minutes=1)).isoformat(timespec="seconds"))
    assert target.as_recorded(opened, [row]).artifact_id == before
    assert target.as_recorded(opened, []).artifact_id == opened.artifact_id
    assert target.as_recorded(opened, [row.but(artifact_path="/elsewhere")]).artifact_id == opened.artifact_id
    earlier = row.but(timestamp=(edited - timedelta(minutes=1)).isoformat(timespec="seconds"))
    assert target.as_recorded(opened, [earlier]).artifact_id == opened.artifact_id
