"""`python -m evaluate.report [--results-dir results/] [--out-dir reports/]`

Results store -> `report.md`, `summary.csv`, `runs.csv` and PNG plots.

Aggregation (grouping, mean ± std, speed-up, ranking) is plain functions over
row dicts; rendering (Markdown, CSV, matplotlib) only formats what they return,
so each half can be tested on its own. Only rows with status "ok" enter
aggregates; the others are listed with their reason. A metric that was not
measured prints as "—", never as 0.
"""
import argparse
import csv
import io
import json
import math
import os
import statistics
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from evaluate import results
from evaluate.metrics import t95
from quantize.common.atomic import write_text
from quantize.common.errors import UserError
from quantize.common.paths import resolve

MISSING = "—"
BASELINE = "original"
ACCURACY_HEADLINE = ("recovery_pct", "perplexity", "kl_divergence", "top1_agreement")
# Metrics shown first in tables and CSVs, in this order; any other numeric key follows.
METRIC_ORDER = (
    "output_throughput", "total_token_throughput", "input_throughput", "latency_s",
    "ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99",
    "tpot_ms_mean", "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99",
    "itl_ms_mean", "itl_ms_p50", "itl_ms_p90", "itl_ms_p99",
    "peak_memory_bytes", "weight_bandwidth_gb_s",
)
# A speed-up is flagged, not ranked, when the runs of either side vary more than
# this (coefficient of variation of output throughput) or its 95% interval holds 1.0.
CV_MAX = 0.15
# Units by metric name, most specific first; a name none of them matches is
# shown without a unit rather than with a made-up one.
UNITS = (("perplexity", "ppl"), ("kl_divergence", "nats"), ("_pct", "%"), ("accuracy", "fraction"),
         ("agreement", "fraction"), ("request_throughput", "req/s"), ("_gb_s", "GB/s"), ("_ms", "ms"),
         ("_bytes", "bytes"), ("throughput", "tok/s"), ("tokens", "tokens"), ("top_k", "tokens"),
         ("windows", "count"), ("items", "count"), ("num_", "count"))


# ---------------------------------------------------------------- aggregation

@dataclass(frozen=True)
class Scenario:
    name: str
    batch_size: int | None = None
    input_len: int | None = None
    output_len: int | None = None

    def heading(self) -> str:
        shape = [f"{k}={v}" for k, v in (("batch_size", self.batch_size), ("input_len", self.input_len),
                                          ("output_len", self.output_len)) if v is not None]
        return f"{self.name} ({', '.join(shape)})" if shape else self.name

    def tick(self) -> str:
        """Two short lines for a plot axis."""
        if self.batch_size is None:
            return self.name
        return f"{self.name}\nbs={self.batch_size} {self.input_len}→{self.output_len}"


@dataclass
class Group:
    """All ok rows of one (scenario, recipe, artifact, engine, setup), with per-metric stats."""
    scenario: Scenario
    model_name: str
    recipe: str
    artifact_id: str
    engine: str
    setup_id: str | None
    quant_format: str | None
    model_bytes: int | None
    runs: list[dict]
    stats: dict[str, tuple[float, float | None, int]] = field(default_factory=dict)
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None  # 95% interval
    flag: str | None = None  # why the speed-up is not ranked

    @property
    def identity(self) -> tuple:
        return (self.model_name, self.recipe, self.artifact_id, self.engine, self.setup_id)

    def mean(self, metric: str) -> float | None:
        return self.stats[metric][0] if metric in self.stats else None

    def std(self, metric: str) -> float | None:
        return self.stats[metric][1] if metric in self.stats else None

    def cv(self, metric: str) -> float | None:
        """Coefficient of variation (std / mean); None with fewer than two runs."""
        mean, std = self.mean(metric), self.std(metric)
        return std / mean if mean and std is not None else None


def is_ok(row: dict) -> bool:
    return row.get("status") == "ok"


def kind(row: dict) -> str:
    return row.get("kind") or "speed"


def scenario_of(row: dict) -> Scenario:
    """Speed rows name a scenario; accuracy rows may name their eval set instead."""
    name = row.get("scenario") or row.get("dataset") or kind(row)
    return Scenario(str(name), row.get("batch_size"), row.get("input_len"), row.get("output_len"))


def numeric_metrics(row: dict) -> dict[str, float]:
    """The row's numeric metrics, with input throughput derived when it is missing.

    A throughput <= 0 cannot come from a completed run (it is the reference
    report's always-0.00 defect), so it counts as not measured. Derived input
    (prefill) throughput is batch_size x input_len / mean TTFT."""
    out = {k: float(v) for k, v in (row.get("metrics") or {}).items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    for k in [k for k in out if "throughput" in k and out[k] <= 0]:
        del out[k]
    ttft = out.get("ttft_ms_mean")
    if "input_throughput" not in out and ttft and row.get("batch_size") and row.get("input_len"):
        out["input_throughput"] = row["batch_size"] * row["input_len"] / (ttft / 1000)
    return out


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None with fewer than two values)."""
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def group_stats(runs: list[dict]) -> dict[str, tuple[float, float | None, int]]:
    values: dict[str, list[float]] = {}
    for row in runs:
        for k, v in numeric_metrics(row).items():
            values.setdefault(k, []).append(v)
    return {k: (*mean_std(vs), len(vs)) for k, vs in values.items()}


def aggregate(rows: list[dict], kind_: str = "speed") -> list[Group]:
    """Ok rows of one kind grouped per (scenario, recipe, artifact, engine,
    setup), in order of first appearance; runs inside a group sorted by run index."""
    groups: dict[tuple, Group] = {}
    for row in rows:
        if not is_ok(row) or kind(row) != kind_:
            continue
        key = (scenario_of(row), row.get("recipe"), row.get("artifact_id"), row.get("engine"), row.get("setup_id"))
        if key not in groups:
            groups[key] = Group(key[0], row.get("model_name") or "?", row.get("recipe") or "?",
                                row.get("artifact_id") or "?", row.get("engine") or "?", row.get("setup_id"),
                                row.get("quant_format"), row.get("model_bytes"), [])
        groups[key].runs.append(row)
    for g in groups.values():
        g.runs.sort(key=lambda r: (r.get("run_index") if isinstance(r.get("run_index"), int) else 1 << 30,
                                   r.get("timestamp") or ""))
        g.stats = group_stats(g.runs)
    return list(groups.values())


def add_speedups(groups: list[Group], metric: str = "output_throughput") -> None:
    """Speed-up = mean `metric` / that of the `original` recipe with the same
    model, engine, setup and scenario; None when there is no such baseline.
    Each group also gets the speed-up's 95% interval and, when the runs
    cannot tell it apart from 1.0 or are too noisy, a flag saying why."""
    baselines: dict[tuple, Group] = {}
    for g in sorted(groups, key=lambda g: g.artifact_id):  # deterministic if several originals
        if g.recipe == BASELINE and g.mean(metric):
            baselines.setdefault((g.model_name, g.engine, g.setup_id, g.scenario), g)
    for g in groups:
        base = baselines.get((g.model_name, g.engine, g.setup_id, g.scenario))
        ours = g.mean(metric)
        g.speedup = ours / base.mean(metric) if base and ours is not None else None
        g.speedup_ci = ratio_interval(g, base, metric) if g.speedup and base is not g else None
        g.flag = speedup_flag(g, base, metric) if ours is not None else None


def ratio_interval(g: Group, base: Group, metric: str) -> tuple[float, float] | None:
    """95% interval of mean(g) / mean(base): delta method on the log ratio,
    Welch-Satterthwaite degrees of freedom. None with fewer than two runs a side."""
    sides = [(x.std(metric), x.mean(metric), x.stats[metric][2]) for x in (g, base)]
    if any(std is None or n < 2 for std, _, n in sides):
        return None
    var = [(std / mean) ** 2 / n for std, mean, n in sides]
    if not sum(var):
        return g.speedup, g.speedup
    df = sum(var) ** 2 / sum(v ** 2 / (n - 1) for v, (_, _, n) in zip(var, sides))
    half = t95(df) * math.sqrt(sum(var))
    return g.speedup * math.exp(-half), g.speedup * math.exp(half)


def speedup_flag(g: Group, base: Group | None, metric: str) -> str | None:
    """Why g's speed (and speed-up) should not be ranked, or None."""
    for who, x in (("", g), ("baseline ", base if base is not g else None)):
        if x is None:
            continue
        cv = x.cv(metric)
        if cv is None:
            return f"{who}1 run: no spread measured"
        if cv > CV_MAX:
            return f"{who}CV {cv:.0%} > {CV_MAX:.0%}"
    if g.speedup_ci and g.speedup_ci[0] <= 1.0 <= g.speedup_ci[1]:
        return f"95% CI {g.speedup_ci[0]:.2f}–{g.speedup_ci[1]:.2f} includes 1.0"
    return None


def scenarios(groups: list[Group]) -> list[Scenario]:
    return list(dict.fromkeys(g.scenario for g in groups))


def by_throughput(groups: list[Group]) -> list[Group]:
    """Highest mean output throughput first; groups without it last."""
    return sorted(groups, key=lambda g: (g.mean("output_throughput") is None, -(g.mean("output_throughput") or 0)))


def geomean(values: list[float]) -> float:
    return math.exp(statistics.mean(math.log(v) for v in values))


def overall_ranking(groups: list[Group]) -> list[tuple[tuple, float, list[Scenario]]]:
    """(identity, geometric-mean speed-up, scenarios) per recipe/artifact/engine,
    over the scenarios where it has an unflagged speed-up; best first."""
    per: dict[tuple, list[Group]] = {}
    for g in groups:
        if g.speedup and not g.flag:
            per.setdefault(g.identity, []).append(g)
    ranked = [(ident, geomean([g.speedup for g in gs]), [g.scenario for g in gs]) for ident, gs in per.items()]
    return sorted(ranked, key=lambda t: -t[1])


def labels(groups: list[Group]) -> dict[tuple, str]:
    """Recipe name, as `model/recipe` when several models are present; where
    several identities share it, what tells them apart: the artifact, the
    engine, and the settings of the setups that differ."""
    first = {}
    for g in groups:
        first.setdefault(g.identity, g)
    several_models = len({g.model_name for g in first.values()}) > 1
    count = Counter((g.model_name, g.recipe) for g in first.values())
    out = {}
    for ident, g in first.items():
        name = f"{g.model_name}/{g.recipe}" if several_models else g.recipe
        if count[g.model_name, g.recipe] == 1:
            out[ident] = name
            continue
        twins = [t for t in first.values() if (t.model_name, t.recipe) == (g.model_name, g.recipe)]
        parts = [short(g.artifact_id)] if len({t.artifact_id for t in twins}) > 1 else []
        parts += [g.engine] if len({t.engine for t in twins}) > 1 else []
        if len({t.setup_id for t in twins}) > 1:
            parts.append(setup_difference(g, twins))
        out[ident] = f"{name} ({'; '.join(parts)})"
    return out


def in_table(names: dict[tuple, str], g: Group) -> str:
    """g's label in a table that has a Model column: without the model prefix."""
    return names[g.identity].removeprefix(f"{g.model_name}/")


def setup_settings(row: dict) -> dict[str, str]:
    """What a setup is made of, flat: engine args and environment, measuring
    library versions, machine."""
    hw = row.get("hardware") or {}
    return {**{k: json.dumps(v) for k, v in (row.get("engine_args") or {}).items()},
            **{k: str(v) for k, v in (row.get("engine_env") or {}).items()},
            **{k: str(v) for k, v in (row.get("versions") or {}).items() if k in results.MEASURING_LIBRARIES},
            "cpu": f"{hw.get('cpu')} x{hw.get('cpu_affinity') or hw.get('cpu_count')}",
            "accelerators": ",".join(hw.get("accelerators") or []) or "none"}


def setup_difference(g: Group, twins: list[Group]) -> str:
    """`key=value` for every setting in which g's setup differs from a twin's."""
    mine = setup_settings(g.runs[0])
    theirs = [setup_settings(t.runs[0]) for t in twins]
    keys = sorted({k for s in theirs for k in s | mine if s.get(k) != mine.get(k)})
    return ", ".join(f"{k}={mine.get(k, MISSING)}" for k in keys) or f"setup {g.setup_id or 'not recorded'}"


def run_labels(runs: list[dict]) -> list[str]:
    """`run N` from run_index + 1; a repeated index gets `(repeat k)` so labels stay unique."""
    seen: Counter = Counter()
    out = []
    for i, row in enumerate(runs):
        idx = row.get("run_index")
        base = f"run {idx + 1}" if isinstance(idx, int) else f"run ?{i + 1}"
        seen[base] += 1
        out.append(base if seen[base] == 1 else f"{base} (repeat {seen[base]})")
    return out


def same_setup(candidates: list[Group], g: Group) -> Group | None:
    """The first candidate measured in g's setup; never one of another setup
    (its engine, versions or machine could explain any difference)."""
    return next((c for c in candidates if c.setup_id == g.setup_id), None)


def accuracy_of(acc_groups: list[Group], g: Group) -> Group | None:
    """Accuracy shown beside a speed group: its artifact's, measured in the
    same setup, in the first eval set; None (shown as missing) otherwise."""
    same = sorted((a for a in acc_groups if a.artifact_id == g.artifact_id), key=lambda a: a.scenario.name)
    return same_setup(same, g)


def accuracy_keys(acc_groups: list[Group]) -> list[str]:
    keys = {k for g in acc_groups for k in g.stats}
    return [k for k in ACCURACY_HEADLINE if k in keys] + sorted(keys - set(ACCURACY_HEADLINE))


def headline_accuracy_keys(acc_groups: list[Group]) -> list[str]:
    return [k for k in ACCURACY_HEADLINE if k in accuracy_keys(acc_groups)] or accuracy_keys(acc_groups)[:3]


def ordered_metrics(keys) -> list[str]:
    keys = set(keys)
    return [k for k in METRIC_ORDER if k in keys] + sorted(keys - set(METRIC_ORDER))


# ---------------------------------------------------------------- formatting

def short(artifact_id: str | None) -> str:
    return (artifact_id or "?")[:8]


def unit(metric: str) -> str | None:
    for marker, u in UNITS:
        if marker in metric:
            return u
    return "s" if metric.endswith("_s") else None


def header(metric: str) -> str:
    u = unit(metric)
    return f"{metric} ({u})" if u else metric


def num(x: float | None, digits: int = 2) -> str:
    return MISSING if x is None else f"{x:.{digits}f}"


def auto(x: float | None) -> str:
    """Accuracy numbers span 0.001 (KL) to 100 (%): four significant digits."""
    return MISSING if x is None else (f"{x:.4g}" if abs(x) < 1e4 else f"{x:.0f}")


def pm(g: Group, metric: str, digits: int = 2) -> str:
    """`mean ± std`; just the mean for a single run; "—" when never measured."""
    mean, std = g.mean(metric), g.std(metric)
    if mean is None:
        return MISSING
    return num(mean, digits) if std is None else f"{num(mean, digits)} ± {num(std, digits)}"


def pm_auto(g: Group, metric: str) -> str:
    mean, std = g.mean(metric), g.std(metric)
    return auto(mean) if std is None else f"{auto(mean)} ± {auto(std)}"


def mb(nbytes) -> float | None:
    return nbytes / 1e6 if isinstance(nbytes, (int, float)) else None


def speedup_text(x: float | None) -> str:
    return MISSING if x is None else f"{x:.2f}x"


def speedup_cell(g: Group) -> str:
    """The speed-up, marked when the runs cannot support it."""
    text = speedup_text(g.speedup)
    return f"{text} ⚠ {g.flag}" if g.flag and g.speedup is not None else text


def interval_text(ci: tuple[float, float] | None) -> str:
    return MISSING if ci is None else f"{ci[0]:.2f}–{ci[1]:.2f}"


def kv_cache_bytes(row: dict) -> int | None:
    """KV cache vLLM-CPU allocates up front (VLLM_CPU_KVCACHE_SPACE GiB),
    whatever the batch; part of the engine's peak memory. None elsewhere
    (transformers grows its cache per request; on GPUs vLLM takes a share of
    device memory instead)."""
    space = (row.get("engine_env") or {}).get("VLLM_CPU_KVCACHE_SPACE")
    on_cpu = not (row.get("hardware") or {}).get("accelerators")
    if row.get("engine") != "vllm" or not on_cpu or space in (None, ""):
        return None
    try:
        return int(float(space) * 2 ** 30)
    except ValueError:
        return None


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    def cell(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(map(cell, headers)) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(map(cell, r)) + " |" for r in rows]
    return "\n".join(lines)


def code(obj) -> str:
    return f"`{json.dumps(obj, sort_keys=True, default=str)}`"


# ---------------------------------------------------------------- markdown

MEMORY_HEADER = "Peak memory (MB): weights + KV cache + runtime"
SUMMARY_SPEED = (  # metric, column header, decimals, mean ± std?
    ("output_throughput", "Output throughput (tok/s)", 2, True),
    ("total_token_throughput", "Total token throughput (tok/s)", 2, True),
    ("input_throughput", "Input (prefill) throughput (tok/s)", 2, True),
    ("latency_s", "Latency (s)", 3, True),
    ("ttft_ms_p50", "TTFT p50 (ms)", 2, False),
    ("tpot_ms_p50", "TPOT p50 (ms)", 2, False),
)
DETAIL_METRICS = (
    ("latency_s", "Latency (s)", 3), ("output_throughput", "Output (tok/s)", 2),
    ("total_token_throughput", "Total (tok/s)", 2), ("input_throughput", "Input (tok/s)", 2),
    ("ttft_ms_p50", "TTFT p50 (ms)", 2), ("tpot_ms_p50", "TPOT p50 (ms)", 2),
    ("itl_ms_p50", "ITL p50 (ms)", 2), ("peak_memory_mb", MEMORY_HEADER, 1),
    ("weight_bandwidth_gb_s", "Weight bandwidth (GB/s)", 2),
)


def render_markdown(rows: list[dict], speed: list[Group], acc: list[Group], title: str, results_dir: Path,
                    lm: list[Group] = ()) -> str:
    parts = [render_header(rows, title, results_dir), render_summary(speed, acc),
             render_ranking(speed), render_details(speed), render_problems(rows)]
    if acc:
        parts.append(render_accuracy(acc))
    if lm:
        parts.append(render_lm_eval(lm))
    return "\n\n".join(p for p in parts if p) + "\n"


def distinct(rows: list[dict], key: str) -> list:
    seen = {json.dumps(r.get(key), sort_keys=True, default=str): r.get(key) for r in rows if r.get(key)}
    return list(seen.values())


def render_header(rows: list[dict], title: str, results_dir: Path) -> str:
    stamps = sorted(r["timestamp"] for r in rows if r.get("timestamp"))
    lines = [f"# {title}", "",
             f"- Generated: {datetime.now(timezone.utc).isoformat(timespec='seconds')}",
             f"- Results: {len(rows)} rows in `{results_dir}`"
             + (f", measured {stamps[0]} … {stamps[-1]}" if stamps else ""),
             f"- Models: {', '.join(sorted({r.get('model_name') or '?' for r in rows}))}"]
    for hw in distinct(rows, "hardware"):
        lines.append(f"- Hardware: {hardware_text(hw)}")
    for facts in distinct(rows, "machine"):
        lines.append(f"- Capabilities: {capability_text(facts)}")
    lines.append(f"- Versions: {versions_text(rows)}")
    lines.append("- Setups (engine, args and environment as recorded; rows of different setups are never averaged):")
    combos: dict[tuple, set] = {}
    for r in rows:
        key = (r.get("setup_id") or MISSING, r.get("engine") or "?", code(r.get("engine_args") or {}),
               code(r.get("engine_env") or {}))
        combos.setdefault(key, set()).add(r.get("recipe") or "?")
    for (setup, engine, args, env), recipes in sorted(combos.items()):
        lines.append(f"  - `{setup}` {engine}: args {args}, env {env} (recipes: {', '.join(sorted(recipes))})")
    lines += ["", "Notes: values are mean ± sample std over the timed runs (warm-up excluded); "
              "TTFT/TPOT percentiles are per-run values averaged over runs; speed-up is mean output "
              "throughput / that of the `original` artifact of the same model, engine, setup and scenario; "
              "input (prefill) throughput is the measured `input_throughput`, or batch_size × input_len / "
              "mean TTFT where a row lacks it; \"—\" means not measured (never 0); model size is weight "
              "bytes on disk / 10^6.",
              "",
              f"A speed-up is flagged (⚠) and left out of the rankings when its 95% interval (Welch, on the "
              f"log ratio of mean output throughputs) includes 1.0, when either side's runs vary by more than "
              f"{CV_MAX:.0%} (coefficient of variation), or when either side has a single run.",
              "",
              "Peak memory is the resident memory of the engine's process tree at its peak: the weights, the "
              "KV cache and the runtime (Python, torch, compiled graphs). vLLM-CPU allocates its whole KV cache "
              "up front (`VLLM_CPU_KVCACHE_SPACE` GiB, shown per row as *KV cache*), so peak memory barely "
              "changes with batch size; model size is the weights alone."]
    return "\n".join(lines)


def hardware_text(hw: dict) -> str:
    parts = [str(hw.get("cpu") or "unknown CPU")]
    if hw.get("cpu_count"):
        parts.append(f"{hw['cpu_count']} CPUs" + (f" ({hw['cpu_affinity']} usable)" if hw.get("cpu_affinity") else ""))
    if hw.get("memory_gib"):
        parts.append(f"{hw['memory_gib']} GiB RAM")
    if hw.get("cpu_isa"):
        parts.append("ISA " + " ".join(hw["cpu_isa"]))
    parts.append("accelerators: " + (", ".join(hw.get("accelerators") or []) or "none"))
    host = f"`{hw['hostname']}` " if hw.get("hostname") else ""
    return host + "; ".join(parts)


def capability_text(facts: dict) -> str:
    """The facts the engine decided from (see `python -m evaluate.capabilities`)."""
    parts = [f"bf16/fp16 {'native' if facts.get('cpu_native_half') else 'emulated on this CPU'}"]
    if facts.get("cuda"):
        parts.insert(0, "CUDA " + ", ".join(f"sm{a}{b}" for a, b in facts["cuda"]))
    if facts.get("vllm_library"):
        parts.append(f"vLLM kernel library {facts['vllm_library']} with "
                     + (", ".join(facts.get("vllm_ops") or []) or "no int8/int4 ops"))
    return "; ".join(parts)


def versions_text(rows: list[dict]) -> str:
    seen: dict[str, set] = {}
    for v in distinct(rows, "versions"):
        for pkg, ver in v.items():
            seen.setdefault(pkg, set()).add(str(ver))
    return ", ".join(f"{pkg} {' / '.join(sorted(vs))}" for pkg, vs in sorted(seen.items())) or MISSING


def by_model(groups: list[Group]) -> list[Group]:
    """Grouped by model (in order of appearance), fastest first within each."""
    order = {m: i for i, m in enumerate(dict.fromkeys(g.model_name for g in groups))}
    return sorted(by_throughput(groups), key=lambda g: order[g.model_name])  # sorted is stable


def render_summary(speed: list[Group], acc: list[Group]) -> str:
    names = labels(speed)
    acc_cols = headline_accuracy_keys(acc)
    heads = (["Model", "Recipe", "Artifact", "Format", "Model size (MB)"] + [h for _, h, _, _ in SUMMARY_SPEED]
             + ["Speed-up vs original (x)", "Speed-up 95% CI", "Runs (n)", MEMORY_HEADER, "of it KV cache (MB)"]
             + [header(k) for k in acc_cols])
    out = ["## Summary"]
    for sc in scenarios(speed):
        rows = []
        for g in by_model([g for g in speed if g.scenario == sc]):
            a = accuracy_of(acc, g)
            rows.append([g.model_name, in_table(names, g), f"`{short(g.artifact_id)}`", g.quant_format or MISSING,
                         num(mb(g.model_bytes), 1)]
                        + [pm(g, m, d) if both else num(g.mean(m), d) for m, _, d, both in SUMMARY_SPEED]
                        + [speedup_cell(g), interval_text(g.speedup_ci), str(len(g.runs)),
                           num(mb(g.mean("peak_memory_bytes")), 1), num(mb(kv_cache_bytes(g.runs[0])), 1)]
                        + [pm_auto(a, k) if a and k in a.stats else MISSING for k in acc_cols])
        out += ["", f"### {sc.heading()}", "", md_table(heads, rows)]
    if not speed:
        out += ["", "No successful speed runs."]
    elif acc_cols:
        out += ["", f"Accuracy columns ({', '.join(acc_cols)}) come from the artifact's accuracy run in the same "
                "setup; — means no such run (a run of another setup is never borrowed)."]
    return "\n".join(out)


def render_ranking(speed: list[Group]) -> str:
    out = ["## Ranking", "", "By mean output throughput (tok/s), per scenario and model; flagged speed-ups "
           "(⚠, see the notes above) are listed apart, not ranked:"]
    names = labels(speed)
    for sc in scenarios(speed):
        for model in dict.fromkeys(g.model_name for g in speed if g.scenario == sc):
            out += ["", f"**{sc.heading()}**" + (f" — {model}" if len({g.model_name for g in speed}) > 1 else ""), ""]
            measured = [g for g in by_throughput([g for g in speed if g.scenario == sc and g.model_name == model])
                        if g.mean("output_throughput")]
            out += [f"{i}. {names[g.identity]} — {num(g.mean('output_throughput'))} tok/s"
                    f" ({speedup_text(g.speedup)} vs original)" for i, g in enumerate(
                        [g for g in measured if not g.flag], 1)]
            out += [f"- not ranked: {names[g.identity]} — {num(g.mean('output_throughput'))} tok/s"
                    f" ({speedup_text(g.speedup)} vs original; {g.flag})" for g in measured if g.flag]
    out += ["", "**Overall** (geometric mean of speed-up vs original over the scenarios each ran, "
            "unflagged speed-ups only):", ""]
    overall = overall_ranking(speed)
    out += [f"{i}. {names[ident]} — {gm:.2f}x over {len(scs)} scenario(s): {', '.join(s.name for s in scs)}"
            for i, (ident, gm, scs) in enumerate(overall, 1)] or ["No recipe has an unflagged speed-up vs an "
                                                                   "`original` baseline."]
    return "\n".join(out)


def run_metrics(row: dict) -> dict[str, float]:
    m = numeric_metrics(row)
    if "peak_memory_bytes" in m:
        m["peak_memory_mb"] = m["peak_memory_bytes"] / 1e6
    return m


def render_details(speed: list[Group]) -> str:
    out = ["## Detailed runs"]
    names = labels(speed)
    heads = ["Run", "Model", "Recipe", "Artifact", "Engine"] + [h for _, h, _ in DETAIL_METRICS] + ["Timestamp (UTC)"]
    for sc in scenarios(speed):
        rows = []
        for g in by_model([g for g in speed if g.scenario == sc]):
            for label, run in zip(run_labels(g.runs), g.runs):
                m = run_metrics(run)
                rows.append([label, g.model_name, in_table(names, g), f"`{short(g.artifact_id)}`", g.engine]
                            + [num(m.get(k), d) for k, _, d in DETAIL_METRICS] + [run.get("timestamp") or MISSING])
        out += ["", f"### {sc.heading()}", "", md_table(heads, rows)]
    if not speed:
        out += ["", "No successful speed runs."]
    return "\n".join(out)


def render_problems(rows: list[dict]) -> str:
    bad = [r for r in rows if not is_ok(r)]
    if not bad:
        return "## Skipped, unsupported and failed\n\nNone: every recorded run succeeded."
    table = [[r.get("status") or "missing", kind(r), scenario_of(r).heading() if r.get("scenario") else MISSING,
              r.get("model_name") or "?", r.get("recipe") or "?",
              f"`{short(r.get('artifact_id'))}`", r.get("engine") or "?",
              str(r["run_index"] + 1) if isinstance(r.get("run_index"), int) else MISSING,
              r.get("reason") or "(no reason recorded)", r.get("timestamp") or MISSING] for r in bad]
    heads = ["Status", "Kind", "Scenario", "Model", "Recipe", "Artifact", "Engine", "Run", "Reason", "Timestamp (UTC)"]
    return ("## Skipped, unsupported and failed\n\nExcluded from every aggregate above. `unsupported`: the "
            "engine has no kernel for this format on this machine (`python -m evaluate.capabilities`).\n\n"
            + md_table(heads, table))


def render_accuracy(acc: list[Group]) -> str:
    out = ["## Accuracy"]
    keys = accuracy_keys(acc)
    names = labels(acc)
    for sc in scenarios(acc):
        rows = [[g.model_name, in_table(names, g), f"`{short(g.artifact_id)}`", g.engine, num(mb(g.model_bytes), 1),
                 str(len(g.runs))] + [pm_auto(g, k) if k in g.stats else MISSING for k in keys]
                for g in sorted((g for g in acc if g.scenario == sc),
                                key=lambda g: (g.model_name, g.recipe != BASELINE, g.recipe))]
        heads = ["Model", "Recipe", "Artifact", "Engine", "Model size (MB)", "Rows (n)"] + [header(k) for k in keys]
        out += ["", f"### {sc.heading()}", "", md_table(heads, rows)]
    return "\n".join(out)


def stderr_key(metric: str) -> str:
    """lm-eval's standard-error metric of `metric`: acc -> acc_stderr, em[f] -> em_stderr[f]."""
    name, bracket, filt = metric.partition("[")
    return f"{name}_stderr{bracket}{filt}"


def lm_recovery(g: Group, base: Group | None, metric: str) -> float | None:
    """Artifact vs baseline in %, oriented so that 100 means no loss."""
    a, b = g.mean(metric), base.mean(metric) if base else None
    if not a or not b:
        return None
    higher = ((g.runs[0].get("lm_eval") or {}).get("higher_is_better") or {}).get(metric.partition("[")[0], True)
    return 100 * (a / b if higher else b / a)


def lm_baseline(groups: list[Group], g: Group) -> Group | None:
    """The `original` of g's model, measured in g's setup."""
    return same_setup([b for b in groups if b.recipe == BASELINE and b.model_name == g.model_name], g)


def render_lm_eval(lm: list[Group]) -> str:
    out = ["## lm-eval tasks", "",
           "lm-evaluation-harness, vLLM backend (`lm_eval=<preset>`). ± is lm-eval's standard error; "
           f"recovery is against `{BASELINE}`, oriented so that 100 % means no loss."]
    names = labels(lm)
    for sc in scenarios(lm):
        groups = sorted((g for g in lm if g.scenario == sc), key=lambda g: (g.model_name, g.recipe != BASELINE, g.recipe))
        keys = [k for k in ordered_metrics({k for g in groups for k in g.stats}) if "_stderr" not in k]
        rows = [[g.model_name, in_table(names, g), f"`{short(g.artifact_id)}`", num(mb(g.model_bytes), 1)]
                + [auto(g.mean(k)) + (f" ± {auto(g.mean(stderr_key(k)))}" if g.mean(stderr_key(k)) else "")
                   for k in keys]
                + [num(lm_recovery(g, lm_baseline(groups, g), k), 1) for k in keys[:1]]
                for g in groups]
        heads = ["Model", "Recipe", "Artifact", "Model size (MB)"] + keys + [f"{k} recovery (%)" for k in keys[:1]]
        out += ["", f"### {sc.heading()}", "", md_table(heads, rows)]
    return "\n".join(out)


# ---------------------------------------------------------------- csv

SUMMARY_FIELDS = ("scenario", "batch_size", "input_len", "output_len", "model_name", "recipe", "artifact_id",
                  "engine", "quant_format", "model_bytes", "model_size_mb", "runs", "speedup_vs_original")


def summary_records(speed: list[Group]) -> list[dict]:
    metrics = ordered_metrics({k for g in speed for k in g.stats})
    out = []
    for g in speed:
        rec = dict(zip(SUMMARY_FIELDS, (
            g.scenario.name, g.scenario.batch_size, g.scenario.input_len, g.scenario.output_len, g.model_name,
            g.recipe, g.artifact_id, g.engine, g.quant_format, g.model_bytes, mb(g.model_bytes), len(g.runs),
            g.speedup)))
        for k in metrics:
            rec[f"{k}_mean"], rec[f"{k}_std"] = g.mean(k), g.std(k)
        out.append(rec)
    return out


RUN_FIELDS = ("timestamp", "kind", "scenario", "batch_size", "input_len", "output_len", "model_name", "recipe",
              "artifact_id", "engine", "quant_format", "model_bytes", "run_index")


def run_records(rows: list[dict]) -> list[dict]:
    """Every ok row, flat: metrics.* become columns; engine args/env as JSON."""
    ok = [r for r in rows if is_ok(r)]
    metrics = ordered_metrics({k for r in ok for k in numeric_metrics(r)})
    out = []
    for r in ok:
        m = numeric_metrics(r)
        rec = {k: r.get(k) for k in RUN_FIELDS}
        rec["engine_args"] = json.dumps(r.get("engine_args") or {}, sort_keys=True)
        rec["engine_env"] = json.dumps(r.get("engine_env") or {}, sort_keys=True)
        rec.update({f"metrics.{k}": m.get(k) for k in metrics})
        out.append(rec)
    return out


def to_csv(records: list[dict], empty_fields: tuple = ()) -> str:
    """CSV text; with no records, just the header `empty_fields`."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(records[0]) if records else list(empty_fields), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in rec.items()} for rec in records)
    return buf.getvalue()


# ---------------------------------------------------------------- plots

def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_png(fig, path: Path) -> None:
    """Save beside `path` under a temp name, then rename: readers never see half a PNG."""
    plt = pyplot()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)


def slug(sc: Scenario, all_scenarios: list[Scenario]) -> str:
    """File-name part for a scenario: its name, plus its shape if the name repeats."""
    name = sc.name
    if sum(s.name == sc.name for s in all_scenarios) > 1:
        name += f"_bs{sc.batch_size}_in{sc.input_len}_out{sc.output_len}"
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def plot_scenario(groups: list[Group], names: dict, sc: Scenario, path: Path) -> None:
    plt = pyplot()
    gs = [g for g in by_throughput(groups) if g.mean("output_throughput")][::-1]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.45 * len(gs)))
    means = [g.mean("output_throughput") for g in gs]
    stds = [g.std("output_throughput") or 0 for g in gs]
    # Flagged speed-ups (see add_speedups) in grey, with the reason.
    ax.barh([names[g.identity] for g in gs], means, xerr=stds, capsize=3,
            color=["0.7" if g.flag else "tab:blue" for g in gs])
    for y, (g, v, e) in enumerate(zip(gs, means, stds)):
        note = f", not ranked: {g.flag}" if g.flag else ""
        ax.text(v + e, y, f"  {v:.1f} ({speedup_text(g.speedup)}{note})", va="center", fontsize=8)
    ax.set_xlim(0, max(m + e for m, e in zip(means, stds)) * 1.35)
    ax.set_xlabel("Output throughput (tok/s), mean ± std")
    ax.set_title(sc.heading())
    save_png(fig, path)


def plot_grouped(groups: list[Group], names: dict, path: Path) -> None:
    plt = pyplot()
    scs = scenarios(groups)
    idents = list(dict.fromkeys(g.identity for g in groups))
    width = 0.8 / len(idents)
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(scs) + 0.15 * len(scs) * len(idents)), 4.5))
    for i, ident in enumerate(idents):
        xs, ys, es = [], [], []
        for x, sc in enumerate(scs):
            g = next((g for g in groups if g.identity == ident and g.scenario == sc), None)
            if g and g.mean("output_throughput"):
                xs.append(x - 0.4 + width * (i + 0.5))
                ys.append(g.mean("output_throughput"))
                es.append(g.std("output_throughput") or 0)
        ax.bar(xs, ys, width, yerr=es, capsize=2, label=names[ident])
    ax.set_xticks(range(len(scs)), [sc.tick() for sc in scs], fontsize=8)
    means = [g.mean("output_throughput") for g in groups]
    log = max(means) / min(means) > 10  # bs=1 bars would vanish next to bs=64 ones
    if log:
        ax.set_yscale("log")
    ax.set_ylabel("Output throughput (tok/s), mean ± std" + (", log scale" if log else ""))
    ax.set_title("Output throughput per scenario")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    save_png(fig, path)


LABEL_FONT = 8  # points


def annotated_scatter(points: list[tuple[str, float, float, float]], xlabel: str, ylabel: str, title: str,
                      path: Path) -> None:
    """points: (label, x, y, bubble area)."""
    plt = pyplot()
    # Tall enough for one label line per point in the label column.
    fig, ax = plt.subplots(figsize=(7.5, max(5.0, 1.5 + len(points) * LABEL_FONT * 1.6 / 72)))
    ax.scatter([p[1] for p in points], [p[2] for p in points], s=[p[3] for p in points], alpha=0.6)
    ax.margins(0.2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    label_points(ax, [(label, x, y) for label, x, y, _ in points])
    save_png(fig, path)


def label_points(ax, points: list[tuple[str, float, float]]) -> list:
    """Labels in a column right of the axes, each at its point's height where
    there is room and pushed apart where not, with a leader line to its point:
    labels never overlap, however close the points are. Returns the texts."""
    fig = ax.figure
    fig.canvas.draw()  # fixes the data limits, so data -> axes coordinates hold
    to_axes = ax.transData + ax.transAxes.inverted()
    heights = [to_axes.transform((x, y))[1] for _, x, y in points]
    gap = LABEL_FONT * 1.6 / 72 / (ax.get_position().height * fig.get_figheight())  # one line, in axes units
    slots = spread(heights, gap)
    return [ax.annotate(label, (x, y), xytext=(1.04, slot), textcoords="axes fraction", va="center",
                        fontsize=LABEL_FONT, annotation_clip=False,
                        arrowprops={"arrowstyle": "-", "color": "0.55", "lw": 0.6, "shrinkA": 2, "shrinkB": 4})
            for (label, x, y), slot in zip(points, slots)]


def spread(heights: list[float], gap: float) -> list[float]:
    """Positions as close to `heights` as possible, at least `gap` apart, in
    the same order, kept within [0, 1] when they fit."""
    order = sorted(range(len(heights)), key=lambda i: heights[i])
    pos = [min(max(heights[i], 0.0), 1.0) for i in order]
    for k in range(1, len(pos)):  # push up
        pos[k] = max(pos[k], pos[k - 1] + gap)
    if pos and pos[-1] > 1.0:  # then down from the top, when that overflowed
        pos[-1] = 1.0
        for k in range(len(pos) - 2, -1, -1):
            pos[k] = min(pos[k], pos[k + 1] - gap)
    out = [0.0] * len(heights)
    for i, p in zip(order, pos):
        out[i] = p
    return out


def pareto_scenario(speed: list[Group], wanted: str | None) -> Scenario:
    scs = scenarios(speed)
    if wanted is None:
        return scs[0]
    match = [s for s in scs if s.name == wanted]
    if not match:
        raise UserError(f"--pareto-scenario {wanted!r} is not in the results; have: {', '.join(s.name for s in scs)}")
    return match[0]


def render_plots(speed: list[Group], acc: list[Group], out_dir: Path, wanted: str | None) -> list[Path]:
    speed = [g for g in speed if g.mean("output_throughput")]
    if not speed:
        return []
    names = labels(speed)
    paths = [out_dir / "throughput.png"]
    plot_grouped(speed, names, paths[0])
    for sc in scenarios(speed):
        paths.append(out_dir / f"throughput_{slug(sc, scenarios(speed))}.png")
        plot_scenario([g for g in speed if g.scenario == sc], names, sc, paths[-1])
    sc = pareto_scenario(speed, wanted)
    chosen = [g for g in speed if g.scenario == sc]
    ylabel = "Output throughput (tok/s), mean"
    sized = [(names[g.identity], mb(g.model_bytes), g.mean("output_throughput"), 60) for g in chosen if g.model_bytes]
    if sized:
        paths.append(out_dir / "speed_vs_size.png")
        annotated_scatter(sized, "Model size (MB)", ylabel, f"Speed vs size\n{sc.heading()}", paths[-1])
    keys = headline_accuracy_keys(acc)
    if keys:
        biggest = max((mb(g.model_bytes) or 0 for g in chosen), default=0) or 1
        scored = [(g, accuracy_of(acc, g)) for g in chosen]
        pts = [(names[g.identity], a.mean(keys[0]), g.mean("output_throughput"),
                40 + 1200 * (mb(g.model_bytes) or 0) / biggest)
               for g, a in scored if a and a.mean(keys[0]) is not None]
        if pts:
            paths.append(out_dir / "pareto.png")
            annotated_scatter(pts, header(keys[0]), ylabel, f"Speed vs accuracy (bubble area ∝ model size)\n{sc.heading()}",
                              paths[-1])
    return paths


# ---------------------------------------------------------------- entry point

def build_report(results_dir: Path, out_dir: Path, title: str, pareto: str | None = None) -> list[Path]:
    """Write every report file into `out_dir`; return their paths."""
    rows = results.read(results_dir) if Path(results_dir).is_dir() else []
    if not rows:
        raise UserError(f"no results in {results_dir}; run python -m evaluate first")
    out_dir.mkdir(parents=True, exist_ok=True)
    speed = aggregate(rows, "speed")
    add_speedups(speed)
    acc = aggregate(rows, "accuracy")
    lm = aggregate(rows, "lm_eval")
    if pareto is not None and speed:
        pareto_scenario(speed, pareto)  # fail on a bad name before writing anything
    written = {out_dir / "report.md": render_markdown(rows, speed, acc, title, results_dir, lm),
               out_dir / "summary.csv": to_csv(summary_records(speed), SUMMARY_FIELDS),
               out_dir / "runs.csv": to_csv(run_records(rows), RUN_FIELDS)}
    for path, text in written.items():
        write_text(path, text)
    return list(written) + render_plots(speed, acc, out_dir, pareto)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results-dir", default="results", help="directory holding results*.jsonl")
    parser.add_argument("--out-dir", default="reports", help="where report.md, CSVs and PNGs are written")
    parser.add_argument("--title", default="quantbench: quantized LLM benchmark report")
    parser.add_argument("--pareto-scenario", default=None,
                        help="scenario whose throughput the speed-vs-size/accuracy plots use (default: first)")


def main(args: argparse.Namespace) -> int:
    try:
        paths = build_report(resolve(args.results_dir), resolve(args.out_dir), args.title, args.pareto_scenario)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="python -m evaluate.report", description=__doc__.splitlines()[2])
    add_cli_args(_parser)
    sys.exit(main(_parser.parse_args()))
