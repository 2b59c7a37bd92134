"""The answer the report opens with: per scenario, model and store (each
store is its own machine), the fastest artifact whose accuracy recovery
meets the floor (default 95 %), and the runner-up. The floor applies to the
recovery's point estimate (accuracy_bounds.Recovery: the pick says where its
interval reaches below the floor). The original counts as its own accuracy
row says, or 100 % without one; an artifact without an accuracy row cannot
be said to meet the floor, so it is named apart when it is faster than the
pick rather than recommended."""
from dataclasses import dataclass, field

from evaluate.analysis.accuracy_bounds import Recovery, recovery
from evaluate.analysis.groups import Group, accuracy_of, by_throughput, compare_groups, scenarios
from evaluate.analysis.significance import Comparison, Verdict
from evaluate.results import Store
from evaluate.scenarios import Scenario

ACCURACY_FLOOR_PCT = 95.0
SPEED = "output_throughput"


@dataclass
class Passed:
    """A candidate: its speed group and its accuracy recovery."""
    group: Group
    recovery: Recovery

    @property
    def recovery_pct(self) -> float:
        return self.recovery.pct


@dataclass
class Choice:
    """One scenario's answer for one model on one store's machine."""
    scenario: Scenario
    model_name: str
    floor_pct: float
    pick: Passed | None                      # None: nothing measured meets the floor
    runner_up: Passed | None = None
    vs_runner_up: Comparison | None = None   # the pick's mean / the runner-up's (significance.compare)
    below_floor: list[Passed] = field(default_factory=list)   # faster than the pick, less accurate
    unmeasured: list[Group] = field(default_factory=list)     # faster than the pick, accuracy not measured
    store: Store | None = None               # where the report reads several

    @property
    def tied(self) -> bool:
        """Whether the rule finds no difference between the pick and the runner-up."""
        return bool(self.vs_runner_up) and self.vs_runner_up.verdict is Verdict.SAME

    @property
    def floor_in_interval(self) -> bool:
        """Whether the pick's recovery interval reaches below the floor (it meets it by the point estimate)."""
        interval = self.pick.recovery.interval if self.pick else None
        return bool(interval) and interval[0] < self.floor_pct


def choose(speed: list[Group], accuracy: list[Group], floor_pct: float = ACCURACY_FLOOR_PCT) -> list[Choice]:
    """The answer for every scenario, model and store of the speed groups:
    scenario by scenario, each's models and stores in order of appearance."""
    blocks: dict[tuple, list[Group]] = {}
    for sc in scenarios(speed):
        for g in speed:
            if g.scenario == sc and g.mean(SPEED):
                blocks.setdefault((sc, g.model_name, g.store), []).append(g)
    return [choose_one(sc, model, gs, accuracy, floor_pct, store) for (sc, model, store), gs in blocks.items()]


def recovery_of(accuracy: list[Group], g: Group) -> Recovery | None:
    """g's accuracy recovery, measured in its own setup (as the summary
    shows it: never borrowed from another)."""
    return recovery(accuracy_of(accuracy, g), g)


def choose_one(sc: Scenario, model: str, groups: list[Group], accuracy: list[Group], floor_pct: float,
               store: Store | None = None) -> Choice:
    choice = Choice(sc, model, floor_pct, None, store=store)
    passed = []
    for g in by_throughput(groups):
        found = recovery_of(accuracy, g)
        if found is not None and found.pct >= floor_pct:
            passed.append(Passed(g, found))
        elif not passed:  # faster than any pick: say why it is not the answer
            if found is None:
                choice.unmeasured.append(g)
            else:
                choice.below_floor.append(Passed(g, found))
    if passed:
        choice.pick = passed[0]
        choice.runner_up = passed[1] if len(passed) > 1 else None
        if choice.runner_up:
            choice.vs_runner_up = compare_groups(choice.pick.group, choice.runner_up.group)
    return choice
