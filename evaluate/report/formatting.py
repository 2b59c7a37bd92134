"""Units and number formatting shared by every output of the report. A
metric that was not measured prints as MISSING, never as 0."""
import json

MISSING = "—"
# Units by metric name, most specific first; a name none of them matches is
# shown without a unit rather than with a made-up one.
UNITS = (("perplexity", "ppl"), ("kl_divergence", "nats"), ("_pct", "%"), ("accuracy", "fraction"),
         ("agreement", "fraction"), ("request_throughput", "req/s"), ("_gb_s", "GB/s"), ("_ms", "ms"),
         ("_bytes", "bytes"), ("throughput", "tok/s"), ("tokens", "tokens"), ("top_k", "tokens"),
         ("windows", "count"), ("items", "count"), ("num_", "count"))


def unit(metric: str) -> str | None:
    for marker, u in UNITS:
        if marker in metric:
            return u
    return "s" if metric.endswith("_s") else None


def header(metric: str) -> str:
    u = unit(metric)
    return f"{metric} ({u})" if u else metric


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
    return MISSING if x is None else f"{x:.2f}x"


def interval_text(ci: tuple[float, float] | None) -> str:
    return MISSING if ci is None else f"{ci[0]:.2f}–{ci[1]:.2f}"


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
