"""One load level as run (requests.LevelRun) -> the metrics of its serving row.

The keys and rules of `vllm bench serve`'s JSON (vllm/benchmarks/serve.py,
`calculate_metrics`), so a row and that tool's output can be compared key by
key:
- completed / failed: requests that streamed at least one token and ended /
  the others (count).
- duration: the level's wall time, LevelRun.end - LevelRun.start (s).
- total_input_tokens / total_output_tokens: prompt and generated tokens of
  the completed requests, from the server's `usage` (tokens). A completed
  request without a usage count counts one token per streamed chunk.
- request_throughput: completed / duration (req/s).
- request_goodput: completed requests that meet every SLO bound (below) /
  duration (req/s); None without an SLO, as vllm bench serve without --goodput.
- output_throughput: total_output_tokens / duration; total_token_throughput:
  (total_input_tokens + total_output_tokens) / duration (tok/s).
- ttft_ms: first streamed token - sent, per completed request.
- tpot_ms: (e2el - ttft) / (output tokens - 1), per completed request with at
  least 2 output tokens.
- itl_ms: gaps between successive streamed chunks, pooled over requests.
- e2el_ms: last token chunk - sent, per completed request (vllm bench's
  client ends there; the usage chunk and [DONE] follow it).
  For each: mean_, median_, std_ (population std, ddof 0) and p50_, p90_, p99_
  (numpy's linear-interpolation percentile; plus the SLO's percentile, e.g.
  p95_), in ms. With no values at all they are 0, as in vllm bench serve.
- max_concurrent_requests / max_output_tokens_per_s: the peak, over the
  level's 1-second buckets from the first send, of completed requests in
  flight (a request counts in every bucket from its send to its last token) and of
  tokens streamed.

Goodput rule (per request, vLLM's): a completed request is good when its
TTFT, its TPOT (0 when it generated one token) and its E2EL are each ≤ the
SLO's bound, for the bounds the SLO sets. The SLO's percentile plays no part
here; it applies to the level's verdict (slo.judge).

Added by quantbench:
- slo_attainment: good requests / all requests sent, failed ones counting as
  misses (fraction), with slo_attainment_low / _high its 95% Wilson score
  interval; None without an SLO or without requests.
- slo_<metric>_misses / slo_<metric>_bound_ms, per bound the SLO sets: the
  requests sent that missed that bound, failed ones counting as misses
  (count), and the bound (ms). slo.judge fails a level where they are more
  than (100 - p) % of the requests sent; the pNN above counts completed
  requests only.
- offered_rate: the arrival rate asked for (req/s; rate mode only, else None);
  achieved_rate_ratio: request_throughput / offered_rate (fraction). The last
  requests' service time is in the duration too, so a short level reads a
  little under 1 while the server keeps up; well under 1 means it did not.
- send_lag_ms_mean / send_lag_ms_p99: how late the client sent each request
  against its arrival schedule (ms; open loop only, else None): the client's
  own queueing, kept out of TTFT.
- client_cpu_pct: CPU time of the client process during the level / duration
  × 100 (% of one core; None when not measured).
- server_peak_memory_bytes: the server process tree's peak RSS (bytes), as
  the load generator measured it.
- off_length_outputs: completed requests that generated other than the
  scenario's output_len tokens (count; None when the run does not say what
  it asked for).
- valid (bool) / valid_reason: false when the level did not measure the
  scenario: its requests generated other than output_len tokens
  (off_length_outputs > 0: a server that ignores ignore_eos / min_tokens
  stops at EOS, so its E2EL and tok/s are not of that output length); or the
  client, not the server, set the pace, so the level measured the client:
  * client_cpu_pct ≥ CLIENT_CPU_MAX_PCT (90 % of one core): the client's
    event loop was saturated;
  * open loop: send_lag_ms_p99 > SEND_LAG_MAX_FRACTION (0.5) × the mean
    inter-arrival time (1000 / offered_rate ms): the client could not keep
    to its schedule.
"""
import math

import numpy as np

from evaluate.serving.requests import LevelRun, RequestResult
from evaluate.serving.slo import SLO

PERCENTILES = (50, 90, 99)
STATS = ("ttft", "tpot", "itl", "e2el")
CLIENT_CPU_MAX_PCT = 90.0
SEND_LAG_MAX_FRACTION = 0.5
WILSON_Z = 1.959964  # two-sided 95%


def request_values(r: RequestResult) -> dict[str, float]:
    """A completed request's ttft, tpot (None below 2 tokens) and e2el, in s."""
    return {"ttft": r.ttft_s, "tpot": r.tpot_s, "e2el": r.e2el_s}


def is_good(values: dict[str, float], limits_ms: dict[str, float]) -> bool:
    """vLLM's goodput rule; a request of one token has TPOT 0."""
    return all((values[m] or 0.0) * 1000 <= bound for m, bound in limits_ms.items())


def stats(name: str, values_s: list[float], percentiles) -> dict:
    arr = np.asarray(values_s if values_s else [0.0], dtype=float) * 1000
    out = {f"mean_{name}_ms": float(arr.mean()), f"median_{name}_ms": float(np.median(arr)),
           f"std_{name}_ms": float(arr.std())}
    for p in percentiles:
        out[f"p{int(p) if p == int(p) else p}_{name}_ms"] = float(np.percentile(arr, p))
    return out


def wilson(successes: int, n: int, z: float = WILSON_Z) -> tuple[float, float] | None:
    """95% Wilson score interval of a proportion; None when n = 0."""
    if n <= 0:
        return None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def peaks(done: list[RequestResult]) -> tuple[int, float]:
    """(max_concurrent_requests, max_output_tokens_per_s) over 1-s buckets from the first send."""
    if not done:
        return 0, 0.0
    t0 = min(r.sent for r in done)
    buckets = int(math.ceil(max(r.last_token for r in done) - t0)) + 1
    tokens, active = np.zeros(buckets), np.zeros(buckets)
    for r in done:
        for t in r.chunk_times:
            if 0 <= int(t - t0) < buckets:
                tokens[int(t - t0)] += 1
        active[int(r.sent - t0):int(r.last_token - t0) + 1] += 1
    return int(active.max()), float(tokens.max())


def level_metrics(run: LevelRun, slo: SLO | None = None) -> dict:
    """The metrics of one level (rules and units in the module docstring)."""
    done = [r for r in run.results if r.success]
    dur = run.duration_s

    def per_s(x):  # a rate over the level; None for a level that took no time
        return x / dur if x is not None and dur > 0 else None
    per = [request_values(r) for r in done]
    inp, out = sum(r.prompt_tokens for r in done), sum(r.generated_tokens for r in done)
    limits = slo.limits() if slo else {}
    good = sum(is_good(v, limits) for v in per) if limits else None
    percentiles = sorted(set(PERCENTILES) | ({float(slo.percentile)} if slo else set()))
    max_conc, max_tok = peaks(done)
    m = {"completed": len(done), "failed": len(run.results) - len(done), "duration": dur,
         "total_input_tokens": inp, "total_output_tokens": out,
         "request_throughput": per_s(len(done)), "request_goodput": per_s(good),
         "output_throughput": per_s(out), "total_token_throughput": per_s(inp + out),
         "max_concurrent_requests": max_conc, "max_output_tokens_per_s": max_tok}
    m |= stats("ttft", [v["ttft"] for v in per], percentiles)
    m |= stats("tpot", [v["tpot"] for v in per if v["tpot"] is not None], percentiles)
    m |= stats("itl", [x for r in done for x in r.itl_s], percentiles)
    m |= stats("e2el", [v["e2el"] for v in per], percentiles)
    sent = len(run.results)
    ci = wilson(good, sent) if limits else None
    m |= {"slo_attainment": good / sent if limits and sent else None,
          "slo_attainment_low": ci[0] if ci else None, "slo_attainment_high": ci[1] if ci else None}
    m |= slo_misses(run.results, limits)
    offered = float(run.level) if run.mode == "rate" and run.level else None
    achieved = m["request_throughput"]
    m |= {"offered_rate": offered,
          "achieved_rate_ratio": achieved / offered if offered and achieved is not None else None}
    lags = [r.send_lag_s * 1000 for r in run.results if r.send_lag_s is not None]
    m |= {"send_lag_ms_mean": float(np.mean(lags)) if lags else None,
          "send_lag_ms_p99": float(np.percentile(lags, 99)) if lags else None,
          "client_cpu_pct": per_s(100 * run.client_cpu_s if run.client_cpu_s is not None else None),
          "server_peak_memory_bytes": run.server_peak_memory_bytes}
    off = [r.generated_tokens for r in done if r.generated_tokens != run.output_len]
    m["off_length_outputs"] = len(off) if run.output_len is not None else None
    m["valid_reason"] = off_length(off, len(done), run.output_len) or client_bound(m)
    m["valid"] = m["valid_reason"] is None
    return m


def slo_misses(results: list[RequestResult], limits_ms: dict[str, float]) -> dict:
    """Per SLO bound: the requests sent that missed it, failed ones included
    (slo_<metric>_misses), and the bound they were counted against (ms)."""
    out = {}
    for metric, bound in limits_ms.items():
        missed = sum(not r.success or (request_values(r)[metric] or 0.0) * 1000 > bound for r in results)
        out |= {f"slo_{metric}_misses": missed, f"slo_{metric}_bound_ms": bound}
    return out


def off_length(off: list[int], completed: int, output_len: int | None) -> str | None:
    """Why the level's requests are not of the scenario's output length; None when they all are."""
    if output_len is None or not off:
        return None
    return (f"{len(off)} of {completed} completed requests generated {off[0]} tokens, not output_len "
            f"{output_len}: the server ignores ignore_eos/min_tokens")


def client_bound(m: dict) -> str | None:
    """Why the client, not the server, set the pace of this level; None when it did not."""
    cpu = m.get("client_cpu_pct")
    if cpu is not None and cpu >= CLIENT_CPU_MAX_PCT:
        return f"client CPU {cpu:.0f} % of one core ≥ {CLIENT_CPU_MAX_PCT:g} %"
    lag, rate = m.get("send_lag_ms_p99"), m.get("offered_rate")
    if lag is not None and rate:
        gap = 1000 / rate
        if lag > SEND_LAG_MAX_FRACTION * gap:
            return (f"send lag p99 {lag:.1f} ms > {SEND_LAG_MAX_FRACTION:g} × the mean inter-arrival time "
                    f"{gap:.1f} ms")
    return None
