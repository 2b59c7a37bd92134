"""Report layouts (`python -m evaluate.report layout=[summary,batch_table]`):
each is a `Layout` (evaluate.report.config) named by
conf/report/layout/<name>.yaml. `summary` is report.md with the CSVs and
plots (its output formats); the others here are `MarkdownLayout`s whose
`body` is the Markdown of `<layout>.md`, in the style of one reference
report. All of them read the same analysed rows and groups: nothing is
measured for a layout."""
from dataclasses import dataclass
from typing import ClassVar

from evaluate.analysis import Analysis
from evaluate.report.config import Layout, ReportConfig
from evaluate.report.stores_markdown import hardware_lines

NO_SPEED = "No speed results in this store: run python -m evaluate first."


@dataclass
class MarkdownLayout(Layout):
    """`<name>.md`: the title, the hardware measured on, then the layout's tables."""
    subtitle: ClassVar[str] = ""
    needs_speed: ClassVar[bool] = True   # False: rendered from other rows (length_grid reads serving rows)

    def body(self, analysis: Analysis) -> str:
        raise NotImplementedError

    def render(self, analysis: Analysis, report: ReportConfig) -> dict[str, str]:
        lines = [f"# {report.title} — {self.subtitle}", ""]
        lines += hardware_lines(analysis.rows)
        body = self.body(analysis) if analysis.speed or not self.needs_speed else NO_SPEED
        return {f"{self.name}.md": "\n".join(lines + ["", body]) + "\n"}
