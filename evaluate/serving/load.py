"""The load generator: one level of a load profile (evaluate.serving.profiles)
run against an OpenAI-compatible server.

A *level* is one load setting held for a bounded number of requests
(`max_requests`) and seconds (`max_seconds`):
- synchronous: one request at a time (closed loop, concurrency 1);
- concurrency: `level` requests in flight at all times (closed loop: a new
  one is sent as soon as one ends);
- rate: open loop, `level` requests per second on average, arrivals drawn
  from a gamma distribution of shape `burstiness` (1 = Poisson; < 1
  burstier), scaled so that the n-th of n requests is due at n/rate (as in
  vllm bench serve), and sent against that precomputed schedule whatever
  the server does; each request records when it was scheduled and when it
  was sent.

When a level's time is up no request is sent any more; those in flight get
`drain_seconds` more, then are cancelled and count as failed.
"""
import asyncio
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from evaluate.memory import PeakMemory
from evaluate.scenarios import random_prompts
from evaluate.serving.client import Client
from evaluate.serving.requests import LevelRun, RequestResult
from quantize.common.errors import EngineDied

# how rate levels lay out their arrivals (arrival_offsets), recorded in their rows' load: a rate row
# of another layout offered another load, so it is measured anew rather than taken as this level's
ARRIVALS = "gamma gaps scaled to n/rate"
ALIVE_POLL_S = 1.0
DEATH_GRACE_S = 2.0  # a dying server closes its sockets a moment before its exit can be seen


@dataclass(frozen=True)
class Level:
    """One load setting of a profile: what a serving row's `load` names."""
    mode: str                       # synchronous | concurrency | rate
    level: float | None             # in-flight requests, or req/s; None for synchronous
    burstiness: float | None = None

    def describe(self) -> str:
        if self.mode == "synchronous":
            return "synchronous"
        if self.mode == "concurrency":
            return f"concurrency {self.level:g}"
        return f"rate {self.level:g} req/s (burstiness {self.burstiness:g})"


class ServerDied(EngineDied):
    """The server stopped serving during a level: no later level can run
    (one line: why, and where its log is)."""

    def __init__(self, why: str):
        super().__init__(f"server died: {why}; what it owed is recorded failed, and once it serves again the "
                         "same command measures that")


def run_level(base_url: str, model: str, level: Level, prompts: list[list[int]], output_len: int,
              max_seconds: float, drain_seconds: float, alive: Callable[[], str | None],
              server_pid: int | None, seed: int = 0, stall_timeout_s: float | None = None) -> LevelRun:
    """Run one level (at most len(prompts) requests and max_seconds of
    sending) and return what the client saw; a request whose stream sends
    nothing for `stall_timeout_s` fails. Raises ServerDied when `alive()`
    says the server stopped during it."""
    watch = PeakMemory(interval_s=0.1, pid=server_pid, gpu=False) if server_pid else nullcontext()
    with watch as memory:
        cpu0 = time.process_time()
        run = asyncio.run(_level(Client(base_url, model, stall_timeout_s=stall_timeout_s), level, prompts,
                                 output_len, max_seconds, drain_seconds, alive, seed))
        run.client_cpu_s = time.process_time() - cpu0
    run.server_peak_memory_bytes = memory.peak_rss_bytes if memory else None
    if run.stopped_by and run.stopped_by.startswith("server died"):
        raise ServerDied(run.stopped_by.removeprefix("server died: "))
    return run


async def _level(client: Client, level: Level, prompts, output_len, max_seconds, drain_seconds, alive, seed):
    results: list[RequestResult] = []
    run = LevelRun(mode=level.mode, level=level.level, start=0.0, end=0.0, results=results,
                   burstiness=level.burstiness, output_len=output_len)
    stop = asyncio.Event()  # set when the level ends early: nothing more is sent
    async with client:
        run.start = time.perf_counter()
        send_until = run.start + max_seconds
        if level.mode == "rate":
            tasks = [asyncio.create_task(_open_loop(client, level, prompts, output_len, run.start, send_until,
                                                    seed, results, stop))]
        else:
            tasks = _closed_loop(client, 1 if level.mode == "synchronous" else int(level.level), prompts,
                                 output_len, send_until, results, stop)
        finished: list[float] = []  # when each task ended: the level ends with the last, as vllm bench's does
        for task in tasks:
            task.add_done_callback(lambda _: finished.append(time.perf_counter()))
        died = await _wait(tasks, send_until + drain_seconds, alive, stop)
        run.end = max(finished, default=time.perf_counter())
    if not died:  # alive at the end, it held its port all along: no other process answered in its place
        died = await _died_within(alive, DEATH_GRACE_S if any(r.connection_lost for r in results) else 0.0)
    if died:
        run.stopped_by = f"server died: {died}"
    elif len(results) >= len(prompts):
        run.stopped_by = "max_requests"
    else:
        run.stopped_by = "max_seconds"
    return run


def _closed_loop(client, n: int, prompts, output_len, send_until, results, stop) -> list[asyncio.Task]:
    queue = iter(prompts)  # shared by the workers: one event loop, no lock needed

    async def worker():
        for prompt in queue:
            if stop.is_set() or time.perf_counter() >= send_until:
                return
            results.append(await client.complete(prompt, output_len))

    return [asyncio.create_task(worker()) for _ in range(n)]


def arrival_offsets(rate: float, burstiness: float, n: int, seed: int) -> np.ndarray:
    """Seconds from the level's start at which each of `n` requests is due:
    gamma-distributed gaps with mean 1/rate (shape `burstiness`; 1 =
    exponential, i.e. Poisson arrivals), the first one before the first
    request, then scaled so that the n-th is due at exactly n/rate, as vllm
    bench serve lays out its arrivals: raw gaps would offer up to a quarter
    more or less than `rate` over a level of a few dozen requests."""
    rng = np.random.default_rng([int(seed), 7])
    due = np.cumsum(rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n))
    return due * (n / rate / due[-1])


async def _open_loop(client, level: Level, prompts, output_len, t0, send_until, seed, results, stop) -> None:
    """Send every request at its scheduled time (offsets from the level's
    start `t0`), never waiting for answers, until the schedule is done or the
    level's time is up; then wait for the requests in flight (cancelling this
    cancels them)."""
    sent = []

    async def one(prompt, scheduled):
        results.append(await client.complete(prompt, output_len, scheduled=scheduled))

    for offset, prompt in zip(arrival_offsets(level.level, level.burstiness, len(prompts), seed), prompts):
        due = t0 + float(offset)
        if due >= send_until:
            break
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if stop.is_set():
            break
        sent.append(asyncio.create_task(one(prompt, due)))
    try:
        await asyncio.gather(*sent)
    finally:
        for task in sent:
            task.cancel()
        await asyncio.gather(*sent, return_exceptions=True)


async def _wait(tasks: list[asyncio.Task], deadline: float, alive, stop) -> str | None:
    """Wait for the level's requests until `deadline`, checking the server
    every ALIVE_POLL_S; cancel what is left. Returns why the server died, or None."""
    loop = asyncio.get_running_loop()
    pending = set(tasks)
    died = None
    while pending:
        timeout = min(ALIVE_POLL_S, deadline - time.perf_counter())
        if timeout <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=timeout)
        if not pending:  # all answered: no poll to wait for
            break
        died = await loop.run_in_executor(None, alive)
        if died:
            break
    stop.set()
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return died


async def _died_within(alive, grace_s: float) -> str | None:
    """Why the server died, if `alive()` says so within `grace_s`; else None."""
    loop = asyncio.get_running_loop()
    until = time.perf_counter() + grace_s
    while (died := await loop.run_in_executor(None, alive)) is None and time.perf_counter() < until:
        await asyncio.sleep(0.1)
    return died


def level_prompts(seed: int, key: int, n: int, input_len: int, vocab: int,
                  scenario: Sequence[int] = ()) -> list[list[int]]:
    """`n` prompts of exactly `input_len` random token ids below 10000 (as
    evaluate.batch.prompts and vllm bench draw), fresh for every level and
    scenario (`key` identifies the level, `scenario` is scenarios.PromptDraw.key),
    so prefix caching serves no level from another, of this scenario or another."""
    return random_prompts([seed, 3000, key, input_len, *scenario], n, input_len, vocab)


def level_requests(max_requests: float) -> int:
    return max(1, int(math.floor(max_requests)))
