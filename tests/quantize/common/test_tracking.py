"""The tracking sink without a server: its config group, the one-line
answers (a missing package, a failing tracker), and the MLflow tracker on a
SQLite file (no server), where a second write of the same runs adds nothing.
tests/test_tracking_server.py drives the stages against a real MLflow server."""
import importlib.util
import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from quantize.common import tracking
from quantize.common.errors import UserError
from quantize.common.tracking import Metric, RunRecord, Tracker
from tests.conftest import ROOT, quantize_env

MLFLOW = {"_target_": "quantize.common.mlflow_tracker.MlflowTracker", "name": "mlflow"}
needs_mlflow = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                                  reason="mlflow-skinny is not installed (bash scripts/setup.sh installs it)")


def test_tracking_none_is_off_and_mlflow_is_built():
    assert tracking.from_group({"name": "none"}) is None
    assert tracking.from_group(None) is None
    if importlib.util.find_spec("mlflow"):
        built = tracking.from_group({**MLFLOW, "uri": "http://127.0.0.1:5000", "experiment": "e"})
        assert (built.uri, built.experiment) == ("http://127.0.0.1:5000", "e")


def test_an_unknown_setting_is_one_line_naming_the_close_one():
    if importlib.util.find_spec("mlflow") is None:
        pytest.skip("mlflow-skinny is not installed")
    with pytest.raises(UserError, match="'url' is not a setting of MlflowTracker; did you mean uri"):
        tracking.from_group({**MLFLOW, "url": "http://127.0.0.1:5000"})


@needs_mlflow
@pytest.mark.parametrize("uri", ["htp://127.0.0.1:5000", "foo://bar"])
def test_a_uri_mlflow_has_no_store_for_is_one_line_before_any_work(uri):
    with pytest.raises(UserError, match=rf"MLflow has no store for uri='{uri}' .*pass tracking.uri=http://"):
        tracking.from_group({**MLFLOW, "uri": uri})
    for fine in ("sqlite:///mlflow.db", "mysql+pymysql://u:p@127.0.0.1/db", "file:///tmp/runs", "runs"):
        assert tracking.from_group({**MLFLOW, "uri": fine}).uri == fine


@needs_mlflow
def test_the_track_command_refuses_a_bad_uri_with_exit_2(tmp_path):
    """It ended `error: cannot log to the tracker: …` with exit 1, a wrapped page of MLflow's words."""
    proc = subprocess.run([sys.executable, "-m", "evaluate.track", f"results_dir={tmp_path}", "tracking.uri=htp://x"],
                          cwd=tmp_path, env=quantize_env(), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: conf/tracking/mlflow.yaml: MLflow has no store")


def test_without_the_package_the_job_says_how_to_install_it_in_one_line(tmp_path):
    """`tracking=mlflow` where mlflow is not installed: one line naming the
    install step, exit 2, before anything is measured."""
    hide = "import sys; sys.modules['mlflow'] = None; from evaluate.cli import main; main()"
    proc = subprocess.run([sys.executable, "-c", hide, "engine=hf", "tracking=mlflow", f"results_dir={tmp_path}"],
                          cwd=tmp_path, env=quantize_env(), capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("error: tracking=mlflow needs the mlflow-skinny package") and \
        "bash scripts/setup.sh" in lines[0], lines[0]
    assert not list(tmp_path.glob("results*.jsonl"))


@dataclass
class Broken(Tracker):
    writes: int = 0

    def write(self, record):
        self.writes += 1
        raise ConnectionError("connection refused\nsecond line")


def test_a_failing_tracker_warns_once_and_never_raises(caplog):
    broken = Broken(name="broken")
    record = RunRecord(key="k", name="n")
    with caplog.at_level(logging.WARNING, logger="quantbench.tracking"):
        assert broken.log(record) is False
        assert broken.log(record) is False   # quiet now: not tried again
    assert broken.writes == 1
    [line] = [r.getMessage() for r in caplog.records]
    assert "ConnectionError: connection refused" in line and "second line" not in line
    assert "python -m evaluate.track" in line


def test_keys_values_and_metrics_as_a_tracker_takes_them():
    assert tracking.clean_key("oneshot (calibrate + quantize in float32)") == "oneshot calibrate quantize in float32"
    assert tracking.flat({"a": {"b": 1, "c": [1, 2]}, "d": {}}, "p") == {"p.a.b": 1, "p.a.c": [1, 2], "p.d": {}}
    assert tracking.clean_params({"x": [1, 2], "y": None, "z": "t" * 7000}) == {"x": "[1, 2]", "z": "t" * 5999 + "…"}
    assert tracking.numeric({"a": 1, "b": True, "c": "s", "d": float("nan"), "e": 2.5}, step=3) == (
        Metric("a", 1.0, 3), Metric("e", 2.5, 3))
    assert tracking.run_key("a", None) == tracking.run_key("a", None) != tracking.run_key("a", "None")


def artifact_dir(tmp_path):
    """An artifact as quantize leaves it, for its manifest and recipe only."""
    art = tmp_path / "art"
    art.mkdir()
    (art / "recipe.yaml").write_text("quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n"
                                     "      scheme: W4A16\n      targets: [Linear]\n")
    (art / "manifest.json").write_text(json.dumps({
        "artifact_id": "0123456789abcdef", "model": {"name": "tiny"}, "recipe": {"name": "w4a16_rtn"},
        "quantization": {"format": "pack-quantized"}, "bytes_on_disk": {"total": 2000, "weights": 1500},
        "timings_s": {"oneshot (calibrate + quantize in float32)": 3.5, "total": 4.0},
        "checks": {"sanity": {"top1_agreement": 0.96, "kl_divergence": 0.001}}}))
    return art


def test_an_artifact_as_a_run(tmp_path):
    record = tracking.artifact_record(artifact_dir(tmp_path))
    assert record.key == tracking.artifact_key("0123456789abcdef") and record.name == "tiny/w4a16_rtn"
    assert record.params["recipe.quant_stage.quant_modifiers.QuantizationModifier.scheme"] == "W4A16"
    assert {m.key: m.value for m in record.metrics} == {
        "size_bytes": 2000, "weights_bytes": 1500, "time_s.oneshot calibrate quantize in float32": 3.5,
        "time_s.total": 4.0, "sanity.top1_agreement": 0.96, "sanity.kl_divergence": 0.001}
    assert [p.name for p in record.files] == ["manifest.json", "recipe.yaml"] and "sanity.json" in record.texts
    assert tracking.artifact_record(tmp_path) is None   # no manifest: nothing to log


@needs_mlflow
def test_mlflow_on_a_sqlite_file_logs_each_run_and_step_once(tmp_path):
    from mlflow import MlflowClient
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = tracking.artifact_record(artifact_dir(tmp_path))

    def measurement(step: int) -> RunRecord:
        return RunRecord(key="m1", name="scenario", params={"engine": "hf"}, tags={"setup_id": "s1"},
                         metrics=(Metric("tok_s", 10.0 + step, step), Metric("ttft_ms", 5.0, step)), parent=parent)

    for attempt in range(2):  # the second, in a fresh process's tracker, finds everything logged
        tracker = tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"})
        assert tracker.log(measurement(0), measurement(1), measurement(1))
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("unit").experiment_id])
    by_name = {r.info.run_name: r for r in runs}
    assert sorted(by_name) == ["scenario", "tiny/w4a16_rtn"]
    child, art = by_name["scenario"], by_name["tiny/w4a16_rtn"]
    assert child.data.tags["mlflow.parentRunId"] == art.info.run_id
    assert child.data.params == {"engine": "hf"} and child.data.tags["setup_id"] == "s1"
    assert [(m.step, m.value) for m in client.get_metric_history(child.info.run_id, "tok_s")] == [(0, 10.0), (1, 11.0)]
    assert art.data.metrics["size_bytes"] == 2000
    assert len(client.get_metric_history(art.info.run_id, "size_bytes")) == 1
    assert sorted(a.path for a in client.list_artifacts(art.info.run_id)) == [
        "manifest.json", "recipe.yaml", "sanity.json"]


@needs_mlflow
def test_a_sqlite_stores_files_are_kept_beside_it_not_in_each_jobs_folder(tmp_path, monkeypatch):
    """MLflow's default put them in ./mlruns of whichever folder a job ran in
    (this suite's own runs left an mlruns/ in the project)."""
    job_folder, store = tmp_path / "job", tmp_path / "store"
    job_folder.mkdir(), store.mkdir()
    monkeypatch.chdir(job_folder)
    tracker = tracking.from_group({**MLFLOW, "uri": f"sqlite:///{store / 'mlflow.db'}", "experiment": "unit"})
    assert tracker.log(tracking.artifact_record(artifact_dir(tmp_path)))
    assert list(job_folder.iterdir()) == []
    assert sorted(p.name for p in store.glob("mlruns/*/*/artifacts/*")) == ["manifest.json", "recipe.yaml", "sanity.json"]


@needs_mlflow
@pytest.mark.parametrize("experiment, folder", [("{tmp}/Users/me", "{tmp}/Users/me"), ("../../outside", "outside"),
                                                ("team/llm", "team/llm"), ("/{tmp}/Users/me", "{tmp}/Users/me")])
def test_an_absolute_or_dotted_experiment_name_keeps_its_files_under_mlruns(tmp_path, experiment, folder):
    """`/Users/me/exp` (a Databricks-style name) put the run's files at
    /Users/me/exp, `../../outside` two folders above the store: outside
    mlruns/, where a rebuild's clean-up deletes files too."""
    store = tmp_path / "a" / "b" / "store"
    store.mkdir(parents=True)
    experiment, folder = experiment.format(tmp=tmp_path), folder.format(tmp=tmp_path).lstrip("/")
    tracker = tracking.from_group({**MLFLOW, "uri": f"sqlite:///{store / 'mlflow.db'}", "experiment": experiment})
    assert tracker.log(tracking.artifact_record(artifact_dir(tmp_path)))
    logged = sorted(p.relative_to(store).as_posix() for p in store.glob("mlruns/**/artifacts/*"))
    assert [p.split("/artifacts/")[0].rsplit("/", 1)[0] for p in logged] == [f"mlruns/{folder}"] * 3
    assert not (tmp_path / "a" / "outside").exists() and not (tmp_path / "Users").exists()


def test_the_tracking_group_is_in_every_entry_config():
    for entry in ("quantize", "evaluate", "report", "track"):
        text = (ROOT / "conf" / f"{entry}.yaml").read_text()
        assert "- tracking: " in text, entry


def _runs_by_name(uri: str, experiment: str = "unit") -> dict:
    from mlflow import MlflowClient
    client = MlflowClient(uri)
    return {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name(experiment).experiment_id])}


def _runs(uri: str) -> list:
    """The experiment's runs (by name, two runs of one name are one)."""
    from mlflow import MlflowClient
    client = MlflowClient(uri)
    return client.search_runs([client.get_experiment_by_name("unit").experiment_id])


def _files(uri: str, run) -> list[str]:
    from mlflow import MlflowClient
    return sorted(a.path for a in MlflowClient(uri).list_artifacts(run.info.run_id))


@needs_mlflow
def test_a_run_cut_short_by_an_outage_is_completed_by_the_next_write(tmp_path):
    """The server dropped right after create_run: the artifact's run stayed
    RUNNING with no params or files, and a back-fill only found it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    record = RunRecord(key="m1", name="scenario", params={"engine": "hf"}, metrics=(Metric("tok_s", 10.0, 0),),
                       parent=tracking.artifact_record(artifact_dir(tmp_path)))
    job = tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"})

    def down(*args, **kwargs):
        raise ConnectionError("server went down")
    job.client().log_batch = down
    assert job.log(record) is False
    assert _runs_by_name(uri)["tiny/w4a16_rtn"].info.status == "RUNNING"   # created, then the outage

    assert tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"}).log(record)   # the back-fill
    runs = _runs_by_name(uri)
    art, child = runs["tiny/w4a16_rtn"], runs["scenario"]
    assert art.info.status == child.info.status == "FINISHED"
    assert art.data.params == record.parent.params and art.data.metrics["size_bytes"] == 2000
    assert _files(uri, art) == ["manifest.json", "recipe.yaml", "sanity.json"]
    assert child.data.params == {"engine": "hf"} and child.data.tags["mlflow.parentRunId"] == art.info.run_id


@needs_mlflow
def test_an_artifact_run_a_back_fill_built_from_rows_gets_its_params_and_files(tmp_path):
    """A back-fill whose artifacts were not at hand built the artifact's run
    from the rows' tags; quantize, finding it, added nothing to it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    art = artifact_dir(tmp_path)
    full = tracking.artifact_record(art)
    from_rows = RunRecord(key=full.key, name=full.name, tags={"artifact_id": "0123456789abcdef"})
    assert tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"}).log(from_rows)
    assert tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"}).log_artifact(art)
    [run] = _runs_by_name(uri).values()
    assert run.data.params == full.params and run.data.tags["artifact_path"] == str(art.resolve())
    assert _files(uri, run) == ["manifest.json", "recipe.yaml", "sanity.json"]


@needs_mlflow
def test_a_rebuild_no_longer_suspect_loses_the_suspect_tag(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    art = artifact_dir(tmp_path)
    described = json.loads((art / "manifest.json").read_text())
    (art / "manifest.json").write_text(json.dumps({**described, "suspect": {"reason": "top-1 agreement 0.41"}}))
    assert tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"}).log_artifact(art)
    assert _runs_by_name(uri)["tiny/w4a16_rtn"].data.tags["suspect"] == "top-1 agreement 0.41"
    (art / "manifest.json").write_text(json.dumps(described))
    assert tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"}).log_artifact(art)
    assert "suspect" not in _runs_by_name(uri)["tiny/w4a16_rtn"].data.tags


@needs_mlflow
def test_a_rebuild_under_the_same_id_replaces_the_runs_metrics_and_files(tmp_path):
    """quantize force=true keeps the artifact id: the run was found, and the
    first build's metrics and manifest.json stayed."""
    from mlflow import MlflowClient
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    art = artifact_dir(tmp_path)
    described = json.loads((art / "manifest.json").read_text())
    for built_at, total in (("2026-01-01T00:00:00", 4.0), ("2026-01-02T00:00:00", 9.0), ("2026-01-02T00:00:00", 9.0)):
        rebuilt = {**described, "created_at": built_at, "timings_s": {"total": total}}
        (art / "manifest.json").write_text(json.dumps(rebuilt))
        assert tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"}).log_artifact(art)
    [run] = _runs_by_name(uri).values()
    client = MlflowClient(uri)
    assert run.data.metrics["time_s.total"] == 9.0
    assert len(client.get_metric_history(run.info.run_id, "time_s.total")) == 2   # the third write: the same build
    logged = client.download_artifacts(run.info.run_id, "manifest.json", str(tmp_path))
    assert json.loads(Path(logged).read_text())["created_at"] == "2026-01-02T00:00:00"


def test_a_failed_artifact_log_points_to_rerunning_quantize_not_the_back_fill(tmp_path, caplog):
    """The back-fill the warning named logs rows: it cannot recover an artifact that was never evaluated."""
    with caplog.at_level(logging.WARNING, logger="quantbench.tracking"):
        assert Broken(name="broken").log_artifact(artifact_dir(tmp_path)) is False
    [line] = [r.getMessage() for r in caplog.records]
    assert "python -m quantize" in line and "evaluate.track" not in line


@needs_mlflow
def test_a_server_that_is_down_is_one_warning_line(monkeypatch, caplog):
    """urllib3 logged a line per retry as well."""
    import socket
    for name, value in (("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0"), ("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", "0"),
                        ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")):
        monkeypatch.setenv(name, value)
    with socket.socket() as closed:   # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    retries = logging.getLogger("urllib3.connectionpool")
    before = retries.level
    retries.setLevel(logging.NOTSET)   # as in a fresh process
    try:
        tracker = tracking.from_group({**MLFLOW, "uri": f"http://127.0.0.1:{port}", "experiment": "unit"})
        with caplog.at_level(logging.WARNING):
            assert tracker.log(RunRecord(key="k", name="n")) is False
    finally:
        retries.setLevel(before)
    assert [r.name for r in caplog.records] == ["quantbench.tracking"], [r.getMessage() for r in caplog.records]


PASSWORD = "S3cretPW"
DB_URI = f"postgresql://mlflow:{PASSWORD}@db.internal:5432/mlflow"


@needs_mlflow
def test_a_password_in_the_uri_is_in_no_line_the_tracker_writes(monkeypatch, caplog):
    """A database store takes its password only in the URI: describe() (the
    job log, evaluate.track's stdout), the tracker-down warning and the
    unknown-scheme refusal showed it."""
    tracker = tracking.from_group({**MLFLOW, "uri": DB_URI, "experiment": "unit"})
    assert tracker.uri == DB_URI   # it still connects with the real one
    assert tracker.describe() == "MLflow experiment unit at postgresql://mlflow:***@db.internal:5432/mlflow"
    with pytest.raises(UserError) as refused:
        tracking.from_group({**MLFLOW, "uri": f"htp://me:{PASSWORD}@127.0.0.1:5000"})
    assert PASSWORD not in str(refused.value) and "htp://me:***@127.0.0.1:5000" in str(refused.value)

    import socket
    for name, value in (("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0"), ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")):
        monkeypatch.setenv(name, value)
    with socket.socket() as closed:   # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    down = tracking.from_group({**MLFLOW, "uri": f"http://me:{PASSWORD}@127.0.0.1:{port}", "experiment": "unit"})
    with caplog.at_level(logging.WARNING):
        assert down.log(RunRecord(key="k", name="n")) is False
    assert caplog.records and PASSWORD not in caplog.text and f"me:***@127.0.0.1:{port}" in caplog.text


def test_a_password_in_the_tracking_uri_is_not_in_the_manifests_config(tiny_model):
    """quantize's manifest (in every artifact, logged to the tracker) recorded the composed tracking.uri."""
    from hydra import compose, initialize_config_dir

    from quantize.common.config import register
    from quantize.common.extensions import plain
    from quantize.common.paths import CONF_DIR
    from quantize.config import QuantizeConfig
    if importlib.util.find_spec("mlflow") is None:
        pytest.skip("mlflow-skinny is not installed")
    register()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("quantize", overrides=["recipe=w4a16_rtn", "model=local", f"model.path={tiny_model}",
                                             "tracking=mlflow", f"tracking.uri={DB_URI}"])
    config = QuantizeConfig.from_config(plain(cfg))
    assert config.tracker.uri == DB_URI
    assert config.composed["tracking"]["uri"] == "postgresql://mlflow:***@db.internal:5432/mlflow"
    assert PASSWORD not in json.dumps(config.composed)


@needs_mlflow
def test_a_refreshed_runs_files_are_exactly_the_latest_writes(tmp_path):
    """A report's run kept the plots an earlier report wrote and the latest
    did not, beside the latest's: the run showed a mix of two reports."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first, second = tmp_path / "first", tmp_path / "second"
    for folder, names in ((first, ("report.md", "old_plot.png")), (second, ("report.md", "new_plot.png"))):
        folder.mkdir()
        for name in names:
            (folder / name).write_text(f"{folder.name} {name}")
    for folder in (first, second):
        report = RunRecord(key="r1", name="report", files=tuple(sorted(folder.iterdir())), refresh_files=True)
        assert tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"}).log(report)
    [run] = _runs_by_name(uri).values()
    assert _files(uri, run) == ["new_plot.png", "report.md"]
    from mlflow import MlflowClient
    logged = MlflowClient(uri).download_artifacts(run.info.run_id, "report.md", str(tmp_path / "down"))
    assert Path(logged).read_text() == "second report.md"


def _build(art: Path, built_at: str, **changes) -> None:
    """The manifest of a build (quantize force=true keeps the id, not `created_at`)."""
    described = json.loads((art / "manifest.json").read_text())
    (art / "manifest.json").write_text(json.dumps({**described, "created_at": built_at, **changes}))


@needs_mlflow
def test_a_rebuild_whose_logging_was_cut_short_is_logged_in_full_by_the_rerun(tmp_path):
    """The new build's revision tag went first: the rerun the warning names
    took the run as of the new build, and it kept the old manifest and metrics."""
    from mlflow import MlflowClient
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    art = artifact_dir(tmp_path)
    _build(art, "2026-01-01T00:00:00", timings_s={"total": 4.0})
    assert tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"}).log_artifact(art)
    _build(art, "2026-01-02T00:00:00", timings_s={"total": 9.0})
    job = tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"})

    def down(*args, **kwargs):
        raise ConnectionError("server went down")
    job.client().log_artifact = down   # the tags went through, then the outage
    assert job.log_artifact(art) is False
    assert tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"}).log_artifact(art)   # the rerun
    [run] = _runs_by_name(uri).values()
    assert run.data.tags["quantbench_revision"] == "2026-01-02T00:00:00" and run.data.metrics["time_s.total"] == 9.0
    logged = MlflowClient(uri).download_artifacts(run.info.run_id, "manifest.json", str(tmp_path / "down"))
    assert json.loads(Path(logged).read_text())["created_at"] == "2026-01-02T00:00:00"


@needs_mlflow
def test_a_rebuild_without_the_sanity_check_keeps_none_of_the_old_builds_metrics(tmp_path):
    """A rebuild under the same id (sanity.enabled=false verify=false are not
    in it) showed the first build's sanity.* and verify time as its own."""
    import math
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    art = artifact_dir(tmp_path)
    _build(art, "2026-01-01T00:00:00", timings_s={"verify (tensors)": 7.0, "total": 4.0})
    assert tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"}).log_artifact(art)
    _build(art, "2026-01-02T00:00:00", timings_s={"total": 9.0}, checks={})
    assert tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"}).log_artifact(art)
    [run] = _runs_by_name(uri).values()
    shown = {k: v for k, v in run.data.metrics.items() if not math.isnan(v)}
    assert shown == {"size_bytes": 2000, "weights_bytes": 1500, "time_s.total": 9.0}
    assert _files(uri, run) == ["manifest.json", "recipe.yaml"]


@needs_mlflow
def test_a_run_another_job_created_meanwhile_is_the_one_both_jobs_log_to(tmp_path):
    """Jobs sharing no lock (quantize's; evaluate's of two results stores) each
    looked the key up, found nothing and created a run: one artifact, two runs."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    record = RunRecord(key="k1", name="tiny/w4a16_rtn", params={"recipe": "w4a16_rtn"},
                       metrics=(Metric("size_bytes", 2000.0),))
    first = tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"})
    second = tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"})
    search = second.client().search_runs
    calls = []

    def before_the_first_created_its_run(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:   # the second job's lookup came first
            assert first.log(record)
            return []
        return search(*args, **kwargs)
    second.client().search_runs = before_the_first_created_its_run
    assert second.log(record)
    [run] = _runs(uri)
    assert second.find("k1") == first.find("k1") == run.info.run_id
    assert run.data.params == {"recipe": "w4a16_rtn"} and run.data.metrics == {"size_bytes": 2000.0}


JOB = """
import sys, time
from pathlib import Path
from quantize.common import tracking
from quantize.common.tracking import Metric, RunRecord
tracker = tracking.from_group({"_target_": "quantize.common.mlflow_tracker.MlflowTracker", "name": "mlflow",
                               "uri": sys.argv[1], "experiment": "unit"})
tracker.experiment_id()
Path(sys.argv[2] + ".ready").touch()
while not Path(sys.argv[2]).exists():
    time.sleep(0.001)
assert tracker.log(RunRecord(key="k1", name="tiny/w4a16_rtn", metrics=(Metric("size_bytes", 2000.0),)))
"""


@needs_mlflow
def test_jobs_logging_one_artifact_at_once_make_one_run(tmp_path):
    import time
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"}).experiment_id()
    jobs = [subprocess.Popen([sys.executable, "-c", JOB, uri, str(tmp_path / f"go{n}")], cwd=tmp_path,
                             env=quantize_env(), stderr=subprocess.PIPE, text=True) for n in range(4)]
    deadline = time.time() + 120
    while len(list(tmp_path.glob("go*.ready"))) < len(jobs) and time.time() < deadline:
        time.sleep(0.05)
    for n in range(len(jobs)):   # all at once, every job's MLflow imported
        (tmp_path / f"go{n}").touch()
    for job in jobs:
        assert job.wait(timeout=120) == 0, job.stderr.read()[-2000:]
    assert len(_runs(uri)) == 1


@needs_mlflow
def test_a_third_job_that_finds_a_run_about_to_be_deleted_keeps_logging(tmp_path):
    """A's run creation was slow (started first, seen last); B created a run
    meanwhile, and C found B's run inside B's settle second and logged to it.
    B then kept A's and deleted its own: C's next write failed (a deleted run)
    and C tracked nothing more."""
    import time
    from quantize.common.tracking import KEY_TAG
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    a, b, c = (tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"}) for _ in range(3))
    experiment = a.experiment_id()
    record = lambda value, step: RunRecord(key="k1", name="m", metrics=(Metric("thr", value, step, 1000 * step),))
    a_started = int(time.time() * 1000)   # A called create_run now; its run lands within SETTLE_S
    landed = []

    def a_run_lands():
        if not landed:
            landed.append(a.client().create_run(experiment, start_time=a_started, tags={KEY_TAG: "k1"},
                                                run_name="m").info.run_id)
    b_search, c_search, b_calls, c_calls = b.client().search_runs, c.client().search_runs, [], []

    def c_looks(*args, **kwargs):
        c_calls.append(args)
        if len(c_calls) == 2:   # a second look, B's run's settle second passed: A's run is in
            a_run_lands()
        return c_search(*args, **kwargs)

    def c_finds_b_run_then_a_run_lands(*args, **kwargs):
        b_calls.append(args)
        if len(b_calls) == 2:   # B's first look after creating its run
            assert c.log(record(30.0, 0))
            a_run_lands()
        return b_search(*args, **kwargs)
    c.client().search_runs = c_looks
    b.client().search_runs = c_finds_b_run_then_a_run_lands
    time.sleep(0.1)
    assert b.log(record(20.0, 0))
    assert c.log(record(31.0, 1))
    [run] = _runs(uri)
    assert b.find("k1") == c.find("k1") == run.info.run_id
    from mlflow import MlflowClient
    assert sorted(m.value for m in MlflowClient(uri).get_metric_history(run.info.run_id, "thr")) == [30.0, 31.0]


@needs_mlflow
def test_a_run_stamped_by_a_clock_ahead_holds_a_looking_job_no_longer_than_the_settle_time(tmp_path):
    """find() waited out a young first run until its start + SETTLE_S: a node
    whose clock ran 4 s ahead held every other job (and its store's lock) 5 s."""
    import time

    from quantize.common import mlflow_tracker
    from quantize.common.tracking import KEY_TAG
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = tracking.from_group({**MLFLOW, "uri": uri, "experiment": "unit"})
    ahead = int((time.time() + 4) * 1000)
    run = tracker.client().create_run(tracker.experiment_id(), start_time=ahead, tags={KEY_TAG: "k1"}).info.run_id
    waited = time.monotonic()
    assert tracker.find("k1") == run
    assert time.monotonic() - waited < mlflow_tracker.SETTLE_S + 0.5


@needs_mlflow
def test_mlflow_is_told_to_send_no_usage_telemetry_before_it_is_imported(tmp_path):
    """MLflow 3 starts its telemetry client at import; the tracker's defaults came after it."""
    import os
    import subprocess
    import sys
    group = {**MLFLOW, "uri": f"sqlite:///{tmp_path / 'm.db'}", "experiment": "x"}
    code = ("from quantize.common import tracking\n"
            f"tracking.from_group({group!r})\n"
            "from mlflow.telemetry.client import get_telemetry_client\n"
            "print(get_telemetry_client())\n")
    # as a user's shell: MLflow itself sends nothing under pytest or a CI (PYTEST_CURRENT_TEST, CI, ...)
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1:] == ["None"], out.stdout[-500:] + out.stderr[-2000:]
