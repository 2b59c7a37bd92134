"""Cost control's rule: a speed measurement is reused only for the same
kernel path, measured on this host (hardware and measuring versions), engine
and scenario; and which earlier evaluate job a trial need not start again."""
import pytest

from evaluate.results import Row
from evaluate.search import speed
from evaluate.search.trial import ran_before

HOST = speed.Host(hardware={"cpu": "X", "cpu_count": 2}, versions={"torch": "2.9", "vllm": "0.11"})
W4 = {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 64}, "activations": None}
ONE_RUN = speed.run_plan(["runs=1"])
ANY_SETUP = lambda row: True   # noqa: E731  (the evaluate setup is tested on its own below)
W8A8 = {"weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
        "activations": {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}}


def fields(scheme=W4, fmt="pack-quantized", base="abc", sparse=None) -> dict:
    out = {"model": {"name": "m", "weights_sha256": base}, "quantization": {"format": fmt, "schemes": [scheme]}}
    return out | ({"sparsity": {"all_layers_hold_pattern": sparse}} if sparse is not None else {})


def row(artifact_id: str, manifest: dict, throughput: float = 10.0, **changes) -> Row:
    base = Row(kind="speed", status="ok", artifact_id=artifact_id, engine="vllm", scenario="interactive",
               manifest=manifest, hardware={"hostname": "a", **HOST.hardware}, versions=dict(HOST.versions),
               metrics={"output_throughput": throughput}, run_index=0)
    return base.but(**changes)


def test_the_first_artifact_of_the_same_kernel_path_is_reused():
    rows = [row("w8", fields(W8A8, "int-quantized")), row("first", fields()), row("second", fields())]
    assert speed.measured_before(rows, fields(), "vllm", "interactive", HOST, ANY_SETUP, ONE_RUN) == "first"


@pytest.mark.parametrize("other", [
    fields(W4 | {"weights": {**W4["weights"], "group_size": 32}}),   # another group size
    fields(W8A8, "int-quantized"),                                     # another scheme and format
    fields(sparse=True),                                               # 2:4
    fields(base="other base weights"),                                 # another model
])
def test_another_kernel_path_is_measured(other):
    assert speed.measured_before([row("a", other)], fields(), "vllm", "interactive", HOST, ANY_SETUP, ONE_RUN) is None


@pytest.mark.parametrize("changes", [
    {"engine": "hf"}, {"scenario": "medium_batch"}, {"status": "failed"}, {"kind": "accuracy"},
    {"hardware": {"hostname": "a", "cpu": "Y", "cpu_count": 2}},       # another machine
    {"versions": {"torch": "2.9", "vllm": "0.12"}},                     # another vLLM measures anew
])
def test_rows_of_another_setup_are_not_reused(changes):
    assert speed.measured_before([row("a", fields(), **changes)], fields(), "vllm", "interactive", HOST, ANY_SETUP, ONE_RUN) is None


def test_a_twin_node_counts_as_this_host_and_the_mean_is_over_its_runs():
    rows = [row("a", fields(), 10.0, hardware={"hostname": "b", **HOST.hardware}), row("a", fields(), 14.0),
            row("a", fields(), 99.0, engine="hf")]
    assert speed.measured_before(rows, fields(), "vllm", "interactive", HOST, ANY_SETUP, ONE_RUN) == "a"
    assert speed.mean_of(rows, "a", "vllm", "interactive", "output_throughput", HOST, ANY_SETUP) == pytest.approx(12.0)
    assert speed.mean_of(rows, "b", "vllm", "interactive", "output_throughput", HOST, ANY_SETUP) is None


def test_a_stage_ran_before_only_with_the_same_arguments_as_its_entry_rewrites_them(tmp_path):
    command = ["python", "-m", "evaluate", f"model={tmp_path}", "engine=hf", "scenario=none", "runs=1"]
    recorded = f"cd /x && python -m quantize recipe=r && cd /y && python -m evaluate model=local model.path={tmp_path} " \
               "engine=hf scenario=file scenario.path=/s.yaml runs=1"
    assert not ran_before(recorded, "evaluate", command)
    assert ran_before(recorded, "evaluate", command, ignore=("scenario", "scenario.path"))
    assert not ran_before(recorded, "evaluate", command[:-1] + ["runs=2"], ignore=("scenario", "scenario.path"))
    assert not ran_before(None, "evaluate", command) and not ran_before("python -m quantize a=b", "evaluate", command)


def test_a_trial_whose_overrides_hold_a_password_finds_the_rows_its_evaluate_wrote(tmp_path):
    """The rows record the command with a URL's password as ***: compared with
    the trial's own (the real password), no row matched, and every trial of a
    search with `evaluate_overrides: [tracking.uri=postgresql://u:<password>@...]`
    failed ("evaluate wrote no <metric>") and quantized again."""
    import shlex
    from types import SimpleNamespace
    from quantize.common.config import expand_path_shorthands, open_pass_through_keys
    from quantize.common.credentials import redact_override
    from evaluate.search.trial import SCENARIO_KEYS, evaluate_command
    uri = "tracking.uri=postgresql://mlflow:S3cret@db.lab/mlflow"
    cfg = SimpleNamespace(engine="hf", scenario_arg="interactive", accuracy="austen", results_dir=tmp_path / "res",
                          evaluate_overrides=["tracking=mlflow", uri])
    (tmp_path / "a").mkdir()
    command = evaluate_command(cfg, tmp_path / "a", measure_speed=False)
    recorded = [redact_override(a) for a in open_pass_through_keys(expand_path_shorthands(command[3:]))]
    repro = "cd /x && python -m evaluate " + " ".join(map(shlex.quote, recorded))   # as jobs.job_command writes it
    assert "S3cret" not in repro
    assert ran_before(repro, "evaluate", command, ignore=SCENARIO_KEYS)
    cfg.evaluate_overrides = ["tracking=mlflow", uri.replace("db.lab", "db2.lab")]
    other = evaluate_command(cfg, tmp_path / "a", measure_speed=False)
    assert not ran_before(repro, "evaluate", other, ignore=SCENARIO_KEYS)


def test_studies_that_calibrate_differently_build_a_recipe_into_two_artifacts():
    """The recipe name is the hash of its text; the artifact folder also says
    how it was calibrated, or a second study (another seed, other
    quantize_overrides) would find the first's artifact and be refused."""
    from types import SimpleNamespace
    from evaluate.search.trial import artifact_name
    default = SimpleNamespace(seed=0, quantize_overrides=[])
    fewer = SimpleNamespace(seed=0, quantize_overrides=["calibration.num_samples=16"])
    reseeded = SimpleNamespace(seed=1, quantize_overrides=[])
    assert artifact_name(default, "search-3454374c") == "search-3454374c"
    names = {artifact_name(c, "search-3454374c") for c in (default, fewer, reseeded)}
    assert len(names) == 3 and all(n.startswith("search-3454374c") for n in names)
    assert artifact_name(fewer, "search-3454374c") == artifact_name(
        SimpleNamespace(seed=0, quantize_overrides=["calibration.num_samples=16"]), "search-3454374c")


def test_a_changed_password_in_quantize_overrides_builds_the_same_artifact():
    """The digest was of the overrides as typed: a new password re-quantized
    every recipe into a new -q<digest> folder."""
    from types import SimpleNamespace
    from evaluate.search.trial import artifact_name

    def name(uri: str) -> str:
        return artifact_name(SimpleNamespace(seed=0, quantize_overrides=[f"tracking.uri={uri}"]), "search-3454374c")
    assert name("postgresql://u:s3cret@h/db") == name("postgresql://u:n3wpass@h/db")
    assert name("postgresql://u:s3cret@h/db") != name("postgresql://u:s3cret@h2/db")


def test_a_stage_that_set_an_engine_arg_ran_before_as_its_entry_recorded_it(tmp_path):
    """evaluate records `engine.args.X=v` as `++engine.args.X=v`: the
    accuracy-only evaluate of a point measured before is not started again."""
    from quantize.common.config import expand_path_shorthands, open_pass_through_keys
    command = ["python", "-m", "evaluate", f"model={tmp_path}", "engine=vllm", "scenario=none",
               "engine.args.max_num_seqs=8"]
    recorded = "cd /x && python -m evaluate " + " ".join(open_pass_through_keys(expand_path_shorthands(command[3:])))
    assert "++engine.args.max_num_seqs=8" in recorded
    assert ran_before(recorded, "evaluate", command)
    assert not ran_before(recorded, "evaluate", command[:-1] + ["engine.args.max_num_seqs=4"])


def test_speed_is_reused_and_averaged_only_over_runs_of_the_trials_own_evaluate_setup(tmp_path):
    """A run measured with other engine args (a manual run, another study's
    evaluate_overrides) is neither reused nor averaged in."""
    from types import SimpleNamespace
    from quantize.common.config import expand_path_shorthands, open_pass_through_keys
    from evaluate.search.trial import evaluate_command, same_speed_setup

    def config(overrides):
        return SimpleNamespace(engine="vllm", scenario_arg="interactive", accuracy="austen",
                               results_dir=tmp_path / "res", evaluate_overrides=overrides)

    def measured_by(cfg, artifact, throughput):
        (tmp_path / artifact).mkdir(exist_ok=True)
        args = evaluate_command(cfg, tmp_path / artifact, measure_speed=True)[3:]
        repro = "cd /x && python -m evaluate " + " ".join(open_pass_through_keys(expand_path_shorthands(args)))
        return row(artifact, fields(), throughput, repro=repro)

    mine, other = config(["engine.args.max_num_seqs=8"]), config(["engine.args.max_num_seqs=1"])
    rows = [measured_by(other, "manual", 10.0), measured_by(mine, "trial-1", 40.0), measured_by(other, "trial-1", 12.0)]
    (tmp_path / "trial-2").mkdir()
    same = same_speed_setup(mine, tmp_path / "trial-2", HOST)
    assert speed.measured_before(rows, fields(), "vllm", "interactive", HOST, same, ONE_RUN) == "trial-1"
    assert speed.mean_of(rows, "trial-1", "vllm", "interactive", "output_throughput", HOST, same) == 40.0
    assert speed.measured_before(rows[:1], fields(), "vllm", "interactive", HOST, same, ONE_RUN) is None


def test_a_measurement_that_still_owes_runs_is_not_reused_until_its_runs_are_measured():
    """Cut short after run 1 of runs=3 (or two runs failed): the retried trial
    evaluates again, which measures only the missing runs."""
    three = speed.run_plan([])   # conf/evaluate.yaml: runs: 3
    assert three.runs == 3 and speed.run_plan(["runs=auto"]).auto
    first = row("a", fields(), 15.8, run_index=0)
    failed = [row("a", fields(), run_index=i, status="failed") for i in (1, 2)]
    assert speed.measured_before([first, *failed], fields(), "vllm", "interactive", HOST, ANY_SETUP, three) is None
    complete = [first, row("a", fields(), 31.0, run_index=1), row("a", fields(), 30.0, run_index=2)]
    assert speed.measured_before(complete, fields(), "vllm", "interactive", HOST, ANY_SETUP, three) == "a"
    # another artifact of the kernel path measured in full is reused meanwhile
    other = [row("b", fields(), run_index=i) for i in range(3)]
    assert speed.measured_before([first, *other], fields(), "vllm", "interactive", HOST, ANY_SETUP, three) == "b"


def test_the_accuracy_objective_is_this_studys_evaluate_commands_newest_row(tmp_path):
    """Another study measured the same artifact later with other accuracy
    settings: its row is not this study's value."""
    from types import SimpleNamespace
    from quantize.common.config import expand_path_shorthands
    from evaluate.search.trial import evaluate_command, objective_value

    def config(overrides):
        return SimpleNamespace(engine="vllm", scenario_arg="interactive", accuracy="austen", accuracy_enabled=True,
                               results_dir=tmp_path / "res", evaluate_overrides=overrides)

    def measured_by(cfg, recovery, when):
        repro = "python -m evaluate " + " ".join(expand_path_shorthands(
            evaluate_command(cfg, tmp_path, measure_speed=False)[3:]))
        return row("X", fields(), kind="accuracy", repro=repro, timestamp=when, metrics={"recovery_pct": recovery})

    mine, other = config([]), config(["accuracy.num_windows=4"])
    rows = [measured_by(mine, 91.0, "2026-01-02T00:00:00"), measured_by(mine, 90.0, "2026-01-01T00:00:00"),
            measured_by(other, 97.3, "2026-01-03T00:00:00")]
    built = SimpleNamespace(manifest=SimpleNamespace(artifact_id="X"), artifact_dir=tmp_path)
    assert objective_value("recovery_pct", rows, mine, built, "X", None, HOST) == 91.0
    assert objective_value("recovery_pct", rows, other, built, "X", None, HOST) == 97.3


def test_on_a_gpu_host_a_trial_finds_the_rows_its_own_evaluate_wrote(tmp_path, monkeypatch):
    """evaluate's entry adds hardware=cuda to what its rows record on a GPU
    host: the trial's command left it out, so no row was ever its own and every
    trial with a speed or accuracy objective failed there."""
    from types import SimpleNamespace
    from evaluate import hardware
    from quantize.common.config import expand_path_shorthands, open_pass_through_keys
    from evaluate.search.trial import SCENARIO_KEYS, evaluate_command, ran_before, same_speed_setup
    monkeypatch.setattr("quantize.common.machine.gpus", lambda: {"cuda": ((9, 0),)})
    cfg = SimpleNamespace(engine="vllm", scenario_arg="interactive", accuracy="austen",
                          results_dir=tmp_path / "res", evaluate_overrides=["engine.args.max_num_seqs=8"])
    (tmp_path / "a").mkdir()
    for speed_too in (True, False):
        launched = evaluate_command(cfg, tmp_path / "a", measure_speed=speed_too)[3:]
        as_recorded = hardware.with_default(open_pass_through_keys(expand_path_shorthands(launched)))
        repro = "cd /x && python -m evaluate " + " ".join(as_recorded)
        assert "hardware=cuda" in repro
        if speed_too:
            assert same_speed_setup(cfg, tmp_path / "a", HOST)(row("a", fields(), 40.0, repro=repro))
        else:
            assert ran_before(repro, "evaluate", evaluate_command(cfg, tmp_path / "a", False), ignore=SCENARIO_KEYS)


def trial_config(tmp_path, engine="vllm", overrides=()):
    from types import SimpleNamespace
    return SimpleNamespace(engine=engine, scenario_arg="interactive", accuracy="none", results_dir=tmp_path / "res",
                           evaluate_overrides=list(overrides))


def exported(monkeypatch, values: dict) -> None:
    """A shell that exported `values` (and no other thread variable) when quantbench started."""
    from evaluate.engines import base
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(base, "LAUNCH_ENV", (base.LAUNCH_ENV - {"OMP_NUM_THREADS", "MKL_NUM_THREADS"}) | set(values))


def test_runs_measured_with_other_threads_exported_in_the_shell_are_neither_reused_nor_averaged(tmp_path, monkeypatch):
    """The row's command is the same, but the shell exported OMP_NUM_THREADS=1
    for one: evaluate gave it another setup, and the search took its runs
    for this trial's (the mean of a 1-thread and a 2-thread run)."""
    from evaluate.search.trial import evaluate_command, same_speed_setup
    cfg = trial_config(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    args = evaluate_command(cfg, tmp_path / "a", measure_speed=True)[3:]
    repro = "cd /x && python -m evaluate " + " ".join(args)
    exported(monkeypatch, {"OMP_NUM_THREADS": "1"})
    one_thread = speed.evaluate_setup(args, HOST)
    exported(monkeypatch, {})
    plain = speed.evaluate_setup(args, HOST)
    assert one_thread != plain
    rows = [row("a", fields(), 10.0, repro=repro, comparison_id=one_thread),
            row("a", fields(), 30.0, repro=repro, comparison_id=plain)]
    same = same_speed_setup(cfg, tmp_path / "b", HOST)
    assert speed.mean_of(rows, "a", "vllm", "interactive", "output_throughput", HOST, same) == 30.0
    assert speed.measured_before(rows[:1], fields(), "vllm", "interactive", HOST, same, ONE_RUN) is None
    assert speed.measured_before(rows[1:], fields(), "vllm", "interactive", HOST, same, ONE_RUN) == "a"


def test_the_trials_setup_is_the_one_its_evaluate_records(tiny_model, tmp_path, monkeypatch):
    """Computed by evaluate's own code, not a copy of it: a row the trial's
    evaluate command wrote carries the setup the trial looks for."""
    import subprocess
    from tests.conftest import quantize_env
    from evaluate import results
    from evaluate.search.trial import evaluate_command
    exported(monkeypatch, {"OMP_NUM_THREADS": "1"})
    cfg = trial_config(tmp_path, "hf", ["runs=1", "engine.args.max_model_len=128"])
    (tmp_path / "interactive.yaml").write_text("name: interactive\nbatch_size: 1\ninput_len: 8\noutput_len: 2\n")
    cfg.scenario_arg = str(tmp_path / "interactive.yaml")
    command = evaluate_command(cfg, tiny_model, measure_speed=True)
    out = subprocess.run(command, cwd=tmp_path, env=quantize_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    written = {r.comparison_id for r in results.read(cfg.results_dir)}
    assert written == {speed.evaluate_setup(command[3:], speed.Host.here())}


def test_the_trials_setup_is_computed_by_the_function_evaluate_records_its_rows_comparison_id_with(monkeypatch):
    """One home: the search's evaluate_setup and the pipeline's rows call
    evaluate.pipeline.comparison_id, whose value is the setup id of the
    engine config as configured (ids already in stores keep matching)."""
    from evaluate import engines, pipeline, results
    args = ["engine=hf", "engine.args.max_model_len=128"]
    preset = engines.config("hf")
    engine_cfg = engines.build(preset | {"args": {**preset["args"], "max_model_len": 128}})
    expected = results.setup_id(engines.identity(engine_cfg, engine_cfg.engine), HOST.versions, HOST.hardware)
    assert pipeline.comparison_id(engine_cfg, HOST.versions, HOST.hardware) == expected
    assert speed.evaluate_setup(args, HOST) == expected
    calls = []
    monkeypatch.setattr(pipeline, "comparison_id", lambda cfg, versions, hardware: calls.append(cfg.name) or "one")
    assert speed.evaluate_setup(args, HOST) == "one" and calls == ["hf"]
