"""The search's study in optuna-dashboard: a toy search (toy_app.py) through
the real sweeper writes its SQLite study; the dashboard, started here on
127.0.0.1 against that file as docs/search.md shows, lists the trials under
the objectives' names, each with the artifact id and recipe its job built
(the tag a tracker's artifact run carries: docs/tracking.md)."""
import json
import shutil
import sys
from pathlib import Path

import optuna
import pytest

from tests.evaluate.search.test_sweeper import db_url, run, toy
from tests.servers import HOST, free_port, get, serving

DASHBOARD = shutil.which("optuna-dashboard", path=str(Path(sys.executable).parent))
pytestmark = [pytest.mark.skipif(DASHBOARD is None, reason="optuna-dashboard is not installed "
                                                            "(bash scripts/setup.sh installs it)"),
              pytest.mark.filterwarnings("ignore:.*Distribution has been deprecated:FutureWarning")]


def api(base: str, path: str) -> dict:
    return json.loads(get(base + path))


def test_the_dashboard_lists_the_trials_with_objective_names_and_what_each_built(tmp_path):
    out = run(toy(tmp_path, "sleep_s=0", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=2"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    study = optuna.load_study(study_name="toy", storage=db_url(tmp_path))
    assert study.metric_names == ["loss", "distance"]
    for trial in study.trials:   # set by the sweeper from each job's record
        assert trial.user_attrs["artifact_id"] == f"toy-{trial.number:04d}"
        assert trial.user_attrs["recipe"] == f"toy-k{trial.params['k']}"

    port = free_port()
    command = [DASHBOARD, db_url(tmp_path), "--host", HOST, "--port", str(port), "--quiet"]
    with serving(command, f"http://{HOST}:{port}/api/meta", tmp_path / "dashboard.log"):
        base = f"http://{HOST}:{port}"
        (summary,) = api(base, "/api/studies")["study_summaries"]
        assert summary["study_name"] == "toy" and summary["directions"] == ["minimize", "minimize"]
        detail = api(base, f"/api/studies/{summary['study_id']}")
    assert detail["objective_names"] == ["loss", "distance"]
    assert [t["number"] for t in detail["trials"]] == [0, 1]
    for shown, trial in zip(detail["trials"], study.trials):
        assert shown["state"] == "Complete" and shown["values"] == trial.values
        attrs = {a["key"]: a["value"] for a in shown["user_attrs"]}
        assert attrs["artifact_id"] == trial.user_attrs["artifact_id"] and attrs["recipe"] == trial.user_attrs["recipe"]
