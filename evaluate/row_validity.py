"""Rows that cannot be true, found as a store is read (results.read_store):
every reader leaves them out, so they are never aggregated, ranked or taken
as measured (evaluate measures their runs anew), and the report lists them
under "Rejected rows" with why.

Only `ok` rows carry a measurement, so only they are checked:
- what every reader relies on: the artifact it measured and its metrics;
- a measured quantity (a time, a token or byte count, a rate) is a finite
  number >= 0;
- a throughput is at most what the row's own tokens allow in its own time:
  output_throughput <= output tokens / latency_s (the tokens as counted,
  else batch_size x output_len, the most a run may generate), and alike
  for total tokens and requests; serving rows over their `duration`.
Rows that record no time are not bounded: rows of the first stores record
throughput alone."""
import math
import re

# Relative slack on a bound: the recorded numbers are computed from the same
# counts and times, so a true row meets its bound exactly.
TOLERANCE = 0.01
QUANTITY = re.compile(r"throughput|goodput|_per_s$|tokens|_bytes$|^latency_s$|^duration$|(^|_)(ttft|tpot|itl|e2el)_")


def why_rejected(data: dict) -> str | None:
    """Why the row `data` (as read, a dict) cannot be true; None when it can
    or when it is not an ok row."""
    if data.get("status") != "ok":
        return None
    if not data.get("artifact_id"):
        return "an ok row without artifact_id: which artifact it measured is unknown"
    metrics = data.get("metrics")
    if not metrics:
        return "an ok row without metrics: it records no measurement"
    if not isinstance(metrics, dict):
        return f"its metrics are a {type(metrics).__name__}, not a mapping of names to values"
    if data.get("kind") not in ("speed", "serving"):
        return None
    return impossible_quantity(metrics) or above_bound(data, metrics)


def impossible_quantity(metrics: dict) -> str | None:
    for name, value in metrics.items():
        if not QUANTITY.search(name) or _number(value) is None:
            continue
        if not math.isfinite(value):
            return f"{name} is {value}, not a finite number"
        if value < 0:
            return f"{name} is {value:g}, but a measured quantity cannot be negative"
    return None


def above_bound(data: dict, metrics: dict) -> str | None:
    """The first throughput above what the row's tokens (or requests) allow in its time."""
    seconds, time_name = _time(data, metrics)
    if not seconds:
        return None
    for rate, amount, what in _amounts(data, metrics):
        value = _number(metrics.get(rate))
        if value is not None and amount is not None and value > amount / seconds * (1 + TOLERANCE):
            return (f"{rate} {value:.6g} is above what {amount:g} {what} in {time_name} {seconds:.6g} s "
                    f"allow ({amount / seconds:.6g}/s)")
    return None


def _time(data: dict, metrics: dict) -> tuple[float | None, str]:
    name = "duration" if data.get("kind") == "serving" else "latency_s"
    seconds = _number(metrics.get(name))
    return (seconds if seconds and seconds > 0 else None), name


def _amounts(data: dict, metrics: dict) -> list[tuple[str, float | None, str]]:
    """(throughput metric, the most it may count, what it counts) for the row's kind."""
    if data.get("kind") == "serving":
        out, inp = _number(metrics.get("total_output_tokens")), _number(metrics.get("total_input_tokens"))
        return [("output_throughput", out, "output tokens"), ("total_token_throughput", _sum(out, inp), "tokens"),
                ("request_throughput", _number(metrics.get("completed")), "requests")]
    batch, in_len, out_len = (_number(data.get(k)) for k in ("batch_size", "input_len", "output_len"))
    out, inp = _number(metrics.get("output_tokens")), _number(metrics.get("prompt_tokens"))
    most_out = out if out is not None else _product(batch, out_len)
    most_total = _sum(out, inp) if None not in (out, inp) else _product(batch, _sum(in_len, out_len))
    requests = _number(metrics.get("num_requests"))
    return [("output_throughput", most_out, "output tokens"), ("total_token_throughput", most_total, "tokens"),
            ("request_throughput", batch if requests is None else requests, "requests")]


def _number(value) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _sum(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _product(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a * b
