"""Result rows as tracker runs (evaluate.tracking, evaluate.track) on an
MLflow SQLite file (no server): what a measurement's run says after a rerun
or a back-fill of a store its attempts wrote. tests/test_tracking_server.py
drives the stages against a real MLflow server."""
import importlib.util
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from evaluate import results, track, tracking
from evaluate.results import Row
from quantize.common.tracking import from_group
from tests.conftest import quantize_env, run_cli

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                                reason="mlflow-skinny is not installed (bash scripts/setup.sh installs it)")


def mlflow_tracker(tmp_path: Path):
    return from_group({"_target_": "quantize.common.mlflow_tracker.MlflowTracker", "name": "mlflow",
                       "uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "unit"})


def measurement_runs(tmp_path: Path) -> list:
    from mlflow import MlflowClient
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("unit").experiment_id])
    return [r for r in runs if "·" in r.info.run_name]


def speed_row(run_index: int, status: str, minute: int, reason: str | None = None) -> Row:
    return Row(kind="speed", status=status, reason=reason, timestamp=f"2026-01-01T00:{minute:02d}:00+00:00",
               artifact_id="a1", model_name="tiny", recipe="w4a16_rtn", engine="hf", setup_id="s1",
               scenario="prefill", batch_size=1, input_len=8, output_len=1, run_index=run_index,
               metrics={"output_throughput": 1.0} if status == "ok" else {})


def sharded_store(tmp_path: Path) -> Path:
    """Attempt 1 (shard 99) measured runs 0 and 1 and failed run 2; the
    retry (shard 100, read first: it sorts first) measured run 2."""
    store = tmp_path / "results"
    store.mkdir()
    for row in (speed_row(0, "ok", 1), speed_row(1, "ok", 2), speed_row(2, "failed", 3, "RuntimeError: OOM")):
        results.append(store / "results-node1-99.jsonl", row)
    results.append(store / "results-node1-100.jsonl", speed_row(2, "ok", 9))
    return store


def test_a_back_fill_of_a_sharded_store_keeps_a_measurement_fixed_by_its_retry_finished(tmp_path):
    """It ended FAILED: the failed row of attempt 1 was replayed after the retry's ok row."""
    store = sharded_store(tmp_path)
    assert [r.status for r in results.read(store)][0] == "ok"   # the retry's row is read first
    track.backfill(store, mlflow_tracker(tmp_path))
    [run] = measurement_runs(tmp_path)
    assert run.info.status == "FINISHED" and run.data.tags["status"] == "ok"


def test_a_rerun_logging_the_stored_rows_keeps_the_run_finished_and_a_run_still_failing_failed(tmp_path):
    store = sharded_store(tmp_path)
    assert tracking.log_rows(tracking.bind(mlflow_tracker(tmp_path), store), results.read(store))
    [run] = measurement_runs(tmp_path)
    assert run.info.status == "FINISHED"
    still_failing = [r for r in results.read(store) if r.timestamp != speed_row(2, "ok", 9).timestamp]
    assert tracking.log_rows(tracking.bind(mlflow_tracker(tmp_path), store), still_failing)
    [run] = measurement_runs(tmp_path)
    assert run.info.status == "FAILED" and run.data.tags["reason"] == "RuntimeError: OOM"


def test_a_measurement_that_later_succeeded_loses_the_reason_of_its_failure(tmp_path):
    store = tmp_path / "results"
    tracker = tracking.bind(mlflow_tracker(tmp_path), store)
    assert tracking.log_rows(tracker, [speed_row(0, "failed", 1, "RuntimeError: OOM")])
    assert tracking.log_rows(tracker, [speed_row(0, "ok", 2)])   # the retry, live
    [run] = measurement_runs(tmp_path)
    assert run.info.status == "FINISHED" and run.data.tags["status"] == "ok" and "reason" not in run.data.tags


def test_logged_live_a_failed_run_still_fails_its_measurement_after_a_later_run_succeeds(tmp_path):
    """A job logs one row at a time: run 1 failed, run 2 ok ended FINISHED
    with the reason removed, where a back-fill of the same store says FAILED."""
    store = tmp_path / "results"
    tracker = tracking.bind(mlflow_tracker(tmp_path), store)
    rows = [speed_row(0, "ok", 1), speed_row(1, "failed", 2, "RuntimeError: OOM"), speed_row(2, "ok", 3)]
    for n, row in enumerate(rows):
        assert tracking.log_rows(tracker, [row], earlier=rows[:n])
    [run] = measurement_runs(tmp_path)
    assert run.info.status == "FAILED" and run.data.tags["reason"] == "RuntimeError: OOM"
    assert [r.failed for r in tracking.measurement_records(rows)] == [True] * 3   # as the back-fill sees it


def test_a_sweeps_artifact_that_cannot_be_opened_is_a_failed_run_too(tmp_path):
    """Its failed row was in the store only: the tracker never got it."""
    res = tmp_path / "results"
    out = run_cli("evaluate", "-m", "engine=hf", "recipe=w4a16_gptq", f"artifacts_dir={tmp_path / 'none'}",
                  f"results_dir={res}", "tracking=mlflow", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
                  "tracking.experiment=unit", cwd=tmp_path)
    assert out.returncode != 0
    [row] = results.read(res)
    [run] = measurement_runs(tmp_path)
    assert row.status == "failed" and run.info.status == "FAILED" and run.data.tags["reason"] == row.reason


def test_a_folder_uri_takes_a_back_fill(tmp_path, monkeypatch):
    """MLflow 3's folder store raised unless MLFLOW_ALLOW_FILE_STORE=true: the
    documented folder URI lost a job's tracking and failed the back-fill."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")   # the reader below; restored after
    env = {k: v for k, v in quantize_env().items() if k != "MLFLOW_ALLOW_FILE_STORE"}
    store = sharded_store(tmp_path)
    for uri in (tmp_path / "runs", f"file://{tmp_path / 'file-runs'}"):
        proc = subprocess.run([sys.executable, "-m", "evaluate.track", f"results_dir={store}", f"tracking.uri={uri}",
                               "tracking.experiment=unit"], cwd=tmp_path, env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr[-2000:]
        from mlflow import MlflowClient
        client = MlflowClient(str(uri))
        runs = client.search_runs([client.get_experiment_by_name("unit").experiment_id])
        assert sorted(r.info.run_name for r in runs) == ["tiny/w4a16_rtn", "w4a16_rtn · prefill · hf"]


def test_a_failed_report_log_points_to_rerunning_the_report_not_the_back_fill(tmp_path, caplog):
    """The back-fill the warning named logs rows, never a report's files."""
    from quantize.common.tracking import Tracker

    class Down(Tracker):
        def write(self, record):
            raise ConnectionError("connection refused")
    (tmp_path / "report.md").write_text("# report")
    with caplog.at_level(logging.WARNING, logger="quantbench.tracking"):
        assert Down(name="down").log(tracking.report_record([tmp_path], tmp_path, [tmp_path / "report.md"])) is False
    [line] = [r.getMessage() for r in caplog.records]
    assert "python -m evaluate.report" in line and "evaluate.track" not in line


def test_a_store_this_user_may_only_read_is_back_filled_without_locks(tmp_path, monkeypatch, caplog):
    """Every write took a lock file in the store: the back-fill failed on the first."""
    store = sharded_store(tmp_path)
    real_mkdir = Path.mkdir

    def read_only(path, *args, **kwargs):   # what a read-only store answers (root ignores chmod)
        if store in (path, *path.parents):
            raise PermissionError(13, "Permission denied", str(path))
        return real_mkdir(path, *args, **kwargs)
    monkeypatch.setattr(Path, "mkdir", read_only)
    with caplog.at_level(logging.WARNING, logger="quantbench.tracking"):
        track.backfill(store, mlflow_tracker(tmp_path))
    [run] = measurement_runs(tmp_path)
    assert run.info.status == "FINISHED" and not (store / "locks").exists()
    [note] = [r.getMessage() for r in caplog.records]
    assert note.startswith(f"note: cannot make lock files in {store / 'locks'} (Permission denied)")


def test_a_back_fill_of_a_file_says_results_dir_must_be_a_folder(tmp_path):
    """It said "no results in <file>; run python -m evaluate first", as of an empty store."""
    rows = sharded_store(tmp_path) / "results-node1-100.jsonl"
    proc = subprocess.run([sys.executable, "-m", "evaluate.track", f"results_dir={rows}",
                           f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"], cwd=tmp_path, env=quantize_env(),
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [f"error: results_dir={rows} is a file, not a folder; pass "
                                                "results_dir=<the folder python -m evaluate wrote its rows to>"]
    assert not (tmp_path / "mlflow.db").exists()


def test_a_report_logged_again_replaces_its_own_files_and_keeps_one_a_user_attached(tmp_path):
    """Refreshing a report's run deleted every file the new report lacked,
    a file a user had attached to the run by hand too."""
    from mlflow import MlflowClient
    tracker = mlflow_tracker(tmp_path)
    for name, files in (("first", ("report.md", "old_plot.png")), ("second", ("report.md", "new_plot.png"))):
        out = tmp_path / name
        out.mkdir()
        for file in files:
            (out / file).write_text(name)
        assert tracker.log(tracking.report_record([tmp_path / "results"], tmp_path / "reports", sorted(out.iterdir())))
        if name == "first":
            run_id = tracker.find(tracking.report_record([tmp_path / "results"], tmp_path / "reports", []).key)
            MlflowClient(tracker.uri).log_text(run_id, "why w4a16 was picked", "notes.txt")
    files = sorted(a.path for a in MlflowClient(tracker.uri).list_artifacts(run_id))
    assert files == ["new_plot.png", "notes.txt", "report.md"]


def test_a_measurement_repeated_or_in_another_store_is_every_one_of_its_runs_in_the_tracker(tmp_path):
    """Steps were known by run index alone: a rerun with skip_completed=false
    (or the same command into another store) measured runs 0 and 1 again, the
    report averaged all four and MLflow kept the first two; the back-fill said
    "2 rows … logged" having logged none."""
    from mlflow import MlflowClient
    store = tmp_path / "results"
    for minute, values in ((1, (10.0, 11.0)), (10, (20.0, 21.0))):   # the same command twice
        tracker, recorded = tracking.bind(mlflow_tracker(tmp_path), store), []
        for index, value in enumerate(values):
            row = speed_row(index, "ok", minute + index).but(metrics={"output_throughput": value})
            results.append(store / "results.jsonl", row)
            assert tracking.log_rows(tracker, [row], earlier=recorded)
            recorded.append(row)
    assert track.backfill(store, mlflow_tracker(tmp_path)).endswith(": 0 new step(s), the rest logged before")
    other = tmp_path / "day2"
    for index in range(2):
        results.append(other / "results.jsonl", speed_row(index, "ok", 30 + index).but(metrics={"output_throughput": 30.0}))
    assert ": 2 new step(s)" in track.backfill(other, mlflow_tracker(tmp_path))
    [run] = measurement_runs(tmp_path)
    history = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_metric_history(run.info.run_id, "output_throughput")
    assert sorted((m.step, m.value) for m in history) == [(0, 10.0), (0, 20.0), (0, 30.0), (1, 11.0), (1, 21.0), (1, 30.0)]


def test_a_measurement_measured_on_twin_hosts_or_two_commits_says_so(tmp_path):
    """Params are write-once: a run measured on node07 at one commit and
    resumed on twin node12 after a git pull (one setup id) said node07 alone."""
    store = tmp_path / "results"
    rows = [speed_row(0, "ok", 1).but(hardware={"hostname": "node07"}, versions={"quantbench": "aaaa1111"}),
            speed_row(1, "ok", 9).but(hardware={"hostname": "node12"}, versions={"quantbench": "bbbb2222"}),
            speed_row(2, "ok", 10).but(hardware={"hostname": "node12"}, versions={"quantbench": "bbbb2222"})]
    for row in rows:
        assert tracking.log_rows(tracking.bind(mlflow_tracker(tmp_path), store), [row])
    [run] = measurement_runs(tmp_path)
    assert run.data.params["hardware.hostname"] == "node07"   # the first row's
    assert run.data.tags["seen.hardware.hostname"] == '["node07", "node12"]'
    assert run.data.tags["seen.versions.quantbench"] == '["aaaa1111", "bbbb2222"]'
    assert not [tag for tag in run.data.tags if tag.startswith("seen.") and "hostname" not in tag and "quantbench" not in tag]


def many_measurements_store(tmp_path: Path, count: int) -> Path:
    store = tmp_path / "results"
    store.mkdir()
    for n in range(count):
        results.append(store / "results.jsonl", speed_row(0, "ok", 1).but(scenario=f"sc{n}"))
    return store


def test_a_back_fill_into_a_new_experiment_waits_for_other_jobs_once_not_once_per_run(tmp_path, monkeypatch):
    """Each run created waited a second for other jobs' runs of its key: a
    back-fill of 300 measurements slept five minutes."""
    from quantize.common import mlflow_tracker as module
    monkeypatch.setattr(module, "SETTLE_S", 0.3)
    sleep, waits = module.time.sleep, []
    monkeypatch.setattr(module.time, "sleep", lambda s: (waits.append(s), sleep(s)))
    store = many_measurements_store(tmp_path, 6)
    track.backfill(store, mlflow_tracker(tmp_path))
    assert len([s for s in waits if s > 0]) <= 2   # the artifacts' runs, then the measurements'
    runs = measurement_runs(tmp_path)
    assert sorted(r.data.params["scenario"] for r in runs) == [f"sc{n}" for n in range(6)]
    assert all(r.data.metrics["output_throughput"] == 1.0 for r in runs)


def test_a_back_fill_keeps_the_run_another_job_created_first_of_a_key(tmp_path, monkeypatch):
    """Runs created in one batch still give way to one another job started
    earlier: one run per key, holding the back-fill's steps."""
    from mlflow import MlflowClient
    from quantize.common import mlflow_tracker as module
    from quantize.common.tracking import KEY_TAG
    monkeypatch.setattr(module, "SETTLE_S", 0.3)
    store = many_measurements_store(tmp_path, 3)
    tracker = mlflow_tracker(tmp_path)
    experiment, started = tracker.experiment_id(), module.time.time()
    key = tracking.measurement_records(results.read(store))[1].key
    sleep, others = module.time.sleep, []

    def another_jobs_run_lands(seconds):
        if not others:   # its creation started before the back-fill's, and lands now
            others.append(MlflowClient(tracker.uri).create_run(experiment, start_time=int(started * 1000) - 100,
                                                               tags={KEY_TAG: key}, run_name="other").info.run_id)
        sleep(seconds)
    monkeypatch.setattr(module.time, "sleep", another_jobs_run_lands)
    track.backfill(store, tracker)
    runs = measurement_runs(tmp_path) + [r for r in MlflowClient(tracker.uri).search_runs([experiment])
                                         if r.info.run_name == "other"]
    assert len(runs) == 3 and len({r.data.tags[KEY_TAG] for r in runs}) == 3
    [kept] = [r for r in runs if r.data.tags[KEY_TAG] == key]
    assert kept.info.run_id == others[0] and kept.data.metrics["output_throughput"] == 1.0
