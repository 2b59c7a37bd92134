"""Evaluate stage end to end on transformers (engine=hf) with a tiny model:
what every engine does alike (identity, rows, accuracy, reruns, sweeps, bad
input) and the typed config. vLLM's own behaviour: test_pipeline_vllm.py;
jobs that cannot measure: test_pipeline_failures.py."""
import json

import pytest

from tests.conftest import run_cli
from tests.evaluate.pipeline_fixtures import PIPELINE_RECIPES, eval_artifacts, scen  # noqa: F401  (fixtures)
from evaluate import results
from quantize.common.errors import UserError
from quantize.common.paths import CONF_DIR


def test_hf_engine_and_plain_checkpoint(eval_artifacts, tmp_path, scen):
    """engine=hf measures a plain HF checkpoint (no manifest): identity from its files."""
    from quantize.common.checkpoint import weight_files
    from quantize.common.manifest import checkpoint_id
    from quantize.common.provenance import sha256_files
    model = eval_artifacts["model"]
    out = run_cli("evaluate", f"model={model}", "engine=hf", scen["test_tiny_a"], "runs=2",
                  "accuracy=none", "+engine.env.QB_TEST_SETTING=on", f"results_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = results.read(tmp_path)
    assert [r.run_index for r in rows] == [0, 1]
    # what its config set, and the threads torch ran with
    assert all(r.engine_env["QB_TEST_SETTING"] == "on" and r.engine_env["torch_num_threads"] >= 1 for r in rows)
    expected_id = checkpoint_id(sha256_files(weight_files(model)), json.loads((model / "config.json").read_text()))
    for r in rows:
        assert r.engine == "hf" and r.status == "ok" and r.artifact_id == expected_id
        assert r.manifest is None and r.recipe == "original" and r.serving_note is None
        assert r.metrics["output_tokens"] == 16
        assert r.metrics["output_throughput"] == pytest.approx(16 / r.metrics["latency_s"])


def test_hf_rows_of_a_quantized_checkpoint_say_its_speed_is_the_dense_models_and_the_answer_repeats_it(
        eval_artifacts, tmp_path, scen):
    """transformers decompresses W4A16 to dense: the rows carry the engine's
    note and the report's answer names the artifact beside it (the pick or the
    runner-up: the tiny model's W4A16 keeps its accuracy)."""
    res = tmp_path / "res"
    out = run_cli("evaluate", "-m", f"model={eval_artifacts['original']},{eval_artifacts['w4a16_rtn']}", "engine=hf",
                  scen["test_tiny_a"], "runs=2", "accuracy.num_windows=2", "accuracy.window_len=64",
                  "accuracy.lastword.num_items=8", f"results_dir={res}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    notes = {(r.recipe, r.serving_note) for r in results.read(res)}   # speed and accuracy rows alike
    assert notes == {("original", None), ("w4a16_rtn", "weights decompressed to dense: its speed and memory are the "
                                                       "dense model's, not the format's kernels'")}
    out = run_cli("evaluate.report", f"results_dir={res}", f"out_dir={tmp_path / 'rep'}", "output=[markdown]",
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    answer = (tmp_path / "rep" / "report.md").read_text().split("\n## Summary", 1)[0]
    assert "- test_tiny_a, tiny-llama: w4a16_rtn served by hf with a note: weights decompressed to dense" in answer


@pytest.mark.parametrize("recipe", PIPELINE_RECIPES)
def test_the_format_a_recipe_plans_is_the_format_it_builds(eval_artifacts, recipe):
    from evaluate.formats import classify
    from evaluate.target import from_path
    from quantize.common.checkpoint import planned_quantization_config
    from quantize.common.paths import RECIPES_DIR
    config = json.loads((eval_artifacts["model"] / "config.json").read_text())
    q = planned_quantization_config(RECIPES_DIR / f"{recipe}.yaml")
    planned = classify(config | ({"quantization_config": q} if q else {}))
    assert planned == from_path(eval_artifacts[recipe]).format


@pytest.mark.extended
def test_w8a16_runs_on_hf_engine(eval_artifacts, tmp_path, scen):
    out = run_cli("evaluate", f"model={eval_artifacts['w8a16_awq']}", "engine=hf",
                  scen["test_tiny_a"], "runs=1", "accuracy=none", f"results_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    (row,) = results.read(tmp_path)
    assert row.recipe == "w8a16_awq" and row.quant_format == "pack-quantized"


@pytest.mark.parametrize("args, expect", [
    (["scenario=no_such_scenario"], "no_such_scenario"),
    (["model=/nonexistent/model"], "does not exist"),
    (["runs=0"], "runs=0"),
    (["scenario=interactive", "scenario.input_len=5000"], "max_model_len"),
    (["engine=no_such_engine"], "no_such_engine"),
    (["accuracy.text=/nonexistent/held_out.txt"], "does not exist"),
    (["accuracy.window_len=4096"], "exceeds the model's context"),
])
def test_bad_inputs_fail_clearly(eval_artifacts, tmp_path, args, expect, scen):
    base = [f"model={eval_artifacts['original']}", scen["test_tiny_a"], f"results_dir={tmp_path}"]
    chosen = {a.split("=", 1)[0] for a in args}
    base = [b for b in base if b.split("=", 1)[0] not in chosen & {"model", "scenario"}]
    out = run_cli("evaluate", *base, *args, cwd=tmp_path)
    assert out.returncode != 0
    assert expect in out.stderr
    assert not (tmp_path / "results.jsonl").exists()


def test_a_scenario_file_that_does_not_exist_is_one_line_naming_the_fix(eval_artifacts, tmp_path):
    missing = tmp_path / "my_scenarios" / "tiny.yaml"
    out = run_cli("evaluate", f"model={eval_artifacts['original']}", "engine=hf", f"scenario={missing}",
                  f"results_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: scenario file {missing} does not exist")
    assert "scenario=<path to a scenario YAML>" in last and "Traceback" not in out.stderr
    assert not (tmp_path / "results.jsonl").exists()


def test_scenario_longer_than_context_is_skipped_with_reason_in_a_set(eval_artifacts, tmp_path, scen):
    """In a scenario set, a scenario the model cannot hold is recorded as
    skipped, once: a rerun (nothing left to do) appends no second row. The
    set includes one scenario by name (next to it) and one by path."""
    d = tmp_path / "my_scenarios"
    d.mkdir()
    tiny_a = scen["test_tiny_a"].split("=", 1)[1]
    (d / "test_too_long.yaml").write_text("name: test_too_long\nbatch_size: 1\ninput_len: 4096\noutput_len: 8\n")
    (d / "test_set_long.yaml").write_text(f"name: test_set_long\ninclude: [test_too_long, {tiny_a}]\n")
    args = ("evaluate", f"model={eval_artifacts['original']}", "engine=hf", f"scenario={d / 'test_set_long.yaml'}",
            "runs=1", "accuracy=none", f"results_dir={tmp_path}")
    out = run_cli(*args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r.scenario: r for r in results.read(tmp_path)}
    assert rows["test_too_long"].status == "skipped"
    assert "max_model_len is 1024" in rows["test_too_long"].reason
    assert rows["test_tiny_a"].status == "ok"
    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "skipping scenario test_too_long: needs 4104 tokens" in again.stdout + again.stderr
    assert [(r.scenario, r.status) for r in results.read(tmp_path)] == [("test_too_long", "skipped"),
                                                                         ("test_tiny_a", "ok")]


@pytest.mark.extended
def test_accuracy_of_the_baseline_against_itself(eval_artifacts, tmp_path, scen):
    """On the same engine as the reference, the baseline has KL 0, full
    agreement and 100% recovery; the row is keyed by the artifact id."""
    out = run_cli("evaluate", f"model={eval_artifacts['original']}", "engine=hf", scen["test_tiny_a"],
                  "runs=1", "accuracy.num_windows=2", f"results_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    (acc,) = [r for r in results.read(tmp_path) if r.kind == "accuracy"]
    manifest = json.loads((eval_artifacts["original"] / "manifest.json").read_text())
    m = acc.metrics
    assert acc.artifact_id == manifest["artifact_id"]
    assert m["scored_tokens"] == 2 * 511
    assert m["kl_divergence"] == pytest.approx(0, abs=1e-6)
    assert m["recovery_pct"] == pytest.approx(100, abs=1e-3)
    assert m["perplexity"] == pytest.approx(m["reference_perplexity"], rel=1e-5)
    assert m["lastword_accuracy"] == m["reference_lastword_accuracy"]
    assert acc.accuracy_samples["window_tokens"] == [511, 511]   # what the report's intervals resample
    assert len(acc.accuracy_samples["item_hits"]) == m["lastword_items"]


def test_accuracy_detects_a_different_model(eval_artifacts, tmp_path, scen):
    """Against another model's reference, KL is orders of magnitude above the
    self-comparison (two random tiny models are both near-uniform, so small)."""
    from quantize.common.tiny_model import build_tiny_llama
    from quantize.common.assets import SMOLLM2_DIR
    other = build_tiny_llama(tmp_path / "other", SMOLLM2_DIR, seed=1)
    out = run_cli("evaluate", f"model={eval_artifacts['original']}", "engine=hf", scen["test_tiny_a"],
                  "runs=1", "accuracy.num_windows=2", f"accuracy.reference={other}",
                  f"results_dir={tmp_path / 'res'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    (acc,) = [r for r in results.read(tmp_path / "res") if r.kind == "accuracy"]
    assert acc.metrics["kl_divergence"] > 1e-5


def test_a_rerun_with_another_accuracy_config_measures_accuracy_anew(eval_artifacts, tmp_path, scen):
    """The accuracy row was keyed by the eval set's name alone: a rerun with
    more windows (or another seed, reference ...) took the old row as complete."""
    args = [f"model={eval_artifacts['original']}", "engine=hf", scen["test_tiny_a"], "runs=1",
            f"results_dir={tmp_path / 'res'}", "accuracy.lastword.num_items=2"]
    for windows, expect in ((2, "appended"), (2, "nothing to do"), (3, "appended")):
        out = run_cli("evaluate", *args, f"accuracy.num_windows={windows}", cwd=tmp_path)
        assert out.returncode == 0 and expect in out.stdout + out.stderr, out.stderr[-2000:]
    accuracy = [r for r in results.read(tmp_path / "res") if r.kind == "accuracy"]
    assert [r.accuracy_config["num_windows"] for r in accuracy] == [2, 3]
    assert [r.metrics["scored_tokens"] for r in accuracy] == [2 * 511, 3 * 511] and accuracy[0].seed == 0
    report = run_cli("evaluate.report", f"results_dir={tmp_path / 'res'}", f"out_dir={tmp_path / 'out'}",
                     "output=[markdown]", cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    section = (tmp_path / "out" / "report.md").read_text().split("## Accuracy", 1)[1].split("\n## ")[0]
    assert "3 windows" in section and "2 windows" not in section   # the latest config, not a mean of both


@pytest.mark.extended
def test_results_per_process_writes_a_shard_that_reruns_honour(eval_artifacts, tmp_path, scen):
    """For jobs on several hosts of a shared filesystem: one file per process,
    still read back by the skip-completed check."""
    args = [f"model={eval_artifacts['original']}", "engine=hf", scen["test_tiny_a"], "runs=1",
            "accuracy=none", f"results_dir={tmp_path}", "results_per_process=true"]
    first = run_cli("evaluate", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    (shard,) = tmp_path.glob("results*.jsonl")
    assert shard.name.startswith("results-") and shard.name != "results.jsonl"
    again = run_cli("evaluate", *args, cwd=tmp_path)
    assert again.returncode == 0 and "nothing to do" in again.stdout + again.stderr
    assert len(results.read(tmp_path)) == 1


@pytest.mark.extended
def test_sweeping_an_engine_setting_measures_each_setting(eval_artifacts, tmp_path, scen):
    """Rows are reused only within one setup: a sweep over an engine arg runs
    every value, and each row says which setup produced it."""
    out = run_cli("evaluate", "-m", f"model={eval_artifacts['original']}", "engine=hf",
                  "engine.args.dtype=float32,bfloat16", scen["test_tiny_a"], "runs=1", "accuracy=none",
                  f"results_dir={tmp_path}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = results.read(tmp_path)
    assert sorted(r.engine_args["dtype"] for r in rows) == ["bfloat16", "float32"]
    assert len({r.setup_id for r in rows}) == 2 and all(r.status == "ok" for r in rows)


# ---------------------------------------------------------------- typed config

def _composed(*overrides: str):
    from hydra import compose, initialize_config_dir

    from quantize.common.config import register
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("evaluate", overrides=list(overrides))


def test_the_entry_converts_the_config_once_into_typed_objects():
    """Below the entry point every setting is a typed object; what rows record
    of the accuracy and lm-eval groups is still the composed group itself."""
    from omegaconf import OmegaConf

    from evaluate.config import EvaluateConfig
    from evaluate.engines import EngineConfig
    from evaluate.scenarios import ScenarioSet
    cfg = _composed("engine=openai", "lm_eval=austen_lastword", "recipe=w4a16_gptq", "runs=auto", "hardware=cpu")
    config = EvaluateConfig.from_cfg(cfg)
    assert isinstance(config.engine, EngineConfig) and config.engine.settings["allow_remote"] is False
    assert config.target.recipe_name == "w4a16_gptq" and config.target.model_name == cfg.model.name
    assert config.plan.auto and config.seed == 0 and config.hardware == "cpu"
    assert (config.limits.runs, config.limits.batch_size, config.limits.batch_tokens) == (100, 1024, "auto")
    assert isinstance(config.scenario, ScenarioSet) and config.scenario.name == "cpu"
    assert config.accuracy.as_dict() == OmegaConf.to_container(cfg.accuracy, resolve=True)
    assert config.lm_eval.as_dict() == OmegaConf.to_container(cfg.lm_eval, resolve=True)
    hub = _composed("lm_eval=hub")
    assert EvaluateConfig.from_cfg(hub).lm_eval.as_dict() == OmegaConf.to_container(hub.lm_eval, resolve=True)
    off = EvaluateConfig.from_cfg(_composed("accuracy=none", "lm_eval=none"))
    assert off.accuracy is None and off.lm_eval is None


def test_a_misspelt_accuracy_key_is_one_line_naming_the_key():
    from evaluate.config import EvaluateConfig
    with pytest.raises(UserError, match="'windw_len' is not a setting of AccuracyConfig; did you mean window_len"):
        EvaluateConfig.from_cfg(_composed("+accuracy.windw_len=3"))


def test_the_job_keeps_no_composed_config():
    """Only the entry sees Hydra's DictConfig (tests/test_entry_configs.py
    checks every function); the Job the steps share keeps none."""
    import dataclasses

    from evaluate import pipeline
    assert "cfg" not in {f.name for f in dataclasses.fields(pipeline.Job)}
