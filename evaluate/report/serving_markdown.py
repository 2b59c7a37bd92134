"""report.md's "Serving under load" section (the serving analysis,
evaluate.analysis.load_levels) and the lines of the serving recommendation
(evaluate.analysis.recommendation), which open the report in "What to use
on this machine" (answer_markdown), as Markdown."""
from evaluate.analysis.cost import Prices
from evaluate.analysis.groups import Group, scenarios
from evaluate.analysis.load_levels import (
    MODES, Curve, LevelResult, ServingAnalysis, accuracy_for, level_text, offline_speed, recovery_of)
from evaluate.analysis.recommendation import CapacityPick, Recommendation, TpotPick
from evaluate.report.cost_markdown import level_cost_text
from evaluate.report.formatting import MISSING, fmt_fixed, fmt_number, mb, md_table, short
from evaluate.report.labels import labels
from evaluate.report.plots import SERVING, Plot, figure_markdown
from evaluate.report.stores_markdown import place_names
from evaluate.scenarios import Scenario
from evaluate.serving.slo import SLO, SloCheck

LEVEL_NAMES = {"concurrency": "concurrency", "rate": "request rate (req/s)"}
CAPACITY_TITLES = {"concurrency": "Most load under the SLO", "rate": "Highest request rate under the SLO"}

NOTE = ("One row per load level (`python -m evaluate engine=vllm_server load=...`), metric names and rules of "
        "`vllm bench serve` (evaluate/serving/metrics.py). Level: in-flight requests (concurrency; synchronous "
        "= 1) or offered request rate (req/s). Achieved = completed requests ÷ level duration. Goodput = "
        "requests meeting every SLO bound ÷ duration (vLLM's per-request rule). SLO attainment = share of all "
        "requests sent that met every bound (failures count as misses), with its 95% Wilson interval. Verdict: "
        "the level's percentile metrics against the SLO; *unresolved* = too few requests for the percentile, "
        "or a level that is not valid (*valid* = no, with its reason: the client, not the server, set the pace, "
        "or the server generated other output lengths than asked), never a pass. "
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


def render_serving(analysis: ServingAnalysis | None, speed: list[Group], accuracy: list[Group],
                   plots: list[Plot] = ()) -> str:
    """The "Serving under load" section, each scenario's plots below its tables; "" without serving rows."""
    if analysis is None:
        return ""
    cs, scs = analysis.curves, analysis.scenarios
    names = labels(analysis.groups)
    out = ["## Serving under load", "", NOTE]
    for sc in scs:
        slo = analysis.slos[sc]
        out += ["", f"SLO for {sc.name}: " + (slo.describe() + f" (a level needs ≥ {slo.min_requests()} "
                                               "requests sent)" if slo else "none stated (slo=none): levels "
                                               "are measured, not judged")]
        for c in [c for c in cs if c.scenario == sc]:
            mode = "" if c.mode == "concurrency" else " · rate"
            out += ["", f"### {sc.heading()} · {names[c.group.identity]}{mode}", "", level_table(c, slo)]
        out += figure_markdown(plots, (SERVING, sc))
    out += ["", join_table(analysis.groups, cs, speed, accuracy, names, scs)]
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


def recommendation_lines(recommendations: list[Recommendation], groups: list[Group], names: dict,
                         prices: Prices = Prices()) -> list[str]:
    """The serving recommendation, per scenario (report.md opens with it, in "What to use on this
    machine"), each named by its model, store and machine where `groups` (the serving groups) have several."""
    out = []
    models = len({r.model_name for r in recommendations}) > 1
    place = place_names(groups)
    for r in recommendations:
        where = [r.model_name] * models + place(r.store, r.machine)
        out += ["", f"**{r.scenario.heading()}**" + (f" ({', '.join(where)})" if where else ""), ""]
        if r.slo is None:
            out.append("No SLO stated for these levels (slo=none), so no artifact can be said to sustain a load: "
                       "rerun with slo=interactive_cpu (or another conf/slo/ preset).")
        else:
            out += [f"For the SLO {r.slo.describe()}:", ""]
            for pick in r.capacity:
                out += capacity_lines(pick, names, prices)
        out += tpot_lines(r.tpot, names)
    return out


def size_text(g: Group) -> str:
    return f"{fmt_fixed(mb(g.model_bytes), 1)} MB" if g.model_bytes else "size unknown"


def capacity_lines(pick: CapacityPick, names: dict, prices: Prices = Prices()) -> list[str]:
    """The pick, the level it sustains and what a million output tokens cost there; ties; who is not eligible."""
    title = CAPACITY_TITLES[pick.mode]
    why = [f"{names[i.group.identity]}: {i.why}" for i in pick.ineligible]
    if pick.chosen is None:
        return [f"- **{title}**: no artifact qualifies:"] + [f"  - {w}" for w in why]
    c, chosen = pick.chosen, pick.chosen.group
    best, above = c.capacity()
    rate = best.get("request_throughput")
    lines = [f"- **{title}**: **{names[chosen.identity]}** ({size_text(chosen)}): "
             f"{level_text(c.mode, best.level)}"
             + (f", {fmt_fixed(rate)} req/s achieved" if rate is not None else "")
             + level_cost_text(prices, best.row, best.get("output_throughput"))
             + (f"; {level_text(c.mode, above.level)} did not pass" if above else "; the highest level measured")]
    if pick.tied:
        lines.append("  - within the measurement's interval (the levels measured cannot tell them apart): "
                     + "; ".join(f"{names[t.group.identity]} ({level_text(t.mode, t.capacity()[0].level)} passed, "
                                 f"{size_text(t.group)})" for t in pick.tied)
                     + ": the smaller model is preferred")
    return lines + [f"  - not eligible: {w}" for w in why]


def tpot_lines(pick: TpotPick, names: dict) -> list[str]:
    title = "Lowest TPOT at concurrency 1"
    why = [f"  - not eligible: {names[i.group.identity]}: {i.why}" for i in pick.ineligible]
    if pick.chosen is None:
        return [f"- **{title}**: no artifact qualifies" + (":" if why else " (no concurrency-1 level measured)")] + why
    mean, low, high = pick.interval
    lines = [f"- **{title}**: **{names[pick.chosen.identity]}** ({size_text(pick.chosen)}): "
             f"{mean:.1f} ms per output token (95% interval {low:.1f}–{high:.1f})"]
    if pick.tied:
        lines.append("  - no significant difference in mean TPOT (the rule in *Method and setups*): "
                     + "; ".join(f"{names[g.identity]} {iv[0]:.1f} ms ({iv[1]:.1f}–{iv[2]:.1f}, "
                                 f"{size_text(g)})" for g, iv in pick.tied)
                     + ": the smaller model is preferred")
    return lines + why
