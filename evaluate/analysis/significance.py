"""The one rule the report decides "faster / slower / no difference" with,
and the letters that show its pairwise verdicts.

Every comparison is a ratio of means (a speed-up vs the original, one
artifact vs another, a geometric mean of speed-ups over scenarios, the
same artifact on two machines): a `Contrast`, a weighted sum of the log
means, whose 95 % interval is Welch's: the delta-method variance of each
log mean, (std / mean)^2 / n, summed with the weights squared, and Student
t with Welch-Satterthwaite degrees of freedom. A mean that appears on both
sides (the shared original of two speed-ups) cancels, as its noise does.
Two things differ when that interval of their ratio excludes 1.0; without
an interval (a side with one run) they are not tested. No correction for
the number of pairs: each test is at 95 %."""
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Hashable, Sequence, TypeVar

from evaluate.metrics import t95

T = TypeVar("T")
RULE = ("two means differ when the 95 % interval of their ratio excludes 1.0 (Welch: delta method on the log "
        "ratio, Welch-Satterthwaite degrees of freedom; no correction for the number of pairs); a side with one "
        "run is not tested")


class Verdict(Enum):
    """How a ratio's interval stands to 1.0."""
    HIGHER = "higher"            # the interval lies above 1.0
    LOWER = "lower"              # below 1.0
    SAME = "no significant difference"   # it holds 1.0
    UNTESTED = "not tested"      # no interval: a side has a single run

    @property
    def differs(self) -> bool:
        return self in (Verdict.HIGHER, Verdict.LOWER)


@dataclass(frozen=True)
class Estimate:
    """A mean over n runs, and what names it (equal keys are one measurement)."""
    key: Hashable
    mean: float
    std: float | None
    n: int

    @property
    def log_variance(self) -> float | None:
        """Variance of log(mean), delta method; None with fewer than two runs."""
        if self.std is None or self.n < 2:
            return None
        return (self.std / self.mean) ** 2 / self.n


@dataclass(frozen=True)
class Contrast:
    """sum(weight x log mean) over estimates: the log of a ratio of means, or
    of a geometric mean of such ratios."""
    weights: dict = field(default_factory=dict)      # key -> (Estimate, weight)

    @classmethod
    def ratio(cls, top: Estimate, bottom: Estimate) -> "Contrast":
        """log(top / bottom)."""
        return cls.of([(top, 1.0), (bottom, -1.0)])

    @classmethod
    def of(cls, terms: Sequence[tuple[Estimate, float]]) -> "Contrast":
        weights: dict = {}
        for est, w in terms:
            weights[est.key] = (est, weights.get(est.key, (est, 0.0))[1] + w)
        return cls({k: (e, w) for k, (e, w) in weights.items() if abs(w) > 1e-12})

    @classmethod
    def mean_of(cls, contrasts: Sequence["Contrast"]) -> "Contrast":
        """The average: the log of the geometric mean of the ratios."""
        n = len(contrasts)
        return cls.of([(e, w / n) for c in contrasts for e, w in c.weights.values()])

    def minus(self, other: "Contrast") -> "Contrast":
        """log(ratio / other ratio)."""
        return Contrast.of([*self.weights.values(), *((e, -w) for e, w in other.weights.values())])

    @property
    def log_ratio(self) -> float:
        return sum(w * math.log(e.mean) for e, w in self.weights.values())

    def half_width(self) -> float | None:
        """The 95 % interval's half-width in log space; None where a term has no variance."""
        parts = [(w * w * e.log_variance, e.n) for e, w in self.weights.values()
                 if e.log_variance is not None]
        if len(parts) < len(self.weights):
            return None
        total = sum(v for v, _ in parts)
        if total == 0:
            return 0.0   # no spread measured on any side (or nothing left: a ratio of a mean with itself)
        df = total ** 2 / sum(v * v / (n - 1) for v, n in parts)
        return t95(df) * math.sqrt(total)

    def compare(self) -> "Comparison":
        ratio, half = math.exp(self.log_ratio), self.half_width()
        interval = None if half is None else (ratio * math.exp(-half), ratio * math.exp(half))
        return Comparison(ratio, interval)


@dataclass(frozen=True)
class Comparison:
    """A ratio of means, its 95 % interval and the rule's verdict on it."""
    ratio: float
    interval: tuple[float, float] | None

    @property
    def verdict(self) -> Verdict:
        if self.interval is None:
            return Verdict.UNTESTED
        low, high = self.interval
        if low > 1.0:
            return Verdict.HIGHER
        if high < 1.0:
            return Verdict.LOWER
        return Verdict.SAME


def compare(top: Estimate, bottom: Estimate) -> Comparison:
    """The rule for two means: top / bottom, its interval and verdict."""
    return Contrast.ratio(top, bottom).compare()


def letters(items: Sequence[T], differ: Callable[[T, T], bool]) -> list[str]:
    """A compact letter display of the pairwise verdicts: items (in the order
    shown) that share a letter do not differ, items with no letter in common
    do. Unlike tiers of neighbours, it never chains: a ~ b and b ~ c leave a
    and c apart when they differ (a: "a", b: "ab", c: "b"). Insert-and-absorb
    (Piepho 2004): start from one set of all; split every set that holds a
    pair that differs; drop sets inside others."""
    sets: list[set[int]] = [set(range(len(items)))] if items else []
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            if differ(items[i], items[j]):
                sets = absorbed([part for s in sets for part in ((s - {j}, s - {i}) if {i, j} <= s else (s,))])
    sets.sort(key=min)
    names = [letter_name(k) for k in range(len(sets))]
    return ["".join(name for name, s in zip(names, sets) if i in s) for i in range(len(items))]


def absorbed(sets: list[set[int]]) -> list[set[int]]:
    """The sets that no other set holds (of equal sets, the first)."""
    return [s for k, s in enumerate(sets)
            if s and not any(s < t or (s == t and m < k) for m, t in enumerate(sets) if m != k)]


def letter_name(k: int) -> str:
    """a, b, ..., z, then aa, ab, ...: as many as there are groups."""
    return letter_name(k // 26 - 1) + chr(ord("a") + k % 26) if k >= 26 else chr(ord("a") + k)


def on_its_side(x: float, boundary: float, digits: int = 2, most: int = 6) -> str:
    """x with `digits` decimals, or more (up to `most`) where fewer would put it
    on or past `boundary` when it is not: a lower bound of 1.0016 reads 1.002,
    not 1.00, beside the verdict "faster"; a recovery of 94.96 % below a 95 %
    floor reads 94.96, not 95.0."""
    for d in range(digits, most + 1):
        text = f"{x:.{d}f}"
        if (float(text) > boundary, float(text) < boundary) == (x > boundary, x < boundary):
            return text
    return text
