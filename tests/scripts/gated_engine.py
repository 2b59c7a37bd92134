"""A test engine: the dummy engine (tests/evaluate/engines/dummy_engine.py,
fake clock, no model) whose runs after the first `free_runs` wait until the
file `gate` exists. A job on it is surely mid-scenario, its first rows
written, when a test cancels, signals or requeues it, however fast or busy
the machine; the test creates the file to let the rest run."""
import time
from pathlib import Path

from tests.evaluate.engines.dummy_engine import DummyEngine

POLL_S = 0.1  # a signal's handler (scancel, Slurm's time-limit warning) raises in the sleep


class GatedEngine(DummyEngine):
    name = "gated"

    @staticmethod
    def accepted_args() -> set[str]:
        return DummyEngine.accepted_args() | {"gate", "free_runs"}

    def start(self, target, args: dict, max_model_len: int) -> None:
        super().start(target, args, max_model_len)
        self.gate = Path(args["gate"])
        self.free_runs = int(args.get("free_runs") or 0)
        self.calls = 0

    def run(self, prompts: list[list[int]], output_len: int, stream: bool = True):
        self.calls += 1
        while self.calls > self.free_runs and not self.gate.exists():
            time.sleep(POLL_S)
        return super().run(prompts, output_len, stream)
