"""The report: results store (or several side by side) -> the files of the layouts asked for
(`python -m evaluate.report`, see __main__.py).

evaluate.analysis computes (groups, stats, speed-ups, rankings, the serving
analysis and the recommendation); everything here only formats what it
returns: `labels` names the groups, `formatting` holds units and number
formats, and each layout (conf/report/layout/) and output format of the
summary (conf/report/output/) is a class named by its YAML's `_target_`
(evaluate.report.config): adding one is one module and one YAML."""
import dataclasses
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import yaml

from evaluate import results
from evaluate.analysis import analyse
from evaluate.report.config import Layout, OutputFormat, ReportConfig, build_choices
from quantize.common.atomic import write_text
from quantize.common.paths import CONF_DIR

SUMMARY = "summary"
STAGING = ".report-"
# A staging folder untouched this long is a killed report's (SIGTERM, kill -9,
# the OOM killer skip its cleanup): a running report writes into its own within seconds.
STALE_STAGING_S = 3600


def default_outputs() -> list[str]:
    """The summary's formats when none are named: conf/report.yaml's `output`."""
    return list(yaml.safe_load((CONF_DIR / "report.yaml").read_text())["output"])


def build_report(results_dir: Path | list[Path], out_dir: Path, title: str, pareto: str | None = None,
                 layouts: tuple[str, ...] = (SUMMARY,), outputs: tuple[str, ...] | None = None) -> list[Path]:
    """The report as the command line writes it, of one store or a list of
    them, by the names of conf/report/'s layouts and output formats; return
    the paths written."""
    dirs = [Path(d) for d in (results_dir if isinstance(results_dir, (list, tuple)) else [results_dir])]
    return write_report(ReportConfig(
        dirs, Path(out_dir), title, pareto, build_choices("layout", Layout, list(layouts) or [SUMMARY]),
        build_choices("output", OutputFormat, default_outputs() if outputs is None else list(outputs))))


def write_report(report: ReportConfig) -> list[Path]:
    """Write the files of every layout into report.out_dir; return their paths,
    the text files first, then the plots. All are written before any replaces
    the last report's (staged)."""
    store = results.read_stores(report.results_dirs)
    analysis = analyse(report.results_dirs, store.rows, report.sanity, store, report.busy_host)
    files: dict[str, str] = {}
    for layout in report.layouts:
        files |= layout.render(analysis, report)
    report.out_dir.mkdir(parents=True, exist_ok=True)
    with staged(report.out_dir) as staging:
        for name, text in files.items():
            write_text(staging / name, text)
        drawn = [path for layout in report.layouts
                 for path in layout.draw(analysis, dataclasses.replace(report, out_dir=staging))]
        names = list(files) + [str(path.relative_to(staging)) for path in drawn]
        for name in names:
            os.replace(staging / name, report.out_dir / name)
    return [report.out_dir / name for name in names]


@contextmanager
def staged(out_dir: Path):
    """A hidden folder in `out_dir` where every file of the report is written
    before any is renamed into place: a full disk or a kill while writing
    leaves the last report whole, not new text beside old tables and plots.
    Those a killed report left are removed first."""
    _remove_stale_staging(out_dir)
    staging = Path(tempfile.mkdtemp(prefix=STAGING, dir=out_dir))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _remove_stale_staging(out_dir: Path) -> None:
    """The staging folders in `out_dir` left by killed reports; never one a
    report running now (in another process) still writes into."""
    cutoff = time.time() - STALE_STAGING_S
    for folder in out_dir.glob(f"{STAGING}*"):
        try:
            stale = folder.is_dir() and not folder.is_symlink() and folder.stat().st_mtime < cutoff
        except OSError:
            continue
        if stale:
            shutil.rmtree(folder, ignore_errors=True)
