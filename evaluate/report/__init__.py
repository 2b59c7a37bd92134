"""The report: results store -> `report.md`, `summary.csv`, `runs.csv` and
PNG plots (`python -m evaluate.report`, see __main__.py).

`aggregate` groups ok rows and computes stats, speed-ups and rankings; each
output is one module that only formats what it returns (`markdown`,
`tables_csv`, `plots`; units and number formats in `formatting`). A new
output format is one more module called from `build_report`. `layouts/`
holds the other reports' tables (`layout=batch_table,...`), each written to
`<layout>.md` from the same groups."""
import importlib.util
import logging
from pathlib import Path

from evaluate import results
from evaluate.report import layouts as layouts_mod
from evaluate.analysis import analyse
from evaluate.analysis.groups import pareto_scenario
from evaluate.report.markdown import render_markdown
from evaluate.report.plots import render_plots, render_serving_plots
from evaluate.report.tables_csv import (
    RUN_FIELDS, SERVING_FIELDS, SUMMARY_FIELDS, run_records, serving_records, summary_records, to_csv)
from quantize.common.atomic import write_text
from quantize.common.errors import UserError

log = logging.getLogger("quantbench.report")


def build_report(results_dir: Path, out_dir: Path, title: str, pareto: str | None = None,
                 layouts: tuple[str, ...] = (layouts_mod.SUMMARY,)) -> list[Path]:
    """Write the files of every layout into `out_dir`; return their paths."""
    layouts = layouts_mod.parse(",".join(layouts))  # fail on a bad name before reading anything
    rows = results.read(results_dir) if Path(results_dir).is_dir() else []
    if not rows:
        raise UserError(f"no results in {results_dir}; run python -m evaluate first")
    analysis = analyse(results_dir, rows)
    speed, accuracy = analysis.speed, analysis.accuracy
    summary = layouts_mod.SUMMARY in layouts
    if summary and pareto is not None and speed:
        pareto_scenario(speed, pareto)  # fail on a bad name before writing anything
    written = {}
    if summary:
        written = {out_dir / "report.md": render_markdown(analysis, title),
                   out_dir / "summary.csv": to_csv(summary_records(speed), SUMMARY_FIELDS),
                   out_dir / "runs.csv": to_csv(run_records(rows), RUN_FIELDS)}
        if any(r.kind == "serving" for r in rows):
            written[out_dir / "serving.csv"] = to_csv(serving_records(rows), SERVING_FIELDS)
    written |= {out_dir / f"{name}.md": layouts_mod.render(name, rows, speed, title)
                for name in layouts if name != layouts_mod.SUMMARY}
    out_dir.mkdir(parents=True, exist_ok=True)
    for path, text in written.items():
        write_text(path, text)
    if summary and importlib.util.find_spec("matplotlib") is None:
        # the tables are the report; a machine without matplotlib (a bare CUDA image) still gets them
        log.warning("matplotlib is not installed: the report has no plots (bash scripts/setup.sh installs it)")
        summary = False
    plots = render_plots(speed, accuracy, out_dir, pareto) + render_serving_plots(analysis.serving, out_dir) if summary else []
    return list(written) + plots
