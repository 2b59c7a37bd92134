"""The client and the load generator against the fake server (known latency
law): counts and timings, the concurrency bound, max_requests and max_seconds,
rate pacing, a server that dies, and slo_search's known right answer.

No outcome here may depend on how fast or loaded the host is: the assertions
are on counts, on the order of events, and on latencies whose law leaves tens
of ms (or, for "it did not wait", tens of seconds) between what passes and
what fails."""
import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from evaluate.engines import openai
from evaluate.engines.openai import OpenAIEngine
from evaluate.serving import load
from evaluate.serving.client import complete_all
from evaluate.serving.load import Level, ServerDied
from evaluate.serving.metrics import level_metrics
from evaluate.serving.profiles import Concurrency, LoadProfile, Rate, SloSearch, Sweep, Synchronous
from evaluate.serving.slo import SLO, judge
from quantize.common.errors import UserError
from quantize.common.extensions import build

LOAD_CONF = Path(__file__).resolve().parents[3] / "conf" / "load"

PROMPT = list(range(100, 132))


def run_level(server, level, n=8, output_len=4, max_seconds=30.0, drain=10.0, alive=None):
    prompts = load.level_prompts(0, 1, n, len(PROMPT), 49152)
    return load.run_level(server.base_url, "fake-model", level, prompts, output_len, max_seconds, drain,
                          alive or server.alive, server_pid=server.proc.pid)


def test_client_counts_tokens_from_usage_and_times_every_chunk(fake_server):
    server = fake_server("--fixed-ms", "20", "--per-active-ms", "0")
    (r,) = asyncio.run(complete_all(server.base_url, "fake-model", [PROMPT], 5))
    assert r.success and r.error is None
    assert (r.prompt_tokens, r.output_tokens, len(r.chunk_times)) == (len(PROMPT), 5, 5)
    # each token is one 20 ms step of the server after the request was sent (a timer may fire a hair early);
    # lower bounds only: a loaded host delays what the client sees, never hastens it
    assert r.ttft_s >= 0.018 and r.e2el_s >= 5 * 0.018 and len(r.itl_s) == 4
    assert r.tpot_s == pytest.approx((r.e2el_s - r.ttft_s) / 4) and r.tpot_s > 0
    assert r.e2el_s < 10  # seconds: in ms it would read 100 or more


def test_a_failed_request_is_a_result_not_an_exception(fake_server):
    (r,) = asyncio.run(complete_all("http://127.0.0.1:9/v1", "m", [PROMPT], 5))
    assert not r.success and r.error and "Connect" in r.error
    server = fake_server("--fail-from", "0", "--fail-to", "0")
    (r,) = asyncio.run(complete_all(server.base_url, "m", [PROMPT], 5))
    assert r.error.startswith("HTTP 500")


def test_a_stream_without_a_token_is_a_failed_request_that_says_so(fake_server):
    """HTTP 200 and [DONE] but no token chunk (max_tokens 0 on the fake server)."""
    server = fake_server("--fixed-ms", "2")
    run = run_level(server, Level("concurrency", 2), n=4, output_len=0)
    assert len(run.results) == 4
    assert all(not r.success and r.error == "the server streamed no token" for r in run.results)


def test_concurrency_holds_exactly_its_in_flight_count_and_max_requests(fake_server):
    server = fake_server("--fixed-ms", "50", "--per-active-ms", "0")  # 200 ms a request: all 3 overlap
    run = run_level(server, Level("concurrency", 3), n=12)
    assert len(run.results) == 12 and all(r.success for r in run.results)
    assert server.stats()["peak_active"] == 3
    assert run.stopped_by == "max_requests" and run.client_cpu_s is not None
    assert run.server_peak_memory_bytes > 0


def test_synchronous_sends_one_at_a_time(fake_server):
    server = fake_server("--fixed-ms", "5")
    run = run_level(server, Level("synchronous", None), n=5)
    assert len(run.results) == 5 and server.stats()["peak_active"] == 1
    for a, b in zip(run.results, run.results[1:]):
        assert b.sent >= a.end


def test_max_seconds_stops_sending_and_cancels_after_the_drain(fake_server):
    server = fake_server("--fixed-ms", "6000", "--per-active-ms", "0")  # 60 s per request of 10 tokens
    t0 = time.perf_counter()
    run = run_level(server, Level("concurrency", 2), n=50, output_len=10, max_seconds=2.0, drain=0.5)
    took = time.perf_counter() - t0
    assert took < 30, f"the level waited {took:.0f} s: its requests were not cancelled after the drain"
    assert run.stopped_by == "max_seconds" and len(run.results) == 2
    assert all(not r.success and "cancelled" in r.error for r in run.results)
    assert server.stats()["requests"] == 2


def test_rate_sends_on_its_precomputed_schedule_without_waiting_for_answers(fake_server):
    """20 requests due within 0.5 s, each answered after 2 s: an open loop has
    sent them all before the first answer, each at or after its due time."""
    server = fake_server("--fixed-ms", "1000", "--per-active-ms", "0")
    run = run_level(server, Level("rate", 40.0, 1.0), n=20, output_len=2)
    assert len(run.results) == 20 and all(r.success for r in run.results)
    expected = load.arrival_offsets(40.0, 1.0, 20, seed=0)
    assert expected[-1] < 0.6 and np.allclose(sorted(r.scheduled - run.start for r in run.results), expected,
                                              atol=1e-9)
    in_order = sorted(run.results, key=lambda r: r.scheduled)
    assert [r.sent for r in in_order] == sorted(r.sent for r in run.results)
    assert all(r.sent >= r.scheduled - 1e-3 for r in run.results)  # never early (a timer may fire a hair early)
    assert max(r.sent for r in run.results) < min(r.end for r in run.results)
    assert server.stats()["peak_active"] == 20
    lags_ms = [1000 * r.send_lag_s for r in run.results]
    m = level_metrics(run)
    assert m["send_lag_ms_p99"] == pytest.approx(np.percentile(lags_ms, 99))
    assert m["send_lag_ms_mean"] == pytest.approx(np.mean(lags_ms)) and m["offered_rate"] == 40.0


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_arrivals_have_the_asked_rate_and_burstiness(burstiness):
    gaps = np.diff(load.arrival_offsets(5.0, burstiness, 40001, seed=3))
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)
    cv = gaps.std() / gaps.mean()   # gamma of shape k: CV = 1/sqrt(k)
    assert cv == pytest.approx(1 / np.sqrt(burstiness), rel=0.05)


def test_rate_level_stops_sending_at_max_seconds(fake_server):
    """1000 requests at 10 req/s are a 100 s schedule; max_seconds=1 sends
    exactly those due in its first second, then waits only for them."""
    server = fake_server("--fixed-ms", "2", "--per-active-ms", "0")
    run = run_level(server, Level("rate", 10.0, 1.0), n=1000, output_len=2, max_seconds=1.0)
    due_in_time = int((load.arrival_offsets(10.0, 1.0, 1000, seed=0) < 1.0).sum())
    assert run.stopped_by == "max_seconds" and 3 <= due_in_time <= 25
    assert len(run.results) == due_in_time == server.stats()["requests"] and all(r.success for r in run.results)
    assert run.duration_s < 50, "the level waited for the rest of its 100 s schedule"


def test_a_server_that_dies_mid_level_ends_it(fake_server):
    server = fake_server("--fixed-ms", "20", "--die-after", "3")
    with pytest.raises(ServerDied, match="exited with code 3"):
        run_level(server, Level("concurrency", 2), n=20)


def test_a_death_seen_late_still_ends_the_level_as_a_death(fake_server):
    """The client sees closed connections a moment before the server's exit is
    visible: the first two looks at a dead server say it is alive."""
    server = fake_server("--fixed-ms", "20", "--die-after", "3")
    looks_at_the_dead = []

    def lagging_alive():
        died = server.alive()
        if died:
            looks_at_the_dead.append(died)
        return died if len(looks_at_the_dead) > 2 else None

    with pytest.raises(ServerDied, match="exited with code 3"):
        run_level(server, Level("concurrency", 2), n=20, alive=lagging_alive)


def test_a_death_ends_the_level_while_it_runs_not_at_its_end(fake_server):
    """The server dies a second into a level of 40 s while another process,
    which took its freed port, answers every request in 10 s: the level ends
    within seconds of the death, not at its end, nothing more is sent, and
    what the other process answered is no measurement (ServerDied)."""
    other = fake_server("--fixed-ms", "1000", "--per-active-ms", "0")
    t0 = time.perf_counter()

    def dies_after_a_second():
        return "the vLLM server was killed by signal 9 (log: x.log)" if time.perf_counter() - t0 > 1 else None

    with pytest.raises(ServerDied, match=r"killed by signal 9 \(log: x.log\)"):
        run_level(other, Level("concurrency", 2), n=8, output_len=10, max_seconds=60.0, drain=30.0,
                  alive=dies_after_a_second)
    assert time.perf_counter() - t0 < 8, "the level ran on after its server died"
    assert other.stats()["requests"] == 2


def test_a_level_ends_with_its_last_response_not_with_a_server_check(fake_server):
    """The level's duration (and so every throughput) ends when the last
    request does, as vllm bench's does, even while a slow liveness check
    (3 s here) is still running."""
    server = fake_server("--fixed-ms", "100", "--per-active-ms", "0")  # 1 s a request of 10 tokens

    def slow_alive():
        time.sleep(3)
        return server.alive()

    run = run_level(server, Level("concurrency", 2), n=4, output_len=10, alive=slow_alive)
    last_response = max(r.end for r in run.results)
    assert all(r.success for r in run.results)
    assert run.end - last_response < 1.5, "the level's end waited for a liveness check"


def test_a_server_slow_to_list_its_models_is_busy_not_dead(fake_server, monkeypatch):
    """engine=openai polls /models during a level: answers later than the
    poll's timeout say nothing about death, and the level runs to its end."""
    monkeypatch.setattr(openai, "ALIVE_TIMEOUT_S", 0.2)
    server = fake_server("--fixed-ms", "50", "--per-active-ms", "0", "--models-delay", "6")
    with OpenAIEngine(None, {}, {}, max_model_len=128, settings={"base_url": server.base_url}) as engine:
        run = run_level(server, Level("concurrency", 2), n=8, output_len=20, alive=engine.alive)
    assert run.stopped_by == "max_requests" and all(r.success for r in run.results)


def test_openai_declares_death_on_a_refusal_or_several_failed_polls(fake_server, monkeypatch):
    server = fake_server("--fixed-ms", "2")
    with OpenAIEngine(None, {}, {}, max_model_len=128, settings={"base_url": server.base_url}) as engine:
        answers = iter(["HTTP 503", "HTTP 503", "ok", "HTTP 503", "late", "HTTP 503", "HTTP 503", "HTTP 503"])
        clock = iter([0.0, 1.0, 2.0, 3.0, 4.0, 14.0])   # the monotonic time of each failed poll
        monkeypatch.setattr(openai, "probe", lambda url, timeout: next(answers))
        monkeypatch.setattr(openai.time, "monotonic", lambda: next(clock))
        seen = [engine.alive() for _ in range(8)]
        # the late answer neither counts nor clears: 3 failures since the ok, but within 2 s of the first
        # (a death-grace loop polls several times a second) are not yet a death; 4 over 12 s are
        assert seen[:7] == [None] * 7
        assert "HTTP 503, 4 failed polls over 12 s since its last answer" in seen[7]
        monkeypatch.undo()
        server.stop()
        assert "connection refused" in engine.alive()


def test_sweep_places_its_rates_between_synchronous_and_saturation():
    seen = []

    def measure(level):
        seen.append(level)
        return {"request_throughput": {"synchronous": 1.0, "concurrency": 5.0}.get(level.mode, 2.0)}

    sweep = Sweep(name="sweep", saturation_concurrency=16, rate_levels=3, burstiness=1.0)
    assert sweep.run(measure, None) is None
    assert [lv.mode for lv in seen] == ["synchronous", "concurrency", "rate", "rate", "rate"]
    assert [lv.level for lv in seen[2:]] == [2.0, 3.0, 4.0] and seen[1].level == 16


def test_slo_search_finds_the_known_highest_concurrency(fake_server):
    """TPOT = 40 + 80 x in-flight ms: a p50 TPOT bound of 320 ms holds up to 3 in flight
    (280 ms; 4 in flight: 360 ms), 40 ms from either level, beyond what a loaded host adds
    to a measured TPOT. From 2 the search doubles to 4, which fails, and bisects to 3."""
    server = fake_server("--fixed-ms", "40", "--per-active-ms", "80")
    slo = SLO(name="test", tpot_ms=320, percentile=50)
    search = SloSearch(name="slo_search", mode="concurrency", start=2, max_level=32, resolution=1,
                       max_requests=20, max_seconds=60)

    def measure(level):
        return level_metrics(run_level(server, level, n=20, output_len=2), slo)

    result = search.run(measure, slo)
    tried = [(lv, round(m["median_tpot_ms"]), v.reason) for lv, m, v in result.trace]
    assert result.best == 3, tried
    assert [lv for lv, _, _ in tried] == [2, 4, 3], tried
    assert search.describe_outcome(result, slo).startswith("slo_search (test: p50 TPOT ≤ 320 ms): best concurrency 3;")


def test_profile_settings_are_checked_before_anything_runs():
    with pytest.raises(UserError, match="load.levels"):
        Concurrency(name="concurrency", levels=[], max_requests=4, max_seconds=5).validate(None)
    with pytest.raises(UserError, match="load=slo_search needs an SLO"):
        SloSearch(name="slo_search", mode="concurrency", start=1, max_level=8, resolution=1, max_requests=4,
                  max_seconds=5).validate(None)
    with pytest.raises(UserError, match=r"^load=slo_search: load.max_requests=100 is below the 1000 requests a "
                                        r"level needs for a p99 SLO; pass load.max_requests=1000$"):
        SloSearch(name="slo_search", mode="concurrency", start=1, max_level=8, resolution=1, max_requests=100,
                  max_seconds=5).validate(SLO(name="t", ttft_ms=200, percentile=99))
    with pytest.raises(UserError, match="load=synchronous: load.max_seconds must be a positive number, not 0"):
        Synchronous(name="synchronous", max_requests=4, max_seconds=0).validate(None)


SLOW = {"max_requests": 100, "max_seconds": 5}


@pytest.mark.parametrize("profile,message", [
    (Concurrency(name="concurrency", levels=[1, 0.5], **SLOW), r"load.levels must be whole numbers of requests in "
                                                              r"flight, >= 1, not 0.5$"),
    (Concurrency(name="concurrency", levels=[1.5], **SLOW), "load.levels must be whole numbers .* not 1.5$"),
    (Sweep(name="sweep", saturation_concurrency=0, rate_levels=3, burstiness=1.0, **SLOW),
     "load.saturation_concurrency must be whole numbers .* not 0$"),
    (Sweep(name="sweep", saturation_concurrency=8, rate_levels=2.5, burstiness=1.0, **SLOW),
     "load.rate_levels must be a whole number of rates >= 0, not 2.5$"),
    (SloSearch(name="slo_search", mode="concurrency", start=0.5, max_level=8, resolution=1, **SLOW),
     "load.start must be whole numbers .* not 0.5$"),
    (SloSearch(name="slo_search", mode="rate", start=1, max_level=float("inf"), resolution=1, burstiness=1, **SLOW),
     "load.max_level must be a finite positive number, not inf$"),
    (SloSearch(name="slo_search", mode="concurrency", start=16, max_level=8, resolution=1, **SLOW),
     r"load.start \(16\) must not be above load.max_level \(8\)$"),
    (Concurrency(name="concurrency", levels=[1], drain_seconds=-60, **SLOW),
     "load.drain_seconds must be a number >= 0"),
], ids=["levels 0.5", "levels 1.5", "saturation 0", "rate_levels 2.5", "start 0.5", "max_level inf", "start > max",
        "drain -60"])
def test_in_flight_counts_are_whole_and_drains_not_negative(profile, message):
    with pytest.raises(UserError, match=f"^load={profile.name}: {message}"):
        profile.validate(SLO(name="t", ttft_ms=100))


def test_an_infinite_rate_is_one_line_pointing_to_concurrency():
    """load.rates=[inf] has no arrival schedule: every level would be marked not valid."""
    with pytest.raises(UserError, match=r"^load=rate: load.rates must be finite request rates .*use load=concurrency"):
        Rate(name="rate", rates=[1, float("inf")], burstiness=1.0, max_requests=8, max_seconds=30).validate(None)


@pytest.mark.parametrize("path", sorted(p for p in LOAD_CONF.glob("*.yaml") if p.stem not in ("none",)),
                         ids=lambda p: p.stem)
def test_every_profile_yaml_builds_its_typed_profile(path):
    values = yaml.safe_load(path.read_text())
    for parent in values.pop("defaults", []):  # sweep_gpu_with_server composes sweep_gpu
        if parent != "_self_":
            values = {**yaml.safe_load((LOAD_CONF / f"{parent}.yaml").read_text()), **values}
    profile = build(values, LoadProfile, str(path))
    assert type(profile).__module__ == "evaluate.serving.profiles" and profile.name == values["name"]
    profile.validate(SLO(name="t", ttft_ms=100))
    levels = []
    profile.run(lambda level: levels.append(level) or {"request_throughput": len(levels)},
                SLO(name="t", ttft_ms=100))
    assert levels and all(isinstance(lv, Level) for lv in levels)


def test_a_profile_yaml_with_an_unknown_setting_is_one_line():
    with pytest.raises(UserError, match="'rate_level' is not a setting of Sweep; did you mean rate_levels"):
        build({"_target_": "evaluate.serving.profiles.Sweep", "name": "sweep", "saturation_concurrency": 4,
               "rate_level": 3}, LoadProfile, "conf/load/sweep.yaml")


@pytest.mark.needs_vllm
def test_requests_sample_as_the_in_process_engine_whatever_the_server_defaults(fake_server):
    """vLLM's server fills every sampling field a request leaves out from the
    model's generation_config.json (top_k 20, repetition_penalty 1.05, ...),
    where engine=vllm samples with vLLM's neutral defaults: each is sent."""
    from vllm import SamplingParams
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    server = fake_server("--fixed-ms", "1", "--per-active-ms", "0")
    (r,) = asyncio.run(complete_all(server.base_url, "fake-model", [PROMPT], 2))
    assert r.success
    sent = server.stats()["last_request"]
    in_process = SamplingParams(temperature=1.0, top_p=1.0)  # as VllmEngine._run samples
    server_defaults = CompletionRequest.__private_attributes__["_DEFAULT_SAMPLING_PARAMS"].default
    for field in server_defaults:
        assert field in sent, f"{field} left to the server's default"
        if field == "top_k":  # 0 and -1 both mean "all tokens"
            assert sent[field] in (0, -1) and in_process.top_k in (0, -1)
        else:
            assert sent[field] == getattr(in_process, field), field


def test_a_server_that_stops_at_eos_gives_a_level_that_says_so_and_is_not_judged(fake_server):
    """A server that ignores ignore_eos and min_tokens stops at EOS: its E2EL
    and tok/s are of a shorter output than the scenario's, so the level is
    not valid, counts them, and the SLO leaves it unresolved."""
    slo = SLO(name="t", ttft_ms=60000, percentile=50)
    n = slo.min_requests()
    short = level_metrics(run_level(fake_server("--fixed-ms", "1", "--eos-after", "2"), Level("concurrency", 2),
                                    n=n, output_len=4), slo)
    assert (short["completed"], short["off_length_outputs"], short["valid"]) == (n, n, False)
    assert short["valid_reason"] == (f"{n} of {n} completed requests generated 2 tokens, not output_len 4: "
                                     "the server ignores ignore_eos/min_tokens")
    verdict = judge(short, slo)
    assert verdict.passed is None and verdict.reason.startswith("unresolved: level of other output lengths")
    full = level_metrics(run_level(fake_server("--fixed-ms", "1"), Level("concurrency", 2), n=n, output_len=4), slo)
    assert (full["off_length_outputs"], full["valid"]) == (0, True) and judge(full, slo).passed is True
