"""The rankings: per scenario (mean output throughput) and overall (the
geometric mean of the speed-ups over one scenario set), each per model,
store and machine (Group.machine), each as letters of the one significance rule (significance.letters):
entries that share a letter do not differ, entries with none in common do.
No tiers of neighbours, so nothing chains."""
from dataclasses import dataclass, field

from evaluate.analysis.groups import SPEED, Group, by_throughput, compare_groups, scenarios, testable
from evaluate.analysis.significance import Comparison, Contrast, letters
from evaluate.results import Store
from evaluate.scenarios import Scenario


@dataclass
class Ranked:
    """One entry of a ranking and its letters."""
    group: Group
    letters: str


@dataclass
class ScenarioRanking:
    """One scenario's groups of one model (and store and machine), fastest first."""
    scenario: Scenario
    model_name: str
    store: Store | None
    ranked: list[Ranked]
    untested: list[Group]     # a single run: the rule cannot compare it, so it has no place
    machine: str | None = None


def rank_scenarios(speed: list[Group]) -> list[ScenarioRanking]:
    """Per scenario, then model, store and machine (in order of appearance),
    the groups with a mean output throughput: those the rule can test, lettered."""
    blocks: dict[tuple, list[Group]] = {}
    for sc in scenarios(speed):
        for g in speed:
            if g.scenario == sc and g.mean(SPEED):
                blocks.setdefault((sc, g.model_name, g.store, g.machine), []).append(g)
    out = []
    for (scenario, model, store, machine), gs in blocks.items():
        ordered = by_throughput(gs)
        tested = [g for g in ordered if testable(g)]
        marks = letters(tested, lambda a, b: compare_groups(a, b).verdict.differs)
        out.append(ScenarioRanking(scenario, model, store, [Ranked(g, m) for g, m in zip(tested, marks)],
                                   [g for g in ordered if not testable(g)], machine))
    return out


@dataclass
class Overall:
    """One recipe/artifact/engine/setup over its ranking's scenario set."""
    identity: tuple
    groups: list[Group]       # one per scenario of the set, in its order
    contrast: Contrast        # the log of the geometric-mean speed-up
    letters: str = ""

    @property
    def comparison(self) -> Comparison:
        return self.contrast.compare()

    @property
    def speedup(self) -> float:
        return self.comparison.ratio

    @property
    def interval(self) -> tuple[float, float] | None:
        return self.comparison.interval

    @property
    def testable(self) -> bool:
        """An interval, from two runs or more of every scenario, its own and
        its baseline's: the original's speed-up over itself is 1 with an
        interval of width 0 whatever its runs, yet one run of it tests nothing."""
        return self.interval is not None and all(testable(g) and testable(g.baseline) for g in self.groups)

    @property
    def flagged(self) -> list[Group]:
        """Its scenarios whose speed-up is flagged (⚠): included all the same."""
        return [g for g in self.groups if g.flag]

    @property
    def dtype_pairs(self) -> tuple[tuple[str, str], ...]:
        """(baseline's dtype, its own) where `dtype: auto` chose two."""
        return tuple(dict.fromkeys((g.baseline.dtype, g.dtype) for g in self.groups if g.dtype_differs))


@dataclass
class Incomplete:
    """A recipe left out of the overall: it lacks a speed-up in some of the set's scenarios."""
    identity: tuple
    have: list[Scenario]
    lack: list[Scenario]


@dataclass
class OverallRanking:
    """The overall of one model (and store and machine): every entry over the same scenarios."""
    model_name: str
    store: Store | None
    scenarios: list[Scenario]
    ranked: list[Overall]                     # best first, lettered
    untested: list[Overall] = field(default_factory=list)        # a scenario with one run: no interval
    incomplete: list[Incomplete] = field(default_factory=list)
    machine: str | None = None


def rank_overall(speed: list[Group]) -> list[OverallRanking]:
    """Per model, store and machine, the geometric mean of each recipe's speed-ups
    over every scenario where any recipe there has one, flagged speed-ups
    included; a recipe that lacks one of those scenarios is named apart, as
    averaging it over fewer would compare it on other ground."""
    blocks: dict[tuple, list[Group]] = {}
    for g in speed:
        if g.speedup is not None:
            blocks.setdefault((g.model_name, g.store, g.machine), []).append(g)
    return [overall_of(model, store, gs, machine) for (model, store, machine), gs in blocks.items()]


def overall_of(model: str, store: Store | None, groups: list[Group], machine: str | None = None) -> OverallRanking:
    scs = list(dict.fromkeys(g.scenario for g in groups))
    per: dict[tuple, dict[Scenario, Group]] = {}
    for g in groups:
        per.setdefault(g.identity, {})[g.scenario] = g
    entries, incomplete = [], []
    for ident, by_sc in per.items():
        if len(by_sc) < len(scs):
            incomplete.append(Incomplete(ident, [s for s in scs if s in by_sc], [s for s in scs if s not in by_sc]))
            continue
        gs = [by_sc[s] for s in scs]
        entries.append(Overall(ident, gs, Contrast.mean_of([speedup_contrast(g) for g in gs])))
    entries.sort(key=lambda o: -o.speedup)
    ranked = [o for o in entries if o.testable]
    for o, mark in zip(ranked, letters(ranked, lambda a, b: a.contrast.minus(b.contrast).compare().verdict.differs)):
        o.letters = mark
    return OverallRanking(model, store, scs, ranked, [o for o in entries if not o.testable], incomplete, machine)


def speedup_contrast(g: Group) -> Contrast:
    """log(g's mean / its baseline's): the baseline's own is 0, and two
    speed-ups over one baseline share (and so cancel) its noise."""
    return Contrast.ratio(g.estimate(SPEED), g.baseline.estimate(SPEED))
