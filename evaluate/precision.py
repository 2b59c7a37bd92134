"""How many warm-up and timed runs a scenario gets: a fixed count, or `auto`.

`runs=auto` adds timed runs until the 95% confidence half-width of the mean
output throughput is at most `target_ci_pct` % of that mean (at least
`min_runs`, at most `max_runs`). `warmup_runs=auto` warms up until two
consecutive warm-up runs' throughputs differ by at most `warmup_tolerance_pct` %
(at most `max_warmup_runs`). The rules are pure functions of the values so far;
`RunPlan` holds the settings, checked before any engine starts."""
from dataclasses import dataclass

from evaluate.metrics import mean_interval
from quantize.common.errors import UserError
from quantize.common.settings import is_integer, is_number, shown

HEADLINE = "output_throughput"  # the metric whose interval decides runs=auto
TARGET_MET, CAP_REACHED = "target met", "max_runs reached"


def ci_pct(values: list[float]) -> float | None:
    """Half-width of the 95% interval of the mean, in % of the mean; None
    with fewer than two values or a mean <= 0."""
    interval = mean_interval(values)
    if interval is None or interval[0] <= 0:
        return None
    mean, _, high = interval
    return 100 * (high - mean) / mean


def stop_reason(values: list[float], min_runs: int, max_runs: int, target_ci_pct: float) -> str | None:
    """Why runs=auto stops after `values` (TARGET_MET or CAP_REACHED), or None: run again."""
    ci = ci_pct(values)
    if len(values) >= min_runs and ci is not None and ci <= target_ci_pct:
        return TARGET_MET
    return CAP_REACHED if len(values) >= max_runs else None


def warmed_up(values: list[float], tolerance_pct: float, max_runs: int) -> bool:
    """True once the last two warm-up throughputs differ by <= tolerance_pct %
    of the earlier one, or max_runs warm-ups ran."""
    if len(values) >= max_runs:
        return True
    return len(values) >= 2 and abs(values[-1] - values[-2]) <= tolerance_pct / 100 * abs(values[-2])


@dataclass(frozen=True)
class RunPlan:
    runs: int | None              # fixed timed runs; None: auto
    min_runs: int
    max_runs: int
    target_ci_pct: float
    warmup_runs: int | None       # fixed warm-up runs; None: auto
    warmup_tolerance_pct: float
    max_warmup_runs: int

    @property
    def auto(self) -> bool:
        return self.runs is None

    def indices(self, done, values: list[float]) -> list[int]:
        """Run indices still to measure, given the indices of the ok runs
        already stored and their output throughputs: the missing ones of
        range(runs); with auto, [] when the stored values already meet the rule,
        else the missing ones of range(max_runs) (measuring stops once it is met)."""
        count = self.max_runs if self.auto else self.runs
        if self.auto and self.stopped(values):
            return []
        return [i for i in range(count) if i not in done]

    def stopped(self, values: list[float]) -> str | None:
        return stop_reason(values, self.min_runs, self.max_runs, self.target_ci_pct) if self.auto else None

    def record(self, values: list[float], warmups: int) -> dict | None:
        """What a row stores about how the run count was decided, as it stood
        after this run (None when both counts are fixed: rows as before)."""
        if not self.auto and self.warmup_runs is not None:
            return None
        out = {"rule": "auto" if self.auto else "fixed", "runs": len(values)}
        if self.auto:
            ci = ci_pct(values)
            out |= {"min_runs": self.min_runs, "max_runs": self.max_runs, "target_ci_pct": self.target_ci_pct,
                    "achieved_ci_pct": None if ci is None else round(ci, 3), "stopped": self.stopped(values)}
        if self.warmup_runs is None:
            out["warmup_runs"] = warmups
        return out


def plan(settings: dict) -> RunPlan:
    """The run settings of an evaluate config (its top-level keys runs,
    warmup_runs, min_runs ... as a plain dict); bad values are one UserError
    line naming the fix."""
    runs = _count_or_auto(settings, "runs", 1, "runs=3 is typical, runs=auto adds runs until the interval is narrow")
    warmup = _count_or_auto(settings, "warmup_runs", 0, "warmup_runs=1 is typical, or warmup_runs=auto")
    # The auto settings are checked with fixed runs too, so a typo shows the first
    # time; how they relate (max_runs >= min_runs) only where they apply.
    min_runs = _integer(settings, "min_runs", 2, "runs=auto", "an interval needs two runs")
    max_runs = _integer(settings, "max_runs", min_runs if runs is None else 1, "runs=auto",
                        f"at least min_runs={min_runs}")
    target = _positive(settings, "target_ci_pct", "the half-width of the 95% interval in % of the mean, e.g. 5")
    max_warmup = _integer(settings, "max_warmup_runs", 2, "warmup_runs=auto", "stability compares two warm-up runs")
    tolerance = _positive(settings, "warmup_tolerance_pct", "e.g. 5")
    if runs is not None:
        min_runs = max_runs = 0
        target = 0.0
    if warmup is not None:
        max_warmup, tolerance = 0, 0.0
    return RunPlan(runs, min_runs, max_runs, target, warmup, tolerance, max_warmup)


def _count_or_auto(settings: dict, key: str, least: int, hint: str) -> int | None:
    value = settings.get(key)
    if value == "auto":
        return None
    if is_integer(value) and value >= least:
        return value
    raise UserError(f"{key}={shown(value)}: pass an integer >= {least} or auto ({hint})")


def _integer(settings: dict, key: str, least: int, mode: str, why: str) -> int:
    value = settings.get(key)
    if is_integer(value) and value >= least:
        return value
    raise UserError(f"{key}={shown(value)}: pass {key}=<an integer >= {least}> ({why}, for {mode})")


def _positive(settings: dict, key: str, what: str) -> float:
    value = settings.get(key)
    if not (is_number(value) and value > 0):
        raise UserError(f"{key}={shown(value)}: pass a number > 0 ({what})")
    return float(value)
