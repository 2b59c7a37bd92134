"""A sweep's failed job: its FAILED.json and the sweep's summary show a URL's password as ***."""
import subprocess
import sys

from quantize.common import jobs
from tests.conftest import quantize_env
from tests.sweep_app import write_sweep_app

APP = '''
import hydra

from quantize.common.jobs import run_job


def work(cfg):
    raise RuntimeError("the engine died")


@hydra.main(version_base=None, config_path=".", config_name="app")
def main(cfg):
    return run_job(work, cfg)


if __name__ == "__main__":
    main()
'''


def test_a_password_in_a_failed_jobs_overrides_is_in_neither_its_failed_json_nor_the_summary(tmp_path):
    """FAILED.json kept the overrides as typed (in a sweep, as Hydra escapes
    them: postgresql\\://bench\\:<password>@...), and the sweep's summary (the
    console, the multirun log) printed them, a tracking.uri's password too."""
    write_sweep_app(tmp_path, APP, first_line="uri: none", subdir=None)
    sweep = tmp_path / "sweep"
    uri = "postgresql://bench:S3cretPW@db.lab/mlflow"
    out = subprocess.run([sys.executable, "app.py", "-m", f"uri={uri}", f"hydra.sweep.dir={sweep}"],
                         cwd=tmp_path, env=quantize_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr[-3000:]
    summary = [line for line in out.stderr.splitlines() if line.startswith("  0: ")]
    assert len(summary) == 1 and summary[0].startswith(
        "  0: uri=postgresql\\://bench\\:***@db.lab/mlflow: RuntimeError: the engine died"), out.stderr
    assert "S3cretPW" not in (sweep / "0" / jobs.FAILURE_FILE).read_text()
