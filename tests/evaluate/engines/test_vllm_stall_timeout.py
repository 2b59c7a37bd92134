"""The in-process vLLM engine's stall timeout (evaluate/engines/vllm.py
_until_done_or_stalled) on plain coroutines: silence past
engine.stall_timeout_s ends the run as a dead engine, output keeps it going
however long it takes. tests/test_failure_lines.py stops a real engine core."""
import asyncio
import signal
from types import SimpleNamespace

import pytest

from evaluate.engines.vllm import VllmEngine
from quantize.common.errors import EngineDied

pytestmark = pytest.mark.needs_vllm  # _engine_core_alive imports vLLM's exceptions


@pytest.fixture
def engine():
    """A VllmEngine with only what a run's watch uses: its settings and its loop."""
    e = VllmEngine.__new__(VllmEngine)
    e.settings = {"stall_timeout_s": 0.5}
    e.loop = asyncio.new_event_loop()
    yield e
    e.loop.close()


def test_silence_past_the_timeout_ends_the_run_as_a_dead_engine_and_cancels_it(engine):
    cancelled = []

    async def silent(progress):
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    with pytest.raises(EngineDied, match=r"^vLLM gave no output for 0.5 s \(engine.stall_timeout_s\)"):
        engine._until_done_or_stalled(silent)
    assert cancelled == [True]


def test_a_run_that_keeps_giving_output_may_take_longer_than_the_timeout(engine):
    async def steady(progress):
        for _ in range(30):  # 1.5 s in all, 0.05 s between outputs
            await asyncio.sleep(0.05)
            progress.tick()
        return "done"

    assert engine._until_done_or_stalled(steady) == "done"


def test_the_default_applies_where_the_config_has_none(engine, monkeypatch):
    import evaluate.engines.vllm as vllm_engine
    monkeypatch.setattr(vllm_engine, "STALL_TIMEOUT_S", 0.2)
    engine.settings = {}

    async def silent(progress):
        await asyncio.sleep(600)

    with pytest.raises(EngineDied, match="no output for 0.2 s"):
        engine._until_done_or_stalled(silent)


def test_an_error_raised_into_a_run_from_outside_cancels_it_before_the_next_run(engine):
    """submitit's time-limit warning raises from a signal handler wherever the
    main thread is: the run's requests stayed pending on the loop, and the
    next run_until_complete went on with them beside its own."""
    ticks = []

    async def endless(progress):
        while True:
            await asyncio.sleep(0.02)
            progress.tick()
            ticks.append(1)

    def time_limit(signum, frame):
        raise RuntimeError("Job not requeued because: timed-out and not checkpointable.")

    before = signal.signal(signal.SIGALRM, time_limit)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(RuntimeError, match="timed-out"):
            engine._until_done_or_stalled(endless)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    ticked = len(ticks)

    async def next_run(progress):
        await asyncio.sleep(0.3)
        return "next"

    assert engine._until_done_or_stalled(next_run) == "next"
    assert len(ticks) == ticked   # the first run did not go on during the second


def test_a_request_that_fails_cancels_the_runs_other_requests_before_the_next_run(engine):
    """asyncio.gather left a failed run's other requests running; a scenario's
    failure no longer ends the job, so the next scenario ran beside them."""
    streamed = {}

    class OneRequestFails:
        async def generate(self, prompt, params, request_id):
            for step in range(40):
                await asyncio.sleep(0.02)
                if request_id.endswith("-0") and step == 3:
                    raise ValueError("this prompt is refused")
                streamed[request_id] = step
                yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[step])])

    engine.engine = OneRequestFails()
    with pytest.raises(ValueError, match="refused"):
        engine.run([[1, 2], [3, 4], [5, 6]], 4)
    assert not [t for t in asyncio.all_tasks(engine.loop) if not t.done()]
    left = dict(streamed)

    async def next_run(progress):
        await asyncio.sleep(0.3)
        return "next"

    assert engine._until_done_or_stalled(next_run) == "next"
    assert streamed == left   # nothing of the failed run went on
