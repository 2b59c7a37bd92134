"""Units and number formatting shared by every output of the report. A
metric that was not measured prints as MISSING, never as 0."""
import json

from evaluate.analysis.significance import Verdict, on_its_side

MISSING = "—"
# Units by metric name, most specific first; a name none of them matches is
# shown without a unit rather than with a made-up one.
UNITS = (("perplexity", "ppl"), ("kl_divergence", "nats"), ("_pct", "%"), ("accuracy", "fraction"),
         ("agreement", "fraction"), ("request_throughput", "req/s"), ("_gb_s", "GB/s"), ("_ms", "ms"), ("_mb", "MB"),
         ("_bytes", "bytes"), ("throughput", "tok/s"), ("tokens", "tokens"), ("top_k", "tokens"),
         ("windows", "count"), ("items", "count"), ("num_", "count"))


# The one table of what each metric is called in the report (Markdown and
# HTML headers), in the order tables and CSVs show them; summary.csv and
# runs.csv name their columns by these keys in this order. A key not here
# gets its name in words and the unit UNITS gives it.
LABELS = {
    "output_throughput": "Output throughput",
    "total_token_throughput": "Total token throughput",
    "input_throughput": "Input (prefill) throughput",
    "latency_s": "Latency",
    **{f"{m}_ms_{s}": f"{m.upper()} {s}" for m in ("ttft", "tpot", "itl") for s in ("mean", "p50", "p90", "p99")},
    "peak_memory_bytes": "Peak host memory",
    "peak_memory_mb": "Peak host memory",
    "peak_gpu_memory_bytes": "GPU in use, whole device",
    "peak_gpu_memory_mb": "GPU in use, whole device",
    "size_mb": "Model size",
    "weight_bandwidth_gb_s": "Weight bandwidth",
    "recovery_pct": "Accuracy recovery",
    "perplexity": "Perplexity",
    "kl_divergence": "KL divergence",
    "top1_agreement": "Top-1 agreement",
    "lastword_recovery_pct": "Last-word recovery",
    "lastword_accuracy": "Last-word accuracy",
    "reference_perplexity": "Reference perplexity",
    "reference_lastword_accuracy": "Reference last-word accuracy",
    "scored_tokens": "Scored tokens",
    "lastword_items": "Last-word items",
    "windows": "Windows",
    "top_k": "Top-k logprobs",
}


def unit(metric: str) -> str | None:
    for marker, u in UNITS:
        if marker in metric:
            return u
    return "s" if metric.endswith("_s") else None


def label(metric: str) -> str:
    """The metric in words: from LABELS, else its key with spaces."""
    return LABELS.get(metric) or metric.replace("_", " ").capitalize()


def header(metric: str) -> str:
    """A table header: the metric in words and its unit; raw keys stay in the CSVs."""
    u = unit(metric)
    return f"{label(metric)} ({u})" if u else label(metric)


def ordered_metrics(keys) -> list[str]:
    """The keys in LABELS' order, any other after them by name."""
    keys = set(keys)
    return [k for k in LABELS if k in keys] + sorted(keys - set(LABELS))


def short(artifact_id: str | None) -> str:
    return (artifact_id or "?")[:8]


def fmt_fixed(x: float | None, digits: int = 2) -> str:
    return MISSING if x is None else f"{x:.{digits}f}"


def fmt_number(x: float | None) -> str:
    """Accuracy numbers span 0.001 (KL) to 100 (%): four significant digits."""
    return MISSING if x is None else (f"{x:.4g}" if abs(x) < 1e4 else f"{x:.0f}")


def mb(nbytes) -> float | None:
    return nbytes / 1e6 if isinstance(nbytes, (int, float)) else None


def gb(nbytes) -> float | None:
    return nbytes / 1e9 if isinstance(nbytes, (int, float)) else None


def speedup_text(x: float | None) -> str:
    return MISSING if x is None else f"{on_its_side(x, 1.0)}x"


def interval_text(ci: tuple[float, float] | None) -> str:
    """A ratio's interval, each bound on its side of 1 as the verdict reads it (on_its_side)."""
    return MISSING if ci is None else f"{on_its_side(ci[0], 1.0)}–{on_its_side(ci[1], 1.0)}"


def speed_verdict(verdict: Verdict) -> str:
    """The significance rule's verdict on a ratio of speeds, in words."""
    return {Verdict.HIGHER: "faster", Verdict.LOWER: "slower"}.get(verdict, verdict.value)


def inline_json(obj) -> str:
    """`obj` as one line of JSON in Markdown code."""
    return f"`{json.dumps(obj, sort_keys=True, default=str)}`"


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; `|` and newlines inside a cell are escaped."""
    def cell(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(map(cell, headers)) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(map(cell, r)) + " |" for r in rows]
    return "\n".join(lines)
