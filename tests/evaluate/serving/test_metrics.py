"""evaluate/serving/metrics.py: level_metrics against hand-computed values and
against vLLM's own calculate_metrics on the same requests; goodput, the SLO
attainment and its Wilson interval, validity."""
import math

import numpy as np
import pytest

from evaluate.serving.metrics import CLIENT_CPU_MAX_PCT, level_metrics, wilson
from evaluate.serving.requests import LevelRun
from evaluate.serving.slo import SLO

from .requests_fixture import request, three_requests


def test_counts_throughputs_and_latencies_by_hand():
    m = level_metrics(three_requests())
    assert (m["completed"], m["failed"], m["duration"]) == (2, 1, 4.0)
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (30, 6)
    assert m["request_throughput"] == pytest.approx(2 / 4)
    assert m["output_throughput"] == pytest.approx(6 / 4)
    assert m["total_token_throughput"] == pytest.approx(36 / 4)
    assert m["mean_ttft_ms"] == pytest.approx(750) and m["median_ttft_ms"] == pytest.approx(750)
    assert m["std_ttft_ms"] == pytest.approx(250)                      # population std of 500, 1000
    assert m["p90_ttft_ms"] == pytest.approx(500 + 0.9 * 500)          # linear interpolation
    assert m["mean_tpot_ms"] == pytest.approx(250)                     # (100 + 400) / 2
    assert m["mean_e2el_ms"] == pytest.approx(1100) and m["p99_e2el_ms"] == pytest.approx(800 + 0.99 * 600)
    assert m["mean_itl_ms"] == pytest.approx(175)                      # 100, 100, 100, 400 pooled
    assert m["median_itl_ms"] == pytest.approx(100)
    assert m["max_concurrent_requests"] == 1                            # r1 in second 0, r2 in seconds 1-2
    assert m["max_output_tokens_per_s"] == 4                            # r1's 4 tokens all in second 0
    assert m["request_goodput"] is None and m["slo_attainment"] is None  # no SLO
    assert m["offered_rate"] is None and m["achieved_rate_ratio"] is None and m["send_lag_ms_p99"] is None
    assert m["client_cpu_pct"] == pytest.approx(10.0)
    assert m["server_peak_memory_bytes"] == 123_000_000
    assert m["valid"] is True and m["valid_reason"] is None
    for key in ("mean", "median", "std", "p50", "p90", "p99"):
        for metric in ("ttft", "tpot", "itl", "e2el"):
            assert f"{key}_{metric}_ms" in m


def test_goodput_is_per_request_and_attainment_counts_failures_as_misses():
    slo = SLO(ttft_ms=600, tpot_ms=200, percentile=90)   # r1 meets both; r2 misses TTFT; r3 failed
    m = level_metrics(three_requests(), slo)
    assert m["request_goodput"] == pytest.approx(1 / 4)
    assert m["slo_attainment"] == pytest.approx(1 / 3)
    low, high = wilson(1, 3)
    assert (m["slo_attainment_low"], m["slo_attainment_high"]) == pytest.approx((low, high))
    assert SLO(tpot_ms=1000).limits() == {"tpot": 1000}
    assert level_metrics(three_requests(), SLO(e2el_ms=10_000))["slo_attainment"] == pytest.approx(2 / 3)


def test_misses_per_bound_count_failed_requests():
    m = level_metrics(three_requests(), SLO(ttft_ms=600, tpot_ms=300))  # r2: TTFT 1000 ms, TPOT 400 ms; r3 failed
    assert (m["slo_ttft_misses"], m["slo_ttft_bound_ms"]) == (2, 600.0)
    assert (m["slo_tpot_misses"], m["slo_tpot_bound_ms"]) == (2, 300.0)
    m = level_metrics(three_requests(), SLO(tpot_ms=500))                 # r3 only
    assert m["slo_tpot_misses"] == 1 and "slo_ttft_misses" not in m and "slo_e2el_misses" not in m
    assert not any(k.startswith("slo_") and k.endswith("misses") for k in level_metrics(three_requests()))


def test_one_token_request_has_tpot_zero_for_goodput_and_none_in_stats():
    run = LevelRun(mode="synchronous", level=None, start=0, end=2,
                   results=[request(0.0, 0.3, [], tokens=1), request(1.0, 0.2, [0.05])])
    m = level_metrics(run, SLO(tpot_ms=10))
    assert m["request_goodput"] == pytest.approx(1 / 2)       # the 1-token request is good, the other (50 ms) not
    assert m["mean_tpot_ms"] == pytest.approx(50)             # only the 2-token request has a TPOT


def test_the_slo_percentile_is_added_to_the_keys():
    m = level_metrics(three_requests(), SLO(ttft_ms=1, percentile=95))
    assert m["p95_ttft_ms"] == pytest.approx(500 + 0.95 * 500)
    assert "p99.9_e2el_ms" in level_metrics(three_requests(), SLO(ttft_ms=1, percentile=99.9))


def test_wilson_interval():
    assert wilson(0, 0) is None
    low, high = wilson(8, 10)
    # the textbook 95% Wilson interval of 8/10
    assert (low, high) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert wilson(10, 10)[1] == pytest.approx(1.0) and wilson(0, 10)[0] == pytest.approx(0.0)
    assert wilson(10, 10)[0] == pytest.approx(0.7225, abs=1e-4)


def rate_level(lag_s: float, rate: float = 10.0, cpu_s: float | None = 0.1) -> LevelRun:
    gap = 1 / rate
    results = [request(i * gap + lag_s, 0.05, [0.01], scheduled=i * gap) for i in range(20)]
    return LevelRun(mode="rate", level=rate, start=0.0, end=2.5, results=results, client_cpu_s=cpu_s)


def test_rate_mode_offered_achieved_and_send_lag():
    m = level_metrics(rate_level(0.002))
    assert m["offered_rate"] == 10.0
    assert m["achieved_rate_ratio"] == pytest.approx(20 / 2.5 / 10)
    assert m["send_lag_ms_mean"] == pytest.approx(2.0) and m["send_lag_ms_p99"] == pytest.approx(2.0)
    assert m["valid"] is True


def test_a_client_that_cannot_keep_its_schedule_makes_the_level_invalid():
    m = level_metrics(rate_level(0.06))          # 60 ms late at a 100 ms mean inter-arrival time
    assert m["valid"] is False and "send lag p99 60.0 ms > 0.5 × the mean inter-arrival time 100.0 ms" \
        in m["valid_reason"]


def test_a_saturated_client_cpu_makes_the_level_invalid():
    m = level_metrics(rate_level(0.0, cpu_s=2.5 * CLIENT_CPU_MAX_PCT / 100))
    assert m["valid"] is False and m["valid_reason"].startswith("client CPU 90 % of one core")
    assert level_metrics(rate_level(0.0, cpu_s=None))["client_cpu_pct"] is None


def test_an_empty_or_all_failed_level():
    run = LevelRun(mode="concurrency", level=4, start=0, end=1, results=[request(0, 0, [], error="refused")] * 3)
    m = level_metrics(run, SLO(ttft_ms=100))
    assert (m["completed"], m["failed"], m["request_throughput"], m["request_goodput"]) == (0, 3, 0, 0)
    assert m["slo_attainment"] == 0 and m["slo_attainment_high"] < 0.6
    assert m["mean_ttft_ms"] == 0 and m["max_concurrent_requests"] == 0   # as vllm bench serve writes them
    m = level_metrics(LevelRun(mode="concurrency", level=1, start=5, end=5), SLO(ttft_ms=100))
    assert m["request_throughput"] is None and m["slo_attainment"] is None


def test_latencies_end_at_the_last_token_not_at_done():
    """vllm bench's client ends a request at its last token chunk: the usage
    chunk and [DONE] a server sends after it are not generation time."""
    late = LevelRun(mode="concurrency", level=1, start=0.0, end=3.0,
                    results=[request(0.0, 0.5, [0.1, 0.1, 0.1], done_after=2.0)])
    m = level_metrics(late)
    assert m["mean_e2el_ms"] == pytest.approx(800) and m["mean_tpot_ms"] == pytest.approx(100)
    assert m["max_concurrent_requests"] == 1


# --- fidelity: vLLM's own calculate_metrics on the same requests -----------------------------------------

def vllm_outputs(run: LevelRun):
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
    out = []
    for r in run.results:
        if not r.success:
            out.append(RequestFuncOutput(success=False, error=r.error or "", prompt_len=r.prompt_tokens,
                                         start_time=r.sent))
            continue
        out.append(RequestFuncOutput(success=True, latency=r.chunk_times[-1] - r.sent, output_tokens=r.output_tokens,
                                     ttft=r.chunk_times[0] - r.sent, itl=r.itl_s, prompt_len=r.prompt_tokens,
                                     start_time=r.sent))
    return out


def random_level(seed: int, n: int = 60) -> LevelRun:
    rng = np.random.default_rng(seed)
    results, t = [], 0.0
    for i in range(n):
        t += rng.exponential(0.2)
        if i % 17 == 5:
            results.append(request(t, 0, [], error="HTTP 503"))
            continue
        tokens = int(rng.integers(1, 40))
        results.append(request(t, float(rng.uniform(0.05, 2.0)), list(rng.uniform(0.005, 0.15, tokens - 1)),
                               prompt=int(rng.integers(16, 512)), done_after=float(rng.uniform(0, 0.05))))
    end = max(r.end for r in results if r.success) + 0.01
    return LevelRun(mode="concurrency", level=8, start=0.0, end=end, results=results)


@pytest.mark.needs_vllm
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_same_numbers_as_vllm_calculate_metrics(seed):
    from vllm.benchmarks import serve
    run = random_level(seed)
    slo = SLO(ttft_ms=1500, tpot_ms=100, e2el_ms=3000, percentile=90)
    ours = level_metrics(run, slo)
    theirs, lens = serve.calculate_metrics(input_requests=[], outputs=vllm_outputs(run), dur_s=run.duration_s,
                                           tokenizer=None, selected_percentiles=[50, 90, 99],
                                           goodput_config_dict=slo.limits())
    assert ours["completed"] == theirs.completed and ours["failed"] == theirs.failed > 0
    assert ours["total_input_tokens"] == theirs.total_input and ours["total_output_tokens"] == theirs.total_output
    for key in ("request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                "max_concurrent_requests", "max_output_tokens_per_s"):
        assert ours[key] == pytest.approx(getattr(theirs, key), rel=1e-12), key
    assert 0 < theirs.request_goodput < theirs.request_throughput    # the SLO splits the requests
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std"):
            key = f"{stat}_{metric}_ms"
            assert ours[key] == pytest.approx(getattr(theirs, key), rel=1e-12), key
        for p, value in getattr(theirs, f"percentiles_{metric}_ms"):
            assert ours[f"p{int(p)}_{metric}_ms"] == pytest.approx(value, rel=1e-12), (metric, p)
    assert math.isclose(ours["slo_attainment"] * len(run.results), theirs.request_goodput * run.duration_s)
