"""The report: results store (or several side by side) -> the files of the layouts asked for
(`python -m evaluate.report`, see __main__.py).

evaluate.analysis computes (groups, stats, speed-ups, rankings, the serving
analysis and the recommendation); everything here only formats what it
returns: `labels` names the groups, `formatting` holds units and number
formats, and each layout (conf/report/layout/) and output format of the
summary (conf/report/output/) is a class named by its YAML's `_target_`
(evaluate.report.config): adding one is one module and one YAML."""
import dataclasses
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path, PurePath

import yaml

from evaluate import results
from evaluate.analysis import analyse
from evaluate.report.config import Layout, OutputFormat, ReportConfig, build_choices
from quantize.common.atomic import write_text
from quantize.common.paths import CONF_DIR

SUMMARY = "summary"
STAGING = ".report-"
# The names of the files the last report in a folder wrote: the next removes
# those it does not write again, and nothing else.
MANIFEST = ".quantbench-report.json"
# A staging folder untouched this long is a killed report's (SIGTERM, kill -9,
# the OOM killer skip its cleanup): a running report writes into its own within seconds.
STALE_STAGING_S = 3600
HELD_SIGNALS = {signal.SIGTERM, signal.SIGINT}
log = logging.getLogger("quantbench.report")


class Stopped(BaseException):
    """A signal (SIGTERM) stopped the report; `python -m evaluate.report`'s
    handler raises it. Not an Exception, so that nothing on the way holds it,
    and `staged` removes its folder as it unwinds."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.written_to: Path | None = None   # where the report was whole when it took effect


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
    the last report's (staged); then the last report's files this one does
    not write again are removed, by its MANIFEST, which this one replaces."""
    store = results.read_stores(report.results_dirs)
    analysis = analyse(report.results_dirs, store.rows, report.sanity, store, report.busy_host)
    files: dict[str, str] = {}
    for layout in report.layouts:
        files |= layout.render(analysis, report)
    report.out_dir.mkdir(parents=True, exist_ok=True)
    earlier = written_before(report.out_dir)
    with staged(report.out_dir) as staging:
        for name, text in files.items():
            write_text(staging / name, text)
        drawn = [path for layout in report.layouts
                 for path in layout.draw(analysis, dataclasses.replace(report, out_dir=staging))]
        names = list(files) + [str(path.relative_to(staging)) for path in drawn]
        write_text(staging / MANIFEST, json.dumps({"files": names}, indent=1) + "\n")
        try:
            with signals_held():
                for name in names + [MANIFEST]:
                    os.replace(staging / name, report.out_dir / name)
                _remove(report.out_dir, (earlier or set()) - set(names))
        except Stopped as e:   # held until every file was in place
            e.written_to = report.out_dir
            raise
        except KeyboardInterrupt:   # held the same way: it says where the whole report is, as SIGTERM does
            stopped = Stopped(signal.SIGINT)
            stopped.written_to = report.out_dir
            raise stopped from None
    if earlier is None:
        _say_what_stays(report.out_dir, names)
    return [report.out_dir / name for name in names]


def written_before(out_dir: Path) -> set[str] | None:
    """The files the last report in `out_dir` wrote, by its MANIFEST; None
    where it has none (no report yet, or one before the record was kept)
    or it cannot be read. Only names of files in `out_dir` itself count."""
    try:
        names = json.loads((out_dir / MANIFEST).read_text())["files"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not isinstance(names, list):
        return None
    return {n for n in names if isinstance(n, str) and _flat(n) and n != MANIFEST}


def _flat(name: str) -> bool:
    """Whether `name` is one file's name, as the report writes them: a record
    edited by hand may name any path, and `shared/x` may lie outside through a link."""
    return name not in ("", ".", "..") and PurePath(name).name == name


def _remove(out_dir: Path, names: set[str]) -> None:
    """The last report's files this one did not write again. The report
    writes no links: one by such a name is the user's, and stays."""
    for name in sorted(names):
        path = out_dir / name
        try:
            if path.is_file() and not path.is_symlink():
                path.unlink()
        except OSError as e:   # the new report is in place: say what stayed, do not fail it
            log.warning(f"could not remove {path}, a file of the last report: {e.strerror}")


def _say_what_stays(out_dir: Path, names: list[str]) -> None:
    """Without the last report's record, its files cannot be told from the
    user's: none is removed, and one line says which stay."""
    others = sorted(p.name for p in out_dir.iterdir()
                    if p.is_file() and not p.name.startswith(".") and p.name not in names)
    if others:
        log.warning(f"{out_dir} holds {len(others)} file{'s' if len(others) > 1 else ''} this report did not write "
                    f"({', '.join(others[:3])}{', …' if len(others) > 3 else ''}) and no record of which an "
                    f"earlier report wrote: left as they are; an empty out_dir holds this report alone")


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


@contextmanager
def signals_held():
    """SIGTERM and Ctrl-C wait while the staged files are renamed into place
    (milliseconds): a report is replaced whole or not at all. One that came
    meanwhile is raised again as the block ends, to the handler it had.
    (Python runs handlers in the main thread only, so there alone.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    handlers = {sig: signal.signal(sig, lambda signum, frame: came.append(signum)) for sig in HELD_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in handlers.items():   # None: one set outside Python, unknown here
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for signum in dict.fromkeys(came):
            signal.raise_signal(signum)


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
