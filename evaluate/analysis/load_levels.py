"""Serving rows (kind "serving": one row per load level) -> load curves,
each level judged against its scenario's SLO, with capacity and knee: what
the report's "Serving under load" section and plots show. Plain functions
over `Row`s and the analysis' `Group`s.

- A *curve* is one artifact's levels (in one scenario, engine, setup and load
  mode; `synchronous` is concurrency 1), sorted by level; where a level was
  measured more than once the latest row stands, and only levels sent as the
  latest was (burstiness, request budget) are in it.
- Each scenario is judged against one SLO, the latest row's (`Row.slo`, the
  `slo=` the levels ran with); every level is re-judged with it
  (evaluate.serving.slo.judge), so artifacts are compared on one rule.
- Capacity: the highest level that passed. Its bracket runs up to the next
  level measured above it (which did not pass), or is open when none was: the
  true limit lies in between, so two artifacts whose brackets overlap are not
  told apart by the measurement.
- Knee: the level with the highest power, request throughput ÷ median E2EL
  (Kleinrock's operating point), when it is not the last level measured.
"""
import json
import math
from dataclasses import dataclass, field

from evaluate.analysis.accuracy_bounds import recovery
from evaluate.analysis.groups import Group, aggregate, scenario_of, scenarios
from evaluate.analysis.significance import Estimate, on_its_side
from evaluate.metrics import t95
from evaluate.results import Row
from evaluate.scenarios import Scenario
from evaluate.serving.slo import SLO, SloCheck, judge

KIND = "serving"
MODES = ("concurrency", "rate")


@dataclass
class LevelResult:
    row: Row
    mode: str               # concurrency | rate
    level: float
    verdict: SloCheck | None = None

    @property
    def metrics(self) -> dict:
        return self.row.metrics

    def get(self, key: str) -> float | None:
        v = self.row.metrics.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


@dataclass
class Curve:
    group: Group            # the serving group (aggregate's identity and labels)
    mode: str
    levels: list[LevelResult] = field(default_factory=list)

    @property
    def scenario(self) -> Scenario:
        return self.group.scenario

    def capacity(self) -> tuple[LevelResult | None, LevelResult | None]:
        """(highest passing level, the next level measured above it)."""
        passed = [lv for lv in self.levels if lv.verdict and lv.verdict.passed]
        if not passed:
            return None, None
        best = max(passed, key=lambda lv: lv.level)
        above = [lv for lv in self.levels if lv.level > best.level]
        return best, min(above, key=lambda lv: lv.level) if above else None

    def knee(self) -> LevelResult | None:
        scored = [(lv.get("request_throughput") / lv.get("median_e2el_ms"), lv) for lv in self.levels
                  if lv.get("request_throughput") and lv.get("median_e2el_ms") and lv.metrics.get("valid") is not False]
        if len(scored) < 3:
            return None
        best = max(scored, key=lambda t: t[0])[1]
        return best if best is not scored[-1][1] else None

    def at(self, level: float) -> LevelResult | None:
        return next((lv for lv in self.levels if lv.level == level), None)


def level_of(row: Row) -> tuple[str, float] | None:
    load = row.load or {}
    mode, level = load.get("mode"), load.get("level")
    if mode == "synchronous":
        return "concurrency", 1.0
    if mode in MODES and isinstance(level, (int, float)):
        return mode, float(level)
    return None


def groups(rows: list[Row]) -> list[Group]:
    return aggregate(rows, KIND)


def scenario_slo(rows: list[Row], sc: Scenario) -> SLO | None:
    """The SLO of a scenario: that of its latest serving row that states one."""
    stated = sorted((r for r in rows if r.kind == KIND and r.ok and scenario_of(r) == sc and r.slo),
                    key=lambda r: r.timestamp or "")
    for r in reversed(stated):
        slo = SLO.from_dict(r.slo)
        if slo is not None:
            return slo
    return None


def profile_of(row: Row) -> str:
    """How a level's requests were sent, but for the level itself (burstiness,
    max_requests, max_seconds): levels of one curve share it."""
    return json.dumps({k: v for k, v in (row.load or {}).items() if k not in ("level", "mode")}, sort_keys=True)


def curves(serving: list[Group], slos: dict[Scenario, SLO | None]) -> list[Curve]:
    """Per group and mode, the levels of the latest load profile: a rerun with
    another burstiness or request budget replaces the curve rather than
    mixing its levels with the older ones."""
    out = []
    for g in serving:
        by_mode: dict[str, dict[float, Row]] = {}
        runs = sorted(g.runs, key=lambda r: r.timestamp or "")
        latest = {level_of(r)[0]: profile_of(r) for r in runs if level_of(r)}
        for r in runs:
            key = level_of(r)
            if key and profile_of(r) == latest[key[0]]:
                by_mode.setdefault(key[0], {})[key[1]] = r  # the latest row of a level stands
        slo = slos.get(g.scenario)
        for mode in MODES:
            if mode in by_mode:
                levels = [LevelResult(r, mode, lvl, judge(r.metrics, slo) if slo else None)
                          for lvl, r in sorted(by_mode[mode].items())]
                out.append(Curve(g, mode, levels))
    return out


# --- accuracy and offline speed beside the serving numbers ----------------------------------------------

def same_place(candidates: list[Group], g: Group) -> list[Group]:
    """The candidates measured in g's store and on g's machine (Group.machine):
    what stands beside g's serving numbers, never another machine's figure."""
    return [c for c in candidates if (c.store, c.machine) == (g.store, g.machine)]


def accuracy_for(accuracy: list[Group], g: Group) -> Group | None:
    """The artifact's accuracy group: measured in the same setup if there is
    one, else in any of its store and machine (a serving engine rarely
    measures accuracy itself)."""
    same = sorted(same_place([a for a in accuracy if a.artifact_id == g.artifact_id], g),
                  key=lambda a: a.scenario.name)
    return next((a for a in same if a.setup_id == g.setup_id), same[0] if same else None)


def recovery_of(accuracy: list[Group], g: Group) -> float | None:
    """g's accuracy recovery (%), from its accuracy group (accuracy_for)."""
    found = recovery(accuracy_for(accuracy, g), g)
    return found.pct if found else None


def floor_miss(accuracy: list[Group], g: Group, slo: SLO | None) -> str | None:
    """Why g misses the SLO's accuracy floor; None when it meets it (or there is none)."""
    if slo is None or slo.min_recovery_pct is None:
        return None
    rec = recovery_of(accuracy, g)
    if rec is None:
        return "no accuracy row (run python -m evaluate with accuracy=austen)"
    if rec < slo.min_recovery_pct:
        floor = slo.min_recovery_pct
        return f"accuracy recovery {on_its_side(rec, floor, 1)} % < the floor {floor:g} %"
    return None


def offline_speed(speed: list[Group], g: Group, sc: Scenario) -> Group | None:
    """The artifact's speed group in scenario sc: the serving setup's, else the
    in-process engine of the same family (vllm for vllm_server), else any; of
    its store and machine only."""
    same = same_place([s for s in speed if s.artifact_id == g.artifact_id and s.scenario == sc], g)
    return (next((s for s in same if s.setup_id == g.setup_id), None)
            or next((s for s in same if g.engine.startswith(s.engine)), None)
            or (same[0] if same else None))




def tpot_interval(lv: LevelResult) -> tuple[float, float, float] | None:
    """(mean, low, high) of the mean TPOT over the level's requests: Student t
    from vllm's population std and the completed count."""
    mean, std, n = lv.get("mean_tpot_ms"), lv.get("std_tpot_ms"), lv.get("completed")
    if mean is None or not n:
        return None
    if n < 2 or std is None:
        return mean, mean, mean
    half = t95(n - 1) * std * math.sqrt(n / (n - 1)) / math.sqrt(n)
    return mean, mean - half, mean + half


def tpot_estimate(lv: LevelResult, key) -> Estimate | None:
    """The level's mean TPOT as the significance rule takes it: vllm's
    population std made the sample one; None without a TPOT."""
    mean, std, n = lv.get("mean_tpot_ms"), lv.get("std_tpot_ms"), lv.get("completed")
    if not mean or not n:
        return None
    return Estimate(key, mean, None if std is None or n < 2 else std * math.sqrt(n / (n - 1)), int(n))


def level_text(mode: str, level: float) -> str:
    """A level in words: `concurrency 4` or `2 req/s`."""
    return f"concurrency {level:g}" if mode == "concurrency" else f"{level:g} req/s"


@dataclass
class ServingAnalysis:
    """Everything the report shows about serving rows, computed once."""
    groups: list[Group]                  # aggregate's serving groups
    scenarios: list[Scenario]
    slos: dict[Scenario, SLO | None]     # the SLO each scenario is judged against
    curves: list[Curve]


def analyse(rows: list[Row]) -> ServingAnalysis | None:
    """The serving analysis of the rows; None when there are no ok serving rows."""
    serving = groups(rows)
    if not serving:
        return None
    scs = scenarios(serving)
    slos = {sc: scenario_slo(rows, sc) for sc in scs}
    return ServingAnalysis(serving, scs, slos, curves(serving, slos))
