"""tracking=mlflow against a real MLflow server (.venv-mlflow's `mlflow server`,
started here on 127.0.0.1 with a SQLite backend and a local artifact root),
driven by the real CLIs on the tiny model, then read back through MlflowClient.

The sweep: quantize two recipes (one run per artifact: recipe params, size,
timings, sanity, manifest.json and recipe.yaml); evaluate both artifacts in a
joblib multirun (each measurement its own run, nested under its artifact's,
the timed runs as steps, accuracy beside them); an evaluate whose server is
down (one warning, the rows still stored) rerun with the server up, as a
requeued job is (the rows the first attempt stored are logged, nothing is
measured again); the report (its files in the sweep's run); quantize on
the Ray launcher (each job its artifact's run). Then
`python -m evaluate.track` back-fills the store: into the same experiment it
adds nothing, twice; into a new one it gives the same runs and steps."""
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from evaluate import results
from tests.conftest import SMALL_CALIB, TINY_NAME, run_cli, tail
from tests.servers import HOST, MLFLOW_SERVER, free_port, mlflow_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not MLFLOW_SERVER.exists(), reason="no MLflow server: make setup-mlflow installs it"),
    pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                       reason="mlflow-skinny is not installed (bash scripts/setup.sh installs it)"),
]
RECIPES = ("original", "w4a16_rtn")
TINY = ["engine=hf", "scenario=interactive", "scenario.input_len=16", "scenario.output_len=8", "runs=2"]
SMALL_ACCURACY = ["accuracy.num_windows=2", "accuracy.window_len=64", "accuracy.lastword.num_items=8"]
REQUEUED = "tracking_requeued"     # the scenario of the evaluate whose first attempt could not log


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as uri:
        yield uri


@dataclass
class Sweep:
    uri: str
    artifacts: dict[str, Path]
    results: Path
    reports: Path
    down: object          # the evaluate whose tracker was down
    report: object        # the report's process


def check(proc):
    assert proc.returncode == 0, tail(proc, 40)
    return proc


@pytest.fixture(scope="module")
def sweep(server, tiny_model, tmp_path_factory) -> Sweep:
    work = tmp_path_factory.mktemp("tracked-sweep")
    tracked = ["tracking=mlflow", f"tracking.uri={server}"]
    arts, res = work / "artifacts", work / "results"
    check(run_cli("quantize", "-m", f"recipe={','.join(RECIPES)}", f"model={tiny_model}", *SMALL_CALIB,
                  f"artifacts_dir={arts}", *tracked, cwd=work))
    artifacts = {r: arts / TINY_NAME / r for r in RECIPES}
    check(run_cli("evaluate", "-m", f"model={','.join(str(a) for a in artifacts.values())}", *TINY,
                  "scenario.name=tracking_tiny", *SMALL_ACCURACY, "hydra/launcher=local_parallel",
                  f"results_dir={res}", *tracked, cwd=work))
    requeued = [f"model={artifacts['w4a16_rtn']}", *TINY, f"scenario.name={REQUEUED}", "accuracy=none",
                f"results_dir={res}"]
    down = check(run_cli("evaluate", *requeued, "tracking=mlflow", f"tracking.uri=http://{HOST}:{free_port()}",
                         env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}, cwd=work))
    check(run_cli("evaluate", *requeued, *tracked, cwd=work))
    report = check(run_cli("evaluate.report", f"results_dir={res}", f"out_dir={work / 'reports'}", *tracked,
                           cwd=work))
    return Sweep(server, artifacts, res, work / "reports", down, report)


def client(uri: str):
    from mlflow import MlflowClient
    return MlflowClient(uri)


def runs_of(uri: str, experiment: str = "quantbench") -> dict[str, object]:
    """Every run of the experiment, by run name (names are unique in this sweep)."""
    c = client(uri)
    found = c.search_runs([c.get_experiment_by_name(experiment).experiment_id], max_results=1000)
    by_name = {r.info.run_name: r for r in found}
    assert len(by_name) == len(found), sorted(r.info.run_name for r in found)
    return by_name


def shape(uri: str, experiment: str = "quantbench") -> dict[str, tuple]:
    """Each run's parent (by name), params, tags we set and metric steps: what a back-fill must reproduce."""
    c, runs = client(uri), runs_of(uri, experiment)
    names = {r.info.run_id: name for name, r in runs.items()}
    return {name: (names.get(r.data.tags.get("mlflow.parentRunId")), r.data.params,
                   {k: v for k, v in r.data.tags.items() if not k.startswith("mlflow.")},
                   {k: [(m.step, m.value) for m in c.get_metric_history(r.info.run_id, k)] for k in r.data.metrics})
            for name, r in runs.items() if not name.startswith("report")}


def test_each_artifact_is_a_run_with_its_recipe_manifest_and_sanity_check(sweep, tmp_path):
    import json
    runs, c = runs_of(sweep.uri), client(sweep.uri)
    for recipe, folder in sweep.artifacts.items():
        manifest = json.loads((folder / "manifest.json").read_text())
        run = runs[f"{TINY_NAME}/{recipe}"]
        assert "mlflow.parentRunId" not in run.data.tags
        assert run.data.tags["artifact_id"] == manifest["artifact_id"] and run.data.params["recipe"] == recipe
        assert run.data.metrics["size_bytes"] == manifest["bytes_on_disk"]["total"]
        assert run.data.metrics["time_s.total"] == manifest["timings_s"]["total"]
        files = {a.path for a in c.list_artifacts(run.info.run_id)}
        assert {"manifest.json", "recipe.yaml"} <= files
        logged = json.loads(Path(c.download_artifacts(run.info.run_id, "manifest.json", str(tmp_path))).read_text())
        assert logged == manifest
    rtn = runs[f"{TINY_NAME}/w4a16_rtn"]
    assert rtn.data.params["recipe.quant_stage.quant_modifiers.QuantizationModifier.config_groups.group_0.weights"
                           ".num_bits"] == "4"
    assert 0 < rtn.data.metrics["sanity.top1_agreement"] <= 1 and "sanity.json" in {
        a.path for a in c.list_artifacts(rtn.info.run_id)}


def test_each_measurement_is_a_run_under_its_artifact_with_timed_runs_as_steps(sweep):
    runs, c = runs_of(sweep.uri), client(sweep.uri)
    rows = [r for r in results.read(sweep.results) if r.ok]
    for recipe in RECIPES:
        artifact = runs[f"{TINY_NAME}/{recipe}"]
        speed = [r for r in rows if r.recipe == recipe and r.scenario == "tracking_tiny"]
        assert sorted(r.run_index for r in speed) == [0, 1]
        run = _child(runs, artifact, "tracking_tiny")
        tags, params = run.data.tags, run.data.params
        assert (tags["artifact_id"], tags["setup_id"], tags["comparison_id"]) == (
            speed[0].artifact_id, speed[0].setup_id, speed[0].comparison_id)
        assert params["engine"] == "hf" and params["dtype"] == speed[0].engine_args["dtype"]
        assert params["hardware.cpu"] == speed[0].hardware["cpu"]
        assert params["versions.transformers"] == speed[0].versions["transformers"]
        history = c.get_metric_history(run.info.run_id, "output_throughput")
        assert sorted((m.step, m.value) for m in history) == sorted(
            (r.run_index, r.metrics["output_throughput"]) for r in speed)
        accuracy = _child(runs, artifact, "austen")
        (row,) = [r for r in rows if r.recipe == recipe and r.kind == "accuracy"]
        assert accuracy.data.metrics["perplexity"] == pytest.approx(row.metrics["perplexity"])


def _child(runs: dict, parent, scenario: str):
    (found,) = [r for r in runs.values() if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
                and r.data.tags.get("scenario") == scenario]
    return found


def test_a_tracker_that_is_down_warns_once_and_the_requeued_job_logs_what_it_stored(sweep):
    warnings = [line for line in (sweep.down.stdout + sweep.down.stderr).splitlines() if "tracking:" in line]
    assert len(warnings) == 1 and "python -m evaluate.track" in warnings[0], warnings
    stored = [r for r in results.read(sweep.results) if r.scenario == REQUEUED]
    assert sorted(r.run_index for r in stored) == [0, 1] and all(r.ok for r in stored)   # measured once
    runs, c = runs_of(sweep.uri), client(sweep.uri)
    run = _child(runs, runs[f"{TINY_NAME}/w4a16_rtn"], REQUEUED)
    assert [m.step for m in c.get_metric_history(run.info.run_id, "output_throughput")] == [0, 1]


def test_the_report_logs_its_files_to_the_sweeps_run(sweep):
    runs, c = runs_of(sweep.uri), client(sweep.uri)
    (report,) = [r for name, r in runs.items() if name.startswith("report")]
    files = {a.path for a in c.list_artifacts(report.info.run_id)}
    assert {"report.md", "report.html", "summary.csv"} <= files
    printed = sweep.report.stdout.splitlines()   # the files written, one per line, as without tracking
    assert {Path(p).name for p in printed} == files and all(Path(p).is_file() for p in printed), printed
    assert report.data.tags["results_dir"] == str(sweep.results.resolve())


def test_a_second_report_leaves_the_server_run_only_its_own_files(server, tmp_path):
    """Files the server stores (its artifact proxy): the first report's plot
    that the second did not write stayed beside the second's files. A report
    to another out_dir (another layout) is a run of its own, left whole."""
    from evaluate.tracking import report_record
    from quantize.common.tracking import from_group
    for out_dir, name, files in (("reports", "first", ("report.md", "old_plot.png")),
                                 ("tables", "tables", ("batch_table.md",)),
                                 ("reports", "second", ("report.md", "new_plot.png"))):
        out = tmp_path / name
        out.mkdir()
        for file in files:
            (out / file).write_text(name)
        tracker = from_group({"_target_": "quantize.common.mlflow_tracker.MlflowTracker", "name": "mlflow",
                              "uri": server, "experiment": "reports"})
        assert tracker.log(report_record([tmp_path / "results"], tmp_path / out_dir, sorted(out.iterdir())))
    runs = {run.info.run_name: run for run in runs_of(server, "reports").values()}
    files = {name: sorted(a.path for a in client(server).list_artifacts(run.info.run_id)) for name, run in runs.items()}
    assert files == {"report: results -> reports": ["new_plot.png", "report.md"],
                     "report: results -> tables": ["batch_table.md"]}


def test_a_backfill_adds_nothing_to_a_tracked_store_and_rebuilds_it_elsewhere(sweep, tmp_path):
    before = shape(sweep.uri)
    for _ in range(2):
        out = check(run_cli("evaluate.track", f"results_dir={sweep.results}", f"tracking.uri={sweep.uri}",
                            cwd=tmp_path))
        assert "rows of 2 artifact(s)" in out.stdout, out.stdout
        assert shape(sweep.uri) == before
    check(run_cli("evaluate.track", f"results_dir={sweep.results}", f"tracking.uri={sweep.uri}",
                  "tracking.experiment=backfill", cwd=tmp_path))
    assert shape(sweep.uri, "backfill") == before


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("ray", "hydra_plugins.hydra_ray_launcher")),
                    reason="Ray or Hydra's Ray launcher is not installed here (bash scripts/setup.sh installs them)")
@pytest.mark.extended
def test_a_ray_sweep_logs_each_job_to_the_one_server(sweep, tiny_model, tmp_path):
    """quantize's two jobs on the Ray launcher (the artifacts found complete)
    each log their artifact's run, into another experiment of the same server."""
    import json
    artifacts_dir = next(iter(sweep.artifacts.values())).parent.parent
    check(run_cli("quantize", "-m", f"recipe={','.join(RECIPES)}", f"model={tiny_model}", *SMALL_CALIB,
                  f"artifacts_dir={artifacts_dir}", "hydra/launcher=ray_local", "tracking=mlflow",
                  f"tracking.uri={sweep.uri}", "tracking.experiment=ray", cwd=tmp_path))
    runs = runs_of(sweep.uri, "ray")
    assert {name: run.data.tags["artifact_id"] for name, run in runs.items()} == {
        f"{TINY_NAME}/{recipe}": json.loads((folder / "manifest.json").read_text())["artifact_id"]
        for recipe, folder in sweep.artifacts.items()}


BROWSER_MISSING = [b for b in ("chromium", "chromedriver") if shutil.which(b) is None]
SCREENSHOT_MAX_BYTES = 300_000


@pytest.mark.skipif(bool(BROWSER_MISSING), reason=f"{' and '.join(BROWSER_MISSING)} not installed: the "
                    "MLflow UI test needs Debian's chromium and chromedriver (make setup-browser, as root)")
def test_a_measurement_in_the_mlflow_ui(sweep, tmp_path):
    """The server's UI shows a measurement's run: its name, a param and a metric.
    QUANTBENCH_SCREENSHOT=<png> keeps the screenshot (docs/tracking-mlflow-run.png)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.evaluate.report.test_html import headless_chromium
    runs = runs_of(sweep.uri)
    run = _child(runs, runs[f"{TINY_NAME}/w4a16_rtn"], "tracking_tiny")
    page = f"{sweep.uri}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    shown = ("output_throughput", "engine_args", "artifact_id", "tiny-llama/w4a16_rtn", run.info.run_name)
    shot = tmp_path / "run.png"
    with headless_chromium() as browser:
        browser.set_window_size(1280, 1300)

        def open_run():
            browser.get(page)
            WebDriverWait(browser, 180).until(
                lambda b: all(text in b.find_element(By.TAG_NAME, "body").text for text in shown))
        open_run()
        for view in browser.find_elements(By.XPATH, "//*[normalize-space(text())='Model training']")[:1]:
            view.click()  # the UI's view for training runs rather than GenAI's; it keeps it
            open_run()
        for close in browser.find_elements(By.CSS_SELECTOR, "button[aria-label='Close']"):
            close.click()  # the assistant's side panel
        assert browser.save_screenshot(str(shot))
    keep = os.environ.get("QUANTBENCH_SCREENSHOT")
    if keep:
        small_png(shot, Path(keep))
        assert Path(keep).stat().st_size < SCREENSHOT_MAX_BYTES


def small_png(source: Path, target: Path) -> None:
    """The screenshot in a 64-colour palette: a UI's flat colours survive, the file shrinks ~5x."""
    from PIL import Image
    with Image.open(source) as image:
        image.convert("RGB").quantize(colors=64).save(target, optimize=True)
