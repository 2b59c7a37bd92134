"""A test engine: the real in-process vLLM engine (evaluate.engines.vllm)
behind a gate (tests/evaluate/engines/gate.py), held before its requests
reach vLLM. Its settings: engine.gate (a path) and engine.free_runs, added
with `+engine.gate=... +engine.free_runs=N` besides `engine._target_=` this class.

A test that signals vLLM's engine core (kill, SIGSTOP) while a run is held
has the signal land surely inside that run, and then opens the gate: the
run's requests meet the dead or stopped core, and evaluate owes that run as
when the core fails mid-step."""
from evaluate.engines.vllm import VllmEngine
from tests.evaluate.engines.gate import Gated


class GatedVllmEngine(Gated, VllmEngine):

    def start(self, target, args: dict, max_model_len: int) -> None:
        super().start(target, args, max_model_len)
        self.hold_runs(self.settings["gate"], self.settings.get("free_runs"))
