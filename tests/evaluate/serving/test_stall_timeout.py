"""A stream that stalls (the server holds it open and sends nothing) fails
after the engine's `stall_timeout_s`, with a one-line reason naming that
setting, instead of waiting up to an hour: a batch scenario's run fails and
the next one runs; a load level's request fails and the level goes on."""
import asyncio
import time

import pytest

from evaluate import engines
from evaluate.serving import load
from evaluate.serving.client import complete_all
from evaluate.serving.load import Level
from quantize.common.errors import ExitCode
from tests.conftest import last_line, tail
from tests.evaluate.serving.test_run import evaluate, rows

STALLED = "stalled: no token for 2 s; raise engine.stall_timeout_s if the server is only slow (a long prefill on a CPU)"


def test_a_stalled_request_fails_after_the_stall_timeout(fake_server):
    server = fake_server("--fixed-ms", "2", "--stall-from", "0", "--stall-to", "0")
    (r,) = asyncio.run(complete_all(server.base_url, "fake-model", [[1] * 8], 4, stall_timeout_s=2))
    assert r.stalled and r.error.startswith(STALLED) and len(r.chunk_times) == 1


def test_a_stalled_request_of_a_load_level_fails_and_the_level_goes_on(fake_server):
    server = fake_server("--fixed-ms", "2", "--stall-from", "1", "--stall-to", "1")
    prompts = load.level_prompts(0, 1, 4, 8, 49152)
    run = load.run_level(server.base_url, "fake-model", Level("concurrency", 2), prompts, 4, 30.0, 10.0,
                         server.alive, server.proc.pid, stall_timeout_s=2)
    assert [r.stalled for r in run.results].count(True) == 1 and sum(r.success for r in run.results) == 3
    assert run.stopped_by == "max_requests"


@pytest.mark.parametrize("stalled, statuses, reason", [
    ("1", ["failed", "ok", "ok"], f"request to {{url}} failed: {STALLED}"),
    ("0", ["failed", "failed", "failed"], f"warm-up failed: request to {{url}} failed: {STALLED}"),
], ids=["timed_run", "warm_up"])
def test_a_stalled_stream_fails_its_run_and_evaluate_goes_on(tmp_path, tiny_model, fake_server, stalled, statuses,
                                                             reason):
    """Request 0 is the warm-up, 1-3 the timed runs (batch size 1)."""
    server = fake_server("--fixed-ms", "2", "--stall-from", stalled, "--stall-to", stalled)
    proc = evaluate(tmp_path, tiny_model, "engine=openai", f"engine.base_url={server.base_url}",
                    "engine.stall_timeout_s=2", "scenario.input_len=16", "scenario.output_len=4", "runs=3",
                    "warmup_runs=1")
    assert proc.returncode == ExitCode.RUNS_FAILED, tail(proc)
    assert last_line(proc.stderr).startswith(f"error: {statuses.count('failed')} run(s) failed while the others "
                                             "were measured (the first: ")
    got = sorted(rows(tmp_path), key=lambda r: r["run_index"])
    assert [(r["run_index"], r["status"]) for r in got] == list(enumerate(statuses))
    assert got[0]["reason"] == reason.format(url=server.base_url)
    assert "Traceback" not in proc.stderr


def test_the_stall_timeout_changes_no_setup():
    """A bound on waiting measures nothing differently: stores keep their ids."""
    config = engines.config("vllm_server")
    assert config["stall_timeout_s"] == 30
    assert engines.identity(config) == engines.identity({k: v for k, v in config.items() if k != "stall_timeout_s"})


def test_a_request_queued_at_the_server_is_served_not_stalled(fake_server):
    """The server streams one request at a time (vLLM's max_num_seqs): the
    second waits ~1.5 s for its first token while the first streams, and
    succeeds with that wait in its TTFT, as `vllm bench serve` records it; the
    stall rule took it for a stalled stream."""
    server = fake_server("--fixed-ms", "150", "--per-active-ms", "0", "--max-active", "1")
    prompts = load.level_prompts(0, 1, 2, 8, 49152)
    run = load.run_level(server.base_url, "fake-model", Level("concurrency", 2), prompts, 10, 30.0, 10.0,
                         server.alive, server.proc.pid, stall_timeout_s=1)
    assert [r.error for r in run.results] == [None, None]
    assert max(r.chunk_times[0] - r.sent for r in run.results) > 1.4


def test_a_server_silent_to_every_request_stalls_the_queued_ones_too(fake_server):
    """Request 0 stalls after its first token while holding the only slot:
    no request gets a token any more, so request 1, queued without one,
    fails as stalled as well instead of waiting for ever."""
    server = fake_server("--fixed-ms", "2", "--max-active", "1", "--stall-from", "0", "--stall-to", "0")
    results = asyncio.run(complete_all(server.base_url, "fake-model", [[1] * 8, [2] * 8], 4, stall_timeout_s=1))
    assert [(r.stalled, len(r.chunk_times)) for r in results] == [(True, 1), (True, 0)]
    assert all(r.error.startswith("stalled: no token for 1 s;") for r in results)


def test_a_request_preempted_after_its_first_token_waits_while_others_stream(fake_server):
    """One of two requests gets a token, then none for 1.5 s (vLLM preempts
    it back into its queue under KV-cache pressure) while the other streams
    a token every 0.1 s: it is served, as `vllm bench serve` waits for it;
    judged by its own silence it failed as stalled after 1 s."""
    server = fake_server("--fixed-ms", "100", "--per-active-ms", "0", "--stall-from", "1", "--stall-to", "1",
                         "--stall-s", "1.5")
    results = asyncio.run(complete_all(server.base_url, "fake-model", [[1] * 8, [2] * 8], 20, stall_timeout_s=1))
    assert [r.error for r in results] == [None, None]
    assert max(max(b - a for a, b in zip(r.chunk_times, r.chunk_times[1:])) for r in results) > 1.4


def test_a_stuck_stream_of_a_batch_fails_once_the_others_are_done(fake_server):
    """The stuck request waits while the other streams (~1.5 s), then fails
    as stalled stall_timeout_s after the server's last token: bounded."""
    server = fake_server("--fixed-ms", "100", "--per-active-ms", "0", "--stall-from", "0", "--stall-to", "0")
    start = time.perf_counter()
    results = asyncio.run(complete_all(server.base_url, "fake-model", [[1] * 8, [2] * 8], 15, stall_timeout_s=1))
    took = time.perf_counter() - start
    assert sorted((r.stalled, r.error is None) for r in results) == [(False, True), (True, False)]
    assert 2.4 < took < 10


class _TaskWithoutUncancel(asyncio.tasks._PyTask):
    """A task as Python 3.10 (which the project supports) has it: no uncancel()."""

    def __getattribute__(self, name):
        if name == "uncancel":
            raise AttributeError("'Task' object has no attribute 'uncancel'")
        return super().__getattribute__(name)


async def _on_tasks_without_uncancel(coro):
    asyncio.get_running_loop().set_task_factory(lambda loop, c, **kw: _TaskWithoutUncancel(c, loop=loop, **kw))
    return await asyncio.ensure_future(coro)


def test_a_stall_is_a_failed_request_on_python_3_10_too(fake_server):
    """Python 3.10's tasks have no uncancel(): a stalled request is still a
    failed request, never an AttributeError out of the client."""
    server = fake_server("--fixed-ms", "2", "--stall-from", "0", "--stall-to", "0")
    (r,) = asyncio.run(_on_tasks_without_uncancel(
        complete_all(server.base_url, "fake-model", [[1] * 8], 4, stall_timeout_s=1)))
    assert r.stalled and r.error.startswith("stalled: no token for 1 s;")
