"""The report: results store -> `report.md`, `summary.csv`, `runs.csv` and
PNG plots (`python -m evaluate.report`, see __main__.py).

`aggregate` groups ok rows and computes stats, speed-ups and rankings; each
output is one module that only formats what it returns (`markdown`,
`tables_csv`, `plots`; units and number formats in `formatting`). A new
output format is one more module called from `build_report`."""
from pathlib import Path

from evaluate import results
from evaluate.report.aggregate import add_speedups, aggregate, pareto_scenario
from evaluate.report.markdown import render_markdown
from evaluate.report.plots import render_plots
from evaluate.report.tables_csv import RUN_FIELDS, SUMMARY_FIELDS, run_records, summary_records, to_csv
from quantize.common.atomic import write_text
from quantize.common.errors import UserError


def build_report(results_dir: Path, out_dir: Path, title: str, pareto: str | None = None) -> list[Path]:
    """Write every report file into `out_dir`; return their paths."""
    rows = results.read(results_dir) if Path(results_dir).is_dir() else []
    if not rows:
        raise UserError(f"no results in {results_dir}; run python -m evaluate first")
    speed = aggregate(rows, "speed")
    add_speedups(speed)
    accuracy, lm = aggregate(rows, "accuracy"), aggregate(rows, "lm_eval")
    if pareto is not None and speed:
        pareto_scenario(speed, pareto)  # fail on a bad name before writing anything
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {out_dir / "report.md": render_markdown(rows, speed, accuracy, title, results_dir, lm),
               out_dir / "summary.csv": to_csv(summary_records(speed), SUMMARY_FIELDS),
               out_dir / "runs.csv": to_csv(run_records(rows), RUN_FIELDS)}
    for path, text in written.items():
        write_text(path, text)
    return list(written) + render_plots(speed, accuracy, out_dir, pareto)
