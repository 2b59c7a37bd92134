"""A tiny Hydra app for launcher and failure-record tests: its app.py (the
test's own source) beside an app.yaml whose sweep ends with quantbench's
failure summary, as the entry points' sweeps do."""
from quantize.common.paths import CONF_DIR


def write_sweep_app(folder, source: str, first_line: str = "action: ok",
                    subdir: str | None = "${hydra.job.num}_${action}") -> None:
    """app.py = `source`; app.yaml = `first_line` (the app's key and its default),
    the project's conf/ on the search path, each job's folder named by `subdir`."""
    (folder / "app.py").write_text(source)
    lines = [first_line, "hydra:", f'  searchpath: ["file://{CONF_DIR}"]']
    if subdir:
        lines += ["  sweep:", f"    subdir: {subdir}"]
    lines += ["  callbacks:", "    failure_summary:", "      _target_: quantize.common.jobs.FailureSummary"]
    (folder / "app.yaml").write_text("\n".join(lines) + "\n")
