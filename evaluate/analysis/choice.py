"""The answer the report opens with: per scenario and model, the fastest
artifact whose accuracy meets the floor (recovery vs the original, default
95 %), and the runner-up. The original meets any floor by definition; an
artifact without an accuracy row cannot be said to meet it, so it is named
apart when it is faster than the pick rather than recommended."""
from dataclasses import dataclass, field

from evaluate.analysis.groups import BASELINE, Group, accuracy_of, by_throughput, compare_groups, scenarios
from evaluate.analysis.significance import Comparison, Verdict
from evaluate.scenarios import Scenario

ACCURACY_FLOOR_PCT = 95.0
SPEED = "output_throughput"


@dataclass
class Passed:
    """A candidate: its speed group and its accuracy recovery (%)."""
    group: Group
    recovery_pct: float


@dataclass
class Choice:
    """One scenario's answer for one model."""
    scenario: Scenario
    model_name: str
    floor_pct: float
    pick: Passed | None                      # None: nothing measured meets the floor
    runner_up: Passed | None = None
    vs_runner_up: Comparison | None = None   # the pick's mean / the runner-up's (significance.compare)
    below_floor: list[Passed] = field(default_factory=list)   # faster than the pick, less accurate
    unmeasured: list[Group] = field(default_factory=list)     # faster than the pick, accuracy not measured

    @property
    def tied(self) -> bool:
        """Whether the rule finds no difference between the pick and the runner-up."""
        return bool(self.vs_runner_up) and self.vs_runner_up.verdict is Verdict.SAME


def choose(speed: list[Group], accuracy: list[Group], floor_pct: float = ACCURACY_FLOOR_PCT) -> list[Choice]:
    """The answer for every scenario and model of the speed groups, in their order."""
    out = []
    for sc in scenarios(speed):
        here = [g for g in speed if g.scenario == sc and g.mean(SPEED)]
        for model in dict.fromkeys(g.model_name for g in here):
            out.append(choose_one(sc, model, [g for g in here if g.model_name == model], accuracy, floor_pct))
    return out


def recovery_of(accuracy: list[Group], g: Group) -> float | None:
    """g's accuracy recovery (%), measured in its own setup (as the summary
    shows it: never borrowed from another); the original's is 100 by definition."""
    if g.recipe == BASELINE:
        return 100.0
    a = accuracy_of(accuracy, g)
    return a.mean("recovery_pct") if a else None


def choose_one(sc: Scenario, model: str, groups: list[Group], accuracy: list[Group], floor_pct: float) -> Choice:
    choice = Choice(sc, model, floor_pct, None)
    passed = []
    for g in by_throughput(groups):
        recovery = recovery_of(accuracy, g)
        if recovery is not None and recovery >= floor_pct:
            passed.append(Passed(g, recovery))
        elif not passed:  # faster than any pick: say why it is not the answer
            if recovery is None:
                choice.unmeasured.append(g)
            else:
                choice.below_floor.append(Passed(g, recovery))
    if passed:
        choice.pick = passed[0]
        choice.runner_up = passed[1] if len(passed) > 1 else None
        if choice.runner_up:
            choice.vs_runner_up = compare_groups(choice.pick.group, choice.runner_up.group)
    return choice
