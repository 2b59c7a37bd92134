"""A fake engine for tests: the whole evaluate.engines.base.Engine interface
with a fake clock (every generated token takes `token_latency_ms`, the first
one `prefill_ms` more) and no model, so `python -m evaluate` runs end to end
in seconds. Its config is dummy.yaml beside it: put it on Hydra's search path
as <dir>/engine/dummy.yaml and this folder on PYTHONPATH.

Noise on demand, the same in every process: `jitter_pct` scales each run's
token latency by a pseudo-random factor in 1 ± jitter_pct %, and the first
`cold_runs` runs are slower (2x, 1.5x, 1.33x ...), like a cold engine."""
import os
import random

from evaluate.formats import YES, Verdict
from evaluate.engines import Engine
from evaluate.metrics import RequestTiming
import quantize.common.machine

VERSION = "0.0.1+fake"


class FakeClock:
    """Seconds that pass only when the engine says so."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


class DummyEngine(Engine):
    name = "dummy"
    has_prompt_logprobs = False
    # recorded from os.environ while it runs (not only what its config sets):
    # a variable left behind by an earlier engine would show here
    speed_env = ("QUANTBENCH_DUMMY_MODE", "QUANTBENCH_DUMMY_EXTRA")

    @staticmethod
    def machine():
        return quantize.common.machine.detect()

    @staticmethod
    def choose_dtype(fmt, machine, args: dict | None = None) -> str:
        requested = (args or {}).get("dtype")
        return fmt.dtype if requested in (None, "auto") else str(requested)

    @staticmethod
    def accepted_args() -> set[str]:
        return {"dtype", "max_model_len", "token_latency_ms", "prefill_ms", "jitter_pct", "cold_runs"}

    @staticmethod
    def supports(fmt, machine, args: dict) -> Verdict:
        return YES

    def start(self, target, args: dict, max_model_len: int) -> None:
        self.args = {**args, "max_model_len": max_model_len}
        self.token_s = float(args.get("token_latency_ms") or 10) / 1e3
        self.prefill_s = float(args.get("prefill_ms") or 0) / 1e3
        self.jitter = float(args.get("jitter_pct") or 0) / 100
        self.cold_runs = int(args.get("cold_runs") or 0)
        self.rng = random.Random(0)  # a fixed seed: every process sees the same sequence
        self.runs = 0
        self.clock = FakeClock()
        self.env_at_start = {k: os.environ.get(k) for k in self.speed_env}
        self.startup_s = 0.0

    def run(self, prompts: list[list[int]], output_len: int, stream: bool = True):
        start = self.clock.now
        timings = [RequestTiming(start=start, prompt_tokens=len(p)) for p in prompts]
        token_s = self.token_s * self._slowdown()
        self.clock.advance(self.prefill_s)
        for step in range(output_len):
            now = self.clock.advance(token_s)
            if stream or step == output_len - 1:
                for t in timings:
                    t.chunks.append((now, 1 if stream else output_len))
        return start, timings

    def _slowdown(self) -> float:
        """This run's token-latency factor: cold start, then jitter."""
        self.runs += 1
        cold = 1 + 1 / self.runs if self.runs <= self.cold_runs else 1.0
        return cold * (1 + self.rng.uniform(-self.jitter, self.jitter))

    def versions(self) -> dict[str, str]:
        return {"dummy-engine": VERSION}
