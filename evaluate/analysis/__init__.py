"""What the report shows, computed: result rows -> groups with stats and
speed-ups (`groups`), the serving analysis of load levels (`load_levels`)
and the recommendation (`recommendation`). Modules here only compute and
return typed objects; evaluate.report only formats them."""
from dataclasses import dataclass
from pathlib import Path

from evaluate.analysis.groups import Group, add_speedups, aggregate
from evaluate.analysis.load_levels import ServingAnalysis, analyse as analyse_serving
from evaluate.results import Row


@dataclass
class Analysis:
    """The results store (or several side by side), analysed once for every
    layout and output format."""
    results_dirs: list[Path]
    rows: list[Row]
    speed: list[Group]          # with speed-ups vs the original
    accuracy: list[Group]
    lm_eval: list[Group]
    serving: ServingAnalysis | None  # None without ok serving rows

    @property
    def results_dir(self) -> Path:
        """The store; the first of several (each row's `store` says which it came from)."""
        return self.results_dirs[0]


def analyse(results_dirs: list[Path], rows: list[Row]) -> Analysis:
    speed = aggregate(rows, "speed")
    add_speedups(speed)
    return Analysis(list(results_dirs), rows, speed, aggregate(rows, "accuracy"), aggregate(rows, "lm_eval"),
                    analyse_serving(rows))
