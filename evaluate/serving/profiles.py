"""Load profiles: the `load=` config group (conf/load/<name>.yaml), one typed
class per profile, named by the YAML's `_target_` (quantize.common.extensions).

A profile is a sequence of levels (evaluate.serving.load.Level), the later
ones possibly chosen from what the earlier ones measured (sweep, slo_search).
Profiles are written against `measure(Level) -> metrics | None` (None: the
level failed), so the same code runs them, resumes them from stored rows, and
lists what a dead server still owed.

Adding a profile is one module with a `LoadProfile` subclass (its dataclass
fields are the YAML's keys; `validate` checks them, `run` sends its levels
through `measure`) and one YAML naming it; `load=none` (no `_target_`) means
batch timed runs instead.
"""
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from evaluate.serving.load import Level, level_requests
from evaluate.serving.slo import SLO, SearchResult, search
from quantize.common.errors import UserError
from quantize.common.extensions import Configurable, build

Measure = Callable[[Level], dict | None]


def from_group(load: dict | None) -> "LoadProfile | None":
    """The `load` group as a plain dict -> its typed profile; None for
    load=none (batch timed runs), which names no class."""
    if not load or load.get("name") in (None, "none"):
        return None
    return build(load, LoadProfile, f"load={load['name']} (conf/load/)")


@dataclass(frozen=True, kw_only=True)
class LoadProfile(Configurable):
    """What every profile sets: each of its levels sends at most
    `max_requests` requests for at most `max_seconds` (those in flight then
    get `drain_seconds` more, by default max_seconds)."""
    name: str                           # the rows' load.profile
    max_requests: float | None = None   # per level
    max_seconds: float | None = None    # per level
    drain_seconds: float | None = None
    burstiness: float | None = None     # open-loop levels: gamma shape of the arrival gaps (1 = Poisson)
    only_with_server: bool = False      # with an in-process engine: batch timed runs instead (a default)

    def validate(self, slo: SLO | None) -> None:
        """Bad settings fail before any server starts (one line each)."""
        for key in ("max_requests", "max_seconds"):
            value = getattr(self, key)
            if not (_is_number(value) and value > 0):
                raise UserError(f"load={self.name}: load.{key} must be a positive number, not {value!r}")
        if self.drain_seconds is not None and not (_is_number(self.drain_seconds) and self.drain_seconds >= 0):
            raise UserError(f"load={self.name}: load.drain_seconds must be a number >= 0 (seconds the requests in "
                            f"flight get after max_seconds), not {self.drain_seconds!r}")

    def _check_in_flight(self, key: str, values: list) -> None:
        """Requests in flight are whole and at least 1: 0.5 would run nothing, 1.5 run 1."""
        bad = next((v for v in values if not _whole_at_least_1(v)), None)
        if bad is not None:
            raise UserError(f"load={self.name}: load.{key} must be whole numbers of requests in flight, >= 1, "
                            f"not {bad!r}")

    def run(self, measure: Measure, slo: SLO | None):
        """Send the profile's levels through `measure`; returns what the
        profile concluded (describe_outcome says it), or None."""
        raise NotImplementedError

    def describe_outcome(self, outcome, slo: SLO | None) -> str:
        """One log line for what `run` returned."""
        return str(outcome)

    def drain(self) -> float:
        """Seconds the requests in flight get after max_seconds."""
        return float(self.max_seconds if self.drain_seconds is None else self.drain_seconds)

    def arrival_burstiness(self) -> float:
        """The gamma shape of open-loop levels (unset: 1, Poisson arrivals)."""
        return float(self.burstiness or 1.0)

    def _check_burstiness(self) -> None:
        if not (_is_number(self.burstiness) and self.burstiness > 0):
            raise UserError(f"load={self.name}: load.burstiness must be > 0 (1 = Poisson arrivals)")


@dataclass(frozen=True, kw_only=True)
class Synchronous(LoadProfile):
    """One request at a time: the latency floor."""

    def run(self, measure: Measure, slo: SLO | None) -> None:
        measure(Level("synchronous", None))


@dataclass(frozen=True, kw_only=True)
class Concurrency(LoadProfile):
    """Closed loop: `levels` requests in flight at all times, one level after the other."""
    levels: list | None = None

    def validate(self, slo: SLO | None) -> None:
        super().validate(slo)
        if not _positive_list(self.levels):
            raise UserError(f"load={self.name}: load.levels must be a list of positive in-flight counts, "
                            "e.g. [1,4,16]")
        self._check_in_flight("levels", self.levels)

    def run(self, measure: Measure, slo: SLO | None) -> None:
        for c in self.levels:
            measure(Level("concurrency", int(c)))


@dataclass(frozen=True, kw_only=True)
class Rate(LoadProfile):
    """Open loop: requests arrive at `rates` req/s whatever the server does."""
    rates: list | None = None

    def validate(self, slo: SLO | None) -> None:
        super().validate(slo)
        if not _positive_list(self.rates):
            raise UserError(f"load={self.name}: load.rates must be a list of positive request rates (req/s), "
                            "e.g. [0.5,1,2]")
        if not all(math.isfinite(r) for r in self.rates):  # an open loop needs a schedule; inf has none
            raise UserError(f"load={self.name}: load.rates must be finite request rates (req/s), e.g. [0.5,1,2]; "
                            "for as many requests as the server takes, use load=concurrency load.levels=[...]")
        self._check_burstiness()

    def run(self, measure: Measure, slo: SLO | None) -> None:
        for r in self.rates:
            measure(Level("rate", round_level(r), self.arrival_burstiness()))


@dataclass(frozen=True, kw_only=True)
class Sweep(LoadProfile):
    """guidellm's sweep: synchronous (the lowest useful rate), saturation (the
    highest), then `rate_levels` open-loop rates evenly spaced between the two
    measured request throughputs."""
    saturation_concurrency: int
    rate_levels: int

    def validate(self, slo: SLO | None) -> None:
        super().validate(slo)
        self._check_burstiness()
        self._check_in_flight("saturation_concurrency", [self.saturation_concurrency])
        if not (_is_number(self.rate_levels) and self.rate_levels >= 0 and float(self.rate_levels).is_integer()):
            raise UserError(f"load={self.name}: load.rate_levels must be a whole number of rates >= 0, "
                            f"not {self.rate_levels!r}")

    def run(self, measure: Measure, slo: SLO | None) -> None:
        sync = measure(Level("synchronous", None))
        sat = measure(Level("concurrency", int(self.saturation_concurrency)))
        for rate in sweep_rates(sync, sat, int(self.rate_levels)):
            measure(Level("rate", rate, self.arrival_burstiness()))


@dataclass(frozen=True, kw_only=True)
class SloSearch(LoadProfile):
    """The highest concurrency (mode: rate for req/s) whose latencies meet the
    SLO (evaluate.serving.slo.search)."""
    mode: str | None = None             # concurrency | rate
    start: float
    max_level: float
    resolution: float

    def validate(self, slo: SLO | None) -> None:
        super().validate(slo)
        if self.mode == "rate":
            self._check_burstiness()
        if slo is None:
            raise UserError(f"load={self.name} needs an SLO to search against: pass slo=interactive_cpu "
                            "(or another conf/slo/ file)")
        if self.mode not in ("concurrency", "rate"):
            raise UserError(f"load={self.name}: load.mode must be concurrency or rate")
        if self.mode == "concurrency":
            self._check_in_flight("start", [self.start])
            self._check_in_flight("max_level", [self.max_level])
        for key in ("start", "max_level", "resolution"):
            value = getattr(self, key)
            if not (_is_number(value) and math.isfinite(value) and value > 0):
                raise UserError(f"load={self.name}: load.{key} must be a finite positive number, not {value!r}")
        if self.start > self.max_level:
            raise UserError(f"load={self.name}: load.start ({self.start:g}) must not be above load.max_level "
                            f"({self.max_level:g})")
        need = slo.min_requests()  # fewer requests per level: every level unresolved, the search finds nothing
        if level_requests(self.max_requests) < need:
            raise UserError(f"load={self.name}: load.max_requests={self.max_requests:g} is below the {need} requests "
                            f"a level needs for a {slo.pct_key} SLO; pass load.max_requests={need}")

    def run(self, measure: Measure, slo: SLO | None) -> SearchResult:
        integer = self.mode == "concurrency"

        def one(level: float) -> dict:
            lv = (Level("concurrency", int(level)) if integer
                  else Level("rate", round_level(level), self.arrival_burstiness()))
            return measure(lv) or {}  # a failed level: no completed requests, so unresolved, never passed

        return search(one, slo, start=float(self.start), max_level=float(self.max_level),
                      resolution=float(self.resolution), integer=integer)

    def describe_outcome(self, outcome: SearchResult, slo: SLO | None) -> str:
        best = "none" if outcome.best is None else f"{outcome.best:g}"
        return f"{self.name} ({slo.describe()}): best {self.mode} {best}; {outcome.reason}"


def sweep_rates(sync: dict | None, sat: dict | None, n: int) -> list[float]:
    """`n` rates strictly between the synchronous and saturated throughputs
    (none when either level failed)."""
    low = (sync or {}).get("request_throughput")
    high = (sat or {}).get("request_throughput")
    if not low or not high or n <= 0:
        return []
    low, high = sorted((float(low), float(high)))
    return [round_level(r) for r in np.linspace(low, high, n + 2)[1:-1]]


def round_level(rate: float) -> float:
    """Rates computed from measurements, to 4 significant digits: a resumed
    sweep that computes them again gets the same level (and row key)."""
    return float(f"{float(rate):.4g}")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _whole_at_least_1(value) -> bool:
    return _is_number(value) and math.isfinite(value) and value >= 1 and float(value).is_integer()


def _positive_list(values) -> bool:
    return isinstance(values, (list, tuple)) and bool(values) and all(
        _is_number(v) and v > 0 for v in values)
