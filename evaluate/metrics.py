"""Per-run speed metrics from per-request token timestamps.

Names follow `vllm bench`; units are in the names (ms, _s, tok/s for
*_throughput). Definitions:
- latency_s: from submitting the batch to the last token of the last request.
- output_throughput: generated tokens / latency_s.
- total_token_throughput: (prompt + generated tokens) / latency_s.
- input_throughput: prompt tokens / time until every request has its first
  token (the prefill phase of the batch).
- ttft_ms: submit -> first token, per request.
- tpot_ms: (last token - first token) / (generated tokens - 1), per request.
- itl_ms: gaps between successive token arrivals, pooled over requests.
- weight_bandwidth_gb_s: weight bytes / mean TPOT: each decode step reads every
  weight once, so this is the memory bandwidth the decode phase achieved.
"""
import math
from dataclasses import dataclass, field

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass
class RequestTiming:
    start: float                 # submit time (perf_counter seconds)
    prompt_tokens: int
    # (arrival time, tokens in this chunk) for every streamed output chunk
    chunks: list[tuple[float, int]] = field(default_factory=list)

    @property
    def output_tokens(self) -> int:
        return sum(n for _, n in self.chunks)

    @property
    def ttft_s(self) -> float:
        return self.chunks[0][0] - self.start

    @property
    def tpot_s(self) -> float | None:
        """None unless the tokens after the first arrived in later chunks (a
        non-streamed request delivers them all at once)."""
        n = self.output_tokens
        return (self.chunks[-1][0] - self.chunks[0][0]) / (n - 1) if n > 1 and len(self.chunks) > 1 else None

    def itl_s(self) -> list[float]:
        times = [t for t, _ in self.chunks]
        return list(np.diff(times)) if len(times) > 1 else []


def summarize(requests: list[RequestTiming], batch_start: float, weight_bytes: int) -> dict:
    if not requests or any(not r.chunks for r in requests):
        raise RuntimeError("a request produced no tokens")
    end = max(r.chunks[-1][0] for r in requests)
    latency = end - batch_start
    prompt = sum(r.prompt_tokens for r in requests)
    output = sum(r.output_tokens for r in requests)
    prefill_s = max(r.chunks[0][0] for r in requests) - batch_start
    out = {
        "latency_s": latency,
        "num_requests": len(requests),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "request_throughput": len(requests) / latency,
        "output_throughput": output / latency,
        "total_token_throughput": (prompt + output) / latency,
        "input_throughput": prompt / prefill_s,
    }
    out |= _stats("ttft_ms", [r.ttft_s * 1e3 for r in requests])
    tpots = [r.tpot_s * 1e3 for r in requests if r.tpot_s is not None]
    out |= _stats("tpot_ms", tpots)
    out |= _stats("itl_ms", [x * 1e3 for r in requests for x in r.itl_s()])
    if tpots:
        out["weight_bandwidth_gb_s"] = weight_bytes / (out["tpot_ms_mean"] / 1e3) / 1e9
    return out


def _stats(name: str, values: list[float]) -> dict:
    if not values:
        return {}
    arr = np.asarray(values, dtype=float)
    out = {f"{name}_mean": float(arr.mean())}
    for p in PERCENTILES:
        out[f"{name}_p{p}"] = float(np.percentile(arr, p))
    return out


# Two-sided 95% Student t quantiles by degrees of freedom (no scipy in the env);
# between listed values the next lower df is used (conservative), above 120: 1.96.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
       10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.0, 120: 1.98}


def t95(df: float) -> float:
    if df > 120:
        return 1.96
    return next((T95[k] for k in sorted(T95, reverse=True) if k <= df), T95[1])


def mean_interval(values: list[float]) -> tuple[float, float, float] | None:
    """(mean, low, high): the 95% confidence interval of the mean; None with
    fewer than two values."""
    if len(values) < 2:
        return None
    arr = np.asarray(values, dtype=float)
    mean, half = arr.mean(), t95(len(arr) - 1) * arr.std(ddof=1) / len(arr) ** 0.5
    return float(mean), float(mean - half), float(mean + half)


def median_interval(values: list[float]) -> tuple[float, float, float] | None:
    """(median, low, high): a distribution-free 95% interval of the median,
    from order statistics (the ranks k and n+1-k that cover it with
    probability 1 - 2 P(Binomial(n, 1/2) < k) >= 95%). One outlying value
    cannot widen it, unlike the mean's. None with fewer than six values."""
    x, n = sorted(values), len(values)
    k, below = 0, 0.0  # k: the largest rank with P(B <= k - 1) <= 2.5%
    while below + math.comb(n, k) / 2 ** n <= 0.025:
        below += math.comb(n, k) / 2 ** n
        k += 1
    if k == 0:
        return None
    return float(np.median(x)), float(x[k - 1]), float(x[n - k])
