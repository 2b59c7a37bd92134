"""`summary`: report.md, summary.csv, runs.csv, serving.csv and the PNG
plots: the files of each output format chosen with `output=[...]`
(conf/report/output/)."""
from dataclasses import dataclass
from pathlib import Path

from evaluate.analysis import Analysis
from evaluate.analysis.groups import pareto_scenario
from evaluate.report.config import Layout, ReportConfig


@dataclass
class Summary(Layout):
    """report.md, the CSVs and the plots: the files of every output format chosen."""

    def render(self, analysis: Analysis, report: ReportConfig) -> dict[str, str]:
        if report.pareto_scenario is not None and analysis.speed:
            pareto_scenario(analysis.speed, report.pareto_scenario)  # fail on a bad name before writing anything
        files: dict[str, str] = {}
        for output in report.outputs:
            files |= output.render(analysis, report)
        return files

    def draw(self, analysis: Analysis, report: ReportConfig) -> list[Path]:
        return [path for output in report.outputs for path in output.draw(analysis, report)]
