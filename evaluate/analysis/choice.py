"""The answer the report opens with: per scenario, model, store and machine
(Group.machine: a store of a cluster's jobs may hold several), the fastest artifact whose accuracy recovery
meets the floor (default 95 %), and the runner-up. The floor applies to the
recovery's point estimate (accuracy_bounds.Recovery: the pick says where its
interval reaches below the floor). The original counts as its own accuracy
row says, or 100 % without one; an artifact without an accuracy row cannot
be said to meet the floor, so it is named apart when it is faster than the
pick rather than recommended. `front` is the speed/accuracy trade-off the
Pareto plots draw: the candidates no other is both faster and more accurate
than (point estimates, evaluate.analysis.pareto)."""
from dataclasses import dataclass, field

from evaluate.analysis.accuracy_bounds import Recovery, recovery
from evaluate.analysis.groups import Group, accuracy_of, by_throughput, compare_groups, scenarios
from evaluate.analysis.pareto import MAXIMIZE, pareto_front
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
    """One scenario's answer for one model on one machine of one store."""
    scenario: Scenario
    model_name: str
    floor_pct: float
    pick: Passed | None                      # None: nothing measured meets the floor
    runner_up: Passed | None = None
    vs_runner_up: Comparison | None = None   # the pick's mean / the runner-up's (significance.compare)
    below_floor: list[Passed] = field(default_factory=list)   # faster than the pick, less accurate
    unmeasured: list[Group] = field(default_factory=list)     # faster than the pick, accuracy not measured
    store: Store | None = None               # where the report reads several
    measured: list[Passed] = field(default_factory=list)      # every artifact with a recovery, fastest first
    no_accuracy: list[Group] = field(default_factory=list)    # every artifact without one
    machine: str | None = None               # Group.machine of its artifacts

    @property
    def front(self) -> list[Passed]:
        """The measured artifacts on the speed/accuracy Pareto front, most accurate first."""
        points = [(p.recovery_pct, p.group.mean(SPEED)) for p in self.measured]
        on_front = [self.measured[i] for i in pareto_front(points, [MAXIMIZE, MAXIMIZE])]
        return sorted(on_front, key=lambda p: (-p.recovery_pct, -p.group.mean(SPEED)))

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
    """The answer for every scenario, model, store and machine of the speed
    groups: scenario by scenario, the rest in order of appearance. Never one
    answer for two machines: what is fastest on one may not be on the other."""
    blocks: dict[tuple, list[Group]] = {}
    for sc in scenarios(speed):
        for g in speed:
            if g.scenario == sc and g.mean(SPEED):
                blocks.setdefault((sc, g.model_name, g.store, g.machine), []).append(g)
    return [choose_one(sc, model, gs, accuracy, floor_pct, store, machine)
            for (sc, model, store, machine), gs in blocks.items()]


def recovery_of(accuracy: list[Group], g: Group) -> Recovery | None:
    """g's accuracy recovery, measured in its own setup (as the summary
    shows it: never borrowed from another)."""
    return recovery(accuracy_of(accuracy, g), g)


def choose_one(sc: Scenario, model: str, groups: list[Group], accuracy: list[Group], floor_pct: float,
               store: Store | None = None, machine: str | None = None) -> Choice:
    choice = Choice(sc, model, floor_pct, None, store=store, machine=machine)
    passed = []
    for g in by_throughput(groups):
        found = recovery_of(accuracy, g)
        if found is None:
            choice.no_accuracy.append(g)
        else:
            choice.measured.append(Passed(g, found))
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
