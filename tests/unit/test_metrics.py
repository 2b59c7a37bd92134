"""evaluate/metrics.py: per-run speed metrics from hand-built token timestamps."""
import pytest

from evaluate.metrics import RequestTiming, summarize

T0 = 100.0  # batch submit time (perf_counter seconds)
WEIGHT_BYTES = 2_000_000_000


def two_requests() -> list[RequestTiming]:
    # r1: first token 0.5 s after submit, then 1 and 2 tokens 0.2 s apart (4 tokens)
    r1 = RequestTiming(start=T0, prompt_tokens=10, chunks=[(T0 + 0.5, 1), (T0 + 0.7, 1), (T0 + 0.9, 2)])
    # r2: first token at 1.0 s, second at 1.5 s: the batch's last token
    r2 = RequestTiming(start=T0, prompt_tokens=20, chunks=[(T0 + 1.0, 1), (T0 + 1.5, 1)])
    return [r1, r2]


def test_per_request_timings():
    r1, r2 = two_requests()
    assert r1.output_tokens == 4 and r2.output_tokens == 2
    assert r1.ttft_s == pytest.approx(0.5) and r2.ttft_s == pytest.approx(1.0)
    assert r1.tpot_s == pytest.approx(0.4 / 3)  # (last - first) / (tokens - 1)
    assert r2.tpot_s == pytest.approx(0.5)
    assert r1.itl_s() == pytest.approx([0.2, 0.2]) and r2.itl_s() == pytest.approx([0.5])


def test_summarize_throughputs_and_latency():
    m = summarize(two_requests(), T0, WEIGHT_BYTES)
    assert m["latency_s"] == pytest.approx(1.5)  # submit -> last token of the last request
    assert m["num_requests"] == 2 and m["prompt_tokens"] == 30 and m["output_tokens"] == 6
    assert m["request_throughput"] == pytest.approx(2 / 1.5)
    assert m["output_throughput"] == pytest.approx(6 / 1.5)
    assert m["total_token_throughput"] == pytest.approx((30 + 6) / 1.5)
    # prefill: until every request has its first token (1.0 s)
    assert m["input_throughput"] == pytest.approx(30 / 1.0)


def test_summarize_ttft_tpot_itl_statistics():
    m = summarize(two_requests(), T0, WEIGHT_BYTES)
    assert m["ttft_ms_mean"] == pytest.approx(750)
    assert m["ttft_ms_p50"] == pytest.approx(750)
    assert m["ttft_ms_p99"] == pytest.approx(500 + 0.99 * 500)  # linear interpolation between 500 and 1000
    tpot_mean = (400 / 3 + 500) / 2
    assert m["tpot_ms_mean"] == pytest.approx(tpot_mean)
    # ITL is pooled over requests: gaps 200, 200, 500 ms
    assert m["itl_ms_mean"] == pytest.approx(300)
    assert m["itl_ms_p50"] == pytest.approx(200)
    assert m["itl_ms_p90"] == pytest.approx(200 + 0.8 * 300)
    assert m["weight_bandwidth_gb_s"] == pytest.approx(WEIGHT_BYTES / (tpot_mean / 1e3) / 1e9)


def test_single_chunk_request_has_no_tpot():
    """A request whose tokens all arrived in one chunk (not streamed) has no
    TPOT: it neither reports one nor enters the batch's TPOT statistics."""
    one_chunk = RequestTiming(start=T0, prompt_tokens=8, chunks=[(T0 + 2.0, 16)])
    one_token = RequestTiming(start=T0, prompt_tokens=8, chunks=[(T0 + 0.3, 1)])
    assert one_chunk.tpot_s is None and one_token.tpot_s is None
    m = summarize([one_chunk], T0, WEIGHT_BYTES)
    assert m["output_tokens"] == 16 and m["output_throughput"] == pytest.approx(16 / 2.0)
    assert m["ttft_ms_mean"] == pytest.approx(2000)
    assert not any(k.startswith(("tpot_ms", "itl_ms")) for k in m) and "weight_bandwidth_gb_s" not in m

    mixed = summarize([one_chunk, *two_requests()], T0, WEIGHT_BYTES)
    assert mixed["tpot_ms_mean"] == pytest.approx((400 / 3 + 500) / 2)  # the streamed requests only
    assert mixed["output_tokens"] == 16 + 6


def test_a_request_without_tokens_is_an_error():
    with pytest.raises(RuntimeError, match="no tokens"):
        summarize([RequestTiming(start=T0, prompt_tokens=4)], T0, WEIGHT_BYTES)
    with pytest.raises(RuntimeError):
        summarize([], T0, WEIGHT_BYTES)
