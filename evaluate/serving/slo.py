"""Service-level objectives: what a load level must meet, the verdict on one
level, and the search for the highest level that meets them.

An SLO (`conf/slo/<name>.yaml`, the `slo=` group) bounds the `percentile`-th
percentile of per-request latencies, in milliseconds; a bound left out (None)
is not checked:
- `ttft_ms`: time to first token;
- `tpot_ms`: time per output token after the first;
- `e2el_ms`: end-to-end latency of a request.
`min_recovery_pct` is the accuracy floor the recommendation applies: the
artifact's accuracy row must reach this `recovery_pct` (% of the original
model's perplexity score). It is not a latency bound and `judge` ignores it.

The check of one level (`judge`), in this order:
1. Failed when more than (100 - p) % of the requests sent failed (a failed
   request misses every bound), however few were sent.
2. Unresolved (passed None) when the level sent (completed + failed) fewer
   than `min_requests(p) = ceil(10 / (1 - p/100))` requests: the pNN is then
   estimated from fewer than 10 requests above it (p90: 100 requests, p95: 200,
   p99: 1000, p50: 20). Failures count here, as they count as misses: one
   failed request of 100 does not leave a p90 level unjudged. An unresolved
   level is never passed.
3. Unresolved when the level is not `valid` (the client, not the server, was
   the bottleneck: see metrics.py): it measured the client.
4. Failed when any `p<p>_<metric>_ms` is above its bound, or when the
   requests that missed a bound, failed ones included
   (`slo_<metric>_misses`, counted against that same bound), are more than
   (100 - p) % of those sent: the pNN is over completed requests only, so
   failures plus slow completed requests could otherwise exceed the share the
   SLO allows. Rows without those counts are judged on the pNN alone;
   unresolved when a bounded metric was not measured.
5. Passed otherwise.

Search (`search`): the highest concurrency (or request rate) that passes.
Double from `start` until a level does not pass, throughput saturates (request
throughput grows less than SATURATION_GAIN = 5 % over the previous level) or
`max_level` is reached; after a level that does not pass, bisect between the
last passing level and it until they are `resolution` apart. A saturated level
that passes is the answer: beyond it more load adds queueing, not throughput.
"""
import math
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Callable

from quantize.common.errors import UserError
from quantize.common.settings import is_number, shown

METRICS = ("ttft", "tpot", "e2el")  # the bounded per-request metrics, as in vllm bench serve's --goodput
TAIL_REQUESTS = 10       # requests expected above the percentile before a pNN counts as measured
SATURATION_GAIN = 0.05   # less request-throughput growth than this between levels: saturated
EXAMPLES = {"percentile": 90, "min_recovery_pct": 95, "tpot_ms": 50}   # for error lines; others: 500 (ms)


@dataclass(frozen=True)
class SLO:
    name: str = "custom"
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    percentile: float = 90
    min_recovery_pct: float | None = None

    def __post_init__(self):
        if not 0 < float(self.percentile) < 100:
            raise UserError(f"slo {self.name}: percentile must be between 0 and 100, not {self.percentile}")
        for metric, bound in self.limits().items():
            if not bound > 0:
                raise UserError(f"slo {self.name}: {metric}_ms must be a positive number of ms, not {bound}")

    @classmethod
    def from_dict(cls, values: dict | None) -> "SLO | None":
        """The `slo` config group as a plain dict (the entry converts it), or a
        row's `slo` -> an SLO; None for `name: none`, no config, or one that
        bounds nothing."""
        if values is None:
            return None
        known = {k: v for k, v in values.items() if k in cls.__dataclass_fields__}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise UserError(f"slo: unknown key(s) {', '.join(unknown)}; an SLO takes "
                            f"{', '.join(cls.__dataclass_fields__)}")
        if str(known.get("name")) == "none":
            return None
        for key, value in known.items():
            if key != "name":
                _check_number(str(known.get("name", "custom")), key, value)
        slo = cls(**{k: (v if k == "name" or v is None else float(v)) for k, v in known.items()})
        return slo if slo.limits() else None

    def as_dict(self) -> dict:
        return asdict(self)

    def judged_by(self) -> dict:
        """What a level's stored metrics depend on: the bounds and the percentile
        (not the name, nor the accuracy floor, which the report applies)."""
        return {"limits": self.limits(), "percentile": float(self.percentile)}

    def limits(self) -> dict[str, float]:
        """{"ttft": ms, ...}: the bounds set (vllm bench serve's --goodput form)."""
        return {m: float(v) for m in METRICS if (v := getattr(self, f"{m}_ms")) is not None}

    @property
    def pct_key(self) -> str:
        """`90` -> "p90", `99.9` -> "p99.9": the metric-name prefix vllm bench serve writes."""
        p = float(self.percentile)
        return f"p{int(p)}" if p == int(p) else f"p{p}"

    def min_requests(self) -> int:
        """Requests a level must send (completed + failed) before its pNN is trusted."""
        return math.ceil(round(TAIL_REQUESTS * 100 / (100 - float(self.percentile)), 6))

    def allowed_pct(self) -> Fraction:
        """The share of requests (%) that may miss a bound, 100 - p, exactly as written (p99.9: 1/10)."""
        return 100 - Fraction(repr(float(self.percentile)))

    def too_many(self, misses: int, sent: int) -> bool:
        """More than (100 - p) % of `sent`? Exact, so 10 of 100 is not more than a p90's 10 %."""
        return misses * 100 > self.allowed_pct() * sent

    def describe(self) -> str:
        bounds = ", ".join(f"{m.upper()} ≤ {v:g} ms" for m, v in self.limits().items())
        floor = f"; accuracy ≥ {self.min_recovery_pct:g} % recovery" if self.min_recovery_pct is not None else ""
        return f"{self.name}: {self.pct_key} {bounds}{floor}"


@dataclass
class SloCheck:
    passed: bool | None     # None: unresolved (never counts as passed)
    reason: str


def judge(metrics: dict, slo: SLO) -> SloCheck:
    """One level's metrics (metrics.level_metrics) against the SLO; the rules are in the module docstring."""
    p = slo.pct_key
    completed = metrics.get("completed") or 0
    failed = metrics.get("failed") or 0
    sent, need = completed + failed, slo.min_requests()
    if slo.too_many(failed, sent):  # first: too many failures fail a level of any size
        return SloCheck(False, f"{failed} of {sent} requests failed, more than the "
                              f"{float(slo.allowed_pct()):g} % a {p} SLO allows")
    if sent < need:
        return SloCheck(None, f"unresolved: {sent} requests sent, {p} needs at least {need}")
    if metrics.get("valid") is False:
        what = "level of other output lengths" if metrics.get("off_length_outputs") else "client-bound level"
        return SloCheck(None, f"unresolved: {what} ({metrics.get('valid_reason') or 'not valid'})")
    misses = []
    for metric, bound in slo.limits().items():
        value = metrics.get(f"{p}_{metric}_ms")
        if not isinstance(value, (int, float)):
            return SloCheck(None, f"unresolved: {p}_{metric}_ms not measured")
        missed = metrics.get(f"slo_{metric}_misses")
        if value > bound:
            misses.append(f"{p} {metric.upper()} {value:.1f} ms > {bound:g} ms")
        elif metrics.get(f"slo_{metric}_bound_ms") == bound and isinstance(missed, int) and slo.too_many(missed, sent):
            misses.append(f"{missed} of {sent} requests missed {metric.upper()} ≤ {bound:g} ms ({failed} failed), "
                          f"more than the {float(slo.allowed_pct()):g} % a {p} SLO allows")
    if misses:
        return SloCheck(False, "; ".join(misses))
    return SloCheck(True, "meets " + ", ".join(f"{p} {m.upper()} ≤ {b:g} ms" for m, b in slo.limits().items()))


@dataclass
class SearchResult:
    best: float | None                      # highest level that passed; None when none did
    reason: str                             # why the search stopped there
    trace: list[tuple[float, dict, SloCheck]] = field(default_factory=list)  # every level measured, in order


def search(measure: Callable[[float], dict], slo: SLO, start: float = 1, max_level: float = 64,
           resolution: float = 1, integer: bool = True) -> SearchResult:
    """The highest level (concurrency, or request rate) whose metrics meet
    `slo`; `measure(level)` runs one level and returns its metrics. See the
    module docstring for the rule."""
    if not (0 < start <= max_level) or resolution <= 0:
        raise UserError(f"slo_search: need 0 < start ({start}) <= max_level ({max_level}) and resolution "
                        f"({resolution}) > 0")
    trace: list[tuple[float, dict, SloCheck]] = []
    seen: dict[float, tuple[dict, SloCheck]] = {}

    def run(level: float) -> tuple[dict, SloCheck]:
        if level not in seen:
            metrics = measure(level)
            seen[level] = (metrics, judge(metrics, slo))
            trace.append((level, *seen[level]))
        return seen[level]

    def done(best, why) -> SearchResult:
        return SearchResult(best, why, trace)

    level, last_pass, prev = (int(start) if integer else start), None, None
    while True:
        metrics, verdict = run(level)
        if not verdict.passed:
            break
        last_pass = level
        tput = metrics.get("request_throughput")
        if prev is not None and tput is not None and prev[1] and tput < prev[1] * (1 + SATURATION_GAIN):
            return done(level, f"saturated at {fmt(level)}: request throughput {tput:.3g} req/s, "
                               f"{(tput / prev[1] - 1):+.1%} over {fmt(prev[0])} (< {SATURATION_GAIN:.0%}); "
                               "more load adds queueing, not throughput")
        if level >= max_level:
            return done(level, f"max_level {fmt(max_level)} reached and still meeting the SLO")
        prev = (level, tput)
        level = min(level * 2, max_level)
    first_fail, fail_verdict = level, verdict
    lo, hi = (last_pass or 0), first_fail
    while hi - lo > resolution:
        mid = lo + (hi - lo) / 2
        mid = math.floor(mid) if integer else mid
        if mid <= lo or mid >= hi:
            break
        _, v = run(mid)
        if v.passed:
            lo = mid
        else:
            hi, first_fail, fail_verdict = mid, mid, v
    if not lo:
        lowest = min(trace, key=lambda t: t[0])
        return done(None, f"no level meets the SLO: at {fmt(lowest[0])} (the lowest tried) {lowest[2].reason}")
    return done(lo, f"{fmt(lo)} meets the SLO, {fmt(first_fail)} does not ({fail_verdict.reason}); "
                    f"bisected to resolution {fmt(resolution)}")


def fmt(level: float) -> str:
    return f"{level:g}"


def _check_number(slo_name: str, key: str, value) -> None:
    """A bound or floor is a number or null (no bound); the percentile a number.
    Hydra gives `slo.ttft_ms=abc` as the text "abc"."""
    nullable = key != "percentile"
    if (value is None and nullable) or is_number(value):
        return
    no_bound = f", or slo.{key}=null for no bound" if nullable else ""
    raise UserError(f"slo {slo_name}: {key}={shown(value)} is not a number; pass e.g. slo.{key}={EXAMPLES.get(key, 500)}"
                    f"{no_bound}")


def judged_by(values: dict | None) -> dict | None:
    """SLO.judged_by of a row's `slo`; None for none. One that cannot be read
    is kept as written: its levels match no SLO configured now."""
    try:
        slo = SLO.from_dict(values)
    except (UserError, TypeError, ValueError):
        return {"unreadable": values}
    return slo.judged_by() if slo else None
