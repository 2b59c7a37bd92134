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


# ---------------------------------------------------------------- runs=auto / warmup_runs=auto (evaluate/precision.py)


from evaluate.metrics import mean_interval  # noqa: E402
from evaluate.precision import CAP_REACHED, TARGET_MET, ci_pct, plan, stop_reason, warmed_up  # noqa: E402
from quantize.common.errors import UserError  # noqa: E402


def test_ci_pct_is_the_half_width_in_percent_of_the_mean():
    values = [98.0, 100.0, 102.0]
    mean, lo, hi = mean_interval(values)
    assert ci_pct(values) == pytest.approx(100 * (hi - mean) / mean)
    assert ci_pct([100.0]) is None and ci_pct([]) is None and ci_pct([0.0, 0.0]) is None
    assert ci_pct([5.0, 5.0, 5.0]) == 0


@pytest.mark.parametrize("values, expect", [
    ([100.0, 100.0], None),                         # below min_runs, however narrow
    ([100.0, 100.0, 100.0], TARGET_MET),            # noise-free: stops at min_runs
    ([90.0, 110.0, 100.0], None),                   # ±24.8 %: go on
    ([90.0, 110.0, 100.0, 95.0, 105.0], CAP_REACHED),
    ([99.0, 101.0, 100.0, 100.5], TARGET_MET),      # ±1.5 %
])
def test_stop_rule(values, expect):
    assert stop_reason(values, min_runs=3, max_runs=5, target_ci_pct=5) == expect


def test_the_target_wins_over_the_cap_when_both_hold():
    assert stop_reason([100.0] * 5, 3, 5, 5) == TARGET_MET


def test_warm_up_stops_when_two_in_a_row_agree_or_at_the_cap():
    assert not warmed_up([], 5, 5) and not warmed_up([50.0], 5, 5)
    assert not warmed_up([50.0, 80.0], 5, 5) and warmed_up([50.0, 80.0, 82.0], 5, 5)  # 2.5 %
    assert warmed_up([50.0, 80.0, 60.0, 90.0, 70.0], 5, 5)  # the cap


def settings(**over):
    """The top-level run keys as the entry point hands them to plan()."""
    return dict({"runs": 3, "min_runs": 3, "max_runs": 10, "target_ci_pct": 5, "warmup_runs": 1,
                             "warmup_tolerance_pct": 5, "max_warmup_runs": 5}, **over)


def test_a_fixed_plan_measures_the_missing_indices_and_records_nothing():
    p = plan(settings())
    assert not p.auto and p.indices({1}, [10.0]) == [0, 2] and p.record([1.0, 2.0], 1) is None


def test_an_auto_plan_continues_until_the_rule_holds():
    p = plan(settings(runs="auto", max_runs=6))
    assert p.indices(set(), []) == list(range(6))
    assert p.indices({0, 2}, [90.0, 110.0]) == [1, 3, 4, 5]
    assert p.indices({0, 1, 2}, [100.0] * 3) == []  # the stored runs already meet it
    assert p.record([90.0, 110.0, 100.0], 1) == {
        "rule": "auto", "runs": 3, "min_runs": 3, "max_runs": 6, "target_ci_pct": 5.0,
        "achieved_ci_pct": round(ci_pct([90.0, 110.0, 100.0]), 3), "stopped": None}


@pytest.mark.parametrize("over, expect", [
    ({"runs": "foo"}, "runs=foo: pass an integer >= 1 or auto"),
    ({"runs": True}, "runs=true: pass an integer >= 1 or auto"),
    ({"runs": "auto", "min_runs": 3, "max_runs": 1}, "max_runs=1: pass max_runs=<an integer >= 3> (at least min_runs=3"),
    ({"min_runs": "zzz"}, "min_runs=zzz: pass min_runs=<an integer >= 2> (an interval needs two runs, for runs=auto)"),
    ({"target_ci_pct": [1]}, "target_ci_pct=[1]: pass a number > 0"),
    ({"warmup_tolerance_pct": None}, "warmup_tolerance_pct=null: pass a number > 0"),
    ({"runs": "auto", "target_ci_pct": 0}, "target_ci_pct=0: pass a number > 0"),
    ({"runs": "auto", "target_ci_pct": "nan"}, "target_ci_pct=nan: pass a number > 0"),
    ({"warmup_runs": "auto", "max_warmup_runs": 1}, "max_warmup_runs=1: pass max_warmup_runs=<an integer >= 2>"),
])
def test_bad_settings_are_one_line(over, expect):
    with pytest.raises(UserError) as e:
        plan(settings(**over))
    assert str(e.value).startswith(expect) and "\n" not in str(e.value)


def test_with_fixed_runs_the_auto_settings_are_checked_but_not_how_they_relate():
    """A typo in an auto setting shows the first time, not on the first runs=auto
    run; max_runs below min_runs matters only where runs=auto reads both."""
    p = plan(settings(max_runs=1))
    assert p.runs == 3 and not p.auto and (p.min_runs, p.max_runs, p.target_ci_pct) == (0, 0, 0.0)
