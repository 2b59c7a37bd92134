"""Serving rows (kind "serving": one row per load level) -> the report's
"Serving under load" and "Recommendation" sections, and the curves the plots
draw. Plain functions over `Row`s and aggregate's `Group`s.

- A *curve* is one artifact's levels (in one scenario, engine, setup and load
  mode; `synchronous` is concurrency 1), sorted by level; where a level was
  measured more than once the latest row stands.
- Each scenario is judged against one SLO, the latest row's (`Row.slo`, the
  `slo=` the levels ran with); every level is re-judged with it
  (evaluate.serving.slo.judge), so artifacts are compared on one rule.
- Capacity: the highest level that passed. Its bracket runs up to the next
  level measured above it (which did not pass), or is open when none was: the
  true limit lies in between, so two artifacts whose brackets overlap are not
  told apart by the measurement.
- Knee: the level with the highest power, request throughput ÷ median E2EL
  (Kleinrock's operating point), when it is not the last level measured.
- Recommendation per scenario, among artifacts that meet the SLO's accuracy
  floor (`min_recovery_pct`, against the artifact's accuracy row; the
  original is 100 % by definition): the one with the highest capacity, and
  the one with the lowest mean TPOT at concurrency 1 (95 % Student-t interval
  over its requests). Where others are within the measurement's interval of
  the best, the smaller model (model_bytes) is preferred and the text says so.
"""
import math
from dataclasses import dataclass, field

from evaluate.metrics import t95
from evaluate.report.aggregate import BASELINE, Group, aggregate, labels, overlap, scenario_of, scenarios
from evaluate.report.formatting import MISSING, fmt_fixed, fmt_number, mb, short
from evaluate.report.markdown import md_table
from evaluate.results import Row
from evaluate.scenarios import Scenario
from evaluate.serving.slo import SLO, SloCheck, judge

KIND = "serving"
MODES = ("concurrency", "rate")
LEVEL_NAMES = {"concurrency": "concurrency", "rate": "request rate (req/s)"}


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
        slo = SLO.from_cfg(r.slo)
        if slo is not None:
            return slo
    return None


def curves(serving: list[Group], slos: dict[Scenario, SLO | None]) -> list[Curve]:
    out = []
    for g in serving:
        by_mode: dict[str, dict[float, Row]] = {}
        for r in sorted(g.runs, key=lambda r: r.timestamp or ""):
            key = level_of(r)
            if key:
                by_mode.setdefault(key[0], {})[key[1]] = r  # the latest row of a level stands
        slo = slos.get(g.scenario)
        for mode in MODES:
            if mode in by_mode:
                levels = [LevelResult(r, mode, lvl, judge(r.metrics, slo) if slo else None)
                          for lvl, r in sorted(by_mode[mode].items())]
                out.append(Curve(g, mode, levels))
    return out


# --- accuracy and offline speed beside the serving numbers ----------------------------------------------

def accuracy_for(accuracy: list[Group], g: Group) -> Group | None:
    """The artifact's accuracy group: measured in the same setup if there is
    one, else in any (a serving engine rarely measures accuracy itself)."""
    same = sorted((a for a in accuracy if a.artifact_id == g.artifact_id), key=lambda a: a.scenario.name)
    return next((a for a in same if a.setup_id == g.setup_id), same[0] if same else None)


def recovery_of(accuracy: list[Group], g: Group) -> float | None:
    a = accuracy_for(accuracy, g)
    if a and a.mean("recovery_pct") is not None:
        return a.mean("recovery_pct")
    return 100.0 if g.recipe == BASELINE else None


def floor_miss(accuracy: list[Group], g: Group, slo: SLO | None) -> str | None:
    """Why g misses the SLO's accuracy floor; None when it meets it (or there is none)."""
    if slo is None or slo.min_recovery_pct is None:
        return None
    rec = recovery_of(accuracy, g)
    if rec is None:
        return "no accuracy row (run python -m evaluate with accuracy=austen)"
    if rec < slo.min_recovery_pct:
        return f"accuracy recovery {rec:.1f} % < the floor {slo.min_recovery_pct:g} %"
    return None


def offline_speed(speed: list[Group], g: Group, sc: Scenario) -> Group | None:
    """The artifact's speed group in scenario sc: the serving setup's, else the
    in-process engine of the same family (vllm for vllm_server), else any."""
    same = [s for s in speed if s.artifact_id == g.artifact_id and s.scenario == sc]
    return (next((s for s in same if s.setup_id == g.setup_id), None)
            or next((s for s in same if g.engine.startswith(s.engine)), None)
            or (same[0] if same else None))


# --- the recommendation ---------------------------------------------------------------------------------

@dataclass
class Pick:
    text: list[str]          # lines of Markdown
    chosen: Group | None


def bracket(c: Curve) -> tuple[float, float]:
    """[capacity, next level measured above) as a closed interval for overlap tests."""
    best, above = c.capacity()
    return best.level, (above.level - 1e-9 if above else math.inf)


def smallest(gs: list[Group]) -> Group:
    return min(gs, key=lambda g: (g.model_bytes is None, g.model_bytes or 0))


def size_text(g: Group) -> str:
    return f"{fmt_fixed(mb(g.model_bytes), 1)} MB" if g.model_bytes else "size unknown"


def level_text(mode: str, level: float) -> str:
    return f"concurrency {level:g}" if mode == "concurrency" else f"{level:g} req/s"


CAPACITY_TITLES = {"concurrency": "Most load under the SLO", "rate": "Highest request rate under the SLO"}


def recommend_capacity(cs: list[Curve], accuracy: list[Group], slo: SLO, names: dict) -> Pick:
    """Among the curves (one mode) of artifacts that meet the accuracy floor, the highest capacity."""
    title = CAPACITY_TITLES[cs[0].mode]
    out, ok = [], []
    for c in cs:
        why = floor_miss(accuracy, c.group, slo)
        best, _ = c.capacity()
        if why is None and best is None:
            lowest = c.levels[0]
            why = (f"no level meets the SLO (at {level_text(c.mode, lowest.level)}: {lowest.verdict.reason})"
                   if lowest.verdict else "not judged")
        if why:
            out.append(f"  - {names[c.group.identity]}: {why}")
        else:
            ok.append(c)
    if not ok:
        return Pick([f"- **{title}**: no artifact qualifies:"] + out, None)
    lead = max(ok, key=lambda c: (c.capacity()[0].level, c.capacity()[0].get("request_throughput") or 0))
    tied = [c for c in ok if overlap(bracket(c), bracket(lead))]
    chosen = smallest([c.group for c in tied]) if len(tied) > 1 else lead.group
    c = next(c for c in ok if c.group is chosen)
    best, above = c.capacity()
    rate = best.get("request_throughput")
    line = (f"- **{title}**: **{names[chosen.identity]}** ({size_text(chosen)}): "
            f"{level_text(c.mode, best.level)}"
            + (f", {fmt_fixed(rate)} req/s achieved" if rate is not None else "")
            + (f"; {level_text(c.mode, above.level)} did not pass" if above else "; the highest level measured"))
    lines = [line]
    if len(tied) > 1:
        others = [t for t in tied if t.group is not chosen]
        lines.append("  - within the measurement's interval (the levels measured cannot tell them apart): "
                     + "; ".join(f"{names[t.group.identity]} ({level_text(t.mode, t.capacity()[0].level)} passed, "
                                 f"{size_text(t.group)})" for t in others)
                     + ": the smaller model is preferred")
    return Pick(lines + [f"  - not eligible: {o.strip()[2:]}" for o in out], chosen)


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


def recommend_tpot(cs: list[Curve], accuracy: list[Group], slo: SLO | None, names: dict) -> Pick:
    out, ok = [], []
    for c in cs:
        if c.mode != "concurrency":
            continue
        lv = c.at(1.0)
        why = floor_miss(accuracy, c.group, slo)
        if why is None and (lv is None or tpot_interval(lv) is None):
            why = "no level at concurrency 1 with a TPOT"
        elif why is None and lv.metrics.get("valid") is False:
            why = f"its concurrency-1 level is client-bound ({lv.metrics.get('valid_reason')})"
        if why:
            out.append(f"  - not eligible: {names[c.group.identity]}: {why}")
        else:
            ok.append((c, tpot_interval(lv)))
    if not ok:
        return Pick(["- **Lowest TPOT at concurrency 1**: no artifact qualifies"
                     + (":" if out else " (no concurrency-1 level measured)")] + out, None)
    lead = min(ok, key=lambda t: t[1][0])
    tied = [t for t in ok if overlap(t[1][1:], lead[1][1:])]
    chosen = smallest([t[0].group for t in tied]) if len(tied) > 1 else lead[0].group
    mean, low, high = next(t[1] for t in ok if t[0].group is chosen)
    lines = [f"- **Lowest TPOT at concurrency 1**: **{names[chosen.identity]}** ({size_text(chosen)}): "
             f"{mean:.1f} ms per output token (95% interval {low:.1f}–{high:.1f})"]
    if len(tied) > 1:
        lines.append("  - within the measurement's interval (95% intervals of mean TPOT overlap): "
                     + "; ".join(f"{names[c.group.identity]} {iv[0]:.1f} ms ({iv[1]:.1f}–{iv[2]:.1f}, "
                                 f"{size_text(c.group)})" for c, iv in tied if c.group is not chosen)
                     + ": the smaller model is preferred")
    return Pick(lines + out, chosen)


# --- Markdown -------------------------------------------------------------------------------------------

NOTE = ("One row per load level (`python -m evaluate engine=vllm_server load=...`), metric names and rules of "
        "`vllm bench serve` (evaluate/serving/metrics.py). Level: in-flight requests (concurrency; synchronous "
        "= 1) or offered request rate (req/s). Achieved = completed requests ÷ level duration. Goodput = "
        "requests meeting every SLO bound ÷ duration (vLLM's per-request rule). SLO attainment = share of all "
        "requests sent that met every bound (failures count as misses), with its 95% Wilson interval. Verdict: "
        "the level's percentile metrics against the SLO; *unresolved* = too few requests for the percentile, "
        "or a client-bound level (*valid* = no: the client, not the server, set the pace), never a pass. "
        f"\"{MISSING}\" = not measured.")


def pcts(slo: SLO | None) -> list[str]:
    keys = ["p50", "p90", "p99"]
    return keys + ([slo.pct_key] if slo and slo.pct_key not in keys else [])


def level_table(c: Curve, slo: SLO | None) -> str:
    ps = pcts(slo)
    heads = ([LEVEL_NAMES[c.mode].capitalize(), "Achieved (req/s)"] + ["Achieved / offered"] * (c.mode == "rate")
             + [f"TTFT {p} (ms)" for p in ps] + [f"TPOT {p} (ms)" for p in ps]
             + ["Output (tok/s)", "Goodput (req/s)", "SLO attainment (%)", "Completed / failed", "Verdict", "Valid"])
    knee, (best, _) = c.knee(), c.capacity()
    rows = []
    for lv in c.levels:
        marks = [m for m, hit in (("knee", lv is knee), ("max under SLO", lv is best)) if hit]
        rows.append([f"{lv.level:g}" + (f" ({', '.join(marks)})" if marks else ""),
                     fmt_fixed(lv.get("request_throughput"), 3)]
                    + [fmt_fixed(lv.get("achieved_rate_ratio"), 2)] * (c.mode == "rate")
                    + [fmt_fixed(lv.get(f"{p}_ttft_ms"), 1) for p in ps]
                    + [fmt_fixed(lv.get(f"{p}_tpot_ms"), 1) for p in ps]
                    + [fmt_fixed(lv.get("output_throughput"), 1), fmt_fixed(lv.get("request_goodput"), 3),
                       attainment_text(lv), f"{fmt_count(lv.get('completed'))} / {fmt_count(lv.get('failed'))}",
                       verdict_text(lv.verdict), valid_text(lv)])
    return md_table(heads, rows)


def fmt_count(x: float | None) -> str:
    return MISSING if x is None else f"{x:.0f}"


def attainment_text(lv: LevelResult) -> str:
    a, low, high = (lv.get(k) for k in ("slo_attainment", "slo_attainment_low", "slo_attainment_high"))
    if a is None:
        return MISSING
    return f"{100 * a:.1f}" + (f" ({100 * low:.1f}–{100 * high:.1f})" if low is not None and high is not None else "")


def verdict_text(v: SloCheck | None) -> str:
    if v is None:
        return MISSING
    return {True: "pass", False: f"fail: {v.reason}", None: v.reason}[v.passed]


def valid_text(lv: LevelResult) -> str:
    valid = lv.metrics.get("valid")
    return MISSING if valid is None else ("yes" if valid else f"no: {lv.metrics.get('valid_reason')}")


def capacity_text(c: Curve | None) -> str:
    if c is None:
        return MISSING
    best, above = c.capacity()
    if best is None:
        return "none passes" if any(lv.verdict for lv in c.levels) else MISSING
    return f"{best.level:g}" + (f" (< {above.level:g})" if above else " (highest measured)")


def render_serving(rows: list[Row], speed: list[Group], accuracy: list[Group]) -> str:
    """The "Serving under load" and "Recommendation" sections; "" without serving rows."""
    serving = groups(rows)
    if not serving:
        return ""
    scs = scenarios(serving)
    slos = {sc: scenario_slo(rows, sc) for sc in scs}
    cs = curves(serving, slos)
    names = labels(serving)
    out = ["## Serving under load", "", NOTE]
    for sc in scs:
        slo = slos[sc]
        out += ["", f"SLO for {sc.name}: " + (slo.describe() + f" (a level needs ≥ {slo.min_requests()} "
                                               "completed requests)" if slo else "none stated (slo=none): levels "
                                               "are measured, not judged")]
        for c in [c for c in cs if c.scenario == sc]:
            mode = "" if c.mode == "concurrency" else " · rate"
            out += ["", f"### {sc.heading()} · {names[c.group.identity]}{mode}", "", level_table(c, slo)]
    out += ["", join_table(serving, cs, speed, accuracy, names, scs), "", render_recommendation(cs, accuracy, slos,
                                                                                                names, scs)]
    return "\n".join(out)


def join_table(serving: list[Group], cs: list[Curve], speed: list[Group], accuracy: list[Group], names: dict,
               scs: list[Scenario]) -> str:
    first = list({g.identity: g for g in reversed(serving)}.values())[::-1]
    speed_scs = scenarios(speed)[:3]
    heads = (["Model", "Recipe", "Artifact", "Engine", "Model size (MB)"]
             + [f"Offline {s.name} (tok/s)" for s in speed_scs]
             + ["Perplexity", "KL (nats)", "Recovery (%)"]
             + [f"{sc.name}: max {'concurrency' if m == 'concurrency' else 'req/s'} under SLO" for sc in scs
                for m in MODES if any(c.scenario == sc and c.mode == m for c in cs)])
    table = []
    for g in first:
        acc = accuracy_for(accuracy, g)
        rec = recovery_of(accuracy, g)
        cells = [g.model_name, names[g.identity].removeprefix(f"{g.model_name}/"), f"`{short(g.artifact_id)}`",
                 g.engine, fmt_fixed(mb(g.model_bytes), 1)]
        cells += [fmt_fixed(s.mean("output_throughput")) if (s := offline_speed(speed, g, sc)) else MISSING
                  for sc in speed_scs]
        cells += [fmt_number(acc.mean(k)) if acc and acc.mean(k) is not None else MISSING
                  for k in ("perplexity", "kl_divergence")] + [fmt_fixed(rec, 1)]
        for sc in scs:
            for m in MODES:
                if any(c.scenario == sc and c.mode == m for c in cs):
                    mine = next((c for c in cs if c.scenario == sc and c.mode == m and
                                 c.group.identity == g.identity), None)
                    cells.append(capacity_text(mine))
        table.append(cells)
    return ("### Capacity, speed and accuracy\n\nOffline speed: mean output throughput of the speed scenarios "
            "(in-process engine); accuracy from the artifact's accuracy row (the original is 100 % recovery by "
            "definition); capacity: the highest level that passed the scenario's SLO, and below it (<) the next "
            "level measured, which did not.\n\n" + md_table(heads, table))


def render_recommendation(cs: list[Curve], accuracy: list[Group], slos: dict, names: dict,
                          scs: list[Scenario]) -> str:
    out = ["## Recommendation"]
    for sc in scs:
        slo = slos[sc]
        here = [c for c in cs if c.scenario == sc]
        out += ["", f"### {sc.heading()}", ""]
        if slo is None:
            out.append("No SLO stated for these levels (slo=none), so no artifact can be said to sustain a load: "
                       "rerun with slo=interactive_cpu (or another conf/slo/ preset).")
            out += recommend_tpot(here, accuracy, None, names).text
            continue
        out.append(f"For the SLO {slo.describe()}:")
        out.append("")
        for mode in MODES:
            mine = [c for c in here if c.mode == mode]
            if mine:
                out += recommend_capacity(mine, accuracy, slo, names).text
        out += recommend_tpot(here, accuracy, slo, names).text
    return "\n".join(out)
