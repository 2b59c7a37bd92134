"""The recommendation per serving scenario, among artifacts that meet the
SLO's accuracy floor (`min_recovery_pct`, against the artifact's accuracy
row; the original is 100 % by definition): the one with the highest
capacity per load mode, and the one with the lowest mean TPOT at
concurrency 1 (95 % Student-t interval over its requests). Where others cannot be told
apart from the best (capacity: the brackets of the levels measured
overlap; TPOT: the significance rule finds no difference), the smaller
model (model_bytes) is preferred; the picks say which were tied."""
import math
from dataclasses import dataclass, field

from evaluate.analysis.groups import Group, overlap
from evaluate.analysis.load_levels import (
    MODES, Curve, ServingAnalysis, floor_miss, level_text, tpot_estimate, tpot_interval)
from evaluate.analysis.significance import Verdict, compare
from evaluate.results import Store
from evaluate.scenarios import Scenario
from evaluate.serving.slo import SLO


@dataclass
class Ineligible:
    """An artifact left out of a pick, and why."""
    group: Group
    why: str


@dataclass
class CapacityPick:
    """The most load under the SLO in one mode (concurrency or rate)."""
    mode: str
    chosen: Curve | None                  # None: no artifact qualifies
    tied: list[Curve] = field(default_factory=list)  # others the levels measured cannot tell apart from it
    ineligible: list[Ineligible] = field(default_factory=list)


@dataclass
class TpotPick:
    """The lowest mean TPOT at concurrency 1, with its 95 % interval (mean, low, high)."""
    chosen: Group | None                  # None: no artifact qualifies
    interval: tuple[float, float, float] | None = None
    tied: list[tuple[Group, tuple[float, float, float]]] = field(default_factory=list)  # no difference by the rule
    ineligible: list[Ineligible] = field(default_factory=list)


@dataclass
class Recommendation:
    """One serving scenario's picks for one model, store and machine (as the
    offline answer has them); no capacity picks without an SLO."""
    scenario: Scenario
    model_name: str
    store: Store | None
    slo: SLO | None
    capacity: list[CapacityPick]
    tpot: TpotPick
    machine: str | None = None


def recommend(analysis: ServingAnalysis, accuracy: list[Group]) -> list[Recommendation]:
    """The picks of every serving scenario, in the analysis' scenario order,
    then per model, store and machine in order of appearance: no reader is
    pointed at an artifact measured on another machine."""
    out = []
    for sc in analysis.scenarios:
        slo = analysis.slos[sc]
        blocks: dict[tuple, list[Curve]] = {}
        for c in analysis.curves:
            if c.scenario == sc:
                blocks.setdefault((c.group.model_name, c.group.store, c.group.machine), []).append(c)
        for (model, store, machine), here in blocks.items():
            capacity = [] if slo is None else [
                recommend_capacity([c for c in here if c.mode == mode], accuracy, slo)
                for mode in MODES if any(c.mode == mode for c in here)]
            out.append(Recommendation(sc, model, store, slo, capacity, recommend_tpot(here, accuracy, slo), machine))
    return out


def bracket(c: Curve) -> tuple[float, float]:
    """[capacity, next level measured above) as a closed interval for overlap tests."""
    best, above = c.capacity()
    return best.level, (above.level - 1e-9 if above else math.inf)


def smallest(gs: list[Group]) -> Group:
    return min(gs, key=lambda g: (g.model_bytes is None, g.model_bytes or 0))


def capacity_miss(c: Curve, accuracy: list[Group], slo: SLO) -> str | None:
    """Why c cannot be picked for capacity; None when it can."""
    why = floor_miss(accuracy, c.group, slo)
    best, _ = c.capacity()
    if why is None and best is None:
        lowest = c.levels[0]
        why = (f"no level meets the SLO (at {level_text(c.mode, lowest.level)}: {lowest.verdict.reason})"
               if lowest.verdict else "not judged")
    return why


def recommend_capacity(cs: list[Curve], accuracy: list[Group], slo: SLO) -> CapacityPick:
    """Among the curves (one mode) of artifacts that meet the accuracy floor, the highest capacity."""
    ineligible, ok = [], []
    for c in cs:
        why = capacity_miss(c, accuracy, slo)
        if why:
            ineligible.append(Ineligible(c.group, why))
        else:
            ok.append(c)
    if not ok:
        return CapacityPick(cs[0].mode, None, [], ineligible)
    lead = max(ok, key=lambda c: (c.capacity()[0].level, c.capacity()[0].get("request_throughput") or 0))
    tied = [c for c in ok if overlap(bracket(c), bracket(lead))]
    chosen = smallest([c.group for c in tied]) if len(tied) > 1 else lead.group
    curve = next(c for c in ok if c.group is chosen)
    others = [t for t in tied if t.group is not chosen] if len(tied) > 1 else []
    return CapacityPick(curve.mode, curve, others, ineligible)


def tpot_miss(c: Curve, accuracy: list[Group], slo: SLO | None) -> str | None:
    """Why c cannot be picked for TPOT at concurrency 1; None when it can."""
    lv = c.at(1.0)
    why = floor_miss(accuracy, c.group, slo)
    if why is None and (lv is None or tpot_interval(lv) is None):
        why = "no level at concurrency 1 with a TPOT"
    elif why is None and lv.metrics.get("valid") is False:
        why = f"its concurrency-1 level is not valid ({lv.metrics.get('valid_reason')})"
    return why


def recommend_tpot(cs: list[Curve], accuracy: list[Group], slo: SLO | None) -> TpotPick:
    """Among the concurrency curves of artifacts that meet the accuracy floor, the lowest TPOT at concurrency 1."""
    ineligible, ok = [], []
    for c in [c for c in cs if c.mode == "concurrency"]:
        why = tpot_miss(c, accuracy, slo)
        if why:
            ineligible.append(Ineligible(c.group, why))
        else:
            ok.append((c.group, tpot_interval(c.at(1.0))))
    if not ok:
        return TpotPick(None, None, [], ineligible)
    lead = min(ok, key=lambda t: t[1][0])
    tied = [t for t in ok if t is lead or same_tpot(t[0], lead[0], cs)]
    chosen = smallest([g for g, _ in tied]) if len(tied) > 1 else lead[0]
    interval = next(iv for g, iv in ok if g is chosen)
    others = [(g, iv) for g, iv in tied if g is not chosen] if len(tied) > 1 else []
    return TpotPick(chosen, interval, others, ineligible)


def same_tpot(a: Group, b: Group, cs: list[Curve]) -> bool:
    """Whether the significance rule finds no difference between two groups'
    mean TPOT at concurrency 1 (a single request leaves it untested: not tied)."""
    level = {id(c.group): c.at(1.0) for c in cs if c.mode == "concurrency"}
    ours, theirs = (tpot_estimate(level[id(g)], id(g)) for g in (a, b))
    return compare(ours, theirs).verdict is Verdict.SAME
