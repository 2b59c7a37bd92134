"""report.md: the answer (answer_markdown), then summary, ranking, speed in
detail, detailed runs, problems, accuracy, lm-eval, serving, recipe search
and layer sensitivity sections (search_markdown), then the method and setups, each rendered from the analysed store. Headers
name metrics in words with their units (formatting.LABELS)."""
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from evaluate.analysis import Analysis
from evaluate.analysis.busy_host import BusyHost
from evaluate.analysis.suspect import Suspect
from evaluate.analysis.groups import (
    BASELINE, CV_MAX, Group, accuracy_of, by_model, headline_accuracy_keys, lm_baseline, lm_recovery,
    numeric_metrics, scenario_of, scenarios, stderr_key)
from evaluate.analysis.accuracy_bounds import recovery
from evaluate.analysis.cost import Prices
from evaluate.analysis.ranking import Overall, OverallRanking, ScenarioRanking
from evaluate.analysis.significance import RULE
from evaluate.report.formatting import (
    MISSING, fmt_fixed, fmt_number, header, inline_json, interval_text, label, mb, md_table, ordered_metrics, short,
    speedup_text)
from evaluate.report.accuracy_markdown import RECOVERY_HEADER, by_recipe, recovery_cell, render_accuracy
from evaluate.report.answer_markdown import SPEEDUP_HEADER, render_answer, speedup_cell
from evaluate.report.conditions_markdown import busy_cell
from evaluate.report.cost_markdown import COST_HEADER, cost_cell
from evaluate.report.labels import dtype_note, dtypes_text, in_table, labels, run_labels
from evaluate.report import memory_figures as memory
from evaluate.report.plots import RANKING, SUMMARY, Plot, figure_markdown, png_plots
from evaluate.report.search_files import sensitivities, studies
from evaluate.report.search_markdown import render_search, render_sensitivity
from evaluate.report.search_plots import png_files
from evaluate.report.serving_markdown import render_serving
from evaluate.report.stores_markdown import (
    hardware_lines, place_names, render_across_stores, setup_hardware_text, shared_rows_lines)
from evaluate.report.config import OutputFormat, ReportConfig
from evaluate.results import Refused, Row, standing
from quantize.common.machine import half_text
from quantize.common.provenance import setup_versions

SPEED = "output_throughput"
SUSPECT_TITLE = "Suspect artifacts (not ranked)"
REFUSED_TITLE = "Rejected rows"
# The summary: at most 10 columns (with a Model column where there are several
# models); every other metric is in "Speed in detail", the runs and the CSVs.
SUMMARY_LATENCY = ("ttft_ms_p50", "tpot_ms_p50")
# "Speed in detail": per artifact, mean ± std (decimals)
DETAIL_STATS = (("total_token_throughput", 2), ("input_throughput", 2), ("latency_s", 3))
RUN_METRICS = (  # per run: metric, decimals
    ("latency_s", 3), ("output_throughput", 2), ("total_token_throughput", 2), ("input_throughput", 2),
    ("ttft_ms_p50", 2), ("tpot_ms_p50", 2), ("itl_ms_p50", 2), ("peak_memory_mb", 1), ("weight_bandwidth_gb_s", 2))
GPU_RUN_METRIC = ("peak_gpu_memory_mb", 1)  # per run, where some run measured it
OTHER_CPU_HEADER = "Other processes' CPU (% of host)"


@dataclass
class Markdown(OutputFormat):
    """report.md."""

    def render(self, analysis: Analysis, report: ReportConfig) -> dict[str, str]:
        return {"report.md": render_markdown(analysis, report, png_plots(analysis, report))}

    def draw(self, analysis: Analysis, report: ReportConfig) -> list[Path]:
        """The figures report.md shows beside it: each study's front, each sensitivity heat map."""
        return png_files(studies(analysis.results_dirs, analysis.suspect_ids), sensitivities(analysis.results_dirs),
                         report.accuracy_floor_pct, report.out_dir)


def render_markdown(analysis: Analysis, report: ReportConfig, plots: list[Plot] = ()) -> str:
    """report.md: the answer first, then the tables, then how they were measured;
    each of `plots` (plots.Plot) below the table it illustrates."""
    speed, accuracy = analysis.speed, analysis.accuracy
    searches = studies(analysis.results_dirs, analysis.suspect_ids)
    parts = [render_title(analysis.rows, report.title, analysis.results_dir, report.generated),
             render_answer(analysis, report.accuracy_floor_pct, searches, report.cost),
             render_across_stores(speed), render_suspects(analysis.suspects),
             render_refused(analysis.refused, analysis.set_aside), render_summary(speed, accuracy, plots, report.cost),
             render_ranking(analysis, plots), render_speed_detail(speed), render_details(speed, analysis.busy_host),
             render_problems(analysis.rows)]
    if accuracy:
        parts.append(render_accuracy(accuracy))
    if analysis.lm_eval:
        parts.append(render_lm_eval(analysis.lm_eval))
    parts += [render_serving(analysis.serving, speed, accuracy, plots), render_search(searches),
              render_sensitivity(sensitivities(analysis.results_dirs)),
              render_method(analysis.rows, analysis.busy_host)]
    return "\n\n".join(p for p in parts if p) + "\n"


def render_suspects(suspects: list[Suspect]) -> str:
    """Artifacts whose accuracy says they are broken: named with why, ranked nowhere."""
    if not suspects:
        return ""
    out = [f"## {SUSPECT_TITLE}", "", "Their accuracy says they are no longer their base model (rules and "
           "thresholds: conf/sanity/default.yaml): kept out of every table, ranking, Pareto front and "
           "recommendation below. Inspect the artifact and its recipe.", ""]
    for s in suspects:
        measured = ", ".join(f"{label} {fmt}" for label, fmt in (
            ("top-1 agreement", None if s.top1_agreement is None else f"{s.top1_agreement:.3f}"),
            ("recovery", None if s.recovery_pct is None else f"{s.recovery_pct:.1f} %")) if fmt)
        out.append(f"- **{s.recipe}** ({s.model_name}, artifact `{s.artifact_id}`, {s.family}"
                   f"{'; ' + measured if measured else ''}): {'; '.join(s.reasons)}")
    return "\n".join(out)


def render_refused(refused: list[Refused], set_aside: list[Path]) -> str:
    """The store's lines that no table counts (results.read_store), each by
    file and line number with why, and the torn tails appends moved aside."""
    if not refused and not set_aside:
        return ""
    rows = sum(r.row is not None for r in refused)
    out = [f"## {REFUSED_TITLE}", "", f"{rows} row(s) whose values cannot be true and {len(refused) - rows} "
           "line(s) that are not rows: left out of every table, ranking and answer below (and owed again: "
           "`python -m evaluate` measures their runs anew). Fix or delete the lines."]
    if refused:
        table = [[f"`{r.path}`", str(r.line), refused_what(r.row), r.why] for r in refused]
        out += ["", md_table(["File", "Line", "Row", "Why left out"], table)]
    out += ["", *(f"- A torn last line, moved aside before an append: `{p}`" for p in set_aside)] if set_aside else []
    return "\n".join(out)


def refused_what(row: Row | None) -> str:
    if row is None:
        return MISSING
    scenario = scenario_of(row).heading() if row.scenario else MISSING
    return f"{row.status} {row.kind}, {row.recipe or '?'} `{short(row.artifact_id)}`, {scenario}"


def mean_pm_std(g: Group, metric: str, digits: int | None = None) -> str:
    """`mean ± std` with `digits` decimals, or four significant digits when
    None; just the mean for a single run; MISSING when never measured."""
    def fmt(x):
        return fmt_number(x) if digits is None else fmt_fixed(x, digits)
    mean, std = g.mean(metric), g.std(metric)
    return fmt(mean) if std is None else f"{fmt(mean)} ± {fmt(std)}"


def ci_cell(g: Group, metric: str, digits: int) -> str:
    """The 95% interval of the mean as `low–high`; MISSING with one run."""
    ci = g.interval(metric)
    return MISSING if ci is None else f"{fmt_fixed(ci[0], digits)}–{fmt_fixed(ci[1], digits)}"


def runs_cell(g: Group) -> str:
    """The run count, with how runs=auto ended where it decided it."""
    p = g.precision or {}
    if p.get("rule") != "auto":
        return str(len(g.runs))
    ended = {"target met": "target met", "max_runs reached": "cap reached"}.get(p.get("stopped"), "interrupted")
    return f"{len(g.runs)} (auto: {ended})"


def decision_text(p: dict | None) -> str:
    """A run's Row.precision in words: how its scenario's run count stood after it."""
    parts = [auto_text(p)] if p and p.get("rule") == "auto" else []
    if p and p.get("warmup_runs") is not None:
        parts.append(f"{p['warmup_runs']} warm-up runs (auto)")
    return "; ".join(parts) or "fixed"


def auto_text(p: dict) -> str:
    ci, target = p.get("achieved_ci_pct"), p.get("target_ci_pct")
    width = f"±{ci:.1f} %" if isinstance(ci, (int, float)) else MISSING
    goal = f"{target:g} %" if isinstance(target, (int, float)) else MISSING
    if p.get("stopped") == "target met":
        return f"auto: target met ({width} ≤ {goal})"
    if p.get("stopped") == "max_runs reached":
        return f"auto: cap reached at max_runs={p.get('max_runs')} ({width} > {goal})"
    return f"auto: {width}, target {goal}: continued"


def distinct(rows: list[Row], attr: str) -> list:
    """The distinct non-empty values of a dict field, in order of first appearance."""
    seen = {json.dumps(getattr(r, attr), sort_keys=True, default=str): getattr(r, attr)
            for r in rows if getattr(r, attr)}
    return list(seen.values())


NOTES = (
    "Notes: values are mean ± sample std over the timed runs (warm-up excluded); "
    "TTFT/TPOT percentiles are per-run values averaged over runs; speed-up is mean output "
    "throughput / that of the `original` artifact of the same model, engine, setup as configured and "
    "scenario (under `dtype: auto` each artifact runs in the dtype the engine chose for it on this machine, "
    "and a speed-up between two dtypes names both: \"float32 → bfloat16\"); "
    "input (prefill) throughput is the measured `input_throughput`, or batch_size × input_len / "
    "mean TTFT where a row lacks it; \"—\" means not measured (never 0); model size is weight "
    "bytes on disk / 10^6.\n\n"
    f"One rule decides faster, slower or no significant difference everywhere in this report (the Summary's "
    f"speed-ups, the Ranking's letters, the plots' letters, the answer's runner-up, *Across stores*): {RULE}. "
    "A speed-up's interval is that rule's interval against the original; the overall ranking averages the same "
    "log ratios over its scenarios (the geometric mean) and compares two recipes on the difference of their "
    "averages, in which a shared original cancels. A speed-up is flagged (⚠) when either side's runs vary by more "
    f"than {CV_MAX:.0%} (coefficient of variation: more than independent runs of a steady host would) or when "
    "either side has a single run; flagged values are ranked and averaged all the same, with their wide "
    "intervals, but a single run cannot be tested and is listed apart. Intervals of a mean are Student-t, from "
    "two runs up; `Runs (n)` says how `runs=auto` ended (target met, or cap reached at max_runs).\n\n"
    "Peak host memory is the engine's resident memory in host RAM, not the harness's (the highest sample, every "
    "50 ms, of a timed run): for an engine in the evaluate process (transformers), what that process grew by "
    "since just before the engine started, its libraries' code left out (the weights, the KV cache and "
    "activations); for an engine in processes of its own (vLLM's engine core and workers, a server), their whole "
    "resident memory, runtime included. So an artifact's figure does not depend on what the process measured "
    "before it. vLLM-CPU allocates its whole KV cache up front (`VLLM_CPU_KVCACHE_SPACE` GiB, shown per row as "
    "*KV cache, in peak host memory*), so peak host memory barely changes with batch size; model size is the "
    "weights alone. GPU memory is never in it: where a run used a GPU, *GPU weights*, *GPU KV cache* (as the "
    "engine reported them) and *GPU in use, whole device* (NVML) are columns of their own.")


def busy_host_note(busy: BusyHost) -> str:
    """How a run is judged busy, with the threshold this report used."""
    return ("A run is marked ⚠ busy host where other processes took more than "
            f"{busy.threshold_pct:g} % of the host's CPU time while it ran (`busy_host_pct=`; the host's busy CPU "
            "time from /proc/stat, steal included, minus that of the evaluate process and its children, over "
            "cores × the run's wall time: each row's `host_load`, with the 1-minute load average at its start "
            "and end). Intervals capture the noise within one sweep only; a busy host shifts every run of it. "
            "Beside the answer, the runs of its picks, their originals and runners-up that were busy are "
            "counted, and where `runs=auto` decided the run count, which of them met its target interval.")


def render_title(rows: list[Row], title: str, results_dir: Path, generated: datetime) -> str:
    """The title, when the report was made (ReportConfig.generated: one time for
    all its files) and what it is of: its stores, models and machines."""
    stamps = sorted(r.timestamp for r in rows if r.timestamp)
    lines = [f"# {title}", "",
             f"- Generated: {generated.isoformat(timespec='seconds')}",
             "- Results: " + ", ".join(f"{sum(r.store == s for r in rows)} rows in `{s.path if s else results_dir}`"
                                       for s in dict.fromkeys(r.store for r in rows))
             + (f", measured {stamps[0]} … {stamps[-1]}" if stamps else ""),
             f"- Models: {', '.join(sorted({r.model_name or '?' for r in rows}))}"]
    return "\n".join(lines + hardware_lines(rows) + shared_rows_lines(rows))


def render_method(rows: list[Row], busy: BusyHost | None = None) -> str:
    """The last section: what the engines decided from, the versions, the
    setups, and how every number above was computed."""
    lines = ["## Method and setups", ""]
    # once per text: machines can differ in facts the line leaves out (driver, GPU memory)
    lines += [f"- Capabilities: {text}" for text in dict.fromkeys(map(capability_text, distinct(rows, "machine")))]
    lines += defaults_lines(rows)
    lines.append(f"- Versions: {versions_text(rows)}")
    lines.append("- Setups (engine, args and environment as recorded; rows of different setups are never averaged; "
                 "speed-ups are computed where only what `dtype: auto` chose differs):")
    lines += setup_lines(rows)
    return "\n".join(lines + ["", NOTES, "", busy_host_note(busy or BusyHost.from_config())])


def defaults_lines(rows: list[Row]) -> list[str]:
    """The hardware profiles the rows' jobs took their defaults from (none for
    rows written before profiles were recorded)."""
    profiles = sorted({r.hardware_defaults for r in rows if r.hardware_defaults})
    if not profiles:
        return []
    return [f"- Defaults: {', '.join(f'`hardware={p}`' for p in profiles)} (conf/hardware/; "
            "command-line choices override them)"]


def setup_lines(rows: list[Row]) -> list[str]:
    """One line per (setup, engine, args, env, versions, hardware) with the
    recipes measured in it: the versions and hardware its id hashes, so each
    setup id is tied to its machine. A row that never reached an engine
    (skipped, failed) records the args as configured, not as the engine
    resolved them, so a setup that measured anything is shown from its
    measured rows only."""
    measured = {r.setup_id for r in rows if r.ok}
    combos: dict[tuple, set] = {}
    for r in rows:
        if r.setup_id in measured and not r.ok:
            continue
        key = (r.setup_id or MISSING, r.engine or "?", inline_json(r.engine_args), inline_json(r.engine_env),
               setup_machine_text(r))
        combos.setdefault(key, set()).add(r.recipe or "?")
    return [f"  - `{setup}` {engine}: args {args}, env {env}{machine} (recipes: {', '.join(sorted(recipes))})"
            for (setup, engine, args, env, machine), recipes in sorted(combos.items())]


def setup_machine_text(row: Row) -> str:
    """`, versions …, on <hardware>`: what the row's setup id hashes beside
    its engine; nothing for what the row did not record."""
    versions = setup_versions(row.versions)
    return ((f", versions `{', '.join(f'{k} {v}' for k, v in sorted(versions.items()))}`" if versions else "")
            + (f", on {setup_hardware_text(row.hardware)}" if row.hardware else ""))


def capability_text(facts: dict) -> str:
    """The facts the engine decided from (see `python -m evaluate.capabilities`)."""
    parts = [half_text(bool(facts.get("cpu_native_half")), facts.get("cpu_native_fp16"))]
    if facts.get("cuda"):
        parts.insert(0, "CUDA " + ", ".join(f"sm{a}{b}" for a, b in facts["cuda"]))
    if facts.get("vllm_library"):
        parts.append(f"vLLM kernel library {facts['vllm_library']} with "
                     + (", ".join(facts.get("vllm_ops") or []) or "no int8/int4 ops"))
    return "; ".join(parts)


def versions_text(rows: list[Row]) -> str:
    seen: dict[str, set] = {}
    for v in distinct(rows, "versions"):
        for pkg, ver in v.items():
            seen.setdefault(pkg, set()).add(str(ver))
    return ", ".join(f"{pkg} {' / '.join(sorted(vs))}" for pkg, vs in sorted(seen.items())) or MISSING


def render_summary(speed: list[Group], accuracy: list[Group], plots: list[Plot] = (), prices: Prices = Prices()) -> str:
    """Per scenario, the headline of each artifact in at most 10 columns (11 with a price: the
    cost per 1M output tokens), its plots below."""
    names = labels(speed)
    several = len({g.model_name for g in speed}) > 1
    with_recovery = "recovery_pct" in headline_accuracy_keys(accuracy)
    memory_heads = memory.summary_heads(speed)
    heads = (["Model"] * several + ["Recipe", "Artifact", "Model size (MB)", header(SPEED), SPEEDUP_HEADER]
             + [header(k) for k in SUMMARY_LATENCY] + memory_heads + [RECOVERY_HEADER] * with_recovery
             + [COST_HEADER] * prices.any)
    out = ["## Summary"]
    for sc in scenarios(speed):
        rows = [[g.model_name] * several
                + summary_row(g, names, accuracy_of(accuracy, g), with_recovery, memory_heads)
                + [cost_cell(prices, g)] * prices.any for g in by_model([g for g in speed if g.scenario == sc])]
        out += ["", f"### {sc.heading()}", "", md_table(heads, rows)] + figure_markdown(plots, (SUMMARY, sc))
    if not speed:
        out += ["", "No successful speed runs."]
    elif with_recovery:
        out += ["", "Accuracy recovery comes from the artifact's accuracy run in the same setup, with its 95% interval "
                "over the windows (what it is: *Accuracy*); — means no such run (a run of another setup is never "
                "borrowed), and an original without one is 100 % by definition. The other accuracy metrics are "
                "under *Accuracy*, every speed metric under *Speed in detail* and in summary.csv."]
    gpu_note = memory.gpu_note(speed)
    out += ["", gpu_note] if gpu_note else []
    return "\n".join(out + figure_markdown(plots, (SUMMARY, None)))


def summary_row(g: Group, names: dict, accuracy: Group | None, with_recovery: bool,
                memory_heads: list[str] = (memory.HOST_HEADER,)) -> list[str]:
    cells = ([in_table(names, g), f"`{short(g.artifact_id)}`", fmt_fixed(mb(g.model_bytes), 1),
              mean_pm_std(g, SPEED, 2), speedup_cell(g)]
             + [fmt_fixed(g.mean(k), 2) for k in SUMMARY_LATENCY] + memory.cells(g, list(memory_heads)))
    if with_recovery:
        cells.append(recovery_cell(recovery(accuracy, g)))   # as the answer: an original without a row is 100 %
    return cells


def render_speed_detail(speed: list[Group]) -> str:
    """Per scenario and artifact, what the summary leaves out: the run count,
    the interval of the mean output throughput, the other throughputs, latency
    and the memory the Summary leaves out (memory_figures.detail_heads)."""
    names = labels(speed)
    memory_heads = memory.detail_heads(speed)
    heads = (["Model", "Recipe", "Artifact", "Format", "Engine", "Runs (n)", f"{label(SPEED)} 95% CI (tok/s)"]
             + [header(k) for k, _ in DETAIL_STATS] + memory_heads)
    out = ["## Speed in detail"]
    for sc in scenarios(speed):
        rows = [[g.model_name, in_table(names, g), f"`{short(g.artifact_id)}`", g.quant_format or MISSING, g.engine,
                 runs_cell(g), ci_cell(g, SPEED, 2)] + [mean_pm_std(g, k, d) for k, d in DETAIL_STATS]
                + memory.cells(g, memory_heads)
                for g in by_model([g for g in speed if g.scenario == sc])]
        out += ["", f"### {sc.heading()}", "", md_table(heads, rows)]
    return "\n".join(out) if speed else ""


def render_ranking(analysis: Analysis, plots: list[Plot] = ()) -> str:
    """Per scenario, then overall: each entry's letters of the significance rule; below a
    scenario's last block, its plots."""
    speed = analysis.speed
    out = ["## Ranking", "", "Per scenario by mean output throughput (tok/s), overall by the geometric mean of the "
           "speed-ups; per model and store. Entries that share a letter do not differ by the rule in *Method and "
           "setups*; entries with no letter in common do. ⚠ marks a flagged measurement (ranked all the same); "
           "one with a single run cannot be tested and is listed apart."]
    names = labels(speed)
    several = block_names(speed)
    for k, ranking in enumerate(analysis.rankings):
        out += ["", f"**{ranking.scenario.heading()}**{several(ranking.model_name, ranking.store, ranking.machine)}",
                ""]
        out += ranking_lines(ranking, names)
        following = analysis.rankings[k + 1:k + 2]
        if not following or following[0].scenario != ranking.scenario:
            out += figure_markdown(plots, (RANKING, ranking.scenario))
    for overall in analysis.overall:
        out += ["", f"**Overall**{several(overall.model_name, overall.store, overall.machine)}: geometric mean of the speed-ups vs "
                f"original over {', '.join(s.name for s in overall.scenarios)} (every scenario with a speed-up "
                "here, flagged ones included), with its 95% interval:", ""]
        out += overall_lines(overall, names)
    if not analysis.overall:
        out += ["", "**Overall**: no recipe has a speed-up vs an `original` baseline."]
    return "\n".join(out)


def block_names(groups: list[Group]):
    """What names a ranking's model, store and machine, where there are several of any."""
    models = len({g.model_name for g in groups}) > 1
    where = place_names(groups)

    def name(model: str, store, machine) -> str:
        return (f" — {model}" if models else "") + "".join(f" — {part}" for part in where(store, machine))
    return name


def ranking_lines(ranking: ScenarioRanking, names: dict) -> list[str]:
    """Numbered fastest first with their letters, then those that cannot be tested."""
    lines = [f"{place}. [{r.letters}] {ranking_entry(r.group, names)}" for place, r in enumerate(ranking.ranked, 1)]
    return lines + [f"- not ranked: {ranking_entry(g, names)}: a single run cannot be tested" for g in ranking.untested]


def ranking_entry(g: Group, names: dict) -> str:
    notes = [n for n in (dtype_note(g, names), g.flag and f"⚠ {g.flag}") if n]
    return (f"{names[g.identity]} — {fmt_fixed(g.mean(SPEED))} tok/s"
            f" ({speedup_text(g.speedup)} vs original{''.join('; ' + n for n in notes)})")


def overall_lines(overall: OverallRanking, names: dict) -> list[str]:
    """Numbered best first with their letters; then those without an interval, and those left out."""
    lines = [f"{place}. [{o.letters}] {overall_entry(o, names)}" for place, o in enumerate(overall.ranked, 1)]
    lines += [f"- not ranked: {overall_entry(o, names)}: no interval, a scenario has a single run"
              for o in overall.untested]
    lines += [f"- not in the overall: {names[i.identity]}, no speed-up in {', '.join(s.name for s in i.lack)}"
              for i in overall.incomplete]
    return lines


def overall_entry(o: Overall, names: dict) -> str:
    ci = f" (95% interval {interval_text(o.interval)})" if o.testable else ""
    dtypes = "".join(f"; {dtypes_text('original', base, names[o.identity], ours)}" for base, ours in o.dtype_pairs)
    flagged = f"; ⚠ flagged in {', '.join(g.scenario.name for g in o.flagged)}" if o.flagged else ""
    return f"{names[o.identity]} — {speedup_text(o.speedup)}{ci}{dtypes}{flagged}"


def run_metrics(row: Row) -> dict[str, float]:
    m = numeric_metrics(row)
    for key in (memory.HOST, memory.GPU_IN_USE):
        if key in m:
            m[key.replace("_bytes", "_mb")] = m[key] / 1e6
    return m


def run_metric_columns(gpu: bool) -> tuple:
    """RUN_METRICS, with the whole GPU's memory in use after peak host memory where a run measured it."""
    if not gpu:
        return RUN_METRICS
    at = [k for k, _ in RUN_METRICS].index("peak_memory_mb") + 1
    return RUN_METRICS[:at] + (GPU_RUN_METRIC,) + RUN_METRICS[at:]


def render_details(speed: list[Group], busy: BusyHost) -> str:
    out = ["## Detailed runs"]
    names = labels(speed)
    runs = [r for g in speed for r in g.runs]
    decided = any(r.precision for r in runs)  # a column only where some run recorded it
    loaded = busy.recorded(runs)
    metrics = run_metric_columns(any(memory.GPU_IN_USE in r.metrics for r in runs))
    heads = (["Run", "Model", "Recipe", "Artifact", "Engine"] + [header(k) for k, _ in metrics]
             + ["Run count decision"] * decided + [OTHER_CPU_HEADER] * loaded + ["Timestamp (UTC)"])
    for sc in scenarios(speed):
        rows = []
        for g in by_model([g for g in speed if g.scenario == sc]):
            for run_label, run in zip(run_labels(g.runs), g.runs):
                m = run_metrics(run)
                rows.append([run_label, g.model_name, in_table(names, g), f"`{short(g.artifact_id)}`", g.engine]
                            + [fmt_fixed(m.get(k), d) for k, d in metrics]
                            + [decision_text(run.precision)] * decided + [busy_cell(run, busy)] * loaded
                            + [run.timestamp or MISSING])
        out += ["", f"### {sc.heading()}", "", md_table(heads, rows)]
    if not speed:
        out += ["", "No successful speed runs."]
    return "\n".join(out)


def render_problems(rows: list[Row]) -> str:
    """The rows of runs that have no ok row: one a rerun measured is counted above (results.standing)."""
    runs = standing(rows)
    bad = [r for r in rows if not r.ok and not runs[r.run_key()].ok]
    since = sum(not r.ok for r in rows) - len(bad)
    rerun = (f"\n\nNot listed: {since} row(s) of runs a rerun measured (their ok rows are counted above)."
             if since else "")
    if not bad:
        none = "every run that failed was measured by a rerun" if since else "every recorded run succeeded"
        return f"## Skipped, unsupported and failed\n\nNone: {none}." + rerun
    table = [[r.status or "missing", r.kind, scenario_of(r).heading() if r.scenario else MISSING,
              r.model_name or "?", r.recipe or "?", f"`{short(r.artifact_id)}`", r.engine or "?",
              str(r.run_index + 1) if isinstance(r.run_index, int) else MISSING,
              r.reason or "(no reason recorded)", r.timestamp or MISSING] for r in bad]
    heads = ["Status", "Kind", "Scenario", "Model", "Recipe", "Artifact", "Engine", "Run", "Reason", "Timestamp (UTC)"]
    return ("## Skipped, unsupported and failed\n\nExcluded from every aggregate above. `unsupported`: the "
            "engine has no kernel for this format on this machine (`python -m evaluate.capabilities`).\n\n"
            + md_table(heads, table) + rerun)


def render_lm_eval(lm: list[Group]) -> str:
    out = ["## lm-eval tasks", "",
           "lm-evaluation-harness, vLLM backend (`lm_eval=<preset>`). ± is lm-eval's standard error; "
           f"recovery is against `{BASELINE}`, oriented so that 100 % means no loss."]
    names = labels(lm)
    for sc in scenarios(lm):
        groups = by_recipe([g for g in lm if g.scenario == sc])
        keys = [k for k in ordered_metrics({k for g in groups for k in g.stats}) if "_stderr" not in k]
        rows = [[g.model_name, in_table(names, g), f"`{short(g.artifact_id)}`", fmt_fixed(mb(g.model_bytes), 1)]
                + [lm_eval_cell(g, k) for k in keys]
                + [fmt_fixed(lm_recovery(g, lm_baseline(groups, g), k), 1) for k in keys[:1]]
                for g in groups]
        heads = (["Model", "Recipe", "Artifact", "Model size (MB)"] + [header(k) for k in keys]
                 + [f"{label(k)} recovery (%)" for k in keys[:1]])
        out += ["", f"### {sc.heading()}", "", md_table(heads, rows)]
    return "\n".join(out)


def lm_eval_cell(g: Group, metric: str) -> str:
    """The metric ± lm-eval's own standard error, when it reported one."""
    stderr = g.mean(stderr_key(metric))
    return fmt_number(g.mean(metric)) + (f" ± {fmt_number(stderr)}" if stderr else "")
