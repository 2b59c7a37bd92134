"""A test layout and a test output format, from outside conf/: their YAMLs
are in searchpath/report/ (on Hydra's search path), this module on
PYTHONPATH (test_main_cli.py)."""
import time
from dataclasses import dataclass
from pathlib import Path

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


@dataclass
class SlowPlot(OutputFormat):
    """A summary format that draws `slow.png` into the staging folder, then
    takes `seconds` more (a plot that takes long): a test stops the report
    while it waits."""
    seconds: float = 600.0

    def draw(self, analysis, report) -> list[Path]:
        path = report.out_dir / "slow.png"
        path.write_bytes(b"half a plot")
        time.sleep(self.seconds)
        return [path]
