"""evaluate/serving/slo.py: SLO configs, the verdict on one level (pass, fail,
unresolved) and slo_search against simulated servers whose latency follows a
known law, so the right answer is computable."""
import math

import pytest
import yaml

from evaluate.serving.load import arrival_offsets
from evaluate.serving.metrics import level_metrics
from evaluate.serving.requests import LevelRun
from evaluate.serving.slo import SLO, judge, search
from quantize.common.errors import UserError
from quantize.common.paths import CONF_DIR

from .requests_fixture import request


# --- SLO configs ------------------------------------------------------------------------------------------

def test_presets_load_and_none_means_no_slo():
    presets = {p.stem: SLO.from_dict(yaml.safe_load(p.read_text())) for p in (CONF_DIR / "slo").glob("*.yaml")}
    assert presets["none"] is None
    cpu = presets["interactive_cpu"]
    assert (cpu.ttft_ms, cpu.tpot_ms, cpu.e2el_ms, cpu.percentile, cpu.min_recovery_pct) == (2000, 100, None, 90, 95)
    assert presets["interactive_gpu"].limits() == {"ttft": 200, "tpot": 50}
    assert presets["batch"].limits() == {"e2el": 60000}
    assert SLO.from_dict(cpu.as_dict()) == cpu  # a row's `slo` reads back as the SLO it was judged against
    assert SLO.from_dict(None) is None and SLO.from_dict({"name": "loose", "percentile": 90}) is None


@pytest.mark.parametrize("cfg,message", [({"ttft": 10}, "unknown key"), ({"ttft_ms": 10, "percentile": 100}, "between"),
                                         ({"tpot_ms": -5}, "positive"),
                                         ({"tpot_ms": "fast"}, r"^slo custom: tpot_ms=fast is not a number; pass e\.g\. "
                                                               r"slo\.tpot_ms=50, or slo\.tpot_ms=null for no bound$"),
                                         ({"ttft_ms": 9, "percentile": None}, r"percentile=null is not a number; pass "
                                                                              r"e\.g\. slo\.percentile=90$")])
def test_bad_slo_configs_are_one_line_errors(cfg, message):
    with pytest.raises(UserError, match=message):
        SLO.from_dict(cfg)


def cuda_default(group: str) -> dict:
    """The `group` config hardware=cuda picks (a load's `defaults` composed)."""
    picks = [d for d in yaml.safe_load((CONF_DIR / "hardware" / "cuda.yaml").read_text())["defaults"]
             if isinstance(d, dict)]
    name = next(v for d in picks for k, v in d.items() if k == f"override /{group}")
    values = yaml.safe_load((CONF_DIR / group / f"{name}.yaml").read_text())
    for parent in values.pop("defaults", []):
        if parent != "_self_":
            values = {**cuda_default_file(group, parent), **values}
    return values


def cuda_default_file(group: str, name: str) -> dict:
    return yaml.safe_load((CONF_DIR / group / f"{name}.yaml").read_text())


def test_the_gpu_defaults_can_judge_a_sweep_rate_of_a_few_requests_a_second():
    """hardware=cuda's SLO against its sweep: a rate level of 1.5 req/s (a GPU
    serves a lone chat request in under a second, so a sweep's rates start
    about there) sends for max_seconds; with latencies far under the bounds it
    must pass, not be left unresolved for want of requests."""
    slo, sweep = SLO.from_dict(cuda_default("slo")), cuda_default("load")
    sent = int((arrival_offsets(1.5, 1.0, int(sweep["max_requests"]), seed=0) < sweep["max_seconds"]).sum())
    fast = {f"{slo.pct_key}_{m}_ms": bound / 10 for m, bound in slo.limits().items()}
    verdict = judge({"completed": sent, "failed": 0, "valid": True, **fast}, slo)
    assert verdict.passed is True, verdict.reason


@pytest.mark.parametrize("p,need", [(50, 20), (90, 100), (95, 200), (99, 1000), (99.9, 10000)])
def test_requests_needed_for_a_percentile(p, need):
    assert SLO(ttft_ms=1, percentile=p).min_requests() == need


# --- judge ------------------------------------------------------------------------------------------------

SLO90 = SLO(name="t", ttft_ms=2000, tpot_ms=100, percentile=90)


def level(completed=100, failed=0, ttft=1500.0, tpot=80.0, valid=True, **more) -> dict:
    return {"completed": completed, "failed": failed, "p90_ttft_ms": ttft, "p90_tpot_ms": tpot, "valid": valid,
            "valid_reason": None if valid else "client CPU 97 % of one core ≥ 90 %", **more}


def test_judge_pass_and_fail():
    assert judge(level(), SLO90).passed is True
    v = judge(level(tpot=130.4), SLO90)
    assert v.passed is False and v.reason == "p90 TPOT 130.4 ms > 100 ms"
    v = judge(level(ttft=2500, tpot=101), SLO90)
    assert v.passed is False and "TTFT 2500.0 ms > 2000 ms" in v.reason and "TPOT" in v.reason


def test_failed_requests_count_as_misses():
    assert judge(level(completed=100, failed=11), SLO90).passed is True     # 9.9 % of 111 ≤ 10 %
    v = judge(level(completed=100, failed=12), SLO90)
    assert v.passed is False and "12 of 112 requests failed" in v.reason


def test_exactly_the_allowed_share_of_failures_is_not_too_many():
    """10 of 100 failed is the 10 % a p90 SLO allows, not more (no float rounding of 1 - 0.9)."""
    assert judge(level(completed=90, failed=10), SLO90).passed is True
    v = judge(level(completed=90, failed=11), SLO90)
    assert v.passed is False and v.reason == "11 of 101 requests failed, more than the 10 % a p90 SLO allows"
    slo999 = SLO(name="t", ttft_ms=2000, percentile=99.9)
    assert judge({"completed": 9990, "failed": 10, "valid": True, "p99.9_ttft_ms": 10.0}, slo999).passed is True
    v = judge({"completed": 9989, "failed": 11, "valid": True, "p99.9_ttft_ms": 10.0}, slo999)
    assert v.passed is False and "more than the 0.1 % a p99.9 SLO allows" in v.reason


def measured(failed: int, slow: int, fine: int) -> dict:
    """level_metrics (SLO90) of a level whose requests failed, took 5 s to a first token, or met both bounds."""
    results = ([request(i, 0, [], error="HTTP 503") for i in range(failed)]
               + [request(i, 5.0, [0.05] * 15) for i in range(slow)]
               + [request(i, 0.3, [0.05] * 15) for i in range(fine)])
    return level_metrics(LevelRun(mode="concurrency", level=4, start=0, end=60, results=results), SLO90)


def test_failed_and_slow_requests_together_miss_the_percentile():
    """9 failed + 8 slow of 100 is 17 % over the TTFT bound, though the pNN of the completed ones meets it."""
    m = measured(failed=9, slow=8, fine=83)
    assert m["p90_ttft_ms"] == pytest.approx(300) and m["slo_attainment"] == pytest.approx(0.83)
    v = judge(m, SLO90)
    assert v.passed is False
    assert v.reason == "17 of 100 requests missed TTFT ≤ 2000 ms (9 failed), more than the 10 % a p90 SLO allows"
    assert judge(measured(failed=9, slow=1, fine=90), SLO90).passed is True     # 10 of 100: the share allowed


def test_misses_counted_against_another_bound_or_not_at_all_leave_the_pnn_rule():
    """Rows stored before the counts, or judged by an SLO of other bounds, are judged on their pNN."""
    m = measured(failed=9, slow=8, fine=83)
    old = {k: v for k, v in m.items() if not k.startswith("slo_")}
    assert judge(old, SLO90).passed is True
    looser = SLO(name="t", ttft_ms=6000, tpot_ms=100, percentile=90)
    assert judge(m, looser).passed is True     # 9 failed only, within 10 %: the counts for 2000 ms do not apply


def test_a_failed_request_counts_toward_the_sample_it_needs():
    """A p90 level of exactly 100 requests with one transient failure is
    judged on its latencies, not left unresolved at 99 completed."""
    assert judge(level(completed=99, failed=1), SLO90).passed is True
    assert judge(level(completed=99, failed=1, tpot=130.0), SLO90).passed is False


def test_too_many_failures_fail_a_level_of_any_size():
    v = judge(level(completed=40, failed=60), SLO90)
    assert v.passed is False and "60 of 100 requests failed" in v.reason
    assert judge(level(completed=5, failed=5), SLO90).passed is False


def test_unresolved_levels_are_never_passed():
    v = judge(level(completed=99), SLO90)
    assert v.passed is None and "99 requests sent, p90 needs at least 100" in v.reason
    v = judge(level(valid=False), SLO90)
    assert v.passed is None and "client-bound" in v.reason
    v = judge({"completed": 500, "failed": 0, "p90_ttft_ms": 10.0}, SLO90)
    assert v.passed is None and "p90_tpot_ms not measured" in v.reason


# --- search against simulated servers ---------------------------------------------------------------------

OUT_TOKENS = 64


class Server:
    """Closed-loop law at concurrency c: TTFT = ttft_per_c·c ms, TPOT = a + b·c ms;
    request throughput = c / E2EL, capped at `cap` req/s."""
    def __init__(self, a=20.0, b=10.0, ttft_per_c=100.0, cap=math.inf, completed=lambda c: 200):
        self.a, self.b, self.ttft_per_c, self.cap, self.completed = a, b, ttft_per_c, cap, completed
        self.calls = []

    def __call__(self, c: float) -> dict:
        self.calls.append(c)
        ttft, tpot = self.ttft_per_c * c, self.a + self.b * c
        e2el_s = (ttft + tpot * (OUT_TOKENS - 1)) / 1000
        return {"completed": self.completed(c), "failed": 0, "valid": True, "p90_ttft_ms": ttft,
                "p90_tpot_ms": tpot, "request_throughput": min(c / e2el_s, self.cap)}


def test_doubles_until_it_fails_then_bisects_to_the_known_answer():
    server = Server()                      # TPOT ≤ 100 ms holds up to c = 8; TTFT ≤ 2000 ms up to 20
    result = search(server, SLO90)
    assert result.best == 8
    assert server.calls == [1, 2, 4, 8, 16, 12, 10, 9]
    assert [v.passed for _, _, v in result.trace] == [True] * 4 + [False] * 4
    assert result.reason.startswith("8 meets the SLO, 9 does not (p90 TPOT 110.0 ms > 100 ms)")


def test_the_answer_between_powers_of_two():
    assert search(Server(b=15.0), SLO90).best == 5              # 20 + 15 c ≤ 100  ->  c ≤ 5.33
    assert search(Server(b=1.0, ttft_per_c=150.0), SLO90).best == 13  # TTFT binds: 150 c ≤ 2000


def test_no_level_meets_the_slo_says_which_metric_where():
    result = search(Server(ttft_per_c=2500.0), SLO90)
    assert result.best is None and [t[0] for t in result.trace] == [1]
    assert result.reason == "no level meets the SLO: at 1 (the lowest tried) p90 TTFT 2500.0 ms > 2000 ms"
    result = search(Server(ttft_per_c=2500.0), SLO90, start=4)    # bisects down to 1 first
    assert result.best is None and [t[0] for t in result.trace] == [4, 2, 1]


def test_stops_at_saturation():
    server = Server(b=0.1, cap=3.0)         # throughput 0.5, 1.0, 1.9, then capped at 3, 3
    result = search(server, SLO90)
    assert result.best == 16 and server.calls == [1, 2, 4, 8, 16]
    assert result.reason.startswith("saturated at 16: request throughput 3 req/s, +0.0% over 8 (< 5%)")


def test_stops_at_max_level():
    result = search(Server(b=0.0, ttft_per_c=1.0), SLO90, max_level=48)
    assert result.best == 48 and [t[0] for t in result.trace] == [1, 2, 4, 8, 16, 32, 48]
    assert "max_level 48 reached" in result.reason


def test_one_transient_failure_does_not_stop_the_search():
    """slo_search sends exactly the 100 requests a p90 needs: one failure at a
    level must not end the doubling there."""
    server = Server(completed=lambda c: 100)
    flaky = search(lambda c: {**server(c), "completed": 99, "failed": 1} if c == 4 else server(c), SLO90)
    assert flaky.best == search(Server(completed=lambda c: 100), SLO90).best == 8


def test_unresolved_levels_count_as_not_passed():
    server = Server(b=0.0, ttft_per_c=1.0, completed=lambda c: 200 if c <= 4 else 50)
    result = search(server, SLO90)
    assert result.best == 4 and "5 does not (unresolved: 50 requests sent" in result.reason


def test_rate_search_to_a_resolution():
    server = Server(a=20.0, b=30.0, ttft_per_c=1.0)   # TPOT ≤ 100 up to 2.67 req/s
    result = search(server, SLO90, start=0.5, max_level=16, resolution=0.25, integer=False)
    assert server.calls == [0.5, 1, 2, 4, 3, 2.5, 2.75]
    assert result.best == 2.5


def test_search_arguments_are_checked():
    with pytest.raises(UserError, match="start"):
        search(Server(), SLO90, start=0)
