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
    """One results store, analysed once for every layout and output format."""
    results_dir: Path
    rows: list[Row]
    speed: list[Group]          # with speed-ups vs the original
    accuracy: list[Group]
    lm_eval: list[Group]
    serving: ServingAnalysis | None  # None without ok serving rows


def analyse(results_dir: Path, rows: list[Row]) -> Analysis:
    speed = aggregate(rows, "speed")
    add_speedups(speed)
    return Analysis(results_dir, rows, speed, aggregate(rows, "accuracy"), aggregate(rows, "lm_eval"),
                    analyse_serving(rows))
