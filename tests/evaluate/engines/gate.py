"""A gate for test engines: the runs after the first `free_runs` wait until
the file `gate` exists, logging HELD as one starts waiting. A test that acts
on a job mid-scenario (cancels, signals, requeues it, or stops vLLM's engine
core) does so while a run waits here, however fast or busy the machine, and
then creates the file to let the rest run."""
import logging
import time
from pathlib import Path

log = logging.getLogger("quantbench.evaluate")

HELD = "gated engine: held at the gate"
POLL_S = 0.1  # a signal's handler (scancel, Slurm's time-limit warning) raises in the sleep


class Gated:
    """Mixed in before an engine class; its start() calls hold_runs()."""

    def hold_runs(self, gate, free_runs) -> None:
        self.gate = Path(gate)
        self.free_runs = int(free_runs or 0)
        self.calls = 0

    def run(self, prompts: list[list[int]], output_len: int, stream: bool = True):
        self.calls += 1
        if self.calls > self.free_runs and not self.gate.exists():
            log.info("%s (run call %d) until %s exists", HELD, self.calls, self.gate)
            while not self.gate.exists():
                time.sleep(POLL_S)
        return super().run(prompts, output_len, stream)
