"""The Pareto front of a recipe search and the answer drawn from it.

`pareto_front` is the bare computation (indices of the non-dominated points
of any objectives, each maximized or minimized); `search_front` applies it to
a study's complete trials and `answer` picks the point the report recommends:
the fastest front point that keeps the accuracy floor (ties: the smaller)."""
import math
from dataclasses import dataclass

from evaluate.search.study_file import Objective, SearchRecord, Trial
from quantize.common.errors import UserError

MAXIMIZE, MINIMIZE = "maximize", "minimize"
DIRECTIONS = (MAXIMIZE, MINIMIZE)
ACCURACY_PREFIXES = ("kl", "top1_agreement", "perplexity")
LATENCY_PREFIXES = ("tpot", "ttft", "itl", "latency")


def pareto_front(points: list[tuple[float, ...]], directions: list[str]) -> list[int]:
    """The indices (ascending) of the points no other point dominates. A point
    dominates another when it is at least as good in every objective and
    better in one; equal points do not dominate each other, so duplicates on
    the front are all kept. O(n^2) comparisons: a study has tens of trials."""
    signs = orientation(directions)
    for i, p in enumerate(points):
        if len(p) != len(signs):
            raise ValueError(f"point {i} has {len(p)} values for {len(signs)} objectives")
        if not all(math.isfinite(v) for v in p):
            raise ValueError(f"point {i} has a value that is not a finite number: {p}")
    oriented = [tuple(s * v for s, v in zip(signs, p)) for p in points]
    return [i for i, p in enumerate(oriented) if not any(dominates(q, p) for q in oriented)]


def orientation(directions: list[str]) -> list[int]:
    """+1 per maximized objective, -1 per minimized one, so that larger is always better."""
    unknown = [d for d in directions if d not in DIRECTIONS]
    if unknown:
        raise UserError(f"unknown objective direction {unknown[0]!r}; use {MAXIMIZE} or {MINIMIZE}")
    return [1 if d == MAXIMIZE else -1 for d in directions]


def dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """a dominates b (both oriented so that larger is better)."""
    return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))


@dataclass(frozen=True)
class Roles:
    """Which objective of a study is its accuracy, speed and size (index, or None)."""
    accuracy: int | None
    speed: int | None
    size: int | None

    @classmethod
    def of(cls, objectives: list[Objective]) -> "Roles":
        def first(test) -> int | None:
            return next((i for i, o in enumerate(objectives) if test(o)), None)
        return cls(accuracy=first(is_accuracy), speed=first(is_speed), size=first(is_size))


def is_recovery(objective: Objective) -> bool:
    return objective.name.endswith("recovery_pct")


def is_accuracy(objective: Objective) -> bool:
    """A recovery, a KL divergence, an agreement or a perplexity."""
    return is_recovery(objective) or objective.name.startswith(ACCURACY_PREFIXES) or objective.unit == "nats"


def is_speed(objective: Objective) -> bool:
    """A throughput (maximized) or a latency (minimized)."""
    return objective.unit == "tok/s" or "throughput" in objective.name or objective.name.startswith(LATENCY_PREFIXES)


def is_size(objective: Objective) -> bool:
    return objective.unit in ("MB", "GB", "bytes") or "size" in objective.name


@dataclass(frozen=True)
class SearchFront:
    """A study's complete trials and the Pareto front among them (best first
    by the objectives in order)."""
    record: SearchRecord
    complete: list[Trial]       # COMPLETE, with a finite value per objective
    front: list[Trial]
    roles: Roles

    def on_front(self, trial: Trial) -> bool:
        return any(t.number == trial.number for t in self.front)

    @property
    def failed(self) -> list[Trial]:
        return [t for t in self.record.trials if t.state == "FAIL"]

    def value(self, trial: Trial, role: str) -> float | None:
        index = getattr(self.roles, role)
        return None if index is None else trial.values[index]


def search_front(record: SearchRecord, suspects: frozenset[str] = frozenset()) -> SearchFront:
    """The front of a study's complete trials. A trial whose values do not
    match the objectives (a study whose objectives changed) is left out, and
    so is one whose artifact is suspect (evaluate.analysis.suspect)."""
    n = len(record.objectives)
    complete = [t for t in record.complete()
                if len(t.values) == n and all(isinstance(v, (int, float)) and math.isfinite(v) for v in t.values)
                and t.artifact_id not in suspects]
    directions = [o.direction for o in record.objectives]
    front = [complete[i] for i in pareto_front([tuple(t.values) for t in complete], directions)]
    signs = orientation(directions)
    front.sort(key=lambda t: ([-s * v for s, v in zip(signs, t.values)], t.number))
    return SearchFront(record, complete, front, Roles.of(record.objectives))


@dataclass(frozen=True)
class SearchAnswer:
    """The recommended point of a study for an accuracy floor."""
    pick: Trial | None          # None: no complete trial
    floor_pct: float | None     # None: the accuracy objective is not a recovery, no floor applies
    meets_floor: bool           # False: nothing kept the floor, and `pick` is the most accurate point


def answer(search: SearchFront, floor_pct: float) -> SearchAnswer:
    """The fastest front point whose recovery is at least floor_pct (ties: the
    smaller, then the more accurate); with a KL (or no) accuracy objective no
    floor applies and it is the fastest front point; where no point keeps the
    floor, the most accurate point, flagged as not meeting it."""
    roles, objectives = search.roles, search.record.objectives
    recovery = roles.accuracy is not None and is_recovery(objectives[roles.accuracy])
    if not search.front:
        return SearchAnswer(None, floor_pct if recovery else None, False)
    if not recovery:
        return SearchAnswer(best(search, search.front), None, True)
    kept = [t for t in search.front if t.values[roles.accuracy] >= floor_pct]
    if kept:
        return SearchAnswer(best(search, kept), floor_pct, True)
    return SearchAnswer(most_accurate(search), floor_pct, False)


SHOWN_DIGITS = 4  # significant digits the report shows speed and size with


def best(search: SearchFront, trials: list[Trial]) -> Trial:
    """Fastest, then smallest, then most accurate, then the lowest trial
    number. Speed and size compare as the report shows them: trials that
    reuse one speed measurement and differ in size by a few bytes tie, and
    accuracy decides."""
    def shown(role: str, value: float) -> float:
        return value if role == "accuracy" else float(f"{value:.{SHOWN_DIGITS}g}")
    order = [(role, objective_sign(search, role)) for role in ("speed", "size", "accuracy")]
    return min(trials, key=lambda t: ([-sign * shown(role, search.value(t, role)) for role, sign in order if sign],
                                      t.number))


def most_accurate(search: SearchFront) -> Trial:
    sign = objective_sign(search, "accuracy")
    return min(search.front, key=lambda t: (-sign * search.value(t, "accuracy"), t.number))


def objective_sign(search: SearchFront, role: str) -> int:
    """+1 (maximized) or -1 (minimized) for the objective of that role; 0 where the study has none."""
    index = getattr(search.roles, role)
    return 0 if index is None else orientation([search.record.objectives[index].direction])[0]
