"""What the report shows, computed: result rows -> groups with stats and
speed-ups (`groups`), decided by one significance rule (`significance`),
the rankings (`ranking`), the accuracy figures' intervals
(`accuracy_bounds`), the serving analysis of load levels (`load_levels`)
and the recommendation (`recommendation`). Modules here only compute and
return typed objects; evaluate.report only formats them. Suspect artifacts
(`suspect`) are found first and their rows enter none of them."""
from dataclasses import dataclass, field
from pathlib import Path

from evaluate.analysis.accuracy_bounds import add_bounds
from evaluate.analysis.busy_host import BusyHost
from evaluate.analysis.groups import Group, add_speedups, aggregate, name_originals
from evaluate.analysis.load_levels import ServingAnalysis, analyse as analyse_serving
from evaluate.analysis.ranking import OverallRanking, ScenarioRanking, rank_overall, rank_scenarios
from evaluate.analysis.suspect import Suspect, find as find_suspects
from evaluate.results import Refused, Row, StoreRead
from quantize.common.sanity_rules import SanityConfig


@dataclass
class Analysis:
    """The results store (or several side by side), analysed once for every
    layout and output format."""
    results_dirs: list[Path]
    rows: list[Row]             # those of the artifacts that are not suspect
    speed: list[Group]          # with speed-ups vs the original
    accuracy: list[Group]
    lm_eval: list[Group]
    serving: ServingAnalysis | None  # None without ok serving rows
    suspects: list[Suspect] = field(default_factory=list)  # left out of everything above
    # lines of the store(s) no reader takes (results.read_store): not rows, or rows that cannot be true
    refused: list[Refused] = field(default_factory=list)
    set_aside: list[Path] = field(default_factory=list)    # torn tails appends moved aside
    rankings: list[ScenarioRanking] = field(default_factory=list)  # per scenario, model and store
    overall: list[OverallRanking] = field(default_factory=list)    # per model and store
    busy_host: BusyHost = field(default_factory=BusyHost.from_config)  # which runs shared a busy host

    @property
    def suspect_ids(self) -> frozenset[str]:
        return frozenset(s.artifact_id for s in self.suspects)

    @property
    def results_dir(self) -> Path:
        """The store; the first of several (each row's `store` says which it came from)."""
        return self.results_dirs[0]


def analyse(results_dirs: list[Path], rows: list[Row], sanity: SanityConfig | None = None,
            store: StoreRead | None = None, busy_host: BusyHost | None = None) -> Analysis:
    """`sanity`: the suspect rules' thresholds (None: conf/sanity/default.yaml);
    `store`: what the rows were read from, for the lines it left out;
    `busy_host`: the busy-host rule (None: conf/report.yaml's threshold)."""
    store = store or StoreRead()
    rows = name_originals(rows)
    suspects = find_suspects(rows, sanity or SanityConfig.from_config(None))
    left_out = {s.artifact_id for s in suspects}
    rows = [r for r in rows if r.artifact_id not in left_out]
    speed = aggregate(rows, "speed")
    add_speedups(speed)
    accuracy = aggregate(rows, "accuracy")
    add_bounds(accuracy)
    return Analysis(list(results_dirs), rows, speed, accuracy, aggregate(rows, "lm_eval"),
                    analyse_serving(rows), suspects, store.refused, store.set_aside,
                    rank_scenarios(speed), rank_overall(speed), busy_host or BusyHost.from_config())
