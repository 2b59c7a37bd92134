"""A test layout and a test output format, from outside conf/: their YAMLs
are in searchpath/report/ (on Hydra's search path), this module on
PYTHONPATH (test_main_cli.py)."""
from dataclasses import dataclass

from evaluate.report.config import Layout, OutputFormat


@dataclass
class Greeting(Layout):
    """`<name>.md`: one line with the greeting and the row count."""
    greeting: str = "hello"

    def render(self, analysis, report) -> dict[str, str]:
        return {f"{self.name}.md": f"{self.greeting}: {len(analysis.rows)} rows\n"}


@dataclass
class RowCount(OutputFormat):
    """A summary format: the row count in `rows.<suffix>`."""
    suffix: str = "txt"

    def render(self, analysis, report) -> dict[str, str]:
        return {f"rows.{self.suffix}": f"{len(analysis.rows)}\n"}
