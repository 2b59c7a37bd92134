"""A test engine: the real in-process vLLM engine (evaluate.engines.vllm),
whose runs after the first `free_runs` wait, before their requests reach
vLLM, until the file `gate` exists; it logs HELD when one starts waiting.
Its settings: engine.gate (a path) and engine.free_runs, added with
`+engine.gate=... +engine.free_runs=N` besides `engine._target_=` this class.

A test that signals vLLM's engine core (kill, SIGSTOP) while a run waits
here has the signal land surely inside that run, however fast or busy the
machine, and then opens the gate: the run's requests meet the dead or
stopped core, and evaluate owes that run as when the core fails mid-step."""
import logging
import time
from pathlib import Path

from evaluate.engines.vllm import VllmEngine

log = logging.getLogger("quantbench.evaluate")

HELD = "gated vLLM engine: held at the gate"
POLL_S = 0.1


class GatedVllmEngine(VllmEngine):

    def start(self, target, args: dict, max_model_len: int) -> None:
        super().start(target, args, max_model_len)
        self.gate = Path(self.settings["gate"])
        self.free_runs = int(self.settings.get("free_runs") or 0)
        self.calls = 0

    def run(self, prompts: list[list[int]], output_len: int, stream: bool = True):
        self.calls += 1
        if self.calls > self.free_runs and not self.gate.exists():
            log.info("%s (run call %d) until %s exists", HELD, self.calls, self.gate)
            while not self.gate.exists():
                time.sleep(POLL_S)
        return super().run(prompts, output_len, stream)
