"""`python -m evaluate.search` end to end: a 6-trial study on the tiny random
model through the real Hydra app, Optuna sweeper, quantize and evaluate
subprocesses (engine=hf, small calibration and accuracy windows); and bad
searches stopped with one line before any trial."""
import json
import re
from pathlib import Path

import pytest
import yaml

from evaluate import results
from evaluate.analysis.groups import mean_std
from evaluate.search import speed, study_file
from tests.conftest import SMALL_CALIB, run_cli, tail

N_TRIALS = 6
SCENARIO = "test_search_scen"
STUDY = "tiny-tiny-llama-hf"   # <space>-<model>-<engine>
EVALUATE_SMALL = ("accuracy.num_windows=2", "accuracy.window_len=128", "accuracy.lastword.num_items=8", "runs=1")
SENSITIVITY_COMMAND = "python -m quantize.sensitivity recipe=w4a16_gptq"


def hydra_list(args) -> str:
    return "[" + ",".join(f'"{a}"' for a in args) + "]"


@pytest.fixture(scope="module")
def scenario_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("scenario") / f"{SCENARIO}.yaml"
    path.write_text(f"name: {SCENARIO}\nbatch_size: 1\ninput_len: 32\noutput_len: 8\n")
    return path


def run_search(root: Path, model: Path, scenario: Path, n_trials: int, *args: str, artifacts: Path | None = None):
    res = root / "results"
    proc = run_cli("evaluate.search", "search=tiny", f"model={model}", "engine=hf", f"scenario={scenario}",
                   f"n_trials={n_trials}", f"results_dir={res}", f"artifacts_dir={artifacts or root / 'artifacts'}",
                   f"quantize_overrides={hydra_list(SMALL_CALIB)}", f"evaluate_overrides={hydra_list(EVALUATE_SMALL)}",
                   *args, cwd=root, timeout=1800)
    assert proc.returncode == 0, tail(proc, 40)
    return res


@pytest.fixture(scope="module")
def search_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("search")


@pytest.fixture(scope="module")
def study(tiny_model, scenario_file, search_root):
    res = run_search(search_root, tiny_model, scenario_file, N_TRIALS)
    record = study_file.read(study_file.path_for(res, STUDY))
    infos = {t.number: study_file.read_trial_info(res, STUDY, t.number) for t in record.trials}
    return record, infos, results.read(res)


@pytest.mark.extended
@pytest.mark.slow
def test_six_trials_finish_each_with_an_artifact_and_rows(study):
    record, infos, rows = study
    assert [t.state for t in record.trials] == ["COMPLETE"] * N_TRIALS
    assert [o.name for o in record.objectives] == ["recovery_pct", "output_throughput", "size_mb"]
    assert record.space == "tiny" and record.engine == "hf" and record.model == "tiny-llama"
    for trial in record.trials:
        info = infos[trial.number]
        assert re.fullmatch(r"search-[0-9a-f]{8}", info["recipe"]) and not info.get("error")
        manifest = json.loads((Path(info["artifact_dir"]) / "manifest.json").read_text())
        assert manifest["artifact_id"] == info["artifact_id"] and manifest["recipe"]["name"] == info["recipe"]
        assert any(r.kind == "accuracy" and r.ok and r.artifact_id == info["artifact_id"] for r in rows)
        recipe = yaml.safe_load(Path(info["recipe_path"]).read_text())
        gptq = recipe["quant_stage"]["quant_modifiers"]["GPTQModifier"]
        assert gptq["config_groups"]["group_0"]["weights"]["num_bits"] == {"w4a16": 4, "w8a8": 8}[trial.params["trial.scheme"]]
        assert "python -m quantize recipe=file" in info["repro"] and "python -m evaluate model=" in info["repro"]
        assert f"{SCENARIO}.yaml" in info["repro"]   # the repro line measures the speed, even where it was reused


@pytest.mark.extended
@pytest.mark.slow
def test_the_values_are_those_of_the_rows_and_manifests(study):
    record, infos, rows = study
    for trial in record.trials:
        info = infos[trial.number]
        recovery, throughput, size = trial.values
        assert info["values"] == trial.values   # the job's record, which a resumed sweeper reads
        accuracy = [r for r in rows if r.kind == "accuracy" and r.ok and r.artifact_id == info["artifact_id"]]
        assert recovery == pytest.approx(accuracy[-1].metrics["recovery_pct"])
        manifest = json.loads((Path(info["artifact_dir"]) / "manifest.json").read_text())
        assert size == pytest.approx(manifest["bytes_on_disk"]["total"] / 1e6)
        source = info["artifact_id"] if info["speed"] == "measured" else info["speed"].removeprefix("reused from ")
        runs = [r.metrics["output_throughput"] for r in rows
                if r.kind == "speed" and r.ok and r.artifact_id == source and r.scenario == SCENARIO]
        assert runs and throughput == pytest.approx(mean_std(runs)[0])


@pytest.mark.extended
@pytest.mark.slow
def test_speed_is_measured_once_per_kernel_path_and_reused_after(study):
    record, infos, rows = study
    speeds = [infos[t.number]["speed"] for t in record.trials]
    assert speeds[0] == "measured" and any(s.startswith("reused from ") for s in speeds)
    measured = {r.artifact_id: r for r in rows if r.kind == "speed" and r.ok}
    paths = [speed.kernel_path(r.manifest) for r in measured.values()]
    assert len(paths) == len(set(paths)), "two artifacts of one kernel path were both measured"
    for trial in record.trials:
        info = infos[trial.number]
        if info["speed"] != "measured":
            source = measured[info["speed"].removeprefix("reused from ")]
            own = json.loads((Path(info["artifact_dir"]) / "manifest.json").read_text())
            assert speed.kernel_path(source.manifest) == speed.kernel_path(own)
    # trials that drew the same recipe share one artifact
    by_recipe = {}
    for info in infos.values():
        by_recipe.setdefault(info["recipe"], set()).add(info["artifact_id"])
    assert all(len(ids) == 1 for ids in by_recipe.values())


@pytest.mark.extended
@pytest.mark.slow
def test_trials_side_by_side_measure_one_kernel_path_once(search_root, tiny_model, scenario_file, tmp_path):
    """Two trials at once on the joblib launcher, both W8A8 (a value on the
    command line fixes a param, as in any Optuna sweep): the second waits for
    the first's speed lock and reuses its runs. The artifacts folder is the
    study's: after it, quantize only finds them."""
    res = run_search(tmp_path, tiny_model, scenario_file, 2, "n_jobs=2", "hydra/launcher=local_parallel",
                     "trial.scheme=w8a8", artifacts=search_root / "artifacts")
    record = study_file.read(study_file.path_for(res, STUDY))
    infos = [study_file.read_trial_info(res, STUDY, t.number) for t in record.trials]
    assert [t.state for t in record.trials] == ["COMPLETE"] * 2
    assert {Path(i["recipe_path"]).read_text().count("input_activations") for i in infos} == {1}   # W8A8
    assert sorted(i["speed"] == "measured" for i in infos) == [False, True]
    speed_rows = {r.artifact_id for r in results.read(res) if r.kind == "speed" and r.ok}
    assert len(speed_rows) == 1


@pytest.mark.extended
@pytest.mark.slow
def test_kept_dense_groups_stay_unquantized_and_unpruned(tiny_model, scenario_file, tmp_path):
    """One trial with k=2 from a sensitivity file and 2:4 on: the two most
    sensitive modules are saved as they were (bf16, no pruned zeros), every
    other Linear is int4 and 2:4 sparse."""
    from safetensors import safe_open

    from tests.evaluate.search.test_search_space import write_sensitivity
    res = tmp_path / "results"
    write_sensitivity(res, tiny_model, {(0, "mlp.down_proj"): 0.5, (1, "self_attn.q_proj"): 0.9, (1, "mlp.up_proj"): 0.1})
    run_search(tmp_path, tiny_model, scenario_file, 1, "trial.scheme=w4a16", "trial.keep_dense=2",
               "trial.sparse_2_4=true")
    info = study_file.read_trial_info(res, STUDY, 0)
    kept = ["model.layers.1.self_attn.q_proj", "model.layers.0.mlp.down_proj"]
    manifest = json.loads((Path(info["artifact_dir"]) / "manifest.json").read_text())
    assert set(kept) <= set(manifest["quantization"]["ignore"])
    assert manifest["checks"]["sparsity"]["all_layers_hold_pattern"] and manifest["modules_changed"]["pruned"] == 12
    with safe_open(str(Path(info["artifact_dir"]) / "model.safetensors"), "pt") as weights:
        for name in kept:
            tensor = weights.get_tensor(f"{name}.weight")
            assert tensor.dtype.is_floating_point and not (tensor == 0).any()
        assert "model.layers.0.mlp.up_proj.weight_packed" in weights.keys()
    assert "sensitivity/tiny-llama/" in Path(info["recipe_path"]).read_text().splitlines()[1]


def test_a_failing_stage_fails_its_trial_with_one_line(tiny_model, scenario_file, tmp_path):
    res = tmp_path / "results"
    proc = run_cli("evaluate.search", "search=tiny", f"model={tiny_model}", "engine=hf", f"scenario={scenario_file}",
                   "n_trials=1", f"results_dir={res}", f"artifacts_dir={tmp_path / 'artifacts'}",
                   'quantize_overrides=["calibration.no_such_setting=1"]', cwd=tmp_path)
    assert proc.returncode == 1, tail(proc)   # the sweep ends; its summary lists the failed job
    (trial,) = study_file.read(study_file.path_for(res, STUDY)).trials
    info = study_file.read_trial_info(res, STUDY, 0)
    assert trial.state == "FAIL" and trial.values is None
    # exit 2: bad input (quantize.common.errors.ExitCode)
    assert info["error"].startswith("quantize failed (exit 2): ") and "no_such_setting" in info["error"]
    assert "\n" not in info["error"] and (res / "search" / STUDY / "logs" / "0-quantize.log").is_file()
    assert not (tmp_path / "artifacts").exists()


def one_error_line(proc) -> str:
    assert proc.returncode == 2, tail(proc)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_an_unknown_search_space_is_one_line(tmp_path):
    line = one_error_line(run_cli("evaluate.search", "search=no_such_space", f"results_dir={tmp_path}", cwd=tmp_path))
    assert "unknown search 'no_such_space'" in line and "default" in line and "tiny" in line


def test_kept_dense_groups_without_a_sensitivity_file_name_the_command(tiny_model, tmp_path):
    res = tmp_path / "results"
    proc = run_cli("evaluate.search", f"model={tiny_model}", "engine=hf", f"results_dir={res}", cwd=tmp_path)
    line = one_error_line(proc)
    assert SENSITIVITY_COMMAND in line and "keep_dense" in line
    assert not (res / "search").exists()   # no study was started
    # the line's other fix: a value on the command line replaces the space's range
    assert "trial.keep_dense=0" in line
    fixed = run_cli("evaluate.search", f"model={tiny_model}", "engine=hf", "trial.keep_dense=0", "scenario=cpu",
                    f"results_dir={res}", cwd=tmp_path)
    assert "one scenario" in one_error_line(fixed)   # past the sensitivity check, to the next one


def test_a_named_sensitivity_file_of_another_models_weights_stops_the_search_before_its_first_trial(tiny_model,
                                                                                                      tmp_path):
    """It was used as it was: the trials kept dense what another model's file ranked."""
    from tests.evaluate.search.test_search_space import write_sensitivity
    res = tmp_path / "results"
    other = write_sensitivity(tmp_path / "elsewhere", tiny_model, {(0, "mlp.up_proj"): 0.1, (1, "mlp.up_proj"): 0.2},
                              weights_hash="0" * 64)
    line = one_error_line(run_cli("evaluate.search", f"model={tiny_model}", "engine=hf", f"sensitivity={other}",
                                  f"results_dir={res}", cwd=tmp_path))
    assert line.startswith(f"error: sensitivity={other} was measured on other weights") and SENSITIVITY_COMMAND in line
    assert not (res / "search").exists()


@pytest.mark.parametrize("args,says", [
    (["scenario=cpu"], "one scenario"),                        # a set: the speed objective needs one
    (["accuracy=none"], "recovery_pct needs an accuracy measurement"),
    (["n_trials=-2"], "n_trials=-2: pass an integer >= 1, e.g. n_trials=20"),   # ran no trial and exited 0
    (["n_jobs=0"], "n_jobs=0: pass an integer >= 1, e.g. n_jobs=2"),           # an IndexError deep in Optuna
    (["trial.dampening=-1"], "trial values out of range"),                      # failed in the first trial
    (["storage=-1"], "hydra.sweeper.storage=-1 is not a database URL"),        # an AttributeError
    (["trial.scheme=[1]"], "unknown scheme family '[1]'; choose from"),          # a TypeError: unhashable list
    (["trial.group_size=true"], "trial.group_size=true is not an integer"),      # int(True): group size 1
    (["seed="], "error: seed=: pass an integer for seed"),                       # OmegaConf's interpolation error
    # a sweep expression beside them: the checks ran on no config (each trial failed, or Optuna raised)
    (["trial.keep_dense=range(0,3)", "trial.scheme=choice(w4a16,w8a8)"], "keep_dense > 0 needs the sensitivity"),
    (["trial.scheme=choice(w4a16,w9a9)"], "unknown scheme family 'w9a9'"),
    (["n_jobs=0", "trial.scheme=choice(w4a16,w8a8)"], "n_jobs=0: pass an integer >= 1"),       # an IndexError
    (["n_trials=abc", "trial.scheme=w4a16,w8a8"], "n_trials=abc: pass an integer >= 1"),      # a TypeError
    (["n_jobs=2.5", "trial.smoothquant=interval(0,0.5)"], "n_jobs=2.5: pass an integer >= 1"),  # a TypeError
    (["trial.keep_dense=range(5,1)"], "trial.keep_dense=range(5,1) gives no value to search"),   # a StopIteration
    # measured at scenario=interactive, labelled decode_bound in study.json
    (["search.objectives.1.scenario=decode_bound"], "objective output_throughput is at scenario decode_bound, but"),
    # one folder under results_dir/search: a '/' hid study.json from the report, '..' wrote outside
    (["study=a/b"], "study='a/b' is not a folder name: it becomes one folder under results_dir/search"),
    (["study=../escape"], "study='../escape' is not a folder name"),
    (["study="], "study='' is not a folder name"),   # search/study.json, the trials' records in search/trials/
])
def test_a_search_that_cannot_run_stops_before_its_first_trial(tiny_model, tmp_path, args, says):
    proc = run_cli("evaluate.search", "search=tiny", f"model={tiny_model}", "engine=hf", f"results_dir={tmp_path}",
                   *args, cwd=tmp_path)
    assert says in one_error_line(proc)
    assert not (tmp_path / "search").exists() and not (tmp_path.parent / "escape").exists()


def test_a_format_the_engine_cannot_serve_here_fails_its_trial_before_quantizing(tiny_model, scenario_file, tmp_path):
    from quantize.common import machine
    if machine.detect().cuda:
        pytest.skip("vLLM on CUDA serves W8A16 (Marlin): the refusal is vLLM-CPU's")
    res = tmp_path / "results"
    proc = run_cli("evaluate.search", "search=tiny", f"model={tiny_model}", "engine=vllm", f"scenario={scenario_file}",
                   "trial.scheme=w8a16", "n_trials=1", f"results_dir={res}", f"artifacts_dir={tmp_path / 'artifacts'}",
                   cwd=tmp_path)
    assert proc.returncode == 1, tail(proc)
    info = study_file.read_trial_info(res, "tiny-tiny-llama-vllm", 0)
    assert info["error"].startswith("not quantized: vllm cannot serve W8A16 here"), info
    assert not (tmp_path / "artifacts").exists()   # no minutes spent on an artifact that cannot be measured


def test_a_trials_stages_decide_for_themselves_whether_they_go_online(monkeypatch):
    """The trial ran offline and its stages inherited HF_HUB_OFFLINE=1 as the
    user's own: quantize_overrides=[calibration=wikitext] failed every trial
    unless cached. A value the user set still reaches them."""
    from evaluate.search import __main__ as search, trial
    monkeypatch.setattr(search, "_trial", lambda cfg: trial._stage_env())
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert "HF_HUB_OFFLINE" not in search._hydra_main.__wrapped__(None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert search._hydra_main.__wrapped__(None)["HF_HUB_OFFLINE"] == "1"
